"""The Comm's non-blocking collectives: issued now, waited for later (--overlap-comm).

The same three collectives ZeRO's stages run blocking (zero_ref/comm/collectives.py),
as MPI's non-blocking calls: `ireduce_scatter_sum` (a gradient bucket, Sec. 5.2),
`iallgather` (a stage-3 unit's parameters, Sec. 5.3) and `iallgather_in_place`
(stages 1-2's updated parameters). Each passes the checks the blocking call does
(contiguous float32/float16/bfloat16 buffers, their dtypes and element counts;
with check_schedule, the ranks' agreement on the call, at issue), counts its bytes
in the ledger in the step that issues it, and returns an InFlight
(zero_ref/comm/in_flight.py) whose wait() makes the result exactly the blocking
call's: MPI's sum, or in deterministic mode the rows added in rank order once they
are all in, and 16-bit sums widened, added in rank order and rounded once.

The caller must not touch the buffers it handed over until wait() returns (the
schedule, zero_ref/engine/collective_schedule.py, and the stages' double-buffered
staging keep to it; DeepSpeed #5523/#5606 was a staging buffer refilled while its
reduction was in flight).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from zero_ref.comm.in_flight import ChainedFlight, InFlight
from zero_ref.comm.reduction import (
    CROSS_HOP,
    LOCAL_HOP,
    finish_second_hop,
    hop_bytes,
    ifirst_hop,
    isecond_hop,
    isum_16bit_words,
    isum_quantized,
    words_of,
)
from zero_ref.numerics.dtypes import DTYPES
from zero_ref.numerics.quantize import segment_payload_bytes


def check_bytes(send: np.ndarray, recv: np.ndarray, world: int) -> None:
    """A bytes gather's buffers: contiguous uint8, recv holding W * send.size bytes."""
    for buf in (send, recv):
        if buf.dtype != np.uint8 or not buf.flags.c_contiguous:
            layout = "contiguous" if buf.flags.c_contiguous else "not contiguous"
            raise ValueError(
                f"a bytes gather needs contiguous uint8 buffers; got {buf.dtype}, {layout}"
            )
    if send.size * world != recv.size:
        raise ValueError(f"block of {send.size} bytes x {world} ranks != {recv.size}")


def check_quantized(send, recv, starts: np.ndarray, packed, world: int) -> None:
    """A quantized reduce-scatter's byte buffers: two contiguous (W, P) uint8, P the
    payload of n values in packed.bits (8 or 4) and 4 bytes a block."""
    shape = (world, segment_payload_bytes(recv.size, len(starts), packed.bits))
    for buf in (packed.send, packed.got):
        if buf.dtype != np.uint8 or not buf.flags.c_contiguous or buf.shape != shape:
            raise ValueError(
                f"a quantized reduce-scatter needs contiguous uint8 buffers of shape {shape}; "
                f"got {buf.dtype} {buf.shape}"
            )
    if recv.size and (len(starts) == 0 or starts[0] != 0 or starts[-1] >= recv.size):
        raise ValueError(f"block starts must begin at 0 and lie in [0, {recv.size})")


