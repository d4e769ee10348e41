"""Checks the non-blocking collectives and the overlapping schedule on real ranks; run by
tests/test_overlap.py as

    mpirun -n 3 python tests/mpi_overlap_check.py

1. Each non-blocking call (ireduce_scatter_sum, iallgather, iallgather_in_place) gives
   the blocking call's result bit for bit and its ledger bytes, for float32, float16
   and bfloat16 and both reduction policies; rows whose float32 sum depends on the
   order come out as the rank-order sum; the buffer checks refuse what the blocking
   calls refuse.
2. Stage 2 with --overlap-comm: a staging lane is never packed while its reduction is
   in flight, reductions really are in flight while backward goes on, and the buckets
   land in blocking's order.
3. Stage 3's prefetch: while unit i computes, the next unit is in flight or held; no
   more buffers are busy than the plan has; a prefetched unit that is not used is
   waited for and dropped; the ledger's buffers are what tracemalloc saw allocated.
"""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks  # beside this script, which runs by path
from mpi_comm_check import Checks  # failures collected per rank, as there

from zero_ref.comm.collectives import Comm, MPIReduction, OrderedReduction
from zero_ref.comm.progress import progress_for
from zero_ref.config import OverlapConfig, ZeroConfig
from zero_ref.engine.gathered_unit import key_of
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16)
UNITS = [("u0", [("w", (5, 7))]), ("u1", [("w", (9,)), ("b", (4, 4))]), ("u2", [("w", (6, 6))])]
UNITS += [("u3", [("w", (3, 11))]), ("u4", [("w", (2,))])]


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def cancelling(world: int, n: int, rank: int) -> np.ndarray:
    """This rank's send: ranks 0-2 hold rotations of (1e8, 1, -1e8), so the float32 sum
    depends on the order it is taken in."""
    vals = np.array([1e8, 1.0, -1e8], np.float32)
    rows = np.zeros((world, world * n), np.float32)
    for r in range(min(world, 3)):
        rows[r] = vals[(r + np.arange(world * n)) % 3]
    return rows[rank]


def check_calls(mpi: MPI.Comm, check: Checks) -> None:
    """1: non-blocking == blocking, bitwise, with the same ledger bytes."""
    rank, world = mpi.Get_rank(), mpi.Get_size()
    for policy in (MPIReduction(), OrderedReduction()):
        for dtype in DTYPES:
            for n in (0, 1, 13, 1009):
                comm = Comm(mpi, policy, progress=progress_for("test", mpi))
                send = np.random.default_rng(rank * 7 + n).standard_normal(world * n).astype(dtype)
                blocking, issued = np.empty(n, dtype), np.empty(n, dtype)
                comm.reduce_scatter_sum(send, blocking)
                before = comm.ledger.current["reduce_scatter"].sent_bytes
                flight = comm.ireduce_scatter_sum(send, issued)
                comm.progress.poke()
                flight.wait()
                name = f"{type(policy).__name__} {np.dtype(dtype).name} n={n}"
                check(np.array_equal(bits(blocking), bits(issued)), f"reduce_scatter {name}")
                sent = comm.ledger.current["reduce_scatter"].sent_bytes - before
                check(sent == (world - 1) * n * np.dtype(dtype).itemsize, f"bytes {name}")
                full_a, full_b = np.empty(world * n, dtype), np.empty(world * n, dtype)
                comm.allgather(blocking, full_a)
                comm.iallgather(blocking, full_b).wait()
                check(np.array_equal(bits(full_a), bits(full_b)), f"allgather {name}")
                in_place = send.copy()
                comm.allgather_in_place(in_place)
                issued_in_place = send.copy()
                comm.iallgather_in_place(issued_in_place).wait()
                check(np.array_equal(bits(in_place), bits(issued_in_place)), f"in place {name}")
                check(comm.in_flight == [], f"nothing left in flight {name}")
    comm = Comm(mpi, OrderedReduction())
    out = np.empty(5, np.float32)
    comm.ireduce_scatter_sum(cancelling(world, 5, rank), out).wait()
    expected = np.full(5, np.nan, np.float32)
    rows = np.stack([cancelling(world, 5, r) for r in range(world)])
    acc = rows[0, rank * 5 : rank * 5 + 5].copy()
    for r in range(1, world):
        acc = (acc + rows[r, rank * 5 : rank * 5 + 5]).astype(np.float32)
    expected[...] = acc
    check(np.array_equal(bits(out), bits(expected)), "rank-order sum, issued")
    for bad, what in (
        (lambda: comm.iallgather(np.zeros(4, np.float64), np.zeros(4 * world)), "float64"),
        (lambda: comm.iallgather(np.zeros(8, np.float32)[::2], np.zeros(4 * world)), "strided"),
        (lambda: comm.ireduce_scatter_sum(np.zeros(world * 3 + 1, np.float32), out), "sizes"),
    ):
        try:
            bad()
            check(False, f"a {what} buffer was accepted")
        except ValueError:
            pass
    check(comm.in_flight == [], "a refused call left nothing in flight")


