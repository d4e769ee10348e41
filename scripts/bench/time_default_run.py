"""How long README's first command takes: `mpirun -n 4 python -m zero_ref.train`, the
default run (800 steps of the default GPT at stage 2), timed from outside, twice.

    python scripts/bench/time_default_run.py            # prints one JSON line last
    python scripts/bench/time_default_run.py --record   # also docs/results/default_run.json

The first run starts with an empty Numba cache (NUMBA_CACHE_DIR: a fresh folder), as
on a fresh clone, so it pays for compiling every kernel; the second reuses that cache.
Both are wall-clock seconds from mpirun's start to its exit, with the machine's load
average beside each: with 4 ranks on few cores, every other job's CPU time comes out of
the run's, so the same command takes several times longer on a busy machine. Take it
on a quiet machine (here under the heavy-run lock, flock /tmp/zero_ref_heavy.lock).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import REPO, add_record_flag, emit, load_average

COMMAND = ["mpirun", "-n", "4", sys.executable, "-m", "zero_ref.train"]
STEP_LINE = re.compile(r"step\s+(\d+)\s+loss\s+([\d.]+).*?([\d.]+) ms/step")


def timed_run(cache: Path) -> dict:
    """One default run with Numba's cache in `cache`: its wall seconds, the load
    average before and after, its last step's loss and the step times it printed."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    before, start = load_average(), time.perf_counter()
    done = subprocess.run(COMMAND, cwd=REPO, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the default run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    steps = [m.groups() for m in STEP_LINE.finditer(done.stdout)]
    if not steps or steps[-1][0] != "800":
        raise SystemExit(f"the default run printed no step 800:\n{done.stdout[-2000:]}")
    return {
        "wall_s": round(wall_s, 1),
        "load_before": round(before, 2),
        "load_after": round(load_average(), 2),
        "final_loss": float(steps[-1][1]),
        "printed_ms_per_step": [float(ms) for _, _, ms in steps],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_flag(p, "default_run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="zero_ref_numba_cache_") as cache:
        cold = timed_run(Path(cache))  # an empty cache: Numba compiles every kernel
        warm = timed_run(Path(cache))
    print(f"cold cache {cold['wall_s']} s, warm cache {warm['wall_s']} s", file=sys.stderr)
    result = {
        "command": "mpirun -n 4 python -m zero_ref.train",
        "cold": cold,
        "warm": warm,
        "cpu_count": os.cpu_count(),
        "load_average": load_average(),
    }
    emit(result, args.record)


if __name__ == "__main__":
    main()
