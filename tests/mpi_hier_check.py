"""The two-level collectives against their definitions; run by tests/test_hierarchical.py
as `mpirun -n 6 python tests/mpi_hier_check.py`. Fake hosts on one machine (test-only
host_of): 3 hosts of 2 in blocks, 2 hosts of 3 placed cyclically, 6 hosts of 1, one host,
and hosts of unequal sizes (3, 2 and 1 in blocks; 4 and 2 interleaved: the owners' scheme
of zero_ref/comm/hierarchical_uneven.py).
For each: the all-gather (blocking, in place, issued) equals world order; the
deterministic reduce-scatter and all-reduce equal two_level_sum bit for bit (the
oracle's order), issued and blocking alike; fast mode within rounding; ledger bytes, and
each host's cross-host blocks the least (every other host's data once)."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI
from mpi_checks import run_checks

from zero_ref.comm.hier_order import hosts_of, two_level_sum
from zero_ref.comm.hierarchical import HierarchicalComm
from zero_ref.comm.hierarchical_uneven import UnevenHierarchicalComm
from zero_ref.comm.reduction import MPIReduction, OrderedReduction
from zero_ref.comm.two_level import two_level_comm
from zero_ref.numerics.dtypes import DTYPES, rounded

WORLD = MPI.COMM_WORLD
BF16 = DTYPES["bf16"]
PLACEMENTS = {
    "3 hosts of 2, blocks": lambda r: r // 2,
    "2 hosts of 3, cyclic": lambda r: r % 2,
    "one rank a host": lambda r: r,
    "one host": lambda r: 0,
    "hosts of 3, 2 and 1": [0, 0, 0, 1, 1, 2].__getitem__,
    "hosts of 4 and 2, interleaved": [0, 1, 0, 0, 1, 0].__getitem__,
}


def rows_of(n: int, seed: int) -> np.ndarray:
    """(W, W*n) every rank's send, the same on every rank: awkward magnitudes, so the
    order of a sum shows."""
    rng = np.random.default_rng(seed)
    shape = (WORLD.size, WORLD.size * n)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 4, shape)).astype(np.float32)


def check_placement(name: str, host_of) -> list[str]:
    fails: list[str] = []
    comm = two_level_comm(WORLD, OrderedReduction(), host_of=host_of)
    uneven = len({len(g) for g in hosts_of([host_of(r) for r in range(WORLD.size)])}) > 1
    if uneven != isinstance(comm, UnevenHierarchicalComm):
        fails.append(f"{name}: two_level_comm chose {type(comm).__name__}")
    rank, world, n = comm.rank, comm.size, 7
    sends = rows_of(n, 1)
    by_dest = sends.reshape(world, world, n)  # [source, destination]
    expected = two_level_sum(by_dest[:, rank], comm.world_of, np.empty(n, np.float32))
    got = np.empty(n, np.float32)
    comm.reduce_scatter_sum(sends[rank].copy(), got)
    if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
        fails.append(f"{name}: rank {rank} reduce_scatter differs from two_level_sum")
    issued = np.empty(n, np.float32)
    comm.ireduce_scatter_sum(sends[rank].copy(), issued).wait()
    if not np.array_equal(issued.view(np.uint32), got.view(np.uint32)):
        fails.append(f"{name}: rank {rank} ireduce_scatter_sum differs from blocking")
    buf = sends[rank].copy()
    comm.allreduce_sum(buf)
    full = np.concatenate(
        [two_level_sum(by_dest[:, d], comm.world_of, np.empty(n, np.float32)) for d in range(world)]
    )
    if not np.array_equal(buf.view(np.uint32), full.view(np.uint32)):
        fails.append(f"{name}: rank {rank} allreduce differs from two_level_sum")
    fails += check_16bit_sums(name, comm, sends)
    mine = np.arange(n, dtype=np.float32) + 100 * rank
    want = np.concatenate([np.arange(n, dtype=np.float32) + 100 * r for r in range(world)])
    out = np.empty(world * n, np.float32)
    comm.allgather(mine, out)
    fails += [f"{name}: rank {rank} allgather order"] * (not np.array_equal(out, want))
    out2 = np.zeros(world * n, np.float32)
    flight = comm.iallgather(mine, out2)
    comm.advance()
    flight.wait()
    fails += [f"{name}: rank {rank} iallgather order"] * (not np.array_equal(out2, want))
    inplace = np.zeros(world * n, np.float32)
    inplace[rank * n : (rank + 1) * n] = mine
    comm.iallgather_in_place(inplace).wait()
    fails += [f"{name}: rank {rank} iallgather_in_place"] * (not np.array_equal(inplace, want))
    half = np.zeros(world * n, np.float16)
    half[rank * n : (rank + 1) * n] = mine
    comm.allgather_in_place(half)
    if not np.array_equal(half, want.astype(np.float16)):
        fails.append(f"{name}: rank {rank} fp16 allgather")
    raw = np.full(n, rank + 1, np.uint8)  # qwZ's bytes
    raw_all = np.empty(world * n, np.uint8)
    comm.allgather_bytes(raw, raw_all)
    if not np.array_equal(raw_all, np.repeat(np.arange(1, world + 1, dtype=np.uint8), n)):
        fails.append(f"{name}: rank {rank} allgather_bytes order")
    totals = comm.ledger.end_step()
    # four float32 gathers (allgather, iallgather, in place, allreduce's) and one fp16
    # one; a host's ranks together take each other host's blocks once and send each of
    # theirs once to every other host; the sums the same, the other way
    hosts = hosts_of([host_of(r) for r in range(world)])
    host = next(g for g in hosts if rank in g)
    least = {"recv": world - len(host), "sent": len(host) * (len(hosts) - 1)}
    # (float32 gathers 4 x 4 bytes, fp16 2; bytes 1; float32 sums 3 x 4, bf16 2 x 2)
    for kind, scale, swap in (("allgather_cross", 4 * 4 + 2, False),
                              ("allgather_int8_cross", 1, False),
                              ("reduce_scatter_cross", 3 * 4 + 2 * 2, True)):  # fmt: skip
        booked = totals.get(kind, {})
        for way in ("sent", "recv"):
            everyone = WORLD.allgather(booked.get(f"{way}_bytes", 0) / (scale * n))
            blocks = sum(everyone[r] for r in host)  # the host's ranks' blocks
            want = least[{"sent": "recv", "recv": "sent"}[way] if swap else way]
            if blocks != want:
                fails.append(f"{name}: rank {rank} {kind} {way} {blocks} blocks, not {want}")
    fast = two_level_comm(WORLD, MPIReduction(), host_of=host_of)
    quick = np.empty(n, np.float32)
    fast.reduce_scatter_sum(sends[rank].copy(), quick)
    if not np.allclose(quick, expected, rtol=1e-5, atol=1e-3):
        fails.append(f"{name}: rank {rank} fast reduce_scatter off")
    for c in (comm, fast):
        c.free()
    return fails


def check_16bit_sums(name: str, comm, sends: np.ndarray) -> list[str]:
    """bf16 words, blocking and issued: each host's partial rounded to bf16 as it crosses,
    bitwise two_level_sum with partial_dtype bf16, rounded once."""
    rank, world = comm.rank, comm.size
    n = sends.shape[1] // world
    words = rounded(sends, BF16).astype(BF16)  # every rank's bf16 send
    widened = words.astype(np.float32).reshape(world, world, n)[:, rank]
    total = two_level_sum(widened, comm.world_of, np.empty(n, np.float32), BF16)
    want = total.astype(BF16)
    fails = []
    for issued in (False, True):
        got = np.empty(n, BF16)
        if issued:
            comm.ireduce_scatter_sum(words[rank].copy(), got).wait()
        else:
            comm.reduce_scatter_sum(words[rank].copy(), got)
        if got.tobytes() != want.tobytes():
            fails.append(f"{name}: rank {rank} bf16 sum (issued {issued}) not two_level_sum's")
    return fails


def check_second_hops_in_any_order() -> list[str]:
    """A gather in flight, then a sum issued, with the gather's second hop issued
    before the sum on some ranks and after it on others (a poke finds its first hop in
    on one rank of a host, not on the other): the second hops go out when each rank's
    bytes happen to arrive, so they must not share a communicator with the calls the
    program issues in between, or MPI pairs one rank's gather with another's sum. Fake
    hosts of 2 in blocks; the ranks at local index 1 of the later hosts start late."""
    fails: list[str] = []
    comm = HierarchicalComm(WORLD, OrderedReduction(), host_of=lambda r: r // 2)
    rank, world, n = comm.rank, comm.size, 5
    local = rank % 2
    mine = np.arange(n, dtype=np.float32) + 100 * rank
    want = np.concatenate([np.arange(n, dtype=np.float32) + 100 * r for r in range(world)])
    sends = rows_of(n, 2)
    expected = two_level_sum(
        sends.reshape(world, world, n)[:, rank], comm.world_of, np.empty(n, np.float32)
    )
    if local == 1 and rank >= 2:
        time.sleep(0.3)  # the gather's first hop at local index 1 is late
    out = np.zeros(world * n, np.float32)
    gather = comm.iallgather(mine, out)
    if local == 0:  # poke until the first hop is in: the second goes out now
        deadline = time.monotonic() + 5.0
        while not gather.second_issued and time.monotonic() < deadline:
            comm.advance()
            time.sleep(0.001)
    else:
        comm.advance()  # rank 1: not in yet (ranks 3 and 5 are asleep)
    issued_second_first = gather.second_issued
    got = np.empty(n, np.float32)
    total = comm.ireduce_scatter_sum(sends[rank].copy(), got)
    gather.wait()
    total.wait()
    if not np.array_equal(out, want):
        fails.append(f"rank {rank}: a gather whose second hop went out early is wrong")
    if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
        fails.append(f"rank {rank}: the sum issued beside it is wrong")
    orders = WORLD.allgather(issued_second_first)
    if orders[0] is not True or orders[1] is not False:  # the case this check is for
        fails.append(f"rank {rank}: the ranks did not issue in different orders: {orders}")
    comm.free()
    return fails


def check_waits_newest_first() -> list[str]:
    """Two gathers in flight, the second hop of the first out early on some ranks, and
    the newer one waited for first: its wait must issue the older one's second hop
    before its own, or ranks issue the two second hops in different orders."""
    fails: list[str] = []
    comm = HierarchicalComm(WORLD, OrderedReduction(), host_of=lambda r: r // 2)
    rank, world, n = comm.rank, comm.size, 3
    local = rank % 2
    outs, flights, wants = [], [], []
    for k in range(2):
        mine = np.arange(n, dtype=np.float32) + 100 * rank + 10 * k
        wants.append(
            np.concatenate(
                [np.arange(n, dtype=np.float32) + 100 * r + 10 * k for r in range(world)]
            )
        )
        if k == 0 and local == 1 and rank >= 2:
            time.sleep(0.3)
        outs.append(np.zeros(world * n, np.float32))
        flights.append(comm.iallgather(mine, outs[-1]))
        if k == 0:
            deadline = time.monotonic() + 5.0
            while local == 0 and not flights[0].second_issued and time.monotonic() < deadline:
                comm.advance()
                time.sleep(0.001)
            if local == 1:
                comm.advance()
    early = flights[0].second_issued
    flights[1].wait()
    flights[0].wait()
    for k in range(2):
        if not np.array_equal(outs[k], wants[k]):
            fails.append(f"rank {rank}: gather {k}, waited newest first, is wrong")
    orders = WORLD.allgather(early)
    if orders[0] is not True or orders[1] is not False:
        fails.append(f"rank {rank}: the ranks did not issue in different orders: {orders}")
    comm.free()
    return fails


def checks() -> list[str]:
    fails: list[str] = []
    for name, host_of in PLACEMENTS.items():
        fails += check_placement(name, host_of)
    fails += check_second_hops_in_any_order()
    fails += check_waits_newest_first()
    return fails


if __name__ == "__main__":
    run_checks(WORLD, checks)
