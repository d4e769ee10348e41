"""`python -m zero_ref.app.estimate [train flags] --ranks N`: one rank's peak memory at every
ZeRO stage, estimated from the flags alone, as DeepSpeed's
estimate_zero3_model_states_mem_needs_all_cold prints it; nothing is run.

The command line only. The estimate is zero_ref/app/rank_estimate.py (on the
formulas of zero_ref/formulas/memory.py, which the engine's ledger is
checked against), its words zero_ref/app/estimate_messages.py; their public names
are importable from here too. Measured against real runs: docs/memory.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zero_ref.app.cli import UsageError, parse_args
from zero_ref.app.estimate_messages import check_fits, estimate_table, human
from zero_ref.app.process_memory import mem_available_bytes
from zero_ref.app.rank_estimate import (
    OVERHEAD_BYTES,
    RankEstimate,
    activation_bytes,
    estimate_for,
    estimate_rank,
    model_for,
    state_bytes,
)

__all__ = [
    "OVERHEAD_BYTES",
    "RankEstimate",
    "activation_bytes",
    "check_fits",
    "estimate_for",
    "estimate_rank",
    "estimate_table",
    "human",
    "main",
    "mem_available_bytes",
    "model_for",
    "state_bytes",
]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m zero_ref.app.estimate [train flags] --ranks N`: the table, nothing run."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--ranks", type=int, default=1)
    own.add_argument("--ranks-per-host", type=int)
    mine, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(USAGE)
        return 0
    try:
        if mine.ranks < 1:
            raise UsageError(f"--ranks {mine.ranks} is not allowed: it must be >= 1")
        parsed = parse_args(rest, mine.ranks)
        model = model_for(parsed, mine.ranks)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"zero_ref.app.estimate: error: {e}", file=sys.stderr)
        return 2
    host, per_host = mem_available_bytes(), mine.ranks_per_host or mine.ranks
    print(estimate_table(parsed, model, mine.ranks, None if host is None else host // per_host))
    if host is not None:
        print(f"(MemAvailable {human(host)} on this host, shared by {per_host} ranks)")
    return 0


USAGE = """usage: python -m zero_ref.app.estimate [flags of python -m zero_ref.train] --ranks N
                                      [--ranks-per-host M]

One rank's estimated peak memory at every ZeRO stage for the run these flags
describe, without running it: model states from the padded layout (what the
engine's ledger will hold), activations of one micro-batch, a measured
overhead; and whether it fits in MemAvailable / M (M: --ranks unless given).
The training flags: python -m zero_ref.train --help."""


if __name__ == "__main__":
    sys.exit(main())