class NonBlockingCollectives:
    """Mixed into Comm: its checks, reduction policy, arrays and ledger are the Comm's."""

    def ireduce_scatter_sum(self, send: np.ndarray, recv: np.ndarray, lane: str = "") -> InFlight:
        """reduce_scatter_sum, issued. `lane` names the caller's buffer pair (a staged
        device Comm keeps host buffers per lane, apart for calls in flight together;
        a host Comm needs none)."""
        t0 = time.perf_counter()
        self._check(send, recv, same_dtype=False)
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        if send.dtype != DTYPES["fp32"]:
            request, finish, keep = isum_16bit_words(self.mpi, send, recv, self.arrays)
        elif recv.dtype != DTYPES["fp32"]:
            request, finish, keep = self._ireduce_scatter_rounded(send, recv)
        else:
            request, finish, keep = self.reduction.ireduce_scatter(
                self.mpi, send, recv, self.arrays
            )
        itemsize = send.dtype.itemsize
        return self._issued("reduce_scatter", recv.size, itemsize, request, finish, keep, t0, lane)

    def ireduce_scatter_quantized(
        self, send: np.ndarray, recv: np.ndarray, starts: np.ndarray, packed, lane: str = ""
    ) -> InFlight:
        """reduce_scatter_quantized, issued: quantized and its Alltoall issued now, the
        received blocks dequantized and added in rank order when they are in."""
        t0 = time.perf_counter()
        self._check(send, recv, same_dtype=False)
        check_quantized(send, recv, starts, packed, self.size)
        self.arrays.sync()
        kind = f"reduce_scatter_int{packed.bits}"
        self._agree(kind, recv.size, f"blocks {len(starts)}")
        request, finish, keep = isum_quantized(self.mpi, send, recv, starts, packed, self.arrays)
        return self._issued(kind, packed.send.shape[1], 1, request, finish, keep, t0, lane)

    def ireduce_scatter_quantized_two_hops(
        self, send: np.ndarray, recv: np.ndarray, starts: np.ndarray, packed, hops, lane: str = ""
    ) -> ChainedFlight:
        """reduce_scatter_quantized_two_hops, issued: quantized and the first hop's
        Alltoall issued now; the partial sums and the second hop's Alltoall issued when
        the first is in (`advance`, at a unit boundary, or the wait); the final sum when
        the second is in."""
        t0 = time.perf_counter()
        self._check(send, recv, same_dtype=False)
        check_quantized(send, recv, starts, packed, self.size)
        kind = f"reduce_scatter_int{packed.bits}"
        self._agree(kind + LOCAL_HOP, recv.size, f"blocks {len(starts)}")
        within, across = hop_bytes(packed.send.shape[1], hops)
        request = ifirst_hop(hops.local.mpi, hops.cross.size, send, starts, packed, self.arrays)

        def second() -> MPI.Request:
            self.ledger.record_issued(kind + CROSS_HOP, across, across)
            return isecond_hop(hops.cross.mpi, starts, recv.size, packed, self.arrays)

        finish = lambda: finish_second_hop(hops.cross.size, starts, recv, packed, self.arrays)  # noqa: E731
        self.ledger.record_issued(kind + LOCAL_HOP, within, within)
        keep, args = (packed.send, packed.got), {"sent_bytes": within + across, "lane": lane}
        flight = ChainedFlight(self, kind + LOCAL_HOP, request, second, finish, keep, args)
        flight.issue_seconds = time.perf_counter() - t0
        return flight

    def advance(self) -> None:
        """A unit boundary: issue the second call of every chained collective whose first
        is in, oldest first, stopping at the first that is not (so every rank issues
        the second calls in the same order)."""
        for flight in list(self.in_flight):
            if isinstance(flight, ChainedFlight) and not flight.advance():
                return

    def _ireduce_scatter_rounded(self, send: np.ndarray, recv: np.ndarray):
        """A float32 sum by the policy into a temporary, rounded once into recv after."""
        total = self.arrays.temporary(recv.size, np.float32)
        request, summed, keep = self.reduction.ireduce_scatter(self.mpi, send, total, self.arrays)

        def finish() -> None:
            if summed is not None:
                summed()
            self.arrays.round_into(recv, total)

        return request, finish, keep + (total,)

    def iallgather(
        self, send: np.ndarray, recv: np.ndarray, kind: str = "allgather", lane: str = ""
    ) -> InFlight:
        """allgather, issued: recv (W*n,) <- every rank's send (n,), in rank order."""
        t0 = time.perf_counter()
        self._check(recv, send)
        self._agree("allgather", send.size, self.arrays.dtype_name(send))
        request = self.mpi.Iallgather(words_of(send), words_of(recv))
        return self._issued(kind, send.size, send.dtype.itemsize, request, None, (), t0, lane)

    def iallgather_bytes(
        self, send: np.ndarray, recv: np.ndarray, kind: str = "allgather_int8", lane: str = ""
    ) -> InFlight:
        """allgather_bytes, issued: recv (W*n,) uint8 <- every rank's send (n,) uint8."""
        t0 = time.perf_counter()
        check_bytes(send, recv, self.size)
        self.arrays.sync()
        self._agree("allgather", send.size, "uint8")
        request = self.mpi.Iallgather(send, recv)
        return self._issued(kind, send.size, 1, request, None, (), t0, lane)

    def iallgather_in_place(self, buf: np.ndarray, lane: str = "") -> InFlight:
        """allgather_in_place, issued: block r of buf <- rank r's block r."""
        t0 = time.perf_counter()
        self._check(buf)
        n = buf.size // self.size
        self._agree("allgather", n, self.arrays.dtype_name(buf))
        request = self.mpi.Iallgather(MPI.IN_PLACE, words_of(buf))
        return self._issued("allgather", n, buf.dtype.itemsize, request, None, (), t0, lane)

    def _issued(self, kind, n_block, itemsize, request, finish, keep, t0, lane) -> InFlight:
        """The ledger's call and bytes now (the blocking call's: W-1 blocks each way),
        and the InFlight that finishes it, named by its lane ("unit 3": stages 1-2's
        updated gather of unit 3), so the trace says which call each wait was for."""
        nbytes = self._block_bytes(n_block, itemsize)
        self.ledger.record_issued(kind, nbytes, nbytes)
        flight = InFlight(self, kind, request, finish, keep, {"sent_bytes": nbytes, "lane": lane})
        flight.issue_seconds = time.perf_counter() - t0
        return flight

    def settle(self) -> None:
        """Wait for every collective still in flight, oldest first."""
        while self.in_flight:
            self.in_flight[0].wait()
