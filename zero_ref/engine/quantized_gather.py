"""qwZ's forward all-gather (ZeRO++, Wang et al. 2023, Sec. 3.1): each rank's slice of a
unit's parameters sent as int8 with one float32 scale per block, and every rank
dequantizing all the slices into the gathered-unit buffer.

One uint8 buffer per rank travels: its slice's int8 values (n bytes), then its blocks'
scales (4 n / block bytes), gathered with one Allgather (Iallgather with
--overlap-comm) of bytes. The layout pads every unit to a multiple of W * block
(zero_ref/layout/flat.py's align), so a slice is whole blocks and block b of a unit is
its elements [b*block, (b+1)*block) at every world size: the dequantized values do not
depend on W. 16-bit parameters are widened (exactly) before quantizing, and the
float32 dequantized values rounded once into the parameters' dtype.

Each lane (a gathered-unit buffer that may have a gather in flight) has its own send
and receive buffers, as wide as the widest unit's; they and the float32 scratch the
16-bit paths widen and dequantize through are in the memory ledger ("buffers").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.numerics.dtypes import round_into, widen_into
from zero_ref.numerics.quantize import SCALE_BYTES, dequantize, payload_bytes, quantize


class QuantizedPending:
    """A quantized gather between issue and use: wait() for the bytes, then dequantize."""

    def __init__(self, schedule, pending, unpack: Callable[[], None]) -> None:
        self.schedule, self.pending, self.unpack = schedule, pending, unpack

    def wait(self) -> None:
        self.schedule.wait(self.pending)
        self.unpack()


class QuantizedGather:
    """The per-lane byte buffers of qwZ's forward gathers, and packing / unpacking."""

    def __init__(self, place, lanes: int, widest_shard: int, world: int, block: int) -> None:
        per_rank = payload_bytes(widest_shard, block)
        self.world, self.block = world, block
        self.sends = [
            place.empty("buffers", f"qwZ send {k}", per_rank, np.uint8) for k in range(lanes)
        ]
        self.recvs = [
            place.empty("buffers", f"qwZ recv {k}", world * per_rank, np.uint8)
            for k in range(lanes)
        ]
        self.scratch = place.empty("buffers", "qwZ float32 scratch", widest_shard, np.float32)

    def issue(self, schedule, shard: np.ndarray, out: np.ndarray, lane: int, what: str):
        """Quantize this rank's slice `shard` (n,) and issue out (W n,) <- every rank's,
        dequantized; the result is valid after the returned pending's wait()."""
        n = shard.size
        per_rank = payload_bytes(n, self.block)
        send, recv = self.sends[lane][:per_rank], self.recvs[lane][: self.world * per_rank]
        self._pack(shard, send, what)
        pending = schedule.gather_unit_bytes(send, recv, lane)
        return QuantizedPending(schedule, pending, lambda: self._unpack(recv, out, n))

    def _pack(self, shard: np.ndarray, send: np.ndarray, what: str) -> None:
        """send <- shard's int8 values, then its scales' bytes."""
        n = shard.size
        x = shard if shard.dtype == np.float32 else widen_into(self.scratch[:n], shard)
        scales = np.empty(n // self.block, np.float32)  # 1/block of the slice: a temporary
        quantize(x, self.block, send[:n].view(np.int8), scales, what)
        send[n:] = scales.view(np.uint8)

    def _unpack(self, recv: np.ndarray, out: np.ndarray, n: int) -> None:
        """out's slice r <- rank r's int8 values times their scales, rounded once into
        out's dtype (16-bit parameters) through the float32 scratch."""
        per_rank = n + SCALE_BYTES * (n // self.block)
        for r in range(self.world):
            chunk = recv[r * per_rank : (r + 1) * per_rank]
            scales = chunk[n:].copy().view(np.float32)  # copied: an aligned float32 array
            dst = out[r * n : (r + 1) * n]
            if out.dtype == np.float32:
                dequantize(chunk[:n].view(np.int8), scales, self.block, dst)
            else:
                dequantize(chunk[:n].view(np.int8), scales, self.block, self.scratch[:n])
                round_into(dst, self.scratch[:n])
