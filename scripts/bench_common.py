"""Helpers the MPI benchmarks share: a ReplayModel of a given size, its inputs,
per-rank medians gathered to rank 0, and the one JSON line every script ends with.

Import zero_ref before NumPy in each script, so that each rank's thread budget
is set before BLAS starts its threads (zero_ref.app.threads).
"""

from __future__ import annotations

import json
import math
import os
import statistics

import numpy as np

from zero_ref.testing.replay import ReplayModel


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


def emit(result: dict) -> None:
    """The last line a benchmark prints: one JSON object."""
    print(json.dumps(result), flush=True)
