"""The memory ledger: bytes each rank really holds, beside the paper's formulas.

The engine registers every array it keeps (`hold`) under a category:
params, grads, optimizer, buffers (bucket staging, unit scratch). The ledger
sums their `nbytes` when asked, so a stage that quietly keeps a full copy
shows it. Arrays that live only for a moment (stage 3's gathered units) go
through `hold`/`drop` and leave a high-water mark. Not counted: activations
(the model's, not ZeRO's), MPI's internal buffers, and the receive rows the
deterministic reduction allocates for the length of one call.

Formulas (Sec. 5.1-5.3 of the paper, per rank, Psi parameters, Nd ranks):
  mixed precision, K = 12:  stage 0: (2 + 2 + K) Psi      stage 1: (2 + 2 + K/Nd) Psi
                            stage 2: (2 + (2 + K)/Nd) Psi stage 3: (2 + 2 + K) Psi / Nd
                            (--precision fp16/bf16: the ledger holds exactly this)
  fp32:                     params 4 Psi, grads 4 Psi, optimizer (m, v) 8 Psi,
                            each divided by Nd once its stage shards it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from zero_ref.dtypes import FP32, ElementBytes
from zero_ref.layout.buckets import bucket_columns

CATEGORIES = ("params", "grads", "optimizer", "buffers")


@dataclass
class MemoryLedger:
    """Live arrays by category, and the peak of their total."""

    held: dict[str, dict[str, np.ndarray]] = field(
        default_factory=lambda: {c: {} for c in CATEGORIES}
    )
    peak_bytes: int = 0
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    on_disk: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # swap files
    on_device: dict[str, dict[str, object]] = field(default_factory=dict)  # --device gpu

    def hold(self, category: str, name: str, array: np.ndarray) -> np.ndarray:
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.held[category][name] = array
        self._update_peak()
        return array

    def hold_on_disk(self, category: str, name: str, array: np.ndarray) -> np.ndarray:
        """An array that lives in a swap file (offload): counted apart from RAM."""
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.on_disk.setdefault(category, {})[name] = array
        return array

    def hold_on_device(self, category: str, name: str, array) -> object:
        """An array in GPU memory (--device gpu): counted apart from RAM."""
        if category not in self.held:
            raise ValueError(f"memory category {category!r} is not one of {CATEGORIES}")
        self.on_device.setdefault(category, {})[name] = array
        return array

    def device_bytes_by_category(self) -> dict[str, int]:
        return {
            c: sum(int(a.nbytes) for a in self.on_device.get(c, {}).values()) for c in CATEGORIES
        }

    def disk_bytes_by_category(self) -> dict[str, int]:
        return {c: sum(int(a.nbytes) for a in self.on_disk.get(c, {}).values()) for c in CATEGORIES}

    def drop(self, category: str, name: str) -> None:
        del self.held[category][name]

    def holds(self, category: str, name: str) -> bool:
        return name in self.held[category]

    def bytes_by_category(self) -> dict[str, int]:
        return {c: sum(int(a.nbytes) for a in arrays.values()) for c, arrays in self.held.items()}

    def total_bytes(self) -> int:
        return sum(self.bytes_by_category().values())

    def _update_peak(self) -> None:
        by_cat = self.bytes_by_category()
        self.peak_bytes = max(self.peak_bytes, sum(by_cat.values()))
        for c, b in by_cat.items():
            self.peak_by_category[c] = max(self.peak_by_category[c], b)


def formula_bytes(
    stage: int, numel: int, world_size: int, grad_accum: int, sizes: ElementBytes = FP32
) -> dict[str, int]:
    """Bytes of params, grads and optimizer state one rank holds in zero_ref's engine.

    numel is the padded Psi (a multiple of world_size); `sizes` the bytes per element
    of each kind of array (fp32 by default). With mixed precision and grad_accum = 1
    this is exactly the paper's (2 + 2 + K) Psi ladder with K = 12 (master weights,
    m, v in float32). Beyond the paper's model: with grad_accum > 1, stage 0 keeps a
    second full gradient buffer (the accumulator) and stage 1 a reduced gradient
    shard beside the full gradient buffer that backward writes into."""
    nd = world_size
    k_bytes = 8 + sizes.master  # m and v, and the master weights when they are separate
    grad_full, grad_shard = sizes.grad * numel, sizes.grad * numel // nd
    accumulating = grad_accum > 1
    grads = {
        0: grad_full * (2 if accumulating else 1),
        1: grad_full + (grad_shard if accumulating else 0),
        2: grad_shard,
        3: grad_shard,
    }[stage]
    return {
        "params": sizes.param * (numel if stage < 3 else numel // nd),
        "grads": grads,
        "optimizer": k_bytes * (numel if stage == 0 else numel // nd),
    }


def paper_formula_bytes(stage: int, numel: int, world_size: int, k: int = 12) -> float:
    """The paper's per-rank model-state bytes with mixed-precision Adam (K = 12)."""
    psi, nd = float(numel), float(world_size)
    return {
        0: (2 + 2 + k) * psi,
        1: (2 + 2 + k / nd) * psi,
        2: (2 + (2 + k) / nd) * psi,
        3: (2 + 2 + k) * psi / nd,
    }[stage]


