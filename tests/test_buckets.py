"""Stage 1-3 engines reduce gradients in the buckets zero_ref/layout/buckets.py plans:
one reduce-scatter per bucket per micro-step, and staging for the widest bucket
only, never more than bucket_numel elements (a stage given one model-sized
bucket keeps a full-size gradient buffer, which is what stage 2 exists to avoid).

The expected plan is computed here from the rule as plan_buckets's docstring
states it, not by calling plan_buckets. tests/test_flat.py checks the plan's
own properties; tests/test_parity.py checks the same at world sizes 1-8.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.layout.buckets import plan_buckets
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel


def expected_bucket_plan(padded: list[int], bucket_numel: int, world: int) -> list[list[int]]:
    """[first unit, last unit, shard numel] of each bucket, in backward order, by the
    rule of zero_ref/layout/buckets.py: the shard space (every unit's padded_numel / world
    columns, unit after unit) is cut into windows of max(1, bucket_numel // world)
    columns from the top down; a bucket names the lowest and highest unit with
    columns inside it; the last (lowest) window takes what is left."""
    columns = max(1, bucket_numel // world)
    owner = [u for u, n in enumerate(padded) for _ in range(n // world)]  # column -> unit
    plan, top = [], len(owner)
    while top > 0:
        start = max(0, top - columns)
        plan.append([owner[start], owner[top - 1], top - start])
        top = start
    return plan


def test_expected_plan_by_hand():
    # one rank, units of 15, 0, 8, 22 columns (45 in all); windows of 20 from the top:
    # [25, 45) is all unit 3; [5, 25) is unit 0's top 10, unit 2, unit 3's bottom 2
    assert expected_bucket_plan([15, 0, 8, 22], 20, 1) == [[3, 3, 20], [0, 3, 20], [0, 0, 5]]
    assert len(expected_bucket_plan([15, 0, 8, 22], 1, 1)) == 45  # one column each
    assert expected_bucket_plan([4, 4], 1 << 20, 2) == [[0, 1, 4]]  # 2 ranks: 4 columns
    assert expected_bucket_plan([8], 4, 2) == [[0, 0, 2], [0, 0, 2]]  # a unit in two pieces
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
    buckets = plan_buckets([n // world for n in padded], offsets, bucket_numel, world)
    got = [[b.first_unit, b.last_unit, b.shard_numel] for b in buckets]
    assert got == expected_bucket_plan(padded, bucket_numel, world)


# Awkward sizes (world 1 padded numels 15, 0, 8, 22): bucket_numel 1, 20 and
# 1 << 20 give 45, three and one bucket(s); 20 splits unit 3 and unit 0.
UNITS = [
    ("embed", [("w", (5, 3))]),
    ("empty", [("z", (0,))]),
    ("mid", [("w", (7,)), ("s", ())]),
    ("head", [("w", (2, 11))]),
]


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("bucket_numel, grad_accum", [(1, 1), (20, 2), (1 << 20, 3)])
def test_engine_reduces_in_the_planned_buckets(mpi_comm, stage, bucket_numel, grad_accum):
    model = ReplayModel(UNITS)
    cfg = ZeroConfig(stage=stage, bucket_numel=bucket_numel, grad_accum=grad_accum)
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(mpi_comm, cfg))
    world, k = engine.world, grad_accum
    padded = [u.padded_numel for u in engine.layout.units]
    plan = expected_bucket_plan(padded, bucket_numel, world)
    assert [[b.first_unit, b.last_unit, b.shard_numel] for b in engine.buckets.plan] == plan
    for step in (1, 2):
        contexts = model.contexts(seed=0, step=step, grad_accum=k, world_size=world)
        engine.train_step(contexts[:, engine.rank], np.zeros((k, 1)))
        calls = engine.comm.ledger.last_step()["reduce_scatter"]["calls"]
        assert calls == k * len(plan), f"step {step}: plan {plan}"
    widest = max(b[2] for b in plan)
    staging = engine.memory.held["buffers"]["bucket_staging"]
    assert staging.nbytes == 4 * world * widest <= 4 * max(bucket_numel, world)
