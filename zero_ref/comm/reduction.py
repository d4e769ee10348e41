"""How a sum over ranks is made: the reduction policies, and 16-bit sums.

  MPIReduction      MPI's own MPI_SUM (Reduce_scatter_block, Allreduce): fast,
                    but the association of the sum is MPI's choice.
  OrderedReduction  an Alltoall of the blocks, then a local sum in rank order:
                    the same bytes on the wire as a ring reduce-scatter, and
                    the result bitwise equal to the oracle's rank-order sum.
  sum_16bit_words   16-bit values (no MPI type for bfloat16): an Alltoall of the
                    words, widened to float32, added in rank order, rounded once.
  sum_quantized     ZeRO++'s qgZ: each destination block quantized to int8 or int4
                    (block scales, zero_ref/numerics/quantize.py), an Alltoall of the bytes,
                    each received block dequantized, added in rank order, rounded once.
  first_hop, second_hop
                    qgZ in DeepSpeed's two hops (all_to_all_quant_reduce), over H
                    groups of L ranks: every block quantized and sent to the rank of
                    this group at its destination's place (an Alltoall in the group),
                    the L received rows of each of the H destinations dequantized and
                    added in local rank order in float32, that partial requantized and
                    sent to its destination (an Alltoall across the groups), the H
                    received partials dequantized, added in group order, rounded once.

Each sum also has an issued form (`ireduce_scatter`, `isum_16bit_words`) for the
non-blocking calls of zero_ref/comm/nonblocking.py: the same bytes moved, the same
additions in the same order, made when the bytes are in.

Each takes the `arrays` of its Comm (zero_ref/numerics/dtypes.py HostArrays, or the GPU
path's DeviceArrays): where its temporaries live and how 16 bits are converted.
zero_ref/comm/collectives.py's Comm (and nonblocking.py's calls) the only callers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from zero_ref.numerics.dtypes import HOST, HostArrays
from zero_ref.numerics.quantize import pack_rows, unpack_sum
from zero_ref.numerics.rank_order import sum_in_rank_order

# An issued sum: the MPI request, what completes it once the bytes are in (None: MPI
# wrote the result), and the temporaries MPI uses until then (zero_ref/comm/in_flight.py).
Issued = tuple[MPI.Request, Callable[[], None] | None, tuple]
_F32 = np.dtype(np.float32)  # a dtype compares faster than the scalar type np.float32


class MPIReduction:
    """Sums with MPI_SUM: fastest, association chosen by the MPI library."""

    deterministic = False

    def reduce_scatter(self, mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> None:
        mpi.Reduce_scatter_block(send, recv, op=MPI.SUM)

    def allreduce(self, mpi: MPI.Comm, buf, arrays: HostArrays = HOST) -> None:
        mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def ireduce_scatter(self, mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> Issued:
        """reduce_scatter, issued: MPI writes the sum into recv when it completes."""
        return mpi.Ireduce_scatter_block(send, recv, op=MPI.SUM), None, ()


class OrderedReduction:
    """Sums in rank order: Alltoall the blocks, then add them up left to right."""

    deterministic = True

    def reduce_scatter(self, mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> None:
        rows = _rows(arrays, mpi.Get_size(), recv.size, np.float32)  # row r: rank r's block
        mpi.Alltoall(send, rows)
        sum_in_rank_order(rows, recv)

    def ireduce_scatter(self, mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> Issued:
        """reduce_scatter, issued: the Alltoall now, the rank-order sum on completion
        (the same sum, whenever the rows arrive)."""
        rows = _rows(arrays, mpi.Get_size(), recv.size, np.float32)
        return mpi.Ialltoall(send, rows), lambda: sum_in_rank_order(rows, recv), (rows,)

    def allreduce(self, mpi: MPI.Comm, buf, arrays: HostArrays = HOST) -> None:
        mine = arrays.temporary(buf.size // mpi.Get_size(), np.float32)
        self.reduce_scatter(mpi, buf, mine, arrays)
        arrays.sync()
        mpi.Allgather(mine, buf)


def _rows(arrays: HostArrays, world: int, n: int, dtype) -> np.ndarray:
    """A (world, n) temporary: row r receives rank r's block."""
    return arrays.temporary(world * n, dtype).reshape(world, n)


