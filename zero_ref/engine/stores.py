"""Where a rank's optimizer state and parameter shard live: policies chosen once.

The ZeRO stages (Sec. 5) say how much of each model state a rank holds; these
stores say where it is held. The optimizer-state store holds the float32 master
weights, m and v and runs the update over them:

  OptimizerInPlace  arrays made by one placement, the update in chunks of
                    OPTIMIZER_CHUNK elements (the paper's plain step): the model's
                    own placement (RAM, or device memory), or, for ZeRO-Offload
                    (--offload-optimizer cpu), the host's whatever the device; then
                    the compute policy moves the gradients down and the parameters
                    up (zero_ref/gpu/cpu_offload.py). There is no class of its own
                    for host memory: only the placement differs.
  OptimizerOnNvme   ZeRO-Infinity's NVMe tier: in swap files, the update streamed
                    through a pool of buffers (zero_ref/offload/pipeline.py).

The parameter store (stage 3's shard) is the placement's RAM, or (ZeRO-Infinity,
--offload-param nvme) a swap file read ahead one unit either side of the gathered
one. `Swap` is the swap folder both share (zero_ref/offload/nvme.py), or nothing.
A stage asks these without knowing which one it got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from zero_ref.engine.memory import offload_pool_numel, offload_pool_row_numel, swap_file_bytes
from zero_ref.layout.flat import FlatLayout, Owned
from zero_ref.offload.nvme import NvmeStore
from zero_ref.offload.pipeline import OffloadedUpdate
from zero_ref.offload.swap_file import ALIGN
from zero_ref.optim.gradnorm import OPTIMIZER_CHUNK

ChunkUpdate = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


class Swap:
    """This rank's swap folder (an NvmeStore), or None: what is dropped from RAM after
    bulk access through a mapping, and removed at the end."""

    def __init__(self, nvme: NvmeStore | None) -> None:
        self.nvme = nvme

    def release_pages(self, view: np.ndarray) -> None:
        """Drop a view of a swap-file array from RAM; a view of RAM: nothing."""
        where = None if self.nvme is None else self.nvme.locate(view)
        if where is not None:
            swap, offset = where
            swap.release(offset, view.size)

    def release_all(self) -> None:
        """Drop every swap-file page from RAM (nothing without swap files)."""
        if self.nvme is not None:
            self.nvme.release_all()

    def close(self) -> None:
        if self.nvme is not None:
            self.nvme.close()


def swap_for(cfg, stage: int, optimizer_numel: int, sizes, rank: int, memory, mpi) -> Swap:
    """The swap folder when anything is offloaded to NVMe, its disk checked for every
    file it will hold (the bytes: zero_ref/engine/memory.py's swap_file_bytes)."""
    off = cfg.offload
    if not off.to_nvme:
        return Swap(None)
    nbytes = swap_file_bytes(stage, off.optimizer, off.param, optimizer_numel, sizes)
    return Swap(NvmeStore(off.nvme_path, rank, memory, nbytes, mpi))


class OptimizerInPlace:
    """Optimizer state where `place` keeps arrays; the update runs chunk by chunk."""

    offloaded: OffloadedUpdate | None = None

    def __init__(self, place) -> None:
        self.place = place

    def zeros(self, name: str, numel: int) -> np.ndarray:
        return self.place.zeros("optimizer", name, numel)

    def start(self, layout: FlatLayout, stage: int, cfg, place, grad_rows: int) -> None:
        """After every array exists: nothing to start in memory."""

    def run(self, owned: Sequence[Owned], update: ChunkUpdate) -> None:
        """update(...) on every owned slice, OPTIMIZER_CHUNK elements at a time."""
        for param, grad, master, exp_avg, exp_avg_sq in owned:
            for lo in range(0, grad.size, OPTIMIZER_CHUNK):
                hi = lo + OPTIMIZER_CHUNK
                update(param[lo:hi], grad[lo:hi], master[lo:hi], exp_avg[lo:hi], exp_avg_sq[lo:hi])

    def close(self) -> None:
        """Nothing runs."""


class OptimizerOnNvme(OptimizerInPlace):
    """With a swap folder: the state in swap files (or, ZeRO-Offload's host arrays), the
    update streamed through the offload pool each step (zero_ref/offload/pipeline.py)."""

    def __init__(self, maker, nvme: NvmeStore) -> None:
        super().__init__(maker)
        self.nvme = nvme

    def start(self, layout: FlatLayout, stage: int, cfg, place, grad_rows: int) -> None:
        """The buffer pool (in the ledger's buffers) and the I/O threads; every swap
        page the initial fill touched is dropped from RAM."""
        shards = [u.shard_numel for u in layout.units]
        sub_group = offload_pool_numel(stage, shards, cfg.offload.sub_group_size)
        row = offload_pool_row_numel(sub_group, ALIGN // 4)
        count, rows = cfg.offload.buffer_count, 3 + grad_rows
        pool = place.aligned_zeros("buffers", "offload_pool", count * rows * row, np.float32, ALIGN)
        pool = pool.reshape(count, rows, row)
        self.offloaded = OffloadedUpdate(self.nvme, pool, count, sub_group)
        self.nvme.release_all()

    def run(self, owned: Sequence[Owned], update: ChunkUpdate) -> None:
        self.offloaded.run(owned, update)  # the state streams from swap files (docs/offload.md)

    def close(self) -> None:
        self.offloaded.close()


def optimizer_store_for(cfg, place, host_place, swap: Swap) -> OptimizerInPlace:
    """In host memory (ZeRO-Offload), in swap files, or where the model's arrays are;
    with a swap folder the update streams through the offload pool."""
    maker = host_place if cfg.offload.optimizer == "cpu" else (swap.nvme or place)
    if swap.nvme is None:
        return OptimizerInPlace(maker)
    return OptimizerOnNvme(maker, swap.nvme)


class ParamsInPlace:
    """Stage 3's parameter shard where `place` keeps arrays (RAM, or device memory)."""

    def __init__(self, place) -> None:
        self.place = place

    def zeros(self, name: str, numel: int, dtype) -> np.ndarray:
        return self.place.zeros("params", name, numel, dtype)

    def after_gather(self, shard: np.ndarray, layout: FlatLayout, i: int, trace) -> None:
        """Unit i was gathered from `shard`: nothing to read ahead in memory."""


class ParamsOnNvme(ParamsInPlace):
    """ZeRO-Infinity's parameter offload: the shard in a swap file (docs/offload.md)."""

    def __init__(self, nvme: NvmeStore) -> None:
        super().__init__(nvme)

    def after_gather(self, shard: np.ndarray, layout: FlatLayout, i: int, trace) -> None:
        """Drop unit i's slice from RAM again, and start reading its neighbours' (forward
        goes up, backward down) while unit i computes. Reading unit i through the mapping
        also mapped the neighbours' cached pages near its ends (the kernel's fault-around,
        64 KiB): those leave this process too, or every unit boundary would keep a few
        pages until the optimizer step. With a trace, each range advised is an instant
        event "readahead <unit>" in lane "swap reads"."""
        swap, base = self.place.locate(shard)
        units = layout.units
        swap.release(base + units[i].shard_offset, units[i].shard_numel)
        for j in (i - 1, i + 1):
            if 0 <= j < len(units):
                offset, numel = base + units[j].shard_offset, units[j].shard_numel
                swap.unmap(offset, numel)
                swap.prefetch(offset, numel)
                if trace is not None:
                    size = swap.dtype.itemsize
                    trace.instant(
                        f"readahead {units[j].name}",
                        "swap reads",
                        gathered=units[i].name,
                        file=swap.path.name,
                        byte_offset=offset * size,
                        bytes=numel * size,
                    )


def param_store_for(cfg, place, swap: Swap) -> ParamsInPlace:
    """Stage 3's shard in a swap file (--offload-param nvme), or where the model's are."""
    if cfg.offload.param == "nvme":
        return ParamsOnNvme(swap.nvme)
    return ParamsInPlace(place)
