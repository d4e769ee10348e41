"""Node-aware collectives: the all-gather and reduce-scatter in two levels (issue 33).

MPICH composes its all-reduce node-aware, but its all-gather and reduce-scatter are one
flat algorithm: with ranks in blocks each rank puts (W-1) blocks on the link where a host
needs only the other hosts' data once. HierarchicalComm is a Comm whose all-gathers
(floats and bytes) and reduce-scatters (float32 and 16-bit, and the all-reduce built from
them) run over two communicators instead: `host`, this host's ranks (MPI_Comm_split_type
COMM_TYPE_SHARED, as hpZ finds them), and `cross`, the ranks at this rank's local index
on every host, in host order. The gather crosses first, then spreads inside the host;
the sum is made inside the host first, then only the partials cross
(zero_ref/comm/hier_order.py has the block orders). NCCL and MiCS's
`mics_hierarchical_params_gather` do the same on GPUs. qwZ's byte gathers (int8 and
their scales) go the same two levels. zero_ref/comm/two_level.py picks this Comm or
UnevenHierarchicalComm (hosts of unequal sizes) and makes hpZ's and hybrid's group Comms
two-level where the groups span hosts.

Deterministic mode: each level is the OrderedReduction (an Alltoall, then a sum in rank
order), so the sum is the host's rows in world-rank order, then the hosts' partials in
host order -- the oracle's two-level order (Oracle `hosts`, docs/multihost.md). Fast mode:
MPI's sum at each level. 16-bit sums (reduction.sum_16bit_words at each level, the
same in both modes) add each host's rows in float32 in world-rank order and round that
partial to the 16 bits it crosses in (the least bytes; float32 partials would double
them), then add the hosts' partials in float32 in host order and round once: the oracle's
two-level order with that one extra rounding.
The ledger books each call under its kind plus "_local" (inside the host) and "_cross".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.comm.hier_order import gathered_order, placement, two_level_bytes
from zero_ref.comm.in_flight import ChainedFlight
from zero_ref.comm.nonblocking import check_bytes
from zero_ref.comm.reduction import (
    CROSS_HOP,
    LOCAL_HOP,
    isum_16bit_words,
    sum_16bit_words,
    words_of,
)

_F32 = np.dtype(np.float32)


def host_labels(mpi_comm: MPI.Comm, host_of: Callable[[int], int] | None = None) -> list[int]:
    """Every rank's host label (a collective): the lowest world rank sharing its memory
    (COMM_TYPE_SHARED), or test-only `host_of(rank)` to make sub-groups of one host act
    as hosts."""
    if host_of is not None:
        mine = int(host_of(mpi_comm.Get_rank()))
    else:
        shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
        mine = shared.allreduce(mpi_comm.Get_rank(), op=MPI.MIN)
        shared.Free()
    return mpi_comm.allgather(mine)


class HierarchicalComm(Comm):
    """A Comm whose gathers and sums go in two levels (see the module), over hosts that
    hold as many ranks each (UnevenHierarchicalComm: any counts; two_level.py picks).
    strict: a split whose groups sit differently on the hosts is refused (collectives
    "hierarchical") rather than left flat ("auto")."""

    def __init__(self, mpi_comm: MPI.Comm, reduction=None, check_schedule: bool = False,
                 host_of: Callable[[int], int] | None = None, strict: bool = True,
                 **kw) -> None:  # fmt: skip
        super().__init__(mpi_comm, reduction, check_schedule, **kw)
        self.labels = host_labels(mpi_comm, host_of)  # each rank's host, by this Comm's rank
        self.world_of = placement(self.labels)  # (H, L); raises if unequal
        self.strict = strict
        self.order = gathered_order(self.world_of)
        h, l = (int(x[0]) for x in np.nonzero(self.world_of == self.rank))
        self.host = mpi_comm.Split(h, self.rank)  # this host's ranks, world order
        self.cross = mpi_comm.Split(l, h)  # local index l on every host, host order
        # An issued call's second level goes out when its first is in, which is sooner
        # on one rank than another; MPI pairs a communicator's collectives by the order
        # each rank issues them, so the second levels get communicators of their own,
        # apart from every call the program issues in its own order (the blocking
        # levels above, the issued first levels): (first level, second level).
        self.gather_levels = (self.cross.Dup(), self.host.Dup())
        self.sum_levels = (self.host.Dup(), self.cross.Dup())
        self.path += ", two-level (node-aware) gathers and sums"

    def free(self) -> None:
        """Free the level communicators (a collective; the world's Comm stays)."""
        for level in (self.host, self.cross, *self.gather_levels, *self.sum_levels):
            level.Free()

    def _gather_bytes(self, n: int, itemsize: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The gather's (sent, received) bytes a rank moves across hosts and inside its
        host, for blocks of n elements (the ledger's). Equal hosts: each way the same."""
        within, across = two_level_bytes(n * itemsize, self.world_of)
        return (across, across), (within, within)

    def _sum_bytes(self, n: int, itemsize: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The sum's (sent, received) inside the host and across: the gather's levels in
        the other order, each direction swapped."""
        across, within = self._gather_bytes(n, itemsize)
        return within[::-1], across[::-1]

    # ---- the all-gather: across hosts, then inside the host
    def _gather_levels(self, send, recv) -> tuple[np.ndarray, np.ndarray, Callable]:
        """The temporaries and the reorder of a two-level gather of send (n,) into recv."""
        hosts, local = self.world_of.shape
        n = send.size
        mine = self.arrays.temporary(hosts * n, send.dtype)  # block h: host h's rank at my l
        got = self.arrays.temporary(local * hosts * n, send.dtype)  # block l H + h
        rows = recv.reshape(self.size, n)

        def reorder() -> None:
            rows[self.order] = got.reshape(self.size, n)

        return mine, got, reorder

    def allgather(self, send, recv, kind: str = "allgather") -> None:
        """recv (W*n,) <- every rank's send (n,), in world-rank order, in two levels."""
        self._check(recv, send)
        self._agree("allgather", send.size, self.arrays.dtype_name(send))
        self._gather(send, recv, kind)

    def allgather_bytes(self, send, recv, kind: str = "allgather_int8") -> None:
        """recv (W*n,) uint8 <- every rank's send (n,) uint8 (qwZ's payload and scales),
        in world-rank order, in two levels."""
        check_bytes(send, recv, self.size)
        self.arrays.sync()
        self._agree("allgather", send.size, "uint8")
        self._gather(send, recv, kind)

    def _gather(self, send, recv, kind: str) -> None:
        """The two-level gather of checked buffers: across hosts, then inside the host."""
        mine, got, reorder = self._gather_levels(send, recv)
        across, within = self._gather_bytes(send.size, send.dtype.itemsize)
        xfer = lambda: self.cross.Allgather(words_of(send), words_of(mine))  # noqa: E731
        self.ledger.run(kind + CROSS_HOP, *across, xfer)

        def inside() -> None:
            self.host.Allgather(words_of(mine), words_of(got))
            reorder()

        self.ledger.run(kind + LOCAL_HOP, *within, inside)

    def _allgather_in_place(self, buf) -> None:
        n = buf.size // self.size
        mine = self.arrays.temporary(n, buf.dtype)
        mine[...] = buf[self.rank * n : (self.rank + 1) * n]
        self.allgather(mine, buf)

    def iallgather(self, send, recv, kind: str = "allgather", lane: str = "") -> ChainedFlight:
        """allgather, issued as one flight: the cross-host gather now, the host's gather
        when it is in (Comm.advance or the wait), the reorder at the end."""
        self._check(recv, send)
        self._agree("allgather", send.size, self.arrays.dtype_name(send))
        return self._issue_gather(send, recv, kind, lane)

    def iallgather_bytes(
        self, send, recv, kind: str = "allgather_int8", lane: str = ""
    ) -> ChainedFlight:
        """allgather_bytes, issued as one flight (as iallgather)."""
        check_bytes(send, recv, self.size)
        self.arrays.sync()
        self._agree("allgather", send.size, "uint8")
        return self._issue_gather(send, recv, kind, lane)

    def _issue_gather(self, send, recv, kind: str, lane: str) -> ChainedFlight:
        """The two-level gather of checked buffers, issued: the cross-host level now."""
        mine, got, reorder = self._gather_levels(send, recv)
        across, within = self._gather_bytes(send.size, send.dtype.itemsize)
        self.ledger.record_issued(kind + CROSS_HOP, *across)
        cross, host = self.gather_levels
        request = cross.Iallgather(words_of(send), words_of(mine))

        def second() -> MPI.Request:
            self.ledger.record_issued(kind + LOCAL_HOP, *within)
            return host.Iallgather(words_of(mine), words_of(got))

        args = {"sent_bytes": within[0] + across[0], "lane": lane}
        return ChainedFlight(self, kind + CROSS_HOP, request, second, reorder, (mine, got), args)

    def iallgather_in_place(self, buf, lane: str = "") -> ChainedFlight:
        self._check(buf)
        n = buf.size // self.size
        mine = buf[self.rank * n : (self.rank + 1) * n].copy()
        flight = self.iallgather(mine, buf, lane=lane)
        flight.keep += (mine,)
        return flight

    # ---- the reduce-scatter: inside the host, then across hosts
    def _staged(self, send) -> tuple[np.ndarray, np.ndarray]:
        """send's W destination blocks in the host level's order (block l H + h: world
        destination world_of[h, l]), in send's dtype, and the host partial's (H n,)
        temporary: float32, or send's 16 bits (the partial crosses rounded to them)."""
        n = send.size // self.size
        staged = self.arrays.temporary(send.size, send.dtype)
        np.take(send.reshape(self.size, n), self.order, axis=0, out=staged.reshape(self.size, n))
        return staged, self.arrays.temporary(self.world_of.shape[0] * n, send.dtype)

    def _reduce_scatter(self, send, recv) -> None:
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        staged, partial = self._staged(send)
        within, across = self._sum_bytes(recv.size, send.dtype.itemsize)
        if send.dtype != _F32:  # 16-bit words: each level an Alltoall and a rank-order sum
            arrays = self.arrays
            hop1 = lambda: sum_16bit_words(self.host, staged, partial, arrays)  # noqa: E731
            hop2 = lambda: sum_16bit_words(self.cross, partial, recv, arrays)  # noqa: E731
        else:
            total = recv if recv.dtype == _F32 else self.arrays.temporary(recv.size, _F32)
            red, arrays = self.reduction, self.arrays
            hop1 = lambda: red.reduce_scatter(self.host, staged, partial, arrays)  # noqa: E731

            def hop2() -> None:
                red.reduce_scatter(self.cross, partial, total, arrays)
                if total is not recv:
                    arrays.round_into(recv, total)

        self.ledger.run("reduce_scatter" + LOCAL_HOP, *within, hop1)
        self.ledger.run("reduce_scatter" + CROSS_HOP, *across, hop2)

    def ireduce_scatter_sum(self, send, recv, lane: str = ""):
        """reduce_scatter_sum, issued as one flight: the host level now, the cross level
        when its partials are summed (Comm.advance or the wait)."""
        self._check(send, recv, same_dtype=False)
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        staged, partial = self._staged(send)
        words = send.dtype != _F32
        total = recv if words or recv.dtype == _F32 else self.arrays.temporary(recv.size, _F32)
        within, across = self._sum_bytes(recv.size, send.dtype.itemsize)
        arrays = self.arrays
        isum = isum_16bit_words if words else self.reduction.ireduce_scatter  # both levels
        self.ledger.record_issued("reduce_scatter" + LOCAL_HOP, *within)
        host, cross = self.sum_levels
        request, summed, keep1 = isum(host, staged, partial, arrays)
        state: dict = {}

        def second() -> MPI.Request:
            if summed is not None:
                summed()  # the host's partials, in local rank order
            self.ledger.record_issued("reduce_scatter" + CROSS_HOP, *across)
            req, state["summed"], state["keep"] = isum(cross, partial, total, arrays)
            return req

        def finish() -> None:
            if state["summed"] is not None:
                state["summed"]()
            if total is not recv:
                arrays.round_into(recv, total)

        keep = (staged, partial, total) + tuple(keep1)
        args = {"sent_bytes": within[0] + across[0], "lane": lane}
        kind = "reduce_scatter" + LOCAL_HOP
        return ChainedFlight(self, kind, request, second, finish, keep, args)

    def allreduce_sum(self, buf) -> None:
        """Deterministic float32: the two-level reduce-scatter, then the two-level gather
        (the oracle's order); fast mode: MPI's Allreduce (MPICH's is node-aware already).
        16-bit: the Comm's reduce-scatter and gather of the words, both two-level here."""
        if buf.dtype != _F32 or not self.reduction.deterministic:
            return super().allreduce_sum(buf)
        self._check(buf)
        n = buf.size // self.size
        mine = self.arrays.temporary(n, _F32)
        self._reduce_scatter(buf, mine)
        buf[self.rank * n : (self.rank + 1) * n] = mine
        self._allgather_in_place(buf)
        return None