def engine_for(mpi: MPI.Comm, **cfg):
    model = ReplayModel(UNITS)
    config = ZeroConfig(deterministic=True, overlap=OverlapConfig(comm=True), bucket_numel=8, **cfg)
    comm = Comm(mpi, OrderedReduction())
    return make_engine(model, init_params(model, 3), config, comm), model


def batch(model, engine):
    """This rank's one micro-batch of replay contexts (inputs and targets alike)."""
    ctx = model.contexts(3, engine.step_count, 1, engine.world)[:, engine.rank]
    return ctx, ctx


def check_stage2_lanes(mpi: MPI.Comm, check: Checks) -> None:
    """2: the staging invariant, and reductions in flight during backward."""
    engine, model = engine_for(mpi, stage=2)
    events: list[tuple] = []
    schedule, buckets = engine.schedule, engine.buckets
    issue, wait, staging = schedule.reduce_bucket, schedule.wait, buckets._staging

    def logged_issue(send, out, lane=0):
        pending = issue(send, out, lane)
        events.append(("issue", lane, id(pending)))
        return pending

    def logged_wait(pending):
        events.append(("wait", None, id(pending)))
        wait(pending)

    def logged_staging(bucket, lane):
        events.append(("pack", lane, None))
        return staging(bucket, lane)

    schedule.reduce_bucket, schedule.wait, buckets._staging = (
        logged_issue,
        logged_wait,
        logged_staging,
    )
    engine.train_step(*batch(model, engine))
    in_flight: dict[int, int] = {}  # lane -> the pending issued in it
    most = 0
    for kind, lane, who in events:
        if kind == "issue":
            in_flight[lane] = who
        elif kind == "wait":
            in_flight = {k: v for k, v in in_flight.items() if v != who}
        else:
            check(lane not in in_flight, f"lane {lane} packed while its reduction was in flight")
        most = max(most, len(in_flight))
    check(most == 2, f"at most {most} reductions in flight at once: expected both lanes")
    engine.close()


def check_stage3_prefetch(mpi: MPI.Comm, check: Checks) -> None:
    """3: one unit ahead, within the plan; unused prefetches dropped; the ledger's
    buffers are what was allocated."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine, model = engine_for(mpi, stage=3)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    buffers = engine.buffer_bytes()
    check(engine.gathered.plan.buffers == 2, f"plan {engine.gathered.plan}")
    held = sum(buffers.values())
    check(held <= grown, f"ledger buffers {held} B but only {grown} B were allocated")
    seen: list[list] = []
    acquire = engine.gathered.acquire

    def watched(i, upcoming=()):
        out = acquire(i, upcoming)
        seen.append((key_of(i)[0], engine.gathered.states()))  # i: a (unit, quantized) key
        return out

    engine.gathered.acquire = watched
    engine.train_step(*batch(model, engine))
    n = len(model.units)
    for i, states in seen[: n - 1]:  # forward: the next unit in flight, or already held
        check((("in flight", i + 1) in states) or (("held", i + 1) in states), f"{i}: {states}")
        check(sum(s != "empty" for s, _ in states) <= 2, f"more than the plan's buffers {states}")
    engine.gathered.acquire = acquire
    engine.unit_params(0, [1, 2])  # unit 1 prefetched ...
    engine.release_unit_params(0)
    check(("in flight", 1) in engine.gathered.states(), f"no prefetch {engine.gathered.states()}")
    engine.gathered.invalidate()  # ... and never used: waited for and dropped
    check(engine.comm.in_flight == [], "a dropped prefetch left a request in flight")
    check(all(s == "empty" for s, _ in engine.gathered.states()), "a dropped prefetch kept")
    engine.close()


def checks() -> list[str]:
    mpi = MPI.COMM_WORLD.Dup()
    check = Checks(mpi.Get_rank())
    check_calls(mpi, check)
    check_stage2_lanes(mpi, check)
    check_stage3_prefetch(mpi, check)
    return check.failures


if __name__ == "__main__":
    run_checks(MPI.COMM_WORLD, checks)
