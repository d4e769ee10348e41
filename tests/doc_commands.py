"""The shell commands of README.md and docs/*.md, read as a reader would type them.

A page's fenced ```bash blocks (and `$ `-prompted lines in any block) are read in
order as one shell session on a fresh clone: backslash continuations joined, `for V
in ...; do ... done` loops unrolled, `name="..."` variables and `export` applied,
`&&` and `;` split. What comes out is a list of steps: a `Command` (python or mpirun
of python), a `Mkdir`, or a `Skip` (pip, git, pytest, printf, `bash scripts/*/*.sh`:
nothing zero_ref's parsers read; python3 is python).
Anything else raises `UnknownCommand`, so a new kind of command in the docs needs
this reader taught, never silently passes.

`scaled` turns a zero_ref.train command into a cheap one with the same flags: a tiny
GPT and step counts divided by 100 (tests/test_docs.py runs the tutorials so).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
SHELL = ("bash", "sh", "shell", "console")


class UnknownCommand(ValueError):
    """A command in the docs that this reader does not know how to check."""


@dataclass(frozen=True)
class Command:
    page: str
    block: int  # which shell block of the page (0-based)
    text: str  # as the page writes it (after unrolling), for messages
    argv: tuple[str, ...]  # after `python`: ("-m", "zero_ref.train", ...) or ("scripts/k/x.py", ..)
    world: int | None = None  # mpirun -n N; None: no mpirun
    hostfile: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def module(self) -> str | None:
        return self.argv[1] if self.argv[:1] == ("-m",) else None

    @property
    def script(self) -> str | None:
        return None if self.module else self.argv[0]

    @property
    def args(self) -> list[str]:
        return list(self.argv[2:] if self.module else self.argv[1:])


@dataclass(frozen=True)
class Mkdir:
    page: str
    block: int
    paths: tuple[str, ...]


@dataclass(frozen=True)
class Skip:
    page: str
    block: int
    text: str


Step = Command | Mkdir | Skip


def shell_blocks(text: str) -> list[str]:
    """Each fenced block's shell lines: a bash block whole, `$ ` lines of any other."""
    blocks = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang in SHELL:
            blocks.append(body)
        else:
            prompted = [line[2:] for line in body.splitlines() if line.startswith("$ ")]
            if prompted:
                blocks.append("\n".join(prompted) + "\n")
    return blocks


def _unroll(body: str) -> list[str]:
    """Logical lines, with `for V in WORDS; do ... done` repeated once per word."""
    body = body.replace("\\\n", " ")
    out: list[str] = []
    lines = iter(body.splitlines())
    for line in lines:
        loop = re.match(r"\s*for (\w+) in (.*); do\s*$", line)
        if not loop:
            out.append(line)
            continue
        inner = []
        for nxt in lines:
            if nxt.strip() == "done":
                break
            inner.append(nxt)
        else:
            raise UnknownCommand(f"a for loop without its done: {line}")
        for word in shlex.split(loop[2]):
            out += [re.sub(rf"\${{?{loop[1]}\b}}?", word, i) for i in inner]
    return out


