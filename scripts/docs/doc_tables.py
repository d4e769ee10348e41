"""The measured tables of README.md and docs/*.md, written from docs/results/*.json.

Every figure a benchmark measured sits between two markers that name what renders
it and the recorded result it comes from (`scripts/bench/*.py --record` writes
docs/results/NAME.json: the benchmark's JSON line with the date, the command and
the commit of the run):

    <!-- measured: train from bench_train -->
    (the command, date and commit of the run, then the table)
    <!-- /measured -->

A marker on a line of its own holds a block (caption and table); a pair inside a
sentence holds a few words, such as a range of ratios. This script rewrites every
marked part from the JSON, so nothing between two markers is edited by hand:

    python scripts/docs/doc_tables.py           # rewrite the marked parts of the docs
    python scripts/docs/doc_tables.py --check   # exit 1 naming each stale or broken part

tests/test_doc_tables.py runs the check. The renderers are in doc_tables_render.py and
doc_tables_memory.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.docs import (
    doc_tables_check,
    doc_tables_memory,
    doc_tables_overlap,
    doc_tables_progress,
    doc_tables_sentences,
    doc_tables_step_model,
    doc_tables_zeropp,
)
from scripts.docs import doc_tables_render as render

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
BEGIN = re.compile(r"<!-- measured: (?P<name>[a-z0-9_]+) from (?P<files>[^>]+?) -->")
END = "<!-- /measured -->"
RENDERERS = {
    **render.RENDERERS,
    **doc_tables_check.RENDERERS,
    **doc_tables_memory.RENDERERS,
    **doc_tables_overlap.RENDERERS,
    **doc_tables_progress.RENDERERS,
    **doc_tables_sentences.RENDERERS,
    **doc_tables_step_model.RENDERERS,
    **doc_tables_zeropp.RENDERERS,
}


@dataclass(frozen=True)
class Marked:
    """One marked part of a doc: its renderer, its result files and where its body is."""

    name: str
    files: tuple[str, ...]
    start: int  # the body's first character (just after the begin marker)
    end: int  # where the end marker starts
    line: int  # of the begin marker, 1-based


def doc_paths() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def marked_parts(text: str) -> list[Marked]:
    """Every marked part of text, in order; a begin marker without its end is an error."""
    parts, pos = [], 0
    while match := BEGIN.search(text, pos):
        line = text.count("\n", 0, match.start()) + 1
        end = text.find(END, match.end())
        following = BEGIN.search(text, match.end())
        if end < 0 or (following and following.start() < end):
            raise ValueError(f"line {line}: {match[0]} has no {END} before the next marker")
        files = tuple(f.strip() for f in match["files"].split(","))
        parts.append(Marked(match["name"], files, match.end(), end, line))
        pos = end + len(END)
    return parts


def result_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def load(name: str, doc: Path) -> render.Result:
    path = result_path(name)
    return render.Result(name, json.loads(path.read_text()), os.path.relpath(path, doc.parent))


def problems(part: Marked) -> list[str]:
    """What keeps a marked part from being rendered: an unknown renderer, a missing file,
    a result that does not say how it was measured (no `recorded`, see bench_common.emit)."""
    found = [] if part.name in RENDERERS else [f"no renderer '{part.name}'"]
    for name in part.files:
        path = result_path(name)
        if not path.is_file():
            found.append(f"no {path.relative_to(REPO)}")
        elif "recorded" not in json.loads(path.read_text()):
            found.append(f"{path.relative_to(REPO)} does not say how it was measured")
    return found


def rendered(part: Marked, doc: Path, old: str) -> str:
    body = RENDERERS[part.name](*(load(f, doc) for f in part.files))
    return f"\n{body}\n" if old.startswith("\n") else body  # a block keeps its own lines


def rewrite(doc: Path, text: str | None = None) -> tuple[str, list[str]]:
    """The doc (or text, as if it were the doc's) with every marked part rendered afresh,
    and a line for each part that was stale (differs from what its JSON gives) or
    cannot be rendered."""
    text = doc.read_text() if text is None else text
    out, pos, stale = [], 0, []
    for part in marked_parts(text):
        where = f"{doc.relative_to(REPO)}:{part.line}: {part.name} from {', '.join(part.files)}"
        old = text[part.start : part.end]
        broken = problems(part)
        new = old if broken else rendered(part, doc, old)
        if broken or new != old:
            stale.append(f"{where}: {'; '.join(broken) or 'stale'}")
        out += [text[pos : part.start], new]
        pos = part.end
    out.append(text[pos:])
    return "".join(out), stale


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a part is stale")
    args = p.parse_args()
    all_stale = []
    for doc in doc_paths():
        text, stale = rewrite(doc)
        all_stale += stale
        if stale and not args.check and text != doc.read_text():
            write_atomically(doc, text)
            print(f"wrote {doc.relative_to(REPO)}: {len(stale)} part(s) rendered afresh")
    broken = [line for line in all_stale if not line.endswith(": stale")]
    for line in all_stale if args.check else broken:
        print(line, file=sys.stderr)
    return 1 if broken or (args.check and all_stale) else 0


if __name__ == "__main__":
    sys.exit(main())
