"""The docs run as written: their Python examples, their shell commands (parsed on a
fresh clone, the tutorials run scaled down), their example configs and outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_doc_examples_run(path, capsys):
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), {})


def test_the_stage_tables_are_what_the_formulas_give():
    """docs/stages.md's byte tables come from scripts/docs/stages_tables.py (memory.py's
    formulas): the page must hold exactly what the script prints."""
    import importlib.util

    script = DOCS.parent / "scripts" / "docs" / "stages_tables.py"
    spec = importlib.util.spec_from_file_location("stages_tables", script)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    page = (DOCS / "stages.md").read_text()
    for table in tables.tables().split("\n\n"):
        assert table in page, f"docs/stages.md lacks, or holds a stale copy of:\n{table}"


# Every shell command of README.md and docs/*.md (tests/doc_commands.py reads them):
# parsed by the real parsers and the output-path rules on a fresh clone, and the
# tutorials' cheap ones run, scaled down.

PARSERS_CHECKED = ("zero_ref.train", "zero_ref.app.estimate", "zero_ref.app.consolidate")


class _Parsed(Exception):
    """Raised by a script's parse_args once it has parsed: stop before the work."""


def fresh_clone(root: Path) -> Path:
    """What a reader has after `git clone`: the repository's folders (docs/ and its
    subfolders empty, so nothing a command writes lands in this checkout), with
    scripts/ and zero_ref/ linked to this one's. runs/ is ignored by git: absent."""
    root.mkdir(parents=True, exist_ok=True)
    for folder in [DOCS, *(d for d in DOCS.rglob("*") if d.is_dir())]:
        (root / folder.relative_to(DOCS.parent)).mkdir(parents=True, exist_ok=True)
    for linked in ("scripts", "zero_ref"):
        (root / linked).symlink_to(DOCS.parent / linked)
    return root


def parse_script(script: Path, args: list[str], monkeypatch):
    """Run scripts/X.py's own argparse on args, and stop there: a misspelt flag or a
    bad value fails (argparse exits 2). Returns the parsed namespace."""
    import argparse
    import runpy
    import sys

    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise _Parsed(original(self, argv, namespace))

    with monkeypatch.context() as patch, pytest.raises(_Parsed) as parsed:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        patch.setattr(sys, "argv", [str(script), *args])
        patch.syspath_prepend(str(script.parent))
        runpy.run_path(str(script), run_name="__main__")
    return parsed.value.args[0]


def check_command(cmd, clone: Path, monkeypatch, capsys) -> None:
    """One command against the parser it will meet, run from the clone's root."""
    from tests.doc_commands import in_clone

    args = [in_clone(a, clone) for a in cmd.args]
    if cmd.module == "zero_ref.train":
        from zero_ref.app.cli import parse_args
        from zero_ref.app.output_paths import check_output_paths

        check_output_paths(parse_args(args, cmd.world or 1).run)
    elif cmd.module == "zero_ref.app.estimate":
        from zero_ref.app import estimate

        assert estimate.main(args) == 0, capsys.readouterr().err
    elif cmd.module == "zero_ref.app.consolidate":
        from zero_ref.app.consolidate import build_parser

        build_parser().parse_args(args)
    elif cmd.module == "zero_ref.check":
        from zero_ref.check.__main__ import build_parser

        build_parser().parse_args(args)
    elif cmd.module == "zero_ref.engine.minimal":  # run in-process by tests/test_minimal.py
        from zero_ref.engine.minimal import build_parser

        build_parser().parse_args(args)
    elif cmd.script:
        parse_script(clone / cmd.script, args, monkeypatch)
    else:
        raise AssertionError(f"{cmd.page}: no parser is checked for {cmd.text}")


@pytest.mark.parametrize("page", __import__("tests.doc_commands").doc_commands.PAGES)
def test_every_command_parses_on_a_fresh_clone(page, tmp_path, monkeypatch, capsys):
    """Each python/mpirun command of the page, in order, as on a fresh clone: a
    misspelt flag, a bad value or an output path the run would refuse (a folder
    that does not exist, a wrong extension) fails here, naming the command."""
    from tests.doc_commands import Command, Mkdir, in_clone, steps_of

    clone = fresh_clone(tmp_path / "clone")
    monkeypatch.chdir(clone)
    for step in steps_of(page):
        if isinstance(step, Mkdir):
            for p in step.paths:
                Path(in_clone(p, clone)).mkdir(parents=True, exist_ok=True)
        elif isinstance(step, Command):
            try:
                check_command(step, clone, monkeypatch, capsys)
            except (Exception, SystemExit) as e:
                if isinstance(e, _Parsed):
                    raise
                err = capsys.readouterr().err
                raise AssertionError(f"{page}: `{step.text}` fails: {e!r} {err}") from e


