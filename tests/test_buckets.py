"""Stage 2-3 engines reduce gradients in the buckets zero_ref/buckets.py plans:
one reduce-scatter per non-empty bucket per micro-step, and staging for the
largest bucket only (a stage given one model-sized bucket keeps a full-size
gradient buffer, which is what stage 2 exists to avoid).

The expected plan is computed here from the rule as plan_buckets's docstring
states it, not by calling plan_buckets. tests/test_flat.py checks the plan's
own properties; tests/test_parity.py checks the same at world sizes 1-8.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.buckets import plan_buckets
from zero_ref.comm import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.models.replay import ReplayModel
from zero_ref.models.unit import init_params
from zero_ref.stages import make_engine


def expected_bucket_plan(padded: list[int], bucket_numel: int, world: int) -> list[list[int]]:
    """[first unit, last unit, shard numel] of each bucket, in backward order, by the
    rule of zero_ref/buckets.py: walk the units from the last, as backward produces
    them; a bucket closes once it holds >= bucket_numel elements; units are never
    split; the units left when unit 0 is reached form the last bucket."""
    plan, pending = [], []
    for u in reversed(range(len(padded))):
        pending.insert(0, u)
        if sum(padded[i] for i in pending) >= bucket_numel or u == 0:
            plan.append([pending[0], pending[-1], sum(padded[i] for i in pending) // world])
            pending = []
    return plan


def test_expected_plan_by_hand():
    # backward order: unit 3 (22) fills a bucket of 20 alone; 2 (8), 1 (0), 0 (15) share one
    assert expected_bucket_plan([15, 0, 8, 22], 20, 1) == [[3, 3, 22], [0, 2, 23]]
    assert expected_bucket_plan([15, 0, 8, 22], 1, 1) == [[3, 3, 22], [2, 2, 8], [0, 1, 15]]
    assert expected_bucket_plan([4, 4], 1 << 20, 2) == [[0, 1, 4]]
    assert expected_bucket_plan([], 4, 2) == []


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda w: st.tuples(st.just(w), st.lists(st.integers(0, 12).map(lambda n: n * w)))
    ),
    st.integers(1, 64),
)
def test_plan_buckets_follows_the_rule(world_and_padded, bucket_numel):
    world, padded = world_and_padded
    offsets = list(np.cumsum([0, *padded[:-1]]) // world) if padded else []
    buckets = plan_buckets(padded, offsets, bucket_numel, world)
    got = [[b.first_unit, b.last_unit, b.shard_numel] for b in buckets]
    assert got == expected_bucket_plan(padded, bucket_numel, world)


# Awkward sizes (world 1 padded numels 15, 0, 8, 22), so that bucket_numel 1, 20
# and 1 << 20 give three, two and one bucket(s).
UNITS = [
    ("embed", [("w", (5, 3))]),
    ("empty", [("z", (0,))]),
    ("mid", [("w", (7,)), ("s", ())]),
    ("head", [("w", (2, 11))]),
]


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("bucket_numel, grad_accum", [(1, 1), (20, 2), (1 << 20, 3)])
def test_engine_reduces_in_the_planned_buckets(mpi_comm, stage, bucket_numel, grad_accum):
    model = ReplayModel(UNITS)
    cfg = ZeroConfig(stage=stage, bucket_numel=bucket_numel, grad_accum=grad_accum)
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(mpi_comm, cfg))
    world, k = engine.world, grad_accum
    padded = [u.padded_numel for u in engine.layout.units]
    plan = expected_bucket_plan(padded, bucket_numel, world)
    assert [[b.first_unit, b.last_unit, b.shard_numel] for b in engine.buckets] == plan
    for step in (1, 2):
        contexts = model.contexts(seed=0, step=step, grad_accum=k, world_size=world)
        engine.train_step(contexts[:, engine.rank], np.zeros((k, 1)))
        calls = engine.comm.ledger.last_step()["reduce_scatter"]["calls"]
        assert calls == k * sum(1 for b in plan if b[2]), f"step {step}: plan {plan}"
    largest = max(b[2] for b in plan)
    staging = engine.memory.held["buffers"]["bucket_staging"]
    assert staging.nbytes == 4 * world * largest, f"staging for plan {plan}"