def buffer_formula_bytes(
    stage: int,
    unit_numels: Sequence[int],
    world_size: int,
    bucket_numel: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
) -> int:
    """Bytes of the `buffers` category: what a stage keeps besides the model states.

    unit_numels are the padded unit sizes. Stages 1-3 stage the widest bucket for all
    ranks (at most bucket_numel elements, zero_ref/layout/buckets.py, in the wire's
    dtype) and a landing row for a reduced bucket that is not written straight into
    the gradient shard (micro-steps after the first; stage 1's landing in the full
    gradient buffer). Stages 2-3 keep one unit's float32 gradient scratch, as do
    stages 0-1 when gradients are 16-bit (backward writes float32, rounded once);
    with 16-bit parameters every stage keeps one unit's float32 widened parameters;
    stage 3 one gathered unit; stage 0 a staging chunk when the wire's dtype is
    not the gradients'. Each is as wide as the widest unit (or bucket)."""
    shard_numel = sum(unit_numels) // world_size
    columns = min(bucket_columns(bucket_numel, world_size), shard_numel)
    widest = max(unit_numels, default=0)
    total = 0
    if stage == 0:
        if sizes.comm != sizes.grad:
            total += sizes.comm * min(
                world_size * bucket_columns(bucket_numel, world_size), sum(unit_numels)
            )
    else:
        total += sizes.comm * world_size * columns
        if grad_accum > 1 or stage == 1:
            total += sizes.grad * columns
    if stage >= 2 or sizes.grad != 4:
        total += 4 * widest  # float32 gradient scratch
    if sizes.master:
        total += 4 * widest  # float32 widened parameters
    if stage == 3:
        total += sizes.param * widest  # the gathered unit
    return total


def grads_on_disk(stage: int, offload_optimizer: str) -> bool:
    """Does the reduced gradient shard live in a swap file? With the optimizer state on
    NVMe at stages 2-3 (ZeRO-Infinity, Sec. 5: what the optimizer streams, its gradient
    included, is on disk; docs/offload.md). Stage 1 keeps a full gradient buffer that
    backward writes: its gradients stay in RAM."""
    return offload_optimizer == "nvme" and stage >= 2


def swap_file_bytes(
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    shard_numel: int,
    sizes: ElementBytes = FP32,
) -> int:
    """Bytes of one rank's swap files (offload is for stages 1-3, whose optimizer state is
    the shard's): master weights (mixed precision), m and v; stage 3's parameter shard;
    the gradient shard when grads_on_disk."""
    total = 0
    if offload_optimizer == "nvme":
        total += (8 + sizes.master) * shard_numel
    if offload_param == "nvme":
        total += sizes.param * shard_numel
    if grads_on_disk(stage, offload_optimizer):
        total += sizes.grad * shard_numel
    return total


def grad_strip_numel(widest_bucket: int, shard_numel: int, itemsize: int, align: int) -> int:
    """Elements of the strip a gradient shard on disk lands its buckets in
    (zero_ref/engine/grad_shard.py): room for the widest bucket plus one disk block
    (so its bottom can sit on a block), at least STRIP_BYTES, never more than the
    shard rounded up to blocks plus one block; a whole number of blocks."""
    block = align // itemsize
    wanted = max(widest_bucket, STRIP_BYTES // itemsize)
    return -(-min(wanted, shard_numel) // block) * block + block


STRIP_BYTES = 1 << 20  # a gradient strip's size: the writes to the disk are this large


def grad_strip_bytes(widest_bucket: int, shard_numel: int, itemsize: int, align: int) -> int:
    """The buffer a gradient shard on disk adds: its strip, aligned for O_DIRECT (one
    block of slack). (With grad_accum > 1 a micro-step's sum lands in reduce_out
    first, as in RAM: buffer_formula_bytes counts it.)"""
    return grad_strip_numel(widest_bucket, shard_numel, itemsize, align) * itemsize + align


def offload_pool_rows(stage: int, offload_optimizer: str) -> int:
    """Rows per buffer set of the offload pool: master, m and v, and the gradient when it
    is on disk (read with them, sub-group by sub-group)."""
    return 3 + grads_on_disk(stage, offload_optimizer)


def offload_pool_numel(stage: int, unit_shard_numels: Sequence[int], sub_group_size: int) -> int:
    """Elements per sub-group of the offload buffer pool: sub_group_size, or less when
    no owned slice is that long (stage 3 owns one slice, its shard; stages 1-2 one
    per unit, its rank's slice). The pool is buffer_count x offload_pool_rows such
    sub-groups."""
    widest = sum(unit_shard_numels) if stage == 3 else max(unit_shard_numels, default=0)
    return max(1, min(sub_group_size, widest))


def offload_pool_row_numel(sub_group: int, align_numel: int) -> int:
    """Elements of one pool buffer: a sub-group rounded up to whole alignment blocks, plus
    one block of slack, so that a sub-group's buffer can start at the same offset within
    a block as its range does in the file (the condition for O_DIRECT), and every
    buffer of the pool starts on a block."""
    return -(-sub_group // align_numel) * align_numel + align_numel