# The pages whose commands a reader runs in order, as a tutorial; each runs scaled
# down (tests/doc_commands.py's scaled: a tiny GPT, steps / 100) in its own clone.
TUTORIALS = ("README.md", "docs/checkpoints.md", "docs/memory.md", "docs/stages.md")
CHEAP_SCRIPTS = (
    "scripts/docs/plot_trace.py",
    "scripts/docs/plot_run.py",
    "scripts/docs/plot_checkpoint.py",
)
SLOW_ENV = ("ZERO_REF_INJECT_FAULT", "NUMBA_ENABLE_CUDASIM")  # a fault on purpose; the simulator


def cheap(cmd) -> bool:
    """Runs in about a second scaled down: zero_ref's commands and the plots, not the
    GPU simulator, a fault injected on purpose, several hosts or the 32 GB demo."""
    if cmd.hostfile or any(k in cmd.env for k in SLOW_ENV) or "gpu" in cmd.args:
        return False
    return cmd.module in PARSERS_CHECKED or cmd.script in CHEAP_SCRIPTS


def command_line(cmd, clone: Path) -> list[str]:
    import glob
    import sys

    from tests.doc_commands import in_clone, scaled
    from tests.mpi_pool import mpirun

    args = scaled(cmd.args) if cmd.module == "zero_ref.train" else cmd.args
    expanded = []
    for a in (in_clone(a, clone) for a in args):
        matches = sorted(glob.glob(a, root_dir=clone)) if "*" in a else []
        expanded += matches or [a]
    python = [sys.executable, *cmd.argv[: 2 if cmd.module else 1], *expanded]
    return [mpirun(), "-n", str(cmd.world), *python] if cmd.world else python


def first_line_shape(line: str) -> str:
    """A run's first line without its numbers and its host's thread count."""
    line = re.sub(r"\d[\d,.]*", "#", line)
    line = line.replace("deterministic mode", "fast mode")
    return re.sub(r"# threads? per rank \(.*\)", "# thread per rank (...)", line)


def readme_first_line() -> str:
    sample = re.search(r"## What you see\n\n```\n(.*?)\n", (DOCS.parent / "README.md").read_text())
    return sample[1]


def check_run(cmd, out: str) -> None:
    """What a tutorial's run must show besides exit 0: the first line README shows
    (the same fields); a resume that trains, at the global batch it was saved with."""
    from tests.doc_commands import scaled

    lines = out.splitlines()
    if cmd.module == "zero_ref.train" and "--quiet" not in cmd.args and lines:
        assert first_line_shape(lines[0]) == first_line_shape(readme_first_line()), (
            f"README's sample first line is not what `{cmd.text}` prints: {lines[0]}"
        )
    resumed = re.search(r"resuming from \S+ after step (\d+)", out)
    if cmd.module == "zero_ref.train" and "--resume" in cmd.args:
        assert resumed, out[-2000:]
        args = scaled(cmd.args)
        last = next((args[i + 1] for i, a in enumerate(args) if a == "--stop-at-step"), None)
        last = int(last or args[args.index("--steps") + 1])
        assert last > int(resumed[1]), f"`{cmd.text}` resumes at step {resumed[1]}: trains nothing"
        batch = re.search(r"resume: batch_size was (\d+), now (\d+)", out)
        assert not batch or int(batch[1]) % cmd.world, (
            f"`{cmd.text}` changes the global batch ({batch[0]}), which {cmd.world} ranks "
            "could keep: give a --micro-batch-size or --grad-accum that keeps it"
        )


def run_script(cmd, clone: Path, monkeypatch) -> None:
    """A plotting script in this process (matplotlib imported once, not per plot), from
    the clone's root, as `python scripts/docs/X.py ARGS` would run it (its folder first
    on sys.path, as python puts it; the script itself puts the project root before it)."""
    import runpy
    import sys

    with monkeypatch.context() as patch:
        patch.chdir(clone)
        patch.setattr(sys, "argv", command_line(cmd, clone)[1:])
        patch.syspath_prepend(str((clone / cmd.script).parent))
        try:
            runpy.run_path(str(clone / cmd.script), run_name="__main__")
        except SystemExit as e:
            assert not e.code, f"`{cmd.text}`: {e}"


