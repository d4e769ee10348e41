"""One model-sized float32 array on disk: a memory-mapped swap file (ZeRO-Infinity's
NVMe tier, Rajbhandari et al., 2021, Sec. 5).

The array is visible two ways. As a NumPy array over the file's memory mapping
(`array`), so every part of the engine that reads or writes state (initial
values, checkpoints, streaming to rank 0) works on it unchanged. And by ranges
through `read_into` / `write_from` (pread/pwrite into in-RAM buffers: the GIL
is released, so I/O threads overlap the optimizer's kernel), which the
offloaded optimizer step uses.

Ranges go around the page cache (O_DIRECT) wherever the buffer and the file
offset agree modulo ALIGN (the pool's buffers are aligned, so the step's
sub-groups do, but for a ragged head or tail): the bytes go straight between
the buffer and the disk, nothing is left to write back, and the disk can read
one sub-group while it writes another. Measured by scripts/bench/bench_offload.py
(docs/offload.md): the step took 0.67 s through the page cache (write, then
fdatasync and drop every range) and 0.32 s with O_DIRECT. A filesystem without
O_DIRECT (tmpfs) gets the page-cache path for everything.

Neither way may let memory grow with the model: `release()` drops the pages a
range left behind, from this process (madvise) and from the page cache
(written back first, then posix_fadvise DONTNEED). Every OS error becomes an
OffloadIOError naming the file and the operation.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from pathlib import Path

import numpy as np

F32 = np.dtype(np.float32)
# O_DIRECT's rule for buffer address, file offset and length: the block size (4096 on
# common disks), and never less than a page, so a buffered ragged end and a direct
# middle never share a page of the cache.
ALIGN = max(4096, mmap.PAGESIZE)


class OffloadIOError(OSError):
    """A swap file could not be created, read or written (the file and the operation).
    Raised on the rank it happened on: the job is aborted with this message."""


class OffloadSetupError(ValueError):
    """--nvme-path cannot hold the swap files (missing, not writable, too small): bad
    input, found on every rank before anything is created."""


class SwapFile:
    """numel elements of `dtype` (float32 state, or 16-bit parameters) in a file of
    their own, zero-filled at creation."""

    def __init__(self, path: Path, numel: int, dtype: np.dtype = F32) -> None:
        self.path, self.numel, self.dtype = Path(path), numel, np.dtype(dtype)
        self.nbytes = numel * self.dtype.itemsize
        self.bytes_read = self.bytes_written = 0  # by read_into / write_from, for reports
        self.bytes_direct = 0  # of those, moved with O_DIRECT (around the page cache)
        self.bytes_read_direct = 0  # ... and of the reads alone
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(self.fd, self.nbytes)  # a sparse file: zeros, no blocks yet
            # no readahead on this descriptor's reads: a read's asynchronous readahead can
            # land after release() dropped the range and stay cached (stage 3's neighbours
            # are asked for by prefetch, explicitly)
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        except OSError as e:
            raise OffloadIOError(f"cannot create swap file {self.path}: {e}") from e
        self.direct_fd = _open_direct(self.path)  # None where the filesystem has no O_DIRECT
        self.retired_fds: list[int] = []  # direct descriptors given up on, closed at close()
        self.cached_writes = False  # written through the page cache since the last sync
        self._sync_lock = threading.Lock()  # the flag and the sync, for two I/O threads
        self._map = mmap.mmap(self.fd, self.nbytes) if self.nbytes else None
        empty = np.zeros(0, self.dtype)
        self.array = np.frombuffer(self._map, self.dtype) if self._map is not None else empty

    def offset_of(self, view: np.ndarray) -> int:
        """The element offset in this file of a view of `array`."""
        base = self.array.__array_interface__["data"][0]
        offset, rest = divmod(view.__array_interface__["data"][0] - base, self.dtype.itemsize)
        if rest or not 0 <= offset <= self.numel - view.size:
            raise ValueError(f"the view is not inside {self.path}'s array")
        return offset

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """out <- elements [offset, offset + out.size) of the file (pread)."""
        self._io("read", offset, out, os.preadv)
        self.bytes_read += out.nbytes

    def write_from(self, offset: int, data: np.ndarray) -> None:
        """Elements [offset, offset + data.size) of the file <- data (pwrite)."""
        self._io("write", offset, data, os.pwritev)
        self.bytes_written += data.nbytes

    def _io(self, op: str, offset: int, buf: np.ndarray, call) -> None:
        """The whole range: its aligned middle with O_DIRECT, a ragged head and tail (or
        all of it, where alignment or O_DIRECT is missing) through the page cache."""
        start, view = offset * self.dtype.itemsize, memoryview(buf.view(np.uint8))
        address = buf.__array_interface__["data"][0]
        head = (-start) % ALIGN
        middle = max(0, len(view) - head) // ALIGN * ALIGN
        if self.direct_fd is None or (address - start) % ALIGN or middle == 0:
            head, middle = len(view), 0
        direct = self.direct_fd
        pieces = [(None, 0, head), (direct, head, head + middle), (None, head + middle, len(view))]
        for fd, lo, hi in pieces:
            if hi > lo and not (
                fd is not None and self._direct(op, fd, start + lo, view[lo:hi], call)
            ):
                self._io_all(op, self.fd, start + lo, view[lo:hi], call)
                if op == "write":
                    with self._sync_lock:
                        self.cached_writes = True

    def _direct(self, op: str, fd: int, start: int, view: memoryview, call) -> bool:
        """One aligned piece with O_DIRECT; False if the filesystem refuses it after all
        (EINVAL: it wants another alignment, or a short transfer left the rest ragged):
        then O_DIRECT is given up for this file and the piece goes through the cache."""
        try:
            self._io_all(op, fd, start, view, call)
        except OffloadIOError as e:
            if getattr(e.__cause__, "errno", None) != errno.EINVAL:
                raise
            if self.direct_fd == fd:
                self.direct_fd = None  # another thread may still be using it: closed at close()
                self.retired_fds.append(fd)
            return False
        self.bytes_direct += len(view)
        if op == "read":
            self.bytes_read_direct += len(view)
        return True

    def _io_all(self, op: str, fd: int, start: int, view: memoryview, call) -> None:
        """Every byte of `view` at byte `start` of the file (a call may move fewer)."""
        done = 0
        try:
            while done < len(view):
                n = call(fd, [view[done:]], start + done)
                if n == 0:
                    raise OSError(f"{op} returned 0 bytes at byte {start + done}")
                done += n
        except OSError as e:
            raise OffloadIOError(
                f"swap file {self.path}: {op} of {len(view)} bytes at byte {start} failed: {e}"
            ) from e

    def unmap(self, offset: int, numel: int) -> None:
        """Drop elements [offset, offset + numel) from this process's mapping only: the
        page cache keeps them (a prefetched neighbour that a read's fault-around mapped
        into this process stays cached for its own read, but leaves the resident set)."""
        if numel > 0 and self._map is not None:
            size, page = self.dtype.itemsize, mmap.PAGESIZE
            lo = offset * size - offset * size % page
            hi = min((offset + numel) * size, self.nbytes)
            try:
                self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except OSError as e:
                raise OffloadIOError(f"swap file {self.path}: unmapping failed: {e}") from e

    def prefetch(self, offset: int, numel: int) -> None:
        """Ask the kernel to start reading elements [offset, offset + numel) now (readahead,
        asynchronous): the next unit's parameters, while this one computes."""
        if numel > 0:
            size = self.dtype.itemsize
            try:
                os.posix_fadvise(self.fd, offset * size, numel * size, os.POSIX_FADV_WILLNEED)
            except OSError as e:
                raise OffloadIOError(f"swap file {self.path}: prefetch failed: {e}") from e

    def release(self, offset: int = 0, numel: int | None = None, mapped: bool = True) -> None:
        """Drop the pages of elements [offset, offset + numel) from this process and from
        the page cache, after writing back what is dirty: RAM stays bounded. mapped=False:
        the range was not written through `array` since its last release (only by
        write_from), so only page-cache writes need syncing, if there were any."""
        numel = self.numel - offset if numel is None else numel
        if numel <= 0 or self._map is None:
            return
        lo, hi = offset * self.dtype.itemsize, (offset + numel) * self.dtype.itemsize
        page = mmap.PAGESIZE
        start = lo - lo % page
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, min(hi, self.nbytes) - start)
            with self._sync_lock:  # held through the sync: a write flagged meanwhile waits
                if mapped or self.cached_writes:
                    self.cached_writes = False
                    os.fdatasync(self.fd)
            os.posix_fadvise(self.fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            raise OffloadIOError(f"swap file {self.path}: releasing pages failed: {e}") from e

    def close(self, remove: bool = True) -> None:
        """Unmap, close and (by default) delete the file: it is scratch, not a checkpoint."""
        self.array = np.zeros(0, self.dtype)
        if self._map is not None:
            with contextlib.suppress(BufferError):  # views alive: it goes with the process
                self._map.close()
            self._map = None
        os.close(self.fd)
        for fd in [self.direct_fd, *self.retired_fds]:
            if fd is not None:
                os.close(fd)
        if remove:
            self.path.unlink(missing_ok=True)


def _open_direct(path: Path) -> int | None:
    """A second descriptor of the file that bypasses the page cache, if the platform and
    filesystem allow it (tmpfs refuses O_DIRECT; macOS has none): else None."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError:
        return None
