"""A pool case for the minimal engine (zero_ref/engine/minimal.py), run by tests/mpi_worker.py
for a case with "engine": "minimal": the minimal engine, the full engine (make_engine)
and, on rank 0, the single-rank oracle take the same steps from the same data, and each
step reports whether the three hold the same parameters bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import AdamWConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.minimal import MinimalEngine
from zero_ref.models.unit import init_params
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.engine_state import full_parameters


def bits_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """The same names, and every tensor the same bytes (so -0.0 is not 0.0, NaN is NaN)."""
    return sorted(a) == sorted(b) and all(
        np.ascontiguousarray(a[n]).tobytes() == np.ascontiguousarray(b[n]).tobytes() for n in a
    )


def run_minimal_case(case: dict, world: MPI.Comm, build_model) -> dict | None:
    """Each step of the case on the three; rank 0 returns the per-step comparison."""
    cfg = ZeroConfig(
        stage=case["stage"],
        grad_accum=case["grad_accum"],
        clip=case["clip"],
        deterministic=True,
        optimizer=AdamWConfig(lr=case["lr"], weight_decay=case["weight_decay"]),
    )
    full_cfg = replace(cfg, bucket_numel=case["bucket_numel"])  # the full engine's buckets
    model, batches = build_model(case)
    init = init_params(model, case["seed"])
    minimal = MinimalEngine(model, init, cfg, comm_for(world, cfg))
    full = make_engine(model, init, full_cfg, comm_for(world, full_cfg))
    oracle = Oracle.for_config(init, cfg, model) if world.rank == 0 else None
    k, w, r, steps = cfg.grad_accum, world.size, world.rank, []
    for step, lr in enumerate(case["lrs"][: case["steps"]]):
        inputs, targets = batches(step, k, w)
        got = minimal.train_step(inputs[:, r], targets[:, r], lr=lr)
        want = full.train_step(inputs[:, r], targets[:, r], lr=lr)
        mine, theirs = minimal.full_parameters(), full_parameters(full)
        if oracle is not None:
            oracle_loss = oracle.model_step(model, inputs, targets, lr)
            expected = oracle.parameters()
            steps.append(
                {
                    "minimal_is_full": bits_equal(mine, theirs),
                    "minimal_is_oracle": bits_equal(mine, expected),
                    "full_is_oracle": bits_equal(theirs, expected),
                    "norms": [got.grad_norm, want.grad_norm, oracle.last_grad_norm],
                    "losses": [got.loss, want.loss, oracle_loss],
                    "step_counts": [got.step, want.step, oracle.step_count],
                }
            )
            print(f"STEP {step + 1}", flush=True)
    full.close()
    return None if world.rank else {"steps": steps, "case_id": case.get("case_id")}
