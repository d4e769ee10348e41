"""Engine-level fault jobs for tests/test_failures.py, run under mpirun:

    mpirun -n 4 python tests/mpi_fault_jobs.py nonfinite
    mpirun -n 4 python tests/mpi_fault_jobs.py lone_error_before_training

Each job runs inside FailureGuard, so a failed check aborts the job (and the
test sees a non-zero exit) instead of hanging. Rank 0 prints "OK <job>" last.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from mpi4py import MPI

from zero_ref.app.failure import FailureGuard
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.optim.nonfinite import NonFiniteGradientError
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.faults import Fault, arm
from zero_ref.testing.replay import ReplayModel

# Awkward sizes: a 0-d tensor, a zero-size one, primes; the last unit's first
# tensor (where the fault writes) has 3 x 5 elements, so its name is "out.w".
UNITS = [
    ("first", [("a", (7,)), ("scalar", ())]),
    ("empty", [("none", (0, 3))]),
    ("mid", [("w", (11, 13)), ("b", (13,))]),
    ("out", [("w", (3, 5)), ("b", (2,))]),
]


def step(engine, model: ReplayModel, n: int):
    """Optimizer step n (1-based) on the replayed gradients of every rank."""
    ctx = model.contexts(seed=0, step=n, grad_accum=engine.cfg.grad_accum, world_size=engine.world)
    return engine.train_step(ctx[:, engine.rank], np.zeros((engine.cfg.grad_accum, 1)))


def state(engine) -> dict[str, np.ndarray]:
    """Parameters (consolidated: a collective at stage 3) and this rank's optimizer state."""
    named = full_parameters(engine)
    named["exp_avg"], named["exp_avg_sq"] = engine.exp_avg.copy(), engine.exp_avg_sq.copy()
    return named


def bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a
    )


def engine_for(world: MPI.Comm, stage: int, deterministic: bool, policy: str):
    model = ReplayModel(UNITS)
    cfg = ZeroConfig(
        stage=stage,
        bucket_numel=17,
        grad_accum=2,
        clip=1.0,
        deterministic=deterministic,
        nonfinite=policy,
        check_schedule=True,
    )
    return make_engine(model, init_params(model, 0), cfg, comm_for(world, cfg)), model


def skip_case(world: MPI.Comm, stage: int, kind: str, deterministic: bool) -> None:
    """Step 2 has a NaN/Inf on rank 1: dropped on every rank, state bitwise unchanged."""
    engine, model = engine_for(world, stage, deterministic, "skip")
    step(engine, model, 1)
    before = state(engine)
    if engine.rank == 1:
        arm(Fault(kind, rank=1, step=2), engine)
    result = step(engine, model, 2)
    skipped_everywhere = world.allgather(result.skipped)
    assert all(skipped_everywhere), f"stage {stage} {kind}: skipped on {skipped_everywhere}"
    assert not math.isfinite(result.grad_norm) and result.step == 1, result
    assert engine.step_count == 1
    assert bitwise_equal(state(engine), before), f"stage {stage} {kind}: state changed"
    result = step(engine, model, 3)  # and training goes on
    assert not result.skipped and result.step == 2 and math.isfinite(result.grad_norm)
    assert not bitwise_equal(state(engine), before)


def raise_case(world: MPI.Comm, stage: int) -> None:
    """Under "raise", every rank raises the same error, naming the element and step."""
    engine, model = engine_for(world, stage, False, "raise")
    step(engine, model, 1)
    if engine.rank == 1:
        arm(Fault("nan", rank=1, step=2), engine)
    try:
        step(engine, model, 2)
        message = "no error"
    except NonFiniteGradientError as e:
        message = str(e)
    everyone = world.allgather(message)
    assert len(set(everyone)) == 1, everyone
    assert "out.w[0, 0]" in message and "at step 2" in message, message


def nonfinite(world: MPI.Comm) -> None:
    for stage in (0, 1, 2, 3):
        for kind, deterministic in (("nan", False), ("inf", True)):
            skip_case(world, stage, kind, deterministic)
        raise_case(world, stage)
        if world.rank == 0:  # progress, so the test can tell a slow job from a hung one
            print(f"stage {stage} done", flush=True)


def lone_error_before_training(world: MPI.Comm) -> None:
    """Rank 1 finds bad input that the others do not: it must abort, not wait."""
    if world.rank == 1:
        raise ValueError("only rank 1 sees this bad input")
    world.Barrier()  # the others are already in a collective on the job's communicator


JOBS = {"nonfinite": nonfinite, "lone_error_before_training": lone_error_before_training}


def main() -> int:
    world = MPI.COMM_WORLD
    job = JOBS[sys.argv[1]]
    with FailureGuard(world, f"mpi_fault_jobs {sys.argv[1]}", agree_timeout_s=2.0) as guard:
        job(world)
        if world.rank == 0:
            print(f"OK {sys.argv[1]}", flush=True)
    return guard.exit_code


if __name__ == "__main__":
    sys.exit(main())
