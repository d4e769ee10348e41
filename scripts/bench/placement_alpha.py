"""The per-message latency the step model's alpha is taken from (scripts/bench/link_probe.py's
tiny all-gather over the 2 x 2 namespace ranks), with ranks in blocks and cyclic, on the
unlimited veth: does the placement change it? (docs/step_model.md, the cyclic misses.)

    python scripts/bench/placement_alpha.py [--repeats 2]    # as root: network namespaces

Prints each probe, then one JSON line: each placement's tiny all-gather times, in us.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import emit
from scripts.bench.netns_pair import NetnsPair
from scripts.bench.overlap_runs import link_probe, rank_env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="probes per placement (default 2)")
    ap.add_argument("--prefix", default="zrq", help="namespace names")
    ap.add_argument("--subnet", default="10.83.0", help="the link's subnet a.b.c")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: must be at least 1")
    times: dict[str, list[float]] = {"block": [], "cyclic": []}
    with NetnsPair(args.prefix, args.subnet) as pair:
        for _ in range(args.repeats):
            for placement, seen in times.items():
                us = link_probe(pair, rank_env(), 1, placement)["allgather_tiny_s"] * 1e6
                seen.append(round(us, 1))
                print(f"{placement}: {us:.1f} us", flush=True)
    emit({"allgather_tiny_us": times, "link": "unlimited veth", "ranks": "2 x 2"})


if __name__ == "__main__":
    main()