def _expand(line: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        line = re.sub(rf"\${{?{name}\b}}?", value, line)
    return line


def steps_of(page: str, text: str | None = None) -> list[Step]:
    """Every step of a page's shell blocks, in order (text: the page, else read it)."""
    text = (REPO / page).read_text() if text is None else text
    steps: list[Step] = []
    variables: dict[str, str] = {}
    env: dict[str, str] = {}
    for block, body in enumerate(shell_blocks(text)):
        for line in _unroll(body):
            line = _expand(line, variables).strip()
            assign = re.fullmatch(r'(\w+)="(.*)"', line)
            if assign:
                variables[assign[1]] = " ".join(assign[2].split())
                continue
            exported = re.fullmatch(r"export (\w+)=(\S*)", line)
            if exported:
                env[exported[1]] = exported[2]
                continue
            for words in _simple_commands(line):
                steps.append(_step(page, block, words, env))
    return steps


def _simple_commands(line: str) -> list[list[str]]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|>")
    lex.whitespace_split, lex.commenters = True, "#"
    words, out = [], []
    for token in lex:
        if token in ("&&", ";", "||"):
            out.append(words)
            words = []
        else:
            words.append(token)
    return [w for w in [*out, words] if w]


def _step(page: str, block: int, words: list[str], env: dict[str, str]) -> Step:
    text = shlex.join(words)
    env = dict(env)
    while words and re.fullmatch(r"\w+=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    while words[:1] in (["time"], ["sudo"]):
        words = words[1:]
    if words[:1] == ["python3"]:
        words = ["python", *words[1:]]
    program = words[0] if words else ""
    script = "".join(words[1:2])
    shell_script = program == "bash" and re.fullmatch(r"scripts/(?:\w+/)?\w+\.sh", script)
    skipped = program in ("pip", "printf", "git") or words[:3] == ["python", "-m", "pytest"]
    if skipped or shell_script:
        return Skip(page, block, text)
    if program == "mkdir":
        return Mkdir(page, block, tuple(w for w in words[1:] if not w.startswith("-")))
    world, hostfile = None, None
    if program == "mpirun":
        i = 1
        while i < len(words) and words[i].startswith("-"):
            if words[i] in ("-n", "-np"):
                world = int(words[i + 1])
            elif words[i] in ("-f", "--hostfile", "-hostfile"):
                hostfile = words[i + 1]
            else:
                raise UnknownCommand(f"{page}: mpirun option {words[i]} in: {text}")
            i += 2
        words = words[i:]
    if words[:1] != ["python"] or len(words) < 2:
        raise UnknownCommand(f"{page}: not a python or mpirun command: {text}")
    argv = tuple(words[1:])
    if argv[0] == "-m" and not argv[1].startswith("zero_ref."):
        raise UnknownCommand(f"{page}: python -m of something other than zero_ref: {text}")
    if argv[0] != "-m" and not re.fullmatch(r"scripts/(?:\w+/)?\w+\.py", argv[0]):
        raise UnknownCommand(f"{page}: a python file outside scripts/: {text}")
    return Command(page, block, text, argv, world, hostfile, env)


# Each flag counting steps, scaled down by STEP_SCALE for a test run (at least 1);
# counts of at most KEEP_STEPS stay as written (a figure may name step 3 or 4), and a
# run keeps at least MIN_STEPS (plot_trace.py --median leaves out 5 warm-up steps).
STEP_FLAGS = ("--steps", "--stop-at-step", "--save-every", "--warmup-steps")
STEP_SCALE, KEEP_STEPS, MIN_STEPS = 100, 10, 7
GPT_STEPS = 800  # the GPT's default --steps (zero_ref/app/cli_flags.py's MODEL_DEFAULTS)
TINY = {"--d-model": "16", "--n-layer": "1", "--context": "8", "--n-head": "4"}


def scaled_steps(n: int, flag: str = "--steps") -> int:
    if n <= KEEP_STEPS:
        return n
    return max(MIN_STEPS if flag == "--steps" else 1, -(-n // STEP_SCALE))


def scaled(args: list[str]) -> list[str]:
    """zero_ref.train's flags with a tiny GPT (the mlp is small already) and step
    counts scaled down; every other flag as written."""
    pairs = []
    for a in args:
        pairs += a.split("=", 1) if a.startswith("--") and "=" in a else [a]
    out, i = [], 0
    gpt = "mlp" not in [pairs[j + 1] for j, a in enumerate(pairs[:-1]) if a == "--model"]
    while i < len(pairs):
        flag = pairs[i]
        if gpt and flag in TINY:
            i += 2
        elif flag in STEP_FLAGS:
            out += [flag, str(scaled_steps(int(pairs[i + 1]), flag))]
            i += 2
        else:
            out.append(flag)
            i += 1
    if "--steps" not in out:
        out += ["--steps", str(scaled_steps(GPT_STEPS))]
    if gpt:
        out += [w for kv in TINY.items() for w in kv]
    return out


def in_clone(path: str, clone: Path) -> str:
    """A path as the test uses it: /tmp/... moved inside the test's clone."""
    return str(clone / path.lstrip("/")) if path.startswith("/tmp/") or path == "/tmp" else path
