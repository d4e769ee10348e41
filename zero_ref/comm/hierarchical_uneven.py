"""Node-aware collectives over hosts that hold different numbers of ranks (issue 33).

HierarchicalComm's cross level joins the ranks at one local index on every host, which
needs as many ranks on each host. Here each destination d has an owner on every host
(zero_ref/comm/hier_order.py owner_table: d itself on its own host, else the rank at d's
local index modulo that host's count), and the cross level is an Alltoallv over the whole
Comm in which only owners exchange:

  reduce-scatter  inside the host, an Alltoallv: each rank gets its host-mates' blocks of
                  the destinations it owns and adds them in world-rank order (float32, or
                  rounded to the 16 bits that cross); then across, an Alltoallv: each owner
                  sends its partial to its destination, which adds the hosts' partials in
                  host order and rounds once.
  all-gather      across, an Alltoallv: each rank sends its block to its owner on every
                  other host; then inside the host, an Allgatherv of what each rank holds
                  (its own block and the ones it owns), reordered to world order.

Each host receives every other host's data once, as with equal hosts; the sums are the
oracle's two-level order (two_level_sum over hosts_of), in both modes (the partials are
added here, not by MPI). With equal hosts the owners are HierarchicalComm's, and so are the
bytes each level moves. The ledger books each level under HierarchicalComm's kinds, with
what the rank sends and receives (they differ where the hosts do).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.comm.hier_order import hosts_of, owner_table
from zero_ref.comm.hierarchical import HierarchicalComm, host_labels
from zero_ref.comm.in_flight import ChainedFlight
from zero_ref.comm.reduction import CROSS_HOP, LOCAL_HOP, sum_words_into, words_of
from zero_ref.numerics.rank_order import sum_in_rank_order

_F32 = np.dtype(np.float32)


class UnevenHierarchicalComm(HierarchicalComm):
    """HierarchicalComm's two levels over hosts of any sizes (see the module)."""

    def __init__(self, mpi_comm: MPI.Comm, reduction=None, check_schedule: bool = False,
                 host_of: Callable[[int], int] | None = None, strict: bool = True,
                 **kw) -> None:  # fmt: skip
        Comm.__init__(self, mpi_comm, reduction, check_schedule, **kw)  # not the equal table
        self.labels = host_labels(mpi_comm, host_of)
        self.world_of = hosts_of(self.labels)  # each host's ranks; two_level_sum's order
        self.strict = strict
        owner = owner_table(self.world_of)
        me = next(h for h, ranks in enumerate(self.world_of) if self.rank in ranks)
        self.mates = self.world_of[me]  # this host's ranks, world order
        self.owned_by = [np.flatnonzero(owner[me] == m) for m in self.mates]  # destinations
        self.owned = self.owned_by[self.mates.index(self.rank)]
        self.order = np.concatenate(self.owned_by)  # block k of the host level: destination
        self.my_owners = owner[:, self.rank]  # who holds my blocks, one a host (host order)
        self.host = mpi_comm.Split(me, self.rank)
        self.cross = mpi_comm.Dup()  # the cross level: owners exchange, over every rank
        self.gather_levels = (mpi_comm.Dup(), self.host.Dup())  # (HierarchicalComm's why)
        self.sum_levels = (self.host.Dup(), mpi_comm.Dup())
        self.path += ", two-level (node-aware) gathers and sums, hosts of unequal sizes"

    def _gather_bytes(self, n: int, itemsize: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The gather's (sent, received) bytes a rank moves, across hosts (its block to
        each other host; the blocks it owns from them) and inside its host (its owned
        blocks to each host-mate; every block it does not own). The sum moves the same
        with sent and received swapped. Unequal hosts make the two directions differ."""
        own, mates, hosts = len(self.owned), len(self.mates), len(self.world_of)
        b = n * itemsize
        across = ((hosts - 1) * b, (own - 1) * b)
        within = (own * (mates - 1) * b, (self.size - own) * b)
        return across, within

    # ---- the levels' buffer specifications (counts and offsets in elements)
    def _host_sum_spec(self, n: int) -> tuple[list[int], list[int], int]:
        """The host level of the sum: to host-mate m the blocks it owns (staged in
        self.order), from each host-mate my owned blocks."""
        counts = [len(d) * n for d in self.owned_by]
        mine = len(self.owned) * n
        return counts, [mine] * len(self.mates), mine

    def _cross_spec(self, n: int, to_owners: bool) -> tuple[tuple, tuple]:
        """The cross level: (send counts, send offsets), (recv counts, recv offsets) over
        every rank. to_owners (the gather): my block to my owner on every other host, and
        from each rank whose blocks I own its block. Else (the sum): each owned partial to
        its destination, and from my owner on every host its partial, in host order."""
        zeros = [0] * self.size
        send_c, send_d, recv_c, recv_d = zeros[:], zeros[:], zeros[:], zeros[:]
        owned = [int(d) for d in self.owned]
        owners = [int(r) for r in self.my_owners]
        if to_owners:
            for r in owners:
                if r != self.rank:
                    send_c[r] = n
            for k, d in enumerate(x for x in owned if x != self.rank):
                recv_c[d], recv_d[d] = n, k * n
        else:
            for k, d in enumerate(owned):
                send_c[d], send_d[d] = n, k * n
            for h, r in enumerate(owners):
                recv_c[r], recv_d[r] = n, h * n
        return (send_c, send_d), (recv_c, recv_d)

    # ---- the all-gather: across hosts, then inside the host
    def _gather_buffers(self, send, recv):
        n = send.size
        remote = self.arrays.temporary(max(len(self.owned) - 1, 0) * n, send.dtype)
        held = self.arrays.temporary(len(self.owned) * n, send.dtype)  # my owned blocks
        got = self.arrays.temporary(self.size * n, send.dtype)  # the host's, in self.order
        rows = recv.reshape(self.size, n)
        (sc, sd), (rc, rd) = self._cross_spec(n, to_owners=True)
        spec = ([words_of(send), (sc, sd)], [words_of(remote), (rc, rd)])
        counts = [len(d) * n for d in self.owned_by]
        host_spec = (words_of(held), [words_of(got), (counts, _offsets(counts))])

        def fill_held() -> None:
            others = iter(remote.reshape(-1, n)) if remote.size else iter(())
            for k, d in enumerate(self.owned):
                held[k * n : (k + 1) * n] = send if d == self.rank else next(others)

        def reorder() -> None:
            rows[self.order] = got.reshape(self.size, n)

        return spec, host_spec, fill_held, reorder, (remote, held, got)

    def _gather(self, send, recv, kind: str) -> None:
        spec, host_spec, fill_held, reorder, _ = self._gather_buffers(send, recv)
        across, within = self._gather_bytes(send.size, send.dtype.itemsize)
        self.ledger.run(kind + CROSS_HOP, *across, lambda: self.cross.Alltoallv(*spec))

        def inside() -> None:
            fill_held()
            self.host.Allgatherv(*host_spec)
            reorder()

        self.ledger.run(kind + LOCAL_HOP, *within, inside)

    def _issue_gather(self, send, recv, kind: str, lane: str) -> ChainedFlight:
        spec, host_spec, fill_held, reorder, keep = self._gather_buffers(send, recv)
        across, within = self._gather_bytes(send.size, send.dtype.itemsize)
        cross, host = self.gather_levels
        self.ledger.record_issued(kind + CROSS_HOP, *across)
        request = cross.Ialltoallv(*spec)

        def second() -> MPI.Request:
            fill_held()
            self.ledger.record_issued(kind + LOCAL_HOP, *within)
            return host.Iallgatherv(*host_spec)

        args = {"sent_bytes": within[0] + across[0], "lane": lane}
        keep = (send, *keep)
        return ChainedFlight(self, kind + CROSS_HOP, request, second, reorder, keep, args)

    # ---- the reduce-scatter: inside the host, then across hosts
    def _sum_buffers(self, send, recv):
        """The buffers and specifications of both levels, and the two sums."""
        n = recv.size
        words = send.dtype != _F32
        staged = self.arrays.temporary(send.size, send.dtype)
        np.take(send.reshape(self.size, n), self.order, axis=0, out=staged.reshape(self.size, n))
        counts, recv_counts, mine = self._host_sum_spec(n)
        rows = self.arrays.temporary(len(self.mates) * mine, send.dtype)
        partial = self.arrays.temporary(mine, send.dtype)  # 16 bits: rounded as it crosses
        host_spec = ([words_of(staged), (counts, _offsets(counts))],
                     [words_of(rows), (recv_counts, _offsets(recv_counts))])  # fmt: skip
        hosts = len(self.world_of)
        partials = self.arrays.temporary(hosts * n, send.dtype)  # from each host, host order
        (sc, sd), (rc, rd) = self._cross_spec(n, to_owners=False)
        spec = ([words_of(partial), (sc, sd)], [words_of(partials), (rc, rd)])

        def sum_host() -> None:
            self._add(rows.reshape(len(self.mates), mine), partial, words)

        def sum_hosts() -> None:
            self._add(partials.reshape(hosts, n), recv, words)

        return host_spec, spec, sum_host, sum_hosts, (staged, rows, partial, partials)

    def _add(self, rows, out, words: bool) -> None:
        """out <- rows added in order in float32, rounded once to out's dtype (16-bit
        rows: reduction.sum_words_into, as the flat and equal-host sums add them)."""
        if words:
            sum_words_into(rows, out, self.arrays)
        elif out.dtype == _F32:
            sum_in_rank_order(rows, out)
        else:
            total = sum_in_rank_order(rows, self.arrays.temporary(out.size, _F32))
            self.arrays.round_into(out, total)

    def _reduce_scatter(self, send, recv) -> None:
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        host_spec, spec, sum_host, sum_hosts, _ = self._sum_buffers(send, recv)
        within, across = self._sum_bytes(recv.size, send.dtype.itemsize)

        def hop1() -> None:
            self.host.Alltoallv(*host_spec)
            sum_host()

        def hop2() -> None:
            self.cross.Alltoallv(*spec)
            sum_hosts()

        self.ledger.run("reduce_scatter" + LOCAL_HOP, *within, hop1)
        self.ledger.run("reduce_scatter" + CROSS_HOP, *across, hop2)

    def ireduce_scatter_sum(self, send, recv, lane: str = "") -> ChainedFlight:
        """reduce_scatter_sum, issued as one flight: the host level now, the cross level
        when the host's partials are summed (Comm.advance or the wait)."""
        self._check(send, recv, same_dtype=False)
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        host_spec, spec, sum_host, sum_hosts, keep = self._sum_buffers(send, recv)
        within, across = self._sum_bytes(recv.size, send.dtype.itemsize)
        host, cross = self.sum_levels
        self.ledger.record_issued("reduce_scatter" + LOCAL_HOP, *within)
        request = host.Ialltoallv(*host_spec)

        def second() -> MPI.Request:
            sum_host()
            self.ledger.record_issued("reduce_scatter" + CROSS_HOP, *across)
            return cross.Ialltoallv(*spec)

        args = {"sent_bytes": within[0] + across[0], "lane": lane}
        kind = "reduce_scatter" + LOCAL_HOP
        return ChainedFlight(self, kind, request, second, sum_hosts, keep, args)


def _offsets(counts: list[int]) -> list[int]:
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts)[:-1]))]
