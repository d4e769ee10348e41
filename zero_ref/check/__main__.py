"""`python -m zero_ref.check RECORDS_DIR`: check a run's records step by step.

Prints each step's verdict (docs/check_reference.md) and a JSON summary last. Exit
status 0: every step within the bound; 1: a step was flagged; 2: the records do not fit
(the message names what), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from zero_ref.check.checker import Checker
from zero_ref.check.record import RecordError
from zero_ref.check.records_io import read_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m zero_ref.check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("records", help="the folder a watcher (or your own code) wrote")
    parser.add_argument(
        "--stop-at-first",
        action="store_true",
        help="stop after the first flagged step (later steps follow from it)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only flagged steps")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    steps, flagged = 0, []
    try:
        spec, initial, records = read_run(args.records)
        checker = Checker(spec, initial)
        for record in records:
            verdict = checker.check(record)
            steps += 1
            if not verdict.ok:
                flagged.append(verdict)
            if not (verdict.ok and args.quiet):
                print(verdict, flush=True)
            if flagged and args.stop_at_first:
                break
    except RecordError as e:
        print(f"zero_ref.check: the records do not fit: {e}", file=sys.stderr)
        return 2
    first = flagged[0] if flagged else None
    summary = {
        "steps_checked": steps,
        "flagged_steps": [v.step for v in flagged],
        "first_flagged": None if first is None else first.step,
        "diagnoses": [] if first is None else list(first.diagnoses),
    }
    print(json.dumps(summary))
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
