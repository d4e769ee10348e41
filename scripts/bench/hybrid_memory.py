"""Hybrid sharding's memory against the process: a shard group of G ranks holds what a
world of G holds, and the ledger says so.

    python scripts/bench/hybrid_memory.py                        # GPT 256x12, G = 2 of 4 ranks
    python scripts/bench/hybrid_memory.py --size 128x4 --steps 3 --record hybrid_memory

Three `zero_ref.train` runs of the same GPT at stage 3 (scripts/bench/bench_memory.py's runs:
context 64, micro-batch 1 per rank, the export in finish), each rank's real peak
resident set above its baseline and its ledger read from the final --log-jsonl record:

  plain G   stage 3 at world G (a shard group alone)
  hybrid    stage 3 at world W with --hybrid-shard-size G (W/G groups, replicas)
  plain W   stage 3 at world W

Per run, in bytes per padded parameter, max over ranks: the real peak, the ledger's
peak, untracked = real - ledger, and the estimate's error against the real peak. The
targets: hybrid's ledger is plain G's (ZeRO at world G; the cross-group all-reduce
adds no buffer that outlives a call), its untracked bytes within 0.25 of plain G's
(what hybrid sharding adds, the ledger counts), and its estimate within 15 % of its real
peak. One JSON line last.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit
from scripts.bench.bench_memory import per_param, run_one, train_flags

UNTRACKED_TOLERANCE = 0.25  # bytes per parameter
ESTIMATE_TOLERANCE = 0.15


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="256x12", help="D_MODELxN_LAYER (default 256x12)")
    p.add_argument("--ranks", type=int, default=4, help="W (default 4)")
    p.add_argument("--group", type=int, default=2, help="G, dividing W (default 2)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per mpirun")
    add_record_flag(p, "hybrid_memory")
    a = p.parse_args()
    if a.group < 1 or a.ranks % a.group or a.group == a.ranks:
        p.error(f"--group {a.group}: a divisor of --ranks {a.ranks} below it")
    a.export, a.checkpoint_activations, a.budget_gib = True, False, 16.0  # bench_memory's
    return a


def measure(name: str, ranks: int, extra: list[str], a: argparse.Namespace, tmp: Path) -> dict:
    """One run at `ranks` ranks, its bytes per parameter (bench_memory.per_param)."""
    flags = [*train_flags(a.size, 3, a), *extra]
    run = argparse.Namespace(**{**vars(a), "ranks": ranks})
    row = per_param(run_one(flags, run, tmp), flags, run)
    print(f"  {name} done", file=sys.stderr, flush=True)
    return {"config": name, "ranks": ranks, "flags": extra, **row}


def targets(plain_g: dict, hybrid: dict) -> dict:
    ledger_ratio = hybrid["ledger"] / plain_g["ledger"]
    untracked_gap = hybrid["untracked"] - plain_g["untracked"]
    return {
        "hybrid_ledger_over_plain_g": ledger_ratio,
        "ledger_as_at_world_g": abs(ledger_ratio - 1) <= 0.01,
        "untracked_gap": untracked_gap,
        "untracked_within_0p25": abs(untracked_gap) <= UNTRACKED_TOLERANCE,
        "estimate_error": hybrid["estimate_error"],
        "estimate_within_15pct": abs(hybrid["estimate_error"]) <= ESTIMATE_TOLERANCE,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| run | ranks | real peak | ledger | untracked | estimate | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["real_peak"], r["ledger"], r["untracked"], r["estimate"]]
        lines.append(
            f"| {r['config']} | {r['ranks']} | "
            + " | ".join(f"{c:.2f}" for c in cells)
            + f" | {r['estimate_error']:+.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    a = parse_args()
    hybrid = ["--hybrid-shard-size", str(a.group)]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            measure(f"plain, {a.group} ranks", a.group, [], a, Path(tmp)),
            measure(f"hybrid, groups of {a.group}", a.ranks, hybrid, a, Path(tmp)),
            measure(f"plain, {a.ranks} ranks", a.ranks, [], a, Path(tmp)),
        ]
    checked = targets(rows[0], rows[1])
    print(f"GPT {a.size}, stage 3, bytes per parameter per rank (max over ranks)")
    print(table(rows))
    print("targets: " + ", ".join(f"{k} {v}" for k, v in checked.items()))
    out = {"size": a.size, "ranks": a.ranks, "group": a.group, "steps": a.steps}
    out.update(context=a.context, load_average=os.getloadavg()[0], targets=checked, rows=rows)
    emit(out, a.record)


if __name__ == "__main__":
    main()
