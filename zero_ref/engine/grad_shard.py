"""Where a rank's reduced gradient shard lives (stages 2-3): in RAM, or on NVMe.

ZeRO's P_os+g (Sec. 5.2) leaves each rank the reduced gradient of its own
slice, 2 (or 4) Psi / Nd bytes. With the optimizer state on NVMe that shard is
what still grows with the model, so ZeRO-Infinity (Sec. 5) puts it on disk as
well: `GradShardOnDisk` writes each bucket's reduce-scattered slice to a swap
file as the bucket completes, and the offloaded optimizer step
(zero_ref/offload/pipeline.py) reads it back sub-group by sub-group beside the
master weights, m and v. `GradShardInRam` is the paper's plain array.

Both are the landing of the bucket reduce-scatters (zero_ref/engine/grad_buckets.py
asks `target(bucket, micro)` where a bucket's sum goes and tells `landed` when
it is there) and the source of the update phase's norm and NaN/Inf search. One
is chosen once from the config (`grad_shard_for`); a stage calls it without
asking which one it got.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from zero_ref.engine.memory import grad_strip_numel, grads_on_disk
from zero_ref.layout.buckets import Bucket
from zero_ref.offload.swap_file import ALIGN
from zero_ref.optim.gradnorm import BIN_SHAPE, bins_to_float, sumsq_bins, sumsq_fast
from zero_ref.optim.nonfinite import first_nonfinite


def _span(bucket: Bucket) -> tuple[int, int]:
    return bucket.shard_offset, bucket.shard_offset + bucket.shard_numel


class GradShardInRam:
    """The shard as one array in RAM; micro-steps after the first land in reduce_out
    and are added (the oracle's order)."""

    pool_rows = 0  # rows of the offload pool its gradient needs: none, it is in RAM

    def __init__(self, place, numel: int, dtype, grad_accum: int, widest: int) -> None:
        self.place = place
        self.array = place.zeros("grads", "shard_grads", numel, dtype)
        self.reduce_out = None
        if grad_accum > 1:
            self.reduce_out = place.zeros("buffers", "reduce_out", widest, dtype)

    @property
    def dtype(self) -> np.dtype:
        """What the buckets' sums are stored as (the gradient's dtype)."""
        return self.array.dtype

    def target(self, bucket: Bucket, micro: int) -> np.ndarray:
        """Where the reduce-scatter of `bucket` writes its sum."""
        lo, hi = _span(bucket)
        return self.array[lo:hi] if micro == 0 else self.reduce_out[: hi - lo]

    def landed(self, bucket: Bucket, out: np.ndarray, micro: int) -> None:
        if micro:
            lo, hi = _span(bucket)
            self.place.accumulate_rounded(self.array[lo:hi], out)

    def norm(self, grads: Sequence[np.ndarray], divisor, compute, comm, exact: bool) -> float:
        return compute.grad_norm(grads, divisor, comm, exact)

    def first_nonfinite(self, grads: Sequence[np.ndarray], compute) -> int | None:
        return compute.first_nonfinite(grads)


class GradShardOnDisk(GradShardInRam):
    """The shard in a swap file. Buckets complete from the top of the shard space down
    (zero_ref/layout/buckets.py), so their slices arrive as one descending run: they
    land in a strip of RAM (STRIP_BYTES, whole disk blocks) that is written to the file
    each time it is full, its aligned part with O_DIRECT, the ragged block below it
    carried into the next strip (and the pages dropped after: nothing stays cached).

    Accumulation is read-add-write: a micro-step after the first reads the strip's
    range back from the file before its buckets are added into it (k micro-steps
    write the shard k times and read it k - 1 times). Holding the sum in RAM until
    the last micro-step would be the shard again.

    On the last micro-step each landed slice's contribution to the global norm
    (divided by the step's divisor, as the in-RAM norm does) is taken while it is in
    RAM, and where the first NaN/Inf is: no second pass over the file. In
    deterministic mode the exact norm's integer bins add in any order, so the norm is
    bitwise the in-RAM one; in fast mode the float64 partials are per bucket (added
    in the plan's fixed order) rather than per 2^18-element chunk, which moves the
    norm by float64 rounding (docs/
    determinism.md: fast mode's norm depends on how the buffer is cut). A gradient
    written some other way (through the mapping, as scripts/bench/bench_offload.py fills
    it) has no partials: the norm then reads the file once through the mapping."""

    pool_rows = 1  # the pipeline reads the gradient into a row of each buffer set

    def __init__(self, nvme, place, numel: int, dtype, grad_accum: int, widest: int,
                 divisor: Callable[[], np.float32], exact: bool) -> None:  # fmt: skip
        self.place, self.nvme, self.k, self.divisor, self.exact = (
            place, nvme, grad_accum, divisor, exact
        )  # fmt: skip
        self.array = nvme.zeros("grads", "shard_grads", numel, dtype)
        self.reduce_out = None
        if grad_accum > 1:
            self.reduce_out = place.zeros("buffers", "reduce_out", widest, dtype)
        itemsize = np.dtype(dtype).itemsize
        self.block = ALIGN // itemsize  # elements per disk block
        self.cap = grad_strip_numel(widest, numel, itemsize, ALIGN)
        self.strip = place.aligned_zeros("buffers", "grad_strip", self.cap, dtype, ALIGN)
        self.base = self.lo = self.hi = 0  # strip[0] is element base; [lo, hi) is filled
        self.open = False  # a micro-step's run of buckets is landing
        self._reset_partials()

    def _reset_partials(self) -> None:
        self.final_numel = 0  # elements landed in the last micro-step, this step
        self.fast = 0.0  # the sum of squares, fast mode: added bucket by bucket, top down
        self.bins = np.zeros(BIN_SHAPE, np.int64)  # exact mode
        self.bad: int | None = None  # shard position of the first NaN/Inf
        self.from_file = False  # the last norm read the file: so does the NaN search

    # ---- landing the buckets
    def target(self, bucket: Bucket, micro: int) -> np.ndarray:
        lo, hi = _span(bucket)
        if not self.open:  # the top bucket of a micro-step
            if micro == 0:
                self._reset_partials()
            self.open, self.lo, self.hi = True, hi, hi
            self._place_strip(-(-hi // self.block) * self.block, micro)
        if hi != self.lo:
            raise AssertionError(f"bucket [{lo}, {hi}) does not end where [{self.lo}, ...) starts")
        if lo < self.base:
            self._flush(micro)
        if micro:
            return self.reduce_out[: hi - lo]
        return self.strip[lo - self.base : hi - self.base]

    def landed(self, bucket: Bucket, out: np.ndarray, micro: int) -> None:
        lo, hi = _span(bucket)
        mine = self.strip[lo - self.base : hi - self.base]
        if micro:
            self.place.accumulate_rounded(mine, out)
        self.lo = lo
        if micro == self.k - 1:
            self._take_partials(lo, mine)
        if lo == 0:  # the last bucket of the micro-step
            self._write(0, self.hi)
            self.open = False

    def _place_strip(self, top: int, micro: int) -> None:
        """The strip covers [top - cap, top), top on a block; a micro-step after the first
        reads what the file holds there (the sum so far)."""
        self.base = top - self.cap
        if micro:
            lo, hi = max(0, self.base), min(top, self.array.size)
            swap = self.nvme.locate(self.array)[0]
            swap.read_into(lo, self.strip[lo - self.base : hi - self.base])
            # a read through the page cache left these pages, and its readahead the ones
            # above them (already written: the strips move down)
            swap.release(lo, self.array.size - lo, mapped=False)

    def _flush(self, micro: int) -> None:
        """Write the filled part from its lowest whole block up; carry the ragged block
        below it into the strip's new place, just under the block it started."""
        aligned = -(-self.lo // self.block) * self.block
        carry = self.strip[self.lo - self.base : min(aligned, self.hi) - self.base].copy()
        self._write(aligned, self.hi)
        self._place_strip(aligned, micro)
        self.hi = self.lo + carry.size
        self.strip[self.lo - self.base : self.hi - self.base] = carry

    def _write(self, lo: int, hi: int) -> None:
        """Elements [lo, hi) of the strip to the file, their pages dropped after."""
        if hi > lo:
            swap = self.nvme.locate(self.array)[0]
            swap.write_from(lo, self.strip[lo - self.base : hi - self.base])
            swap.release(lo, hi - lo, mapped=False)

    # ---- the norm and the NaN/Inf search, from what landed
    def _take_partials(self, lo: int, final: np.ndarray) -> None:
        g = np.divide(final, self.divisor(), dtype=np.float32)
        if self.exact:
            bins = sumsq_bins(g)
            self.bins += bins
            finite = not bins[-1].any()
        else:
            partial = sumsq_fast(g)
            self.fast += partial
            finite = math.isfinite(partial)
        if not finite:
            at = first_nonfinite([final])  # in the gradient itself, as in RAM
            if at is not None and (self.bad is None or lo + at < self.bad):
                self.bad = lo + at
        self.final_numel += final.size

    def norm(self, grads: Sequence[np.ndarray], divisor, compute, comm, exact: bool) -> float:
        """The global norm from this step's partials (one collective, as in RAM), or, if
        the gradient did not land through the buckets, from one read of the file."""
        self.from_file = self.final_numel != self.array.size
        if self.from_file:
            norm = compute.grad_norm(grads, divisor, comm, exact)
            self.nvme.release_all()
            return norm
        if exact:
            bins = self.bins if comm is None else comm.allreduce_int64(self.bins, kind="norm")
            return math.sqrt(bins_to_float(bins))
        total = self.fast
        if comm is not None:
            total = comm.allreduce_float64(total, kind="norm")
        return math.sqrt(total)

    def first_nonfinite(self, grads: Sequence[np.ndarray], compute) -> int | None:
        if self.from_file:
            at = compute.first_nonfinite(grads)
            self.nvme.release_all()
            return at
        return self.bad


def grad_shard_for(
    stage: int, cfg, place, nvme, numel: int, dtype, widest: int, divisor
) -> GradShardInRam:
    """The store for this config: on disk when grads_on_disk (the optimizer on NVMe at
    stages 2-3), else in RAM. divisor() is the step's W k S (for the norm's partials)."""
    if grads_on_disk(stage, cfg.offload.optimizer):
        return GradShardOnDisk(
            nvme, place, numel, dtype, cfg.grad_accum, widest, divisor, cfg.deterministic
        )
    return GradShardInRam(place, numel, dtype, cfg.grad_accum, widest)
