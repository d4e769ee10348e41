"""Helpers the benchmarks share: a ReplayModel of a given size, its inputs,
per-rank medians gathered to rank 0, and the one JSON line every script ends with,
which --record also writes to docs/results/NAME.json with the date, the command and
the commit that produced it (scripts/docs/doc_tables.py renders the docs' tables from it).

Import zero_ref before NumPy in each script, so that each rank's thread budget
is set before BLAS starts its threads (zero_ref.runtime.threads).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from zero_ref.io.atomic import atomic_write_bytes
from zero_ref.testing.replay import ReplayModel

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
_IMPORTED = time.perf_counter()


def replay_model(numel: int, n_units: int) -> ReplayModel:
    """n_units units of one (d, d + 1) weight and one (d,) bias, about numel params in all.

    d + 1 columns keep every unit's size odd, so padding to the world size is exercised."""
    d = max(1, int(math.sqrt(numel / n_units)))
    return ReplayModel(
        [(f"unit{i}", [("weight", (d, d + 1)), ("bias", (d,))]) for i in range(n_units)]
    )


def model_numel(model: ReplayModel) -> int:
    """Parameters in the model (Psi), before any padding."""
    return sum(s.numel for u in model.units for s in u.specs)


def step_inputs(model: ReplayModel, seed: int, step: int, rank: int, world: int):
    """This rank's (inputs, targets) for one step with grad_accum = 1."""
    contexts = model.contexts(seed, step, 1, world)  # (1, W, 4)
    return contexts[:, rank], np.zeros(1)


def median(xs) -> float:
    return float(statistics.median(xs))


def gather_medians(mpi, samples: dict[str, list[float]]) -> dict[str, list[float]] | None:
    """Each rank's median of each series, gathered to rank 0 (None elsewhere)."""
    mine = {k: median(v) for k, v in samples.items()}
    every = mpi.gather(mine, root=0)
    if every is None:
        return None
    return {k: [m[k] for m in every] for k in mine}


def load_average() -> float:
    """The 1-minute load average: how busy the machine was while we measured."""
    return os.getloadavg()[0]


def add_record_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """--record [NAME]: also write the JSON line to docs/results/NAME.json."""
    parser.add_argument(
        "--record",
        nargs="?",
        const=name,
        metavar="NAME",
        help=f"also write the result to docs/results/NAME.json (default NAME: {name})",
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def process_seconds() -> float:
    """Seconds since this process started (Linux's /proc; elsewhere, since this import)."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return time.perf_counter() - _IMPORTED
    return uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time


def provenance(world: int | None = None) -> dict:
    """When, by which command and at which commit this result was measured.

    world: the ranks mpirun started this script with (None: a plain python command)."""
    launcher = ["mpirun", "-n", str(world)] if world else []
    script = Path(sys.argv[0]).resolve()  # as run from the repository root: scripts/bench/X.py
    shown = script.relative_to(REPO).as_posix() if script.is_relative_to(REPO) else script.name
    argv = ["python", shown, *sys.argv[1:]]
    changes = _git("status", "--porcelain", "--", "zero_ref", "scripts")
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join([*launcher, *argv]),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": None if changes is None else bool(changes),
        "wall_s": round(process_seconds(), 1),
        "cpu_count": os.cpu_count(),
    }


def emit(result: dict, record: str | None = None, world: int | None = None) -> None:
    """The last line a benchmark prints: one JSON object. With record, the same object,
    its provenance added, goes to docs/results/<record>.json (written atomically)."""
    if record:
        result = {**result, "recorded": provenance(world)}
        text = json.dumps(result, indent=1) + "\n"
        atomic_write_bytes(RESULTS / f"{record}.json", text.encode())
    print(json.dumps(result), flush=True)
