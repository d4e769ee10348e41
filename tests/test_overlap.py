"""--overlap-comm: non-blocking collectives and the overlapping schedule.

The values are the oracle's whatever the schedule (tests/test_parity.py draws overlap,
prefetch depth, budget and persistence beside every other option); here, on three real
ranks (tests/mpi_overlap_check.py): each non-blocking call is its blocking twin bit for
bit, stage 2's staging lanes are never packed while in flight, stage 3 gathers one unit
ahead within its plan and drops an unused prefetch; and, in-process, the prefetch plan's
arithmetic, the memory formula of the extra buffers, and the live-parameter budget
(stage3_max_live_parameters) bounding what the engine holds at budgets that bind."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from tests.mpi_pool import run_mpi_checks
from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OverlapConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.formulas.memory import OverlapBuffers, buffer_bytes, prefetch_plan
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel


def test_three_ranks_under_mpirun():
    run_mpi_checks("mpi_overlap_check.py", 3, timeout=300)


def test_no_prefetch_without_the_overlapping_schedule():
    plan = prefetch_plan([10, 20, 30], False, None, None, 0)
    assert (plan.buffers, plan.ahead_units) == (1, 0)


def test_one_unit_ahead_by_default_and_as_many_as_fit_when_told():
    assert prefetch_plan([10, 20, 30], True, None, None, 0).buffers == 2
    deep = prefetch_plan([10, 20, 30, 40], True, 35, None, 0)  # 10 + 20 fit, not 30 more
    assert (deep.buffers, deep.ahead_units, deep.ahead_numel) == (3, 2, 35)
    assert prefetch_plan([10, 20, 30], True, 0, None, 0).buffers == 1


def test_the_live_budget_bounds_the_buffers_and_refuses_less_than_one_unit():
    assert prefetch_plan([10, 20, 30, 40], True, 1000, 80, 0).buffers == 2  # 80 // 40
    with pytest.raises(ValueError, match=r"max_live_numel=39 .* allowed: >= 40"):
        prefetch_plan([10, 20, 30, 40], True, None, 39, 0)
    kept = prefetch_plan([5, 20, 30], True, None, None, 10)
    assert kept.persistent == frozenset({0})
    with pytest.raises(ValueError, match=r"persistent units \(5\); allowed: >= 35"):
        prefetch_plan([5, 20, 30], True, None, 34, 10)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("extra", [{}, {"prefetch_numel": 10**6, "persistence_numel": 40}])
def test_the_ledger_holds_the_formula_of_the_overlap_buffers(stage, extra):
    """The second staging lane, each lane's receive row, stage 3's prefetch buffers and
    persistent units: what the engine holds is the formula (so the estimate is too)."""
    units = [("a", [("w", (7, 3))]), ("b", [("w", (50,))]), ("c", [("w", (9, 9))])]
    model = ReplayModel(units)
    cfg = ZeroConfig(stage=stage, bucket_numel=16, overlap=OverlapConfig(comm=True, **extra))
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
    numels = [u.padded_numel for u in engine.layout.units]
    ov = cfg.overlap
    plan = prefetch_plan(numels, True, ov.prefetch_numel, None, ov.persistence_numel)
    expected = buffer_bytes(stage, numels, 1, 16, 1, overlap=OverlapBuffers(2, plan))
    assert engine.buffer_bytes() == expected
    assert "bucket_staging (lane 1)" in expected and "bucket_recv (lane 0)" in expected
    if stage == 3:
        assert ("gathered_unit (prefetch 1)" in expected) == (plan.buffers > 1)
    engine.close()


BUDGET_UNITS = [(f"u{n}", [("w", (n,))]) for n in (5, 30, 40, 50, 60)]  # widest 60


def gathered_numel(engine) -> int:
    """The gathered-parameter elements this rank holds (the ledger's buffers): every
    gathered-unit buffer, prefetch ones included, and every persistent unit's own."""
    itemsize = engine.precision.param.itemsize
    held = engine.buffer_bytes()
    names = [k for k in held if k.startswith(("gathered_unit", "persistent unit"))]
    return sum(held[k] for k in names) // itemsize


@pytest.mark.parametrize("persistence", [0, 5, 6, 31])  # none, 5 < 5 is not, u5, u5 + u30
@pytest.mark.parametrize("params", ["fp32", "bf16"])
def test_the_engine_never_holds_more_gathered_parameters_than_the_live_budget(persistence, params):
    """stage3_max_live_parameters bounds everything gathered a rank holds, the
    persistent units' buffers included, at budgets that bind: from the least allowed
    (the widest unit plus the persistent units) up past what the prefetch wants, at
    each buffer boundary's both sides. And a budget is not wasted: one more buffer of
    the widest unit would not fit, unless the prefetch already has all it asks for."""
    model = ReplayModel(BUDGET_UNITS)
    kept = sum(n for n in (5, 30) if n < persistence)
    least, widest = 60 + kept, 60
    unbounded, counts = None, set()
    for budget in [None] + [least + d for k in range(5) for d in (k * widest - 1, k * widest)]:
        if budget is not None and budget < least:
            continue
        overlap = OverlapConfig(
            comm=True, prefetch_numel=10**6, max_live_numel=budget, persistence_numel=persistence
        )
        cfg = ZeroConfig(
            stage=3, overlap=overlap, mixed_precision=MixedPrecisionConfig(dtype=params)
        )
        engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
        held, buffers = gathered_numel(engine), len(engine.gathered.slots)
        engine.close()
        assert held == buffers * widest + kept, "a buffer outside the ledger's names"
        if budget is None:
            unbounded = buffers  # one unit in use, every other unit ahead
            continue
        counts.add(buffers)
        assert held <= budget, (
            f"max_live_numel={budget}, persistence {persistence}: the rank holds {held} "
            f"gathered elements ({buffers} buffers of {widest} and {kept} persistent)"
        )
        assert buffers == unbounded or held + widest > budget, (
            f"max_live_numel={budget}: {buffers} buffers where {held + widest} elements fit"
        )
    assert counts == set(range(1, unbounded + 1)), "budgets that bind at every count"
