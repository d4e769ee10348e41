"""How close correct runs come to fast mode's one-step bound, and how far bugs land.

    python scripts/bench/check_fast_bound.py [--steps 400]

Races the oracle against itself with the ranks summed in shuffled orders
(zero_ref/testing/oracle_race.py) for several accumulation and clipping
settings, and reports the largest |difference| / bound seen (must stay below
1). Then injects each bug for one step and reports its ratio (must be far above
1). JSON last. The end-to-end counterpart, with the real engine over MPI, is
tests/test_oracle_check.py.
"""

from __future__ import annotations

import argparse
import json

from zero_ref.testing.oracle_race import BUGS, race

SETTINGS = [(1, None), (2, 1.0), (3, 0.05)]  # (grad accumulation k, clip)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    correct = {}
    for k, clip in SETTINGS:
        worst = max(race(k, clip, args.steps, seed=s) for s in range(args.seeds))
        correct[f"k={k} clip={clip}"] = worst
        print(
            f"correct, k={k}, clip={clip}: at most {worst:.3f} of the bound over {args.steps} steps"
        )
    bugs = {}
    for name, bug in BUGS.items():
        bugs[name] = min(race(2, 1.0, 1, mutate=bug, seed=s) for s in range(args.seeds))
        print(f"{name}: {bugs[name]:.3g} times the bound, in its first step")
    print(json.dumps({"steps": args.steps, "correct_max_ratio": correct, "bug_min_ratio": bugs}))


if __name__ == "__main__":
    main()
