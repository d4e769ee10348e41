"""The reliability table of docs/reliability.md, produced from the failure tests.

Runs tests/test_failures.py with ZERO_REF_RELIABILITY_JSONL set, so that each
fault case appends one row (fault injected, how the job ended, exit code, time
to exit), and prints the rows as a Markdown table. With --write it also
replaces the table between the markers in docs/reliability.md.

    python scripts/reliability_table.py [--write]

Exit status is pytest's: a table is only written from a run where every case passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "reliability.md"
BEGIN, END = "<!-- reliability-table -->", "<!-- /reliability-table -->"


def run_failure_tests(rows_path: Path) -> int:
    env = dict(os.environ, ZERO_REF_RELIABILITY_JSONL=str(rows_path))
    cmd = [sys.executable, "-m", "pytest", "tests/test_failures.py", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def exit_code(row: dict) -> str:
    code = row["exit_code"]
    return "-9 (writer)" if code is None else str(code)


def time_to_exit(row: dict) -> str:
    if row.get("timing") == "whole job":
        return f"{row['seconds']:.1f} s (whole job)"
    return f"{row['seconds']:.2f} s after the fault"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| case | fault injected | how it ended | ranks | exit code | time to exit |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        fault = f"`{r['fault']}`" if ":rank=" in r["fault"] else r["fault"]
        cells = [r["case"], fault, r["ended"], str(r.get("ranks", 4))]
        lines.append("| " + " | ".join([*cells, exit_code(r), time_to_exit(r)]) + " |")
    return "\n".join(lines)


def write_into_doc(table: str) -> None:
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"replace the table in {DOC.name}")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        status = run_failure_tests(rows_path)
        lines = rows_path.read_text().splitlines() if rows_path.exists() else []
        rows = [json.loads(line) for line in lines]
    table = markdown(rows)
    print(table)
    if args.write and status == 0:
        write_into_doc(table)
        print(f"wrote the table into {DOC.relative_to(REPO)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