@pytest.mark.parametrize("page", TUTORIALS)
def test_tutorial_commands_run_scaled_down(page, tmp_path, monkeypatch, capsys):
    """The page's cheap commands (cheap()), in order, in a fresh clone, each scaled
    down with its other flags as written: each must exit 0 and show what check_run
    asks. Commands that are not cheap are only parsed (the test above)."""
    import subprocess

    from tests.doc_commands import Command, Mkdir, in_clone, steps_of
    from tests.mpi_pool import mpi_env

    clone = fresh_clone(tmp_path / "clone")
    ran = 0
    for step in steps_of(page):
        if isinstance(step, Mkdir):
            for p in step.paths:
                (clone / in_clone(p, clone)).mkdir(parents=True, exist_ok=True)
        if not isinstance(step, Command) or not cheap(step):
            continue
        ran += 1
        if step.script:
            run_script(step, clone, monkeypatch)
            continue
        env = {**mpi_env(), **step.env, "PYTHONPATH": str(DOCS.parent)}
        done = subprocess.run(
            command_line(step, clone), cwd=clone, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, f"`{step.text}`:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        check_run(step, done.stdout)
    assert ran, f"{page}: no command ran"


@pytest.mark.parametrize("config", sorted((DOCS / "configs").glob("*.json")), ids=lambda p: p.name)
def test_each_example_config_is_the_default_run_at_its_stage(config):
    """docs/configs/X.json with no flags trains what the flags' defaults train at that
    stage and precision (README says so): AdamW's settings (betas included), the
    batch, the clip, the bucket and the seed are the command line's defaults."""
    from zero_ref.app.cli import parse_args

    file = parse_args(["--config", str(config)], world_size=4)
    same = ["--stage", str(file.zero.stage), "--precision", file.zero.mixed_precision.dtype]
    for flag in ("grad_accum_dtype", "communication_data_type"):
        if getattr(file.zero.mixed_precision, flag):
            same += [f"--{flag.replace('_', '-')}", getattr(file.zero.mixed_precision, flag)]
    flags = parse_args(same, world_size=4)
    assert file.zero.optimizer == flags.zero.optimizer
    assert file.zero == flags.zero
    assert file.run == flags.run


def masked_estimate(text: str) -> list[str]:
    """zero_ref.app.estimate's table without what depends on the host: the memory
    available, and the fits / largest-model columns."""
    lines = []
    for line in text.strip().splitlines():
        if line.startswith(("memory available per rank", "(MemAvailable")):
            continue
        if re.match(r"\s*\d\*?\s", line):
            line = line[: line.rindex(re.findall(r"\s+(?:yes|no|\?)\s", line)[-1])]
        lines.append(line.rstrip())
    return lines


def test_memory_pages_estimate_is_what_the_estimate_prints(capsys):
    """docs/memory.md's example output of `python -m zero_ref.app.estimate` is what that
    command prints now, but for the host's memory."""
    from zero_ref.app import estimate

    page = (DOCS / "memory.md").read_text()
    found = re.search(
        r"```bash\n(python -m zero_ref\.app\.estimate [^\n]*)\n```\n\n```text\n(.*?)```", page, re.S
    )
    assert found, "docs/memory.md lost its estimate example"
    assert estimate.main(found[1].split()[3:]) == 0
    assert masked_estimate(found[2]) == masked_estimate(capsys.readouterr().out)


@pytest.mark.parametrize(
    "line, refused",
    [
        ("mpirun -n 2 python -m zero_ref.train --micro-batchsize 8", "UsageError"),
        ("mpirun -n 2 python -m zero_ref.train --log-jsonl runs/a.jsonl", "UsageError"),
        ("python -m zero_ref.train --export out.npz", "UsageError"),
        ("mpirun -n 3 python -m zero_ref.train --batch-size 32 --micro-batch-size 8", "UsageError"),
        ("python -m zero_ref.app.consolidate ckpt", "SystemExit"),
        ("python -m zero_ref.app.estimate --ranks 0", "AssertionError"),
        ("python scripts/docs/plot_trace.py runs/x.json --outt a.png", "SystemExit"),
    ],
)
def test_the_check_refuses_what_a_run_would(line, refused, tmp_path, monkeypatch, capsys):
    """check_command fails on a misspelt flag, a folder that does not exist, a wrong
    extension, a batch that does not split, a missing argument: the commands test above
    can fail."""
    from tests.doc_commands import steps_of

    clone = fresh_clone(tmp_path / "clone")
    monkeypatch.chdir(clone)
    (cmd,) = steps_of("page.md", f"```bash\n{line}\n```\n")
    with pytest.raises(BaseException) as caught:
        check_command(cmd, clone, monkeypatch, capsys)
    assert type(caught.value).__name__ == refused, caught.value


def test_readme_names_every_flag_help_lists():
    """README's "--help lists every flag" names each option `--help` prints, and no
    other: a flag added to the settings table and not to the list fails here."""
    from zero_ref.app.cli_flags import build_parser

    helped = {
        s for a in build_parser(0)._actions for s in a.option_strings if s.startswith("--")
    } - {"--help"}
    readme = (DOCS.parent / "README.md").read_text()
    listed = readme.split("<!-- flags: all -->", 1)[1].split("<!-- /flags -->", 1)[0]
    assert set(re.findall(r"`(--[a-z0-9-]+)", listed)) == helped


def test_architecture_names_only_what_the_code_defines():
    """Every snake_case name docs/architecture.md puts in backticks (`_fill_shards`,
    `release_unit_params`, `rank_order`) is a function, class, attribute or module of
    zero_ref: a renamed method leaves no stale name on the map."""
    package = DOCS.parent / "zero_ref"
    sources = "\n".join(p.read_text() for p in package.rglob("*.py"))
    defined = set(re.findall(r"(?:def|class)\s+(\w+)", sources))
    defined |= set(re.findall(r"^\s*(?:self\.)?(\w+)\s*[:=]", sources, flags=re.M))
    defined |= {p.stem for p in package.rglob("*.py")} | {p.name for p in package.iterdir()}
    page = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"`(_?[a-z][a-z0-9]*_[a-z0-9_]+|_[a-z][a-z0-9]*)`", page))
    assert sorted(named - defined) == []


