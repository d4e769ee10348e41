"""The reliability table of docs/reliability.md, measured by the failure tests.

Runs tests/test_failures.py with ZERO_REF_RELIABILITY_JSONL set, so that each
fault case appends one row (fault injected, how the job ended, exit code, time
to exit), and prints the rows as a Markdown table and, last, one JSON line. With
--record (only when every case passed) the JSON also goes to
docs/results/reliability.json, from which scripts/docs/doc_tables.py writes the table
into docs/reliability.md.

    python scripts/bench/reliability_table.py [--record]

Exit status is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import REPO, add_record_flag, emit, load_average

# the table's one renderer (scripts/docs/doc_tables_render.py), from any working directory
from scripts.docs.doc_tables_render import reliability_table


def run_failure_tests(rows_path: Path) -> int:
    env = dict(os.environ, ZERO_REF_RELIABILITY_JSONL=str(rows_path))
    cmd = [sys.executable, "-m", "pytest", "tests/test_failures.py", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_flag(p, "reliability")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        status = run_failure_tests(rows_path)
        lines = rows_path.read_text().splitlines() if rows_path.exists() else []
        rows = [json.loads(line) for line in lines]
    print(reliability_table(rows))
    result = {"pytest_exit": status, "rows": rows, "load_average": load_average()}
    emit(result, args.record if status == 0 else None)
    return status


if __name__ == "__main__":
    sys.exit(main())