def sum_16bit_words(mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> None:
    """recv = this rank's block of the sum over ranks of a 16-bit send: an Alltoall of
    the 16-bit words, each row widened to float32 (exact), added in rank order, and
    rounded once to recv's dtype. The same result in fast and deterministic mode."""
    words = _rows(arrays, mpi.Get_size(), recv.size, np.uint16)  # row r: rank r's block for me
    mpi.Alltoall(words_of(send), words)
    sum_words_into(words.view(send.dtype), recv, arrays)


def isum_16bit_words(mpi: MPI.Comm, send, recv, arrays: HostArrays = HOST) -> Issued:
    """sum_16bit_words, issued: the Alltoall of the words now; widening, the rank-order
    sum and the one rounding when it completes."""
    words = _rows(arrays, mpi.Get_size(), recv.size, np.uint16)  # row r: rank r's block
    request = mpi.Ialltoall(words_of(send), words)
    dtype = send.dtype
    return request, lambda: sum_words_into(words.view(dtype), recv, arrays), (words,)


def sum_words_into(rows, recv, arrays: HostArrays = HOST) -> None:
    """recv <- the (W, n) 16-bit rows widened, added in rank order in float32, rounded
    once to recv's dtype: one pass into a float32 recv or one of the rows' own dtype
    (the common cases), a float32 temporary between them otherwise."""
    if recv.dtype == _F32:
        arrays.sum_widened_rows(rows, recv)
    elif recv.dtype == rows.dtype:
        arrays.sum_widened_rows_rounded(rows, recv)
    else:
        total = arrays.sum_widened_rows(rows, arrays.temporary(recv.size, np.float32))
        arrays.round_into(recv, total)


def words_of(buf: np.ndarray) -> np.ndarray:
    """What MPI is handed: float32 as it is, 16-bit floats as uint16 words (mpi4py has
    no bfloat16 type, and only moving them, never adding, needs no float type)."""
    return buf.view(np.uint16) if buf.dtype.itemsize == 2 else buf


class QuantizedBuffers(NamedTuple):
    """qgZ's byte buffers for one reduce-scatter: `send` and `got`, two (W, P) uint8 (row d
    of send goes to rank d, row r of got came from rank r), P the payload of a row in
    `bits`-bit values and float32 block scales (zero_ref/numerics/quantize.py)."""

    send: np.ndarray
    got: np.ndarray
    bits: int = 8


def quantize_staging(staging, starts: np.ndarray, send: np.ndarray, arrays: HostArrays,
                     bits: int = 8, order: np.ndarray | None = None) -> None:  # fmt: skip
    """send (W, P) uint8 <- each row of staging (W, n) (float32 or 16-bit, widened
    exactly) quantized in `bits` in the blocks at `starts` (zero_ref/layout/grad_blocks.py);
    send row k is staging row order[k] (default: row k)."""
    world, n = send.shape[0], staging.size // send.shape[0]
    rows = staging.reshape(world, n)
    wide = None if rows.dtype == np.float32 else arrays.temporary(n, np.float32)
    for k in range(world):
        d = k if order is None else order[k]
        row = rows[d] if wide is None else arrays.widen_into(wide, rows[d])
        pack_rows(row.reshape(1, n), starts, send[k : k + 1], bits)


def dequantize_sum(got: np.ndarray, starts: np.ndarray, recv, arrays: HostArrays,
                   bits: int = 8) -> None:  # fmt: skip
    """recv (n,) <- the W received rows of got (W, P) dequantized, added in rank order in
    float32, rounded once into recv's dtype."""
    n = recv.size
    total = recv if recv.dtype == np.float32 else arrays.temporary(n, np.float32)
    unpack_sum(got, starts, total, arrays.temporary(n, np.float32), bits)
    if total is not recv:
        arrays.round_into(recv, total)


def sum_quantized(
    mpi: MPI.Comm, staging, recv, starts, packed: QuantizedBuffers, arrays=HOST
) -> None:
    """recv = this rank's block of the sum over ranks of staging (W*n,), through int8 or
    int4 (packed.bits): every rank quantizes its W destination blocks into packed.send (W, P)
    uint8, an Alltoall moves them into packed.got (W, P) (row r: rank r's block for me), and
    each row is dequantized and added in rank order. Deterministic in both modes (the
    order is the rank order)."""
    quantize_staging(staging, starts, packed.send, arrays, packed.bits)
    mpi.Alltoall(packed.send, packed.got)
    dequantize_sum(packed.got, starts, recv, arrays, packed.bits)


def isum_quantized(
    mpi: MPI.Comm, staging, recv, starts, packed: QuantizedBuffers, arrays=HOST
) -> Issued:
    """sum_quantized, issued: quantized and the Alltoall issued now, dequantized and summed
    when it completes."""
    quantize_staging(staging, starts, packed.send, arrays, packed.bits)
    request = mpi.Ialltoall(packed.send, packed.got)
    finish = lambda: dequantize_sum(packed.got, starts, recv, arrays, packed.bits)  # noqa: E731
    return request, finish, (packed.send, packed.got)


LOCAL_HOP, CROSS_HOP = "_local", "_cross"  # the ledger's suffixes of qgZ's two hops


def hop_bytes(row_bytes: int, hops) -> tuple[int, int]:
    """Bytes a rank sends in qgZ's two hops (each way), of rows of row_bytes: the first
    (L-1) x H rows inside its group, the second H-1 rows, one to each other group."""
    local, groups = hops.local.size, hops.cross.size
    return (local - 1) * groups * row_bytes, (groups - 1) * row_bytes


def first_hop_order(groups: int, local: int) -> np.ndarray:
    """The staging rows in the first hop's send order: world rank d = h L + l goes to
    local rank l, so send block l is the rows h L + l for h = 0..H-1 (H rows a block)."""
    return np.arange(groups * local).reshape(groups, local).T.reshape(-1)


def first_hop(local: MPI.Comm, groups: int, staging, starts, packed: QuantizedBuffers,
              arrays=HOST) -> None:  # fmt: skip
    """qgZ's first hop inside a group of L ranks (of H groups): every destination row of
    staging (W*n,) quantized in first_hop_order into packed.send, an Alltoall over `local`
    into packed.got (row l H + h: local rank l's block for group h's rank at my place)."""
    _quantize_first_hop(local.Get_size(), groups, staging, starts, packed, arrays)
    local.Alltoall(packed.send, packed.got)


def ifirst_hop(local: MPI.Comm, groups: int, staging, starts, packed: QuantizedBuffers,
               arrays=HOST) -> MPI.Request:  # fmt: skip
    """first_hop, issued: quantized now, its Alltoall's request returned."""
    _quantize_first_hop(local.Get_size(), groups, staging, starts, packed, arrays)
    return local.Ialltoall(packed.send, packed.got)


def _quantize_first_hop(local: int, groups: int, staging, starts, packed, arrays) -> None:
    """packed.send <- staging's W destination rows quantized, in first_hop_order."""
    order = first_hop_order(groups, local)
    quantize_staging(staging, starts, packed.send, arrays, packed.bits, order)


def second_hop(cross: MPI.Comm, recv, starts, packed: QuantizedBuffers, arrays=HOST) -> None:
    """qgZ's second hop across the H groups, after first_hop: for each group h the L rows
    received for its rank at my place, dequantized and added in local rank order in
    float32 (a partial sum, not rounded), requantized into send row h; an Alltoall over
    `cross` (this rank's place in every group, in group order) into got's first H rows;
    recv <- those partials dequantized, added in group order, rounded once."""
    groups = cross.Get_size()
    _requantize_partials(groups, starts, recv.size, packed, arrays)
    cross.Alltoall(packed.send[:groups], packed.got[:groups])
    finish_second_hop(groups, starts, recv, packed, arrays)


def isecond_hop(
    cross: MPI.Comm, starts, n: int, packed: QuantizedBuffers, arrays=HOST
) -> MPI.Request:
    """second_hop, issued once the first hop's bytes are in: the partials of rows of n
    requantized now, the Alltoall's request returned (finish_second_hop completes it)."""
    groups = cross.Get_size()
    _requantize_partials(groups, starts, n, packed, arrays)
    return cross.Ialltoall(packed.send[:groups], packed.got[:groups])


def finish_second_hop(groups: int, starts, recv, packed: QuantizedBuffers, arrays=HOST) -> None:
    """recv <- the H received partials (got's first H rows) dequantized, added in group
    order in float32, rounded once."""
    dequantize_sum(packed.got[:groups], starts, recv, arrays, packed.bits)


def _requantize_partials(groups: int, starts, n: int, packed: QuantizedBuffers, arrays) -> None:
    """send's first H rows <- for each group h, the L rows got holds for its rank at my
    place dequantized, added in local rank order in float32 and quantized again (hop 1's
    bytes are all read before any is overwritten)."""
    by_source = packed.got.reshape(packed.got.shape[0] // groups, groups, -1)  # (L, H, P)
    partials = arrays.temporary(groups * n, np.float32).reshape(groups, n)
    scratch = arrays.temporary(n, np.float32)
    for h in range(groups):
        unpack_sum(by_source[:, h], starts, partials[h], scratch, packed.bits)
    pack_rows(partials, starts, packed.send[:groups], packed.bits)
