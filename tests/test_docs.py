"""The Python examples in docs/ run as written."""

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
    """docs/stages.md's byte tables come from scripts/stages_tables.py (memory.py's
    formulas): the page must hold exactly what the script prints."""
    import importlib.util

    script = DOCS.parent / "scripts" / "stages_tables.py"
    spec = importlib.util.spec_from_file_location("stages_tables", script)
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    page = (DOCS / "stages.md").read_text()
    for table in tables.tables().split("\n\n"):
        assert table in page, f"docs/stages.md lacks, or holds a stale copy of:\n{table}"
