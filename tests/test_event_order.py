"""The order of events inside a step, read from the run's trace (zero_ref/io/trace.py):
no unit's parameters are read before the collective that brings them is complete.

With --overlap-comm a stage issues a collective and waits for it only where its
result is read (zero_ref/engine/collective_schedule.py). On one machine the bytes
arrive at once, so a wait placed on the wrong call (unit i waiting for its
neighbour's all-gather) leaves every value right; on a slow network forward would
read the previous step's parameters. Only the order shows it: at stages 1-2 the wait
for unit i's updated all-gather (its trace event names lane "unit i") must end before
unit i's forward begins, for every unit and every step after an update; at stage 3
the wait for the gather issued for unit i (stage 3's instant event "gather <unit>"
names the buffer, whose lane the wait names) must end, since the last update, before
unit i's forward or backward reads it, prefetched or not.
One rank (COMM_SELF) suffices: the order is each rank's own."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import OverlapConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.io.trace import Trace
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

# five units: one small (persistent under a case's threshold below), one empty
UNITS = [
    ("embed", [("w", (5, 3))]),
    ("a", [("w", (40,))]),
    ("empty", [("w", (0,))]),
    ("b", [("w", (6, 7)), ("bias", (6,))]),
    ("head", [("w", (33,))]),
]
STEPS = 3


def traced_run(stage: int, grad_accum: int = 1, **overlap) -> tuple[list[dict], list[str]]:
    """STEPS steps of a ReplayModel on one rank with a trace, under --overlap-comm and
    `overlap`'s other OverlapConfig fields; the trace's events in the order they were
    recorded (each at its end: the main thread's order of events), and the units' names."""
    model = ReplayModel(UNITS)
    overlapping = OverlapConfig(comm=True, **overlap)
    cfg = ZeroConfig(stage=stage, bucket_numel=16, grad_accum=grad_accum, overlap=overlapping)
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
    trace = Trace(0)
    engine.attach_trace(trace)
    k = cfg.grad_accum
    for step in range(STEPS):
        ctx = model.contexts(0, step, k, 1)
        engine.train_step(ctx[:, 0], np.zeros((k, 1)))
    engine.close()
    return [e for e in trace.events if e.get("ph") in ("X", "i")], [u.name for u in model.units]


def read_of(event: dict, names: list[str]) -> tuple[str, int] | None:
    """("forward" or "backward", unit) if the event is a read of a unit's parameters."""
    what, _, unit = event["name"].partition(" ")
    if event["cat"] == "compute" and what in ("forward", "backward"):
        return what, names.index(unit)
    return None


def check_order(events: list[dict], names: list[str], ready_unit, where: str, ready=()) -> int:
    """Walk the events in order: an update makes every unit stale, `ready_unit(event)`
    names the unit an event makes ready (or None), and every read of a non-empty unit
    must find it ready (`ready`: the units step 1 may read as they are). Returns the
    reads checked."""
    ready, last_update, checked = set(ready), None, 0
    for n, e in enumerate(events):
        if e["cat"] == "optimizer":
            ready, last_update = set(), n
        elif (unit := ready_unit(e)) is not None:
            ready.add(unit)
        elif (read := read_of(e, names)) is not None and names[read[1]] != "empty":
            what, i = read
            since = "the start" if last_update is None else f"the update at event {last_update}"
            assert i in ready, (
                f"{where}: the {what} of unit {i} ({names[i]}, event {n}) read it before "
                f"its own collective was complete (none since {since}); complete by "
                f"then: units {sorted(ready)}"
            )
            checked += 1
    assert last_update is not None, "no optimizer step on the trace"
    return checked


def updated_gather(event: dict) -> int | None:
    """Stages 1-2: the unit whose updated all-gather this wait was for (its lane)."""
    lane = event.get("args", {}).get("lane", "")
    if event["name"] == "wait allgather" and lane.startswith("unit "):
        return int(lane.split()[1])
    return None


class Stage3Gathers:
    """Stage 3: which unit each gathered-unit buffer's gather was issued for (instant
    "gather <unit>" with its buffer), and so the unit a wait on lane "gather <buffer>"
    completes."""

    def __init__(self) -> None:
        self.issued: dict[str, int] = {}  # lane -> the unit last issued on it

    def __call__(self, event: dict) -> int | None:
        args = event.get("args", {})
        if event["ph"] == "i" and event["name"].startswith("gather "):
            self.issued[f"gather {args['buffer']}"] = args["unit"]
        elif event["name"].startswith("wait allgather") and args["lane"] in self.issued:
            return self.issued.pop(args["lane"])
        return None


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_stages_1_2_read_a_unit_only_after_its_own_updated_gather_is_waited_for(stage, grad_accum):
    events, names = traced_run(stage, grad_accum=grad_accum)
    where = f"stage {stage}, grad_accum {grad_accum}, --overlap-comm"
    whole = range(len(names))  # step 1 reads the initial parameters, whole on every rank
    checked = check_order(events, names, updated_gather, where, ready=whole)
    assert checked == STEPS * 2 * grad_accum * (len(names) - 1)  # every read was checked


@pytest.mark.parametrize(
    "options",
    [
        {},  # one unit ahead
        {"prefetch_numel": 10**6, "persistence_numel": 16},  # all ahead, embed kept
        {"prefetch_numel": 10**6, "max_live_numel": 2 * 48, "grad_accum": 2},  # budget binds
    ],
)
def test_stage_3_reads_a_unit_only_after_its_own_gather_is_complete(options):
    events, names = traced_run(3, **options)
    k = options.get("grad_accum", 1)
    checked = check_order(events, names, Stage3Gathers(), f"stage 3 {options}")
    assert checked == STEPS * 2 * k * (len(names) - 1)


def owned_grads(engine) -> np.ndarray:
    """This rank's reduced gradient slices, as the update will read them, in one array."""
    return np.concatenate([o[1].ravel() for o in engine.owned_slices()] or [np.zeros(0)])


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_every_bucket_has_landed_when_backward_ends(stage, grad_accum):
    """After each micro-step's backward (--overlap-comm: the last buckets still in flight
    when unit 0 finishes) every bucket's sum is in the gradient the update reads, and
    nothing is in flight: the same bits as the blocking schedule's, bucket by bucket.
    Stage 2's own backward end (stage 3 inherits it) is the one most at risk: a bucket
    left in flight there lands only when a later pack retires it, after the update."""
    model = ReplayModel(UNITS)
    engines = []
    for overlap in (False, True):
        cfg = ZeroConfig(
            stage=stage, bucket_numel=16, grad_accum=grad_accum, overlap=OverlapConfig(comm=overlap)
        )
        engines.append(make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg)))
    blocking, overlapped = engines
    plan = overlapped.buckets.plan
    for step in range(2):
        ctx = model.contexts(0, step, grad_accum, 1)[:, 0]
        for micro in range(grad_accum):
            for engine in engines:
                engine.forward_backward(ctx[micro], np.zeros(1), micro)
            assert overlapped.comm.in_flight == [], (
                f"stage {stage}: {len(overlapped.comm.in_flight)} bucket reduce-scatters "
                f"still in flight, their sums not landed in the gradient, when micro-step "
                f"{micro}'s backward ended"
            )
            want, got = owned_grads(blocking), owned_grads(overlapped)
            if stage >= 2 or grad_accum > 1:  # the shard space: name the buckets that differ
                missing = [
                    k for k, b in enumerate(plan)
                    if not np.array_equal(
                        want[b.shard_offset : b.shard_offset + b.shard_numel],
                        got[b.shard_offset : b.shard_offset + b.shard_numel],
                    )
                ]  # fmt: skip
                assert not missing, (
                    f"stage {stage}, step {step}, micro-step {micro}: buckets {missing} of "
                    f"{len(plan)} had not landed in the gradient shard when backward ended"
                )
            assert np.array_equal(want.view(np.uint8), got.view(np.uint8))
        for engine in engines:
            engine.optimizer_step()
    for engine in engines:
        engine.close()
