"""The measured tables of README.md and docs/*.md are exactly what scripts/docs/doc_tables.py
writes from the recorded results in docs/results/, so a figure cannot drift from the
run that measured it without this failing."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_script():
    spec = importlib.util.spec_from_file_location(
        "doc_tables", REPO / "scripts" / "docs" / "doc_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


tables = _load_script()
DOCS = tables.doc_paths()
# pages with tables of their own making: stages.md's are computed by scripts/docs/stages_tables.py
# (tests/test_docs.py), gpu.md and oracle.md are outside this check for now
UNMARKED_ALLOWED = {"stages.md", "gpu.md", "oracle.md"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_marker_names_a_renderer_and_a_recorded_result(doc):
    for part in tables.marked_parts(doc.read_text()):
        assert not tables.problems(part), f"{doc.name}:{part.line}: {tables.problems(part)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_doc_holds_what_the_script_writes(doc):
    _, stale = tables.rewrite(doc)
    assert not stale, "stale (run python scripts/docs/doc_tables.py):\n" + "\n".join(stale)


def test_every_recorded_result_is_shown_and_says_how_it_was_measured():
    cited = {f for doc in DOCS for part in tables.marked_parts(doc.read_text()) for f in part.files}
    for path in sorted(tables.RESULTS.glob("*.json")):
        assert path.stem in cited, f"{path.name} is in no doc"
        recorded = json.loads(path.read_text())["recorded"]
        for key in ("date", "command", "commit"):
            assert recorded[key], f"{path.name} lacks recorded.{key}"


def test_an_edited_figure_is_named():
    doc = REPO / "README.md"
    text = doc.read_text()
    part = tables.marked_parts(text)[0]
    body = text[part.start : part.end]
    digit = next(i for i, c in enumerate(body) if c.isdigit())
    changed = "1" if body[digit] != "1" else "2"
    edited = text[: part.start + digit] + changed + text[part.start + digit + 1 :]
    fixed, stale = tables.rewrite(doc, edited)
    assert f"README.md:{part.line}: {part.name} from {', '.join(part.files)}: stale" in stale
    assert fixed == tables.rewrite(doc)[0]


def test_a_marker_without_its_end_or_its_file_is_an_error():
    begin = "<!-- measured: train from bench_train -->"
    with pytest.raises(ValueError, match="line 2"):
        tables.marked_parts(f"text\n{begin}\n| table |\n")
    (part,) = tables.marked_parts(f"{begin}x{tables.END} <!-- unrelated -->")
    assert part.files == ("bench_train",) and not tables.problems(part)
    (part,) = tables.marked_parts(f"<!-- measured: nothing from no_such_run -->{tables.END}")
    assert tables.problems(part) == ["no renderer 'nothing'", "no docs/results/no_such_run.json"]


FIGURE = re.compile(r"^\**[-+]?\d[\d,]*\.\d")  # a cell that starts with a decimal figure


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.name not in UNMARKED_ALLOWED], ids=lambda p: p.name
)
def test_no_measured_looking_table_outside_the_markers(doc):
    """A table cell that starts with a decimal figure, outside the markers, was typed by hand."""
    text = doc.read_text()
    for part in reversed(tables.marked_parts(text)):
        text = text[: part.start] + text[part.end :]
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("|") and any(FIGURE.match(c.strip()) for c in line.split("|"))
    ]
    assert not rows, f"{doc.name}: rows with figures outside the markers:\n" + "\n".join(rows)
