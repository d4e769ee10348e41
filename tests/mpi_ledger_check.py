"""Run under mpirun (tests/test_ledger_truth.py does): on every rank, at every stage,
the memory ledger must agree with what NumPy really allocated, as tracemalloc sees
it (NumPy reports its array allocations there), after init and after a training
step, within LEDGER_TOLERANCE; and the `buffers` category must equal its formula.
Prints one line per failed check, then "all checks passed on N ranks" from rank 0.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks  # beside this script, which runs by path

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.memory import buffer_formula_bytes
from zero_ref.models.gpt import GPT, GPTConfig

LEDGER_TOLERANCE = 0.03  # Python objects (layout, plans, the comm ledger) are the rest
K, BATCH, CONTEXT = 2, 2, 16


def traced_since(base: int) -> int:
    return tracemalloc.get_traced_memory()[0] - base


def check_stage(world: MPI.Comm, stage: int, failures: list[str]) -> None:
    model = GPT(GPTConfig(vocab_size=64, context=CONTEXT, n_layer=4, n_head=4, d_model=128))
    cfg = ZeroConfig(stage=stage, bucket_numel=4096, grad_accum=K)
    rng = np.random.default_rng(world.Get_rank())
    ids = rng.integers(0, 64, (K, BATCH, CONTEXT + 1))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    engine = make_engine(model, RandomInit(model, 0), cfg, comm_for(world, cfg))
    points = [("after init", traced_since(base))]
    engine.train_step(ids[..., :-1], ids[..., 1:])
    points.append(("after a step", traced_since(base)))
    tracemalloc.stop()
    ledger = engine.memory.total_bytes()
    for when, traced in points:
        if abs(traced - ledger) > LEDGER_TOLERANCE * ledger:
            failures.append(f"stage {stage} rank {engine.rank} {when}: NumPy holds {traced} "
                            f"bytes, the ledger says {ledger}")  # fmt: skip
    numels = [u.padded_numel for u in engine.layout.units]
    expected = buffer_formula_bytes(stage, numels, engine.world, cfg.bucket_numel, K)
    held = engine.memory.bytes_by_category()["buffers"]
    if held != expected:
        failures.append(f"stage {stage} rank {engine.rank}: buffers {held} != formula {expected}")


def warm_up(world: MPI.Comm) -> None:
    """One step of a tiny engine first: Numba's kernels load (and allocate) on first use,
    and that belongs to no stage."""
    model = GPT(GPTConfig(vocab_size=64, context=CONTEXT, n_layer=1, n_head=4, d_model=8))
    cfg = ZeroConfig(stage=3, grad_accum=K)
    ids = np.zeros((K, BATCH, CONTEXT + 1), np.int64)
    make_engine(model, RandomInit(model, 0), cfg, comm_for(world, cfg)).train_step(
        ids[..., :-1], ids[..., 1:]
    )


def check_every_stage(world: MPI.Comm) -> list[str]:
    failures: list[str] = []
    warm_up(world)
    for stage in (0, 1, 2, 3):
        check_stage(world, stage, failures)
    return failures


if __name__ == "__main__":
    comm = MPI.COMM_WORLD.Dup()
    run_checks(comm, lambda: check_every_stage(comm))
