"""scripts/bench/overlap_budget.py's pure parts: a trace's step shared out into phases, and the
dependency bound (the least step time a schedule of the collectives could reach)."""

from __future__ import annotations

import pytest

from scripts.bench.overlap_budget import dependency_bound, kind_link_seconds, step_phases


def event(lane: int, name: str, start_ms: float, dur_ms: float) -> dict:
    return {"ph": "X", "tid": lane, "name": name, "ts": start_ms * 1e3, "dur": dur_ms * 1e3}


def test_a_step_is_shared_out_from_one_optimizer_end_to_the_next():
    events = [{"ph": "M", "tid": 3, "name": "thread_name"}]  # lane names: no times
    events += [event(3, "optimizer step 0", 0, 10)]  # step 0 ends at 10 ms
    events += [
        event(0, "forward h0", 12, 20),
        event(1, "wait allgather", 32, 5),
        event(0, "backward h0", 37, 30),
        event(1, "wait reduce_scatter", 67, 7),
        event(1, "norm", 74, 1),
        event(1, "sample", 74, 1),  # not a training step's
        event(3, "optimizer step 1", 75, 15),  # step 1 ends at 90 ms
    ]
    (p,) = step_phases(events, skip_first=1)
    assert p["step"] == pytest.approx(0.080)
    assert (p["forward"], p["backward"], p["optimizer"]) == pytest.approx((0.020, 0.030, 0.015))
    assert p["waits"] == pytest.approx({"allgather": 0.005, "reduce_scatter": 0.007})
    assert p["blocking"] == pytest.approx(0.001)
    assert p["other"] == pytest.approx(0.080 - 0.020 - 0.030 - 0.015 - 0.012 - 0.001)


def test_the_bound_puts_each_collective_under_the_compute_it_can_hide_behind():
    compute = {"step": 0.100, "forward": 0.030, "backward": 0.060}
    t = kind_link_seconds(1e6, {"allgather": 1.0, "reduce_scatter": 1.0}, 2e7)  # 25 ms each
    assert t == pytest.approx({"allgather": 0.025, "reduce_scatter": 0.025})
    assert dependency_bound(2, compute, t) == pytest.approx(0.100)  # both hidden
    slow = {"allgather": 0.050, "reduce_scatter": 0.050}
    # stages 1-2: the gather only under forward (20 ms of it uncovered), the reduction
    # under backward (covered)
    assert dependency_bound(1, compute, slow) == pytest.approx(0.120)
    # stage 3: half the gathers under forward (covered), the other half and the
    # reduction under backward (75 ms: 15 uncovered)
    assert dependency_bound(3, compute, slow) == pytest.approx(0.115)
