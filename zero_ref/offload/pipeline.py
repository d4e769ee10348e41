"""The offloaded optimizer step: sub-groups of the shard stream disk -> RAM -> disk
through a fixed pool of buffers, the kernel never waiting for the disk when the
disk is the faster of the two (ZeRO-Infinity, Sec. 6.2: overlap-centric design).

The shard's (master, m, v) are cut into sub-groups of sub_group_size elements,
and with them the gradient when it is on disk too (stages 2-3:
zero_ref/engine/grad_shard.py), which is read and not written back.
Sub-group i uses buffer set i mod B (B = buffer_count). While the main thread
runs the AdamW kernel (Numba, nogil) on sub-group i, a pool of two I/O threads
(one ThreadPoolExecutor: either thread takes whichever read or write is queued
next) reads sub-groups i + 1 .. i + B - 2 ahead and writes sub-group i - 1
back; a buffer set is read into only after its last sub-group was written. The
kernel, the values and their order are the in-RAM step's, so results are
bitwise the same; only where the bytes wait changes. RAM used is the pool, B x 3
buffers (4 with the gradient) of sub_group_size elements (rounded up to whole 4
KiB blocks, plus one block of slack so that a buffer can start where its range
does within a disk block, as O_DIRECT needs) x 4 bytes, whatever the model's
size; nothing written stays in the page cache. With a trace (--trace) each read,
update and write is an event in its own lane, the reads and writes with their
bytes (zero_ref/io/trace.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from zero_ref.layout.flat import Owned
from zero_ref.offload.nvme import NvmeStore
from zero_ref.offload.swap_file import ALIGN, SwapFile

ChunkUpdate = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
SWAP_LANES = {"read": "swap reads", "update": "adamw sub-groups", "write": "swap writes"}


@dataclass(frozen=True)
class SubGroup:
    """Elements [lo, hi) of owned slice `index`."""

    index: int
    lo: int
    hi: int


def plan_sub_groups(sizes: Sequence[int], sub_group_size: int) -> list[SubGroup]:
    """Each owned slice cut into sub-groups of at most sub_group_size elements."""
    return [
        SubGroup(i, lo, min(n, lo + sub_group_size))
        for i, n in enumerate(sizes)
        for lo in range(0, n, sub_group_size)
    ]


class OffloadedUpdate:
    """Runs one optimizer step's update over swap-file state through the buffer pool."""

    def __init__(
        self, store: NvmeStore, pool: np.ndarray, buffer_count: int, sub_group: int
    ) -> None:
        """pool: (buffer_count, 3 or 4, row) float32 (master, m, v, and a gradient on
        disk), held in the ledger's buffers, each row a
        sub-group plus slack to match a range's alignment (offload_pool_row_numel)."""
        self.store, self.pool, self.count, self.sub_group = store, pool, buffer_count, sub_group
        self.io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zero_ref-swap")
        self.trace = None  # a zero_ref.io.trace.Trace (--trace): every read, update, write

    def _timed(self, what: str, i: int, fn, *args) -> None:
        """fn(*args), an event on the trace if there is one: "read 3" in lane "swap
        reads", with the bytes it moved and the thread that ran it (either I/O thread runs
        reads and writes alike). Runs on the I/O threads for reads and writes:
        Trace.complete is one list.append, atomic in CPython, so they need no lock."""
        t0 = time.perf_counter()
        moved = fn(*args)
        if self.trace is not None:
            seconds = time.perf_counter() - t0
            args = {"sub_group": i, "thread": threading.current_thread().name}
            if moved is not None:
                args["bytes"] = moved
            self.trace.complete(f"{what} {i}", SWAP_LANES[what], t0, seconds, **args)

    def run(self, owned: Sequence[Owned], update: ChunkUpdate) -> None:
        """update(param, grad, master, m, v) on every sub-group, master/m/v in RAM."""
        groups = plan_sub_groups([o.grad.size for o in owned], self.sub_group)
        swapped = [self._swapped(o) for o in owned]
        reads: dict[int, Future] = {}
        writes: dict[int, Future] = {}
        k = self.count
        for i in range(min(k - 1, len(groups))):
            reads[i] = self.io.submit(self._timed, "read", i, self._read, groups[i], swapped, i % k)
        for i, group in enumerate(groups):
            reads.pop(i).result()  # re-raises an I/O error here, on the main thread
            self._timed("update", i, self._compute, group, owned, swapped, i % k, update)
            writes[i] = self.io.submit(self._timed, "write", i, self._write, group, swapped, i % k)
            ahead = i + k - 1
            if ahead < len(groups):
                if i >= 1:
                    writes.pop(i - 1).result()  # buffer set of `ahead` is free again
                reads[ahead] = self.io.submit(
                    self._timed, "read", ahead, self._read, groups[ahead], swapped, ahead % k
                )
        for future in writes.values():
            future.result()
        if self.trace is not None:  # the swap files' own count, to check the events against
            files = self.store.files
            moved = {"read": sum(f.bytes_read for f in files)}
            moved["written"] = sum(f.bytes_written for f in files)
            self.trace.counter("swap file bytes", moved)

    def _swapped(self, o: Owned) -> list[tuple[SwapFile, int] | None]:
        """For master, m, v of one owned slice, its parameters when they are not the
        master (16-bit), and its gradient: (swap file, offset), or None if in RAM."""
        state = [self.store.locate(a) for a in (o.master, o.exp_avg, o.exp_avg_sq)]
        params = None if o.param is o.master else self.store.locate(o.param)
        return [*state, params, self.store.locate(o.grad)]

    def _buffers(self, group: SubGroup, swapped, k: int) -> np.ndarray:
        """Buffer set k's three state rows for `group`, each starting at the same offset
        within an ALIGN block as the group's range in the swap files (master, m and v
        share a layout), so its aligned middle moves with O_DIRECT."""
        where = next((w for w in swapped[group.index][:3] if w is not None), None)
        block = ALIGN // 4
        shift = 0 if where is None else (where[1] + group.lo) % block
        return self.pool[k, :3, shift : shift + group.hi - group.lo]

    def _grad_buffer(self, group: SubGroup, swapped, k: int) -> np.ndarray:
        """Buffer set k's gradient row for `group`, in the gradient's dtype (16 bits with
        mixed precision), starting where the group's bytes do within an ALIGN block."""
        swap, offset = swapped[group.index][4]
        itemsize = swap.dtype.itemsize
        shift = (offset + group.lo) * itemsize % ALIGN
        row = self.pool[k, 3].view(np.uint8)[shift : shift + (group.hi - group.lo) * itemsize]
        return row.view(swap.dtype)

    def _read(self, group: SubGroup, swapped, k: int) -> int:
        """The group's master, m, v and gradient (those in swap files) into buffer set k;
        the bytes."""
        nbytes = 0
        for j, where in enumerate(swapped[group.index][:3]):
            if where is not None:
                swap, offset = where
                buffer = self._buffers(group, swapped, k)[j]
                swap.read_into(offset + group.lo, buffer)
                nbytes += buffer.nbytes
        grad = swapped[group.index][4]
        if grad is not None:
            buffer = self._grad_buffer(group, swapped, k)
            grad[0].read_into(grad[1] + group.lo, buffer)
            nbytes += buffer.nbytes
        return nbytes

    def _write(self, group: SubGroup, swapped, k: int) -> int:
        """Buffer set k back to the swap files, pages dropped after; the bytes written.
        The gradient is only read: its range's pages are dropped."""
        nbytes = 0
        for j, where in enumerate(swapped[group.index][:3]):
            if where is not None:
                swap, offset = where
                buffer = self._buffers(group, swapped, k)[j]
                swap.write_from(offset + group.lo, buffer)
                swap.release(offset + group.lo, group.hi - group.lo, mapped=False)
                nbytes += buffer.nbytes
        for j, mapped in ((3, True), (4, False)):  # 16-bit params written in place; grads
            where = swapped[group.index][j]
            if where is not None:
                swap, offset = where
                swap.release(offset + group.lo, group.hi - group.lo, mapped=mapped)
        return nbytes

    def _compute(self, group: SubGroup, owned, swapped, k: int, update: ChunkUpdate) -> None:
        param, grad, master, m, v = owned[group.index]
        lo, hi = group.lo, group.hi
        buffers = self._buffers(group, swapped, k)
        state = [
            a[lo:hi] if where is None else buffers[j]
            for j, (a, where) in enumerate(
                zip((master, m, v), swapped[group.index][:3], strict=True)
            )
        ]
        g = grad[lo:hi] if swapped[group.index][4] is None else self._grad_buffer(group, swapped, k)
        update(param[lo:hi], g, *state)

    def close(self) -> None:
        self.io.shutdown(wait=True)