@pytest.mark.parametrize("page", __import__("tests.doc_commands").doc_commands.PAGES)
def test_no_command_overwrites_a_tracked_figure(page, tmp_path, monkeypatch):
    """A reader running the page's commands never overwrites docs/img/*.png: no
    command names a path there, and no script's default writes there (drawing a
    figure into docs/img/ is for regenerating it on purpose, a flag away)."""
    from tests.doc_commands import Command, steps_of

    clone = fresh_clone(tmp_path / "clone")
    monkeypatch.chdir(clone)
    for step in steps_of(page):
        if not isinstance(step, Command):
            continue
        assert not [a for a in step.args if "docs/img" in a], f"{page}: `{step.text}`"
        if step.script and (clone / step.script).suffix == ".py":
            values = vars(parse_script(clone / step.script, step.args, monkeypatch)).values()
            into = [v for v in values if isinstance(v, str | Path) and "docs/img" in str(v)]
            assert not into, f"{page}: `{step.text}` writes {into} by default"


def _map_blocks(page: str) -> dict[str, list[str]]:
    """docs/architecture.md's map (its first code block): folder -> the file names (or
    globs, `*_cuda.py`) its block names; "" is the package root."""
    block = page.split("```\n", 2)[1]
    blocks, folder = {"": []}, ""
    for line in block.splitlines():
        if found := re.match(r"^  (\w+)/", line):
            folder = found[1]
            blocks.setdefault(folder, [])
        elif re.match(r"^  \w+\.py", line):
            folder = ""
        blocks[folder] += re.findall(r"(?<![/\w*])([\w*]+\.py)\b", line)
    return blocks


def test_architecture_map_names_every_module_and_only_modules_that_exist():
    """Every module of zero_ref is on docs/architecture.md's map, in its folder's block
    (by name or by a glob such as `*_cuda.py`), and every file the map names exists
    there (or at the package root): the map is the code's as it is now."""
    import fnmatch

    package = DOCS.parent / "zero_ref"
    blocks = _map_blocks((DOCS / "architecture.md").read_text())
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        if not any(fnmatch.fnmatch(path.name, name) for name in blocks.get(folder, [])):
            missing.append(str(rel))
    assert missing == [], f"not on the map: {missing}"
    absent = [
        f"{folder}/{name}"
        for folder, names in blocks.items()
        for name in names
        if not list((package / folder).glob(name)) and not list(package.glob(name))
    ]
    assert absent == [], f"on the map, not in the code: {absent}"
