"""Collectives over flat buffers; with reduction.py the only mpi4py users below train.py.

Every hot-path call uses mpi4py's uppercase buffer API (no pickling). Each call
is recorded in a CommLedger (bytes this rank really exchanges, and seconds).

Sums across ranks come from a *reduction policy* (zero_ref/comm/reduction.py):
  MPIReduction      MPI's own MPI_SUM (Reduce_scatter_block, Allreduce): fast,
                    but the association of the sum is MPI's choice.
  OrderedReduction  an Alltoall of the blocks, then a local sum in rank order:
                    the same bytes on the wire as a ring reduce-scatter, and
                    the result bitwise equal to the oracle's rank-order sum.
ZeroConfig.deterministic is the one switch: `comm_for(mpi_comm, cfg)` (zero_ref/comm/
choose.py) is the one place that turns it into a policy, and an engine refuses a Comm
whose policy disagrees with its config (the clipping norm follows the same switch).

16-bit buffers (mixed precision, zero_ref/engine/precision.py) travel as 16-bit
words: MPI has no bfloat16 type, and MPICH's float16 MPI_SUM rounds every partial
sum to 16 bits, in an order of its choosing, and is slower than the alternative
(scripts/bench/bench_half_reduce.py). So a sum of 16-bit values is always an Alltoall of
the words, then each rank widens its rows to float32, adds them in rank order and
rounds once: half the bytes of float32 on the wire, and deterministic in either
mode. A sum may land in a buffer of another dtype (16-bit gradients summed into
float32 ones): it is rounded once, to the receiving buffer's dtype.

With check_schedule on (a debug mode), ranks first agree on what each collective
is -- operation, count, dtype, where in the step, step -- so a rank that skips
or reorders a collective raises ScheduleMismatchError instead of hanging (see
zero_ref/comm/signatures.py). That exchange is not counted in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from zero_ref.comm import signatures
from zero_ref.comm.ledger import CommLedger
from zero_ref.comm.nonblocking import NonBlockingCollectives, check_bytes, check_quantized
from zero_ref.comm.progress import ProgressPolicy, progress_for
from zero_ref.comm.reduction import (
    CROSS_HOP,
    LOCAL_HOP,
    MPIReduction,
    OrderedReduction,
    QuantizedBuffers,
    first_hop,
    hop_bytes,
    second_hop,
    sum_16bit_words,
    sum_quantized,
    words_of,
)
from zero_ref.numerics.dtypes import HOST, HostArrays

FLOAT_DTYPES = ("float32", "float16", "bfloat16")  # what collectives accept
_F32 = np.dtype(np.float32)  # a dtype compares faster than the scalar type np.float32


class Comm(NonBlockingCollectives):
    """A communicator, its reduction policy and its ledger, passed explicitly; its
    non-blocking calls (ireduce_scatter_sum, iallgather, iallgather_in_place) are
    zero_ref/comm/nonblocking.py's."""

    def __init__(
        self,
        mpi_comm: MPI.Comm,
        reduction: MPIReduction | OrderedReduction | None = None,
        check_schedule: bool = False,
        arrays: HostArrays = HOST,
        progress: ProgressPolicy | None = None,
    ) -> None:
        """arrays: what the buffers are (their temporaries, roundings and the wait before
        MPI touches them): HostArrays, or DeviceArrays for device buffers handed to a
        CUDA-aware MPI (zero_ref/comm/choose.py's device_comm). progress: what drives
        the non-blocking calls between issue and wait (zero_ref/comm/progress.py;
        default "none": MPI's own calls only)."""
        self.mpi = mpi_comm
        self.arrays = arrays
        self.path = "MPI: host buffers"  # how buffers reach MPI, for the run's first line
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.ledger = CommLedger()
        self.reduction = MPIReduction() if reduction is None else reduction
        self.check_schedule = check_schedule
        self.step: int | None = None  # labels for the collectives that follow
        self.where = ""
        self.progress = progress_for("none", mpi_comm) if progress is None else progress
        self.in_flight: list = []  # InFlight calls issued and not yet waited for

    @property
    def host_comm(self) -> Comm:
        """The Comm whose buffers are in RAM: this one (a StagedComm, which forwards what
        it does not define, answers with the host Comm it stages through)."""
        return self

    def group_comm(self, split: MPI.Comm) -> Comm:
        """The Comm of a sub-group split from this one (hpZ's partition group, hybrid
        sharding's groups: zero_ref/comm/groups.py): flat, with this Comm's reduction
        policy, schedule checking and arrays (zero_ref/comm/two_level.py group_comm makes
        a two-level Comm's groups two-level where they span hosts)."""
        return Comm(split, self.reduction, self.check_schedule, self.arrays)

    def track_memory(self, memory) -> None:
        """Register buffers this Comm keeps between calls with an engine's memory ledger:
        a host Comm keeps none (the staged Comm of --device gpu does)."""

    # ---- collective-schedule checking (debug)
    def set_context(self, step: int | None = None, where: str | None = None) -> None:
        """Label the collectives that follow: the step, and where in it ("forward hidden")."""
        if step is not None:
            self.step = step
        if where is not None:
            self.where = self.ledger.where = where

    def _agree(self, op: str, count: int, dtype: str = "float32") -> None:
        """With check_schedule: all-gather every rank's signature; raise on a mismatch."""
        if not self.check_schedule:
            return
        mine = signatures.signature(op, count, dtype, self.where, self.step)
        everyone = np.empty((self.size, mine.size), np.uint8)  # row r: rank r's signature
        self.mpi.Allgather(mine, everyone)
        signatures.check_agreement(everyone)

    def _check(self, full, block=None, same_dtype: bool = True) -> None:
        """_check_blocks with the buffers' element names; then wait for a device's
        writes to them (a CUDA-aware MPI reads device memory behind CUDA's back)."""
        names = [self.arrays.dtype_name(b) for b in (full, block) if b is not None]
        _check_blocks(full, block, self.size, same_dtype, names)
        self.arrays.sync()

    # ---- bytes each rank exchanges, from the buffers of the call
    def _block_bytes(self, n_block: int, itemsize: int = 4) -> int:
        """(W-1) blocks of n_block elements of `itemsize` bytes."""
        return (self.size - 1) * n_block * itemsize

    def _timed(
        self, kind: str, n_block: int, factor: int, itemsize: int, fn: Callable, *args
    ) -> None:
        """fn(*args), timed and booked in the ledger as factor x (W-1) blocks each way."""
        nbytes = factor * self._block_bytes(n_block, itemsize)
        self.ledger.run(kind, nbytes, nbytes, fn, *args)

    # ---- sums across ranks
    def reduce_scatter_sum(self, send: np.ndarray, recv: np.ndarray) -> None:
        """recv (n,) = sum over ranks of their send[rank*n : (rank+1)*n]; send is (W*n,).

        float32 both: the reduction policy's sum. A 16-bit send: its words, summed in
        float32 in rank order (sum_16bit_words). A 16-bit recv: rounded once into it."""
        self._check(send, recv, same_dtype=False)
        self._reduce_scatter(send, recv)

    def _reduce_scatter(self, send: np.ndarray, recv: np.ndarray) -> None:
        """reduce_scatter_sum on checked buffers."""
        self._agree("reduce_scatter", recv.size, self.arrays.dtype_name(send))
        if send.dtype != _F32:
            fn, args = sum_16bit_words, (self.mpi, send, recv, self.arrays)
        elif recv.dtype != _F32:
            fn, args = self._reduce_scatter_rounded, (send, recv)
        else:
            fn, args = self.reduction.reduce_scatter, (self.mpi, send, recv, self.arrays)
        self._timed("reduce_scatter", recv.size, 1, send.dtype.itemsize, fn, *args)

    def reduce_scatter_quantized(
        self, send: np.ndarray, recv: np.ndarray, starts: np.ndarray, packed: QuantizedBuffers
    ) -> None:
        """recv (n,) = sum over ranks of their send block for this rank, through int8 or
        int4 (ZeRO++'s qgZ, packed.bits): send (W*n,) float32 or 16-bit, quantized in the
        blocks at `starts` (zero_ref/layout/grad_blocks.py); packed: the send and received
        bytes, two (W, P) uint8 buffers, P = ceil(n bits / 8) + 4 * len(starts). The ledger
        counts the bytes moved, as reduce_scatter_int8 or reduce_scatter_int4."""
        self._check(send, recv, same_dtype=False)
        check_quantized(send, recv, starts, packed, self.size)
        self.arrays.sync()
        kind = f"reduce_scatter_int{packed.bits}"
        self._agree(kind, recv.size, f"blocks {len(starts)}")
        args = (self.mpi, send, recv, starts, packed, self.arrays)
        self._timed(kind, packed.send.shape[1], 1, 1, sum_quantized, *args)

    def reduce_scatter_quantized_two_hops(
        self, send: np.ndarray, recv: np.ndarray, starts: np.ndarray, packed: QuantizedBuffers, hops
    ) -> None:
        """reduce_scatter_quantized in DeepSpeed's two hops (reduction.py first_hop and
        second_hop) over `hops` (zero_ref/comm/groups.py QgzHops: H groups of L ranks),
        with the same (W, P) buffers. The ledger books the first hop as
        reduce_scatter_int{bits}_local ((L-1) H rows each way, inside the group) and the
        second as _cross (H-1 rows): together the one hop's W-1 rows."""
        self._check(send, recv, same_dtype=False)
        check_quantized(send, recv, starts, packed, self.size)
        kind = f"reduce_scatter_int{packed.bits}"
        self._agree(kind + LOCAL_HOP, recv.size, f"blocks {len(starts)}")
        local, cross, arrays = hops.local.mpi, hops.cross.mpi, self.arrays
        within, across = hop_bytes(packed.send.shape[1], hops)
        groups = hops.cross.size
        hop1 = lambda: first_hop(local, groups, send, starts, packed, arrays)  # noqa: E731
        self.ledger.run(kind + LOCAL_HOP, within, within, hop1)
        hop2 = lambda: second_hop(cross, recv, starts, packed, arrays)  # noqa: E731
        self.ledger.run(kind + CROSS_HOP, across, across, hop2)

    def _reduce_scatter_rounded(self, send: np.ndarray, recv: np.ndarray) -> None:
        """A float32 sum by the policy, rounded once into the 16-bit recv."""
        total = self.arrays.temporary(recv.size, np.float32)
        self.reduction.reduce_scatter(self.mpi, send, total, self.arrays)
        self.arrays.round_into(recv, total)

    def allreduce_sum(self, buf: np.ndarray) -> None:
        """buf (W*n,) <- sum over ranks, in place. A 16-bit buf: reduce-scatter of its
        words (summed in float32, rounded once), then an all-gather of the blocks."""
        self._check(buf)
        if buf.dtype != _F32:  # checked once for both halves (~800 calls a step at stage 0)
            n = buf.size // self.size
            self._reduce_scatter(buf, buf[self.rank * n : (self.rank + 1) * n])
            self._allgather_in_place(buf)
            return
        self._agree("allreduce", buf.size)
        args = (self.mpi, buf, self.arrays)
        self._timed("allreduce", buf.size // self.size, 2, 4, self.reduction.allreduce, *args)

    def allreduce_sum_into(self, send: np.ndarray, recv: np.ndarray) -> None:
        """recv (W*n,) <- sum over ranks of send (W*n,), when the two dtypes differ
        (16-bit gradients summed into float32 ones): this rank's block is reduced
        and rounded once into recv, then recv's blocks are all-gathered."""
        self._check(send)
        self._check(recv)
        n = recv.size // self.size
        self._reduce_scatter(send, recv[self.rank * n : (self.rank + 1) * n])
        self._allgather_in_place(recv)

    # ---- gathers
    def allgather(self, send: np.ndarray, recv: np.ndarray, kind: str = "allgather") -> None:
        """recv (W*n,) <- every rank's send (n,), in rank order; `kind` names it in the ledger."""
        self._check(recv, send)
        self._agree("allgather", send.size, self.arrays.dtype_name(send))
        args = (words_of(send), words_of(recv))
        self._timed(kind, send.size, 1, send.dtype.itemsize, self.mpi.Allgather, *args)

    def allgather_bytes(
        self, send: np.ndarray, recv: np.ndarray, kind: str = "allgather_int8"
    ) -> None:
        """recv (W*n,) uint8 <- every rank's send (n,) uint8, in rank order: bytes that
        are not floats (qwZ's int8 payload and its scales, zero_ref/numerics/quantize.py)."""
        check_bytes(send, recv, self.size)
        self.arrays.sync()
        self._agree("allgather", send.size, "uint8")
        self._timed(kind, send.size, 1, 1, self.mpi.Allgather, send, recv)

    def allgather_in_place(self, buf: np.ndarray) -> None:
        """buf (W*n,): block r <- rank r's block r, for every r (MPI_IN_PLACE)."""
        self._check(buf)
        self._allgather_in_place(buf)

    def _allgather_in_place(self, buf: np.ndarray) -> None:
        """allgather_in_place on a checked buffer."""
        self._agree("allgather", buf.size // self.size, self.arrays.dtype_name(buf))
        args = (MPI.IN_PLACE, words_of(buf))
        n, itemsize = buf.size // self.size, buf.dtype.itemsize
        self._timed("allgather", n, 1, itemsize, self.mpi.Allgather, *args)

    def gather_to_root(self, send: np.ndarray, recv: np.ndarray | None, kind: str) -> None:
        """recv (W*n,) on rank 0 <- every rank's send (n,), in rank order; other ranks
        pass recv=None and hold nothing (streaming consolidation to one writer)."""
        if self.rank == 0:
            self._check(recv, send)
        self.arrays.sync()
        self._agree("gather", send.size, self.arrays.dtype_name(send))
        nbytes = send.nbytes
        sent, received = (0, (self.size - 1) * nbytes) if self.rank == 0 else (nbytes, 0)
        with self.ledger.timed(kind, sent, received):
            self.mpi.Gather(words_of(send), words_of(recv) if self.rank == 0 else None, root=0)

    def broadcast(self, buf: np.ndarray, kind: str) -> None:
        """buf <- rank 0's buf, on every rank (small arrays: sampled logits)."""
        self._agree("broadcast", buf.size, buf.dtype.name)
        nbytes = buf.nbytes * (self.size - 1) if self.rank == 0 else 0
        with self.ledger.timed(kind, nbytes, 0 if self.rank == 0 else buf.nbytes):
            self.mpi.Bcast(buf, root=0)

    # ---- small float64 exchanges (the gradient norm's partials)
    def allreduce_int64(self, buf: np.ndarray, kind: str) -> np.ndarray:
        """Elementwise sum of an int64 array over ranks. Integer addition is exact and
        associative, so the result does not depend on MPI's order."""
        return self._allreduce_small(np.ascontiguousarray(buf, np.int64), MPI.SUM, kind)

    def allreduce_float64(self, value: float, kind: str) -> float:
        """Sum of one float64 per rank (MPI's order); `kind` names it in the ledger."""
        return float(self._allreduce_small(np.array([value], np.float64), MPI.SUM, kind)[0])

    def allreduce_min_int64(self, value: int, kind: str) -> int:
        """Smallest of one int64 per rank; `kind` names it in the ledger."""
        return int(self._allreduce_small(np.array([value], np.int64), MPI.MIN, kind)[0])

    def allreduce_max_float64(self, value: float, kind: str) -> float:
        """Largest of one float64 per rank (e.g. the slowest rank's time)."""
        return float(self._allreduce_small(np.array([value], np.float64), MPI.MAX, kind)[0])

    def _allreduce_small(self, values: np.ndarray, op: MPI.Op, kind: str) -> np.ndarray:
        """Allreduce of a small array (norms, losses, flags); ledger bytes as for a
        ring all-reduce, 2 (W-1)/W of the array, at least one element each way."""
        op_name = (
            "allreduce" if op == MPI.SUM else "allreduce_min" if op == MPI.MIN else "allreduce_max"
        )
        self._agree(op_name, values.size, values.dtype.name)
        per_block = max(values.nbytes // self.size, values.itemsize) if values.size else 0
        nbytes = 2 * (self.size - 1) * per_block
        out = np.empty_like(values)
        with self.ledger.timed(kind, nbytes, nbytes):
            self.mpi.Allreduce(values, out, op=op)
        return out


def ranks_sharing_this_host(mpi_comm: MPI.Comm) -> int:
    """How many ranks of mpi_comm run on this host, as MPI knows it (a collective):
    MPI_Comm_split_type(COMM_TYPE_SHARED), whatever launched them."""
    shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return shared.Get_size()
    finally:
        shared.Free()


def _check_blocks(
    full: np.ndarray,
    block: np.ndarray | None,
    world: int,
    same_dtype: bool = True,
    names: list[str] | None = None,
) -> None:
    """full (and block) must be contiguous float32/float16/bfloat16, of one dtype unless
    a reduction rounds into another, full holding W * block.size elements. names: what
    their elements are, when not their dtype's name (a GPU's bf16 is stored as uint16)."""
    buffers = (full,) if block is None else (full, block)
    names = names or [b.dtype.name for b in buffers]
    for buf, name in zip(buffers, names, strict=True):
        if name not in FLOAT_DTYPES or not buf.flags.c_contiguous:
            layout = "contiguous" if buf.flags.c_contiguous else "not contiguous"
            raise ValueError(
                f"collective buffers must be contiguous {', '.join(FLOAT_DTYPES)}; "
                f"got {buf.dtype}, {layout}"
            )
    if same_dtype and block is not None and block.dtype != full.dtype:
        raise ValueError(f"collective buffers must share a dtype: {full.dtype} vs {block.dtype}")
    if full.size % world:
        raise ValueError(f"buffer of {full.size} elements does not split into {world} blocks")
    if block is not None and block.size * world != full.size:
        raise ValueError(f"block of {block.size} elements x {world} ranks != {full.size}")
