"""What --overlap-comm costs in memory, per stage: the buffers it adds, from the ledger.

    python scripts/bench/overlap_memory.py [--world 4] [-- extra zero_ref.train flags]

For the default GPT (or the flags given after --), stages 1-3 at --world ranks: one
engine per setting on this process (MPI_COMM_SELF, laid out for --world ranks through
the estimate, which tests/test_estimate.py checks equals the engine's ledger), its
`buffers` bytes blocking and with --overlap-comm (one unit ahead), and at stage 3
with a deeper prefetch (--prefetch-numel of four widest units' elements: as many
units as fit): the second staging lane and the lanes' receive rows (stages 1-3), the
prefetch buffers (stage 3), each as bytes and bytes per parameter. Prints a table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.cli import parse_args
from zero_ref.app.rank_estimate import estimate_for, model_for
from zero_ref.layout.flat import model_layout

SETTINGS = {  # name -> flags added to the run's
    "blocking": [],
    "overlap": ["--overlap-comm"],
    "overlap, prefetch 4 widest units": ["--overlap-comm", "--prefetch-numel", "{deep}"],
}


def row(stage: int, world: int, flags: list[str]) -> dict:
    base = parse_args(["--stage", str(stage), *flags], world)
    model = model_for(base, world)
    widest = model_layout(model, world).widest_unit_numel
    out = {"stage": stage, "params": None}
    for name, extra in SETTINGS.items():
        if stage < 3 and "prefetch" in name:
            continue
        argv = ["--stage", str(stage), *flags, *(x.format(deep=4 * widest) for x in extra)]
        est = estimate_for(parse_args(argv, world), model, world)
        out["params"] = est.numel
        out[name] = est.buffers
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    add_record_flag(p, "overlap_memory")
    args, flags = p.parse_known_args()
    flags = [f for f in flags if f != "--"]
    rows = [row(stage, args.world, flags) for stage in (1, 2, 3)]
    print(f"buffers per rank, bytes ({args.world} ranks; {' '.join(flags) or 'default GPT'})")
    print(f"{'stage':>5} {'blocking':>10} {'overlap':>10} {'added':>10} {'B/param':>8} "
          f"{'prefetch 4w':>10} {'B/param':>8}")  # fmt: skip
    for r in rows:
        added = r["overlap"] - r["blocking"]
        deep = r.get("overlap, prefetch 4 widest units")
        deep_cells = (
            "" if deep is None else f"{deep:>10,} {(deep - r['blocking']) / r['params']:>8.3f}"
        )
        print(
            f"{r['stage']:>5} {r['blocking']:>10,} {r['overlap']:>10,} {added:>10,} "
            f"{added / r['params']:>8.3f} {deep_cells}"
        )
    result = {"world": args.world, "flags": flags, "rows": rows, "load_average": load_average()}
    emit(result, args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
