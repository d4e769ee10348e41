"""A swap file's pages leave RAM after write-back (zero_ref/offload/swap_file.py):
`release()` writes back what is dirty and drops the range from this process's
mapping (madvise) and from the page cache (fdatasync, then DONTNEED), so RAM
does not grow with the model. Checked from outside the code under test:

* the page cache, by mincore(2) on a fresh read-only mapping of the file (a fresh
  mapping faults nothing in; mincore reports which of its pages are cached);
* this process's resident pages of the swap file's own mapping, by its Rss line
  in /proc/self/smaps;
* the bytes, read back through a new descriptor after the release: with none of
  the file's pages cached, they come from the disk.

tmpfs keeps its pages in the page cache by design: skipped there (pytest's
tmp_path is under /tmp, a disk folder on the machines this runs on)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import MixedPrecisionConfig, OffloadConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.offload.swap_file import SwapFile
from zero_ref.testing.replay import ReplayModel

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mincore and /proc: Linux")

PAGE = mmap.PAGESIZE
NUMEL = 2 << 20  # 8 MiB of float32: 2048 pages, far above any edge effect
EDGE_PAGES = 2  # a range's partial first and last pages may stay cached


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def cached_pages(path: Path, lo: int = 0, hi: int | None = None) -> int:
    """How many pages of bytes [lo, hi) of the file are in the page cache (mincore on a
    fresh shared mapping, which faults none of them in)."""
    libc, size = _libc(), os.path.getsize(path)
    hi = size if hi is None else hi
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path}")
        try:
            vec = ctypes.create_string_buffer(-(-size // PAGE))
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path}")
            return sum(b & 1 for b in vec.raw[lo // PAGE : -(-hi // PAGE)])
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def mapped_rss(array: np.ndarray) -> int:
    """Resident bytes of the mapping that starts at `array`'s first byte (smaps Rss)."""
    start = array.__array_interface__["data"][0]
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        first = line.split(maxsplit=1)[0]
        if "-" in first and int(first.split("-")[0], 16) == start:
            for field in lines[i + 1 :]:
                if field.startswith("Rss:"):
                    return int(field.split()[1]) * 1024
    raise LookupError(f"no mapping at {start:#x} in /proc/self/smaps")


def filesystem_type(path: Path) -> str:
    """The type of the filesystem `path` is on (the longest mount point above it)."""
    path, best, kind = path.resolve(), "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        inside = path == Path(mount) or Path(mount) in path.parents
        if inside and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    kind = filesystem_type(tmp_path)
    if kind in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {kind}, whose pages never leave RAM")
    return tmp_path


def read_back(path: Path, numel: int) -> np.ndarray:
    """The file's float32 contents through a new descriptor (not the swap file's)."""
    with open(path, "rb", buffering=0) as f:
        return np.frombuffer(f.read(numel * 4), np.float32)


def test_writes_through_the_mapping_leave_ram_at_release(disk):
    swap = SwapFile(disk / "x.f32", NUMEL)
    data = np.random.default_rng(0).standard_normal(NUMEL).astype(np.float32)
    swap.array[:] = data  # dirty pages in the mapping: resident, and in the page cache
    assert mapped_rss(swap.array) > swap.nbytes // 2  # what release must undo
    assert cached_pages(swap.path) > NUMEL * 4 // PAGE // 2
    swap.release()
    assert mapped_rss(swap.array) <= EDGE_PAGES * PAGE
    assert cached_pages(swap.path) <= EDGE_PAGES, "written back, yet still in the page cache"
    assert np.array_equal(read_back(swap.path, NUMEL), data)  # from the disk: none cached
    swap.close()


def test_page_cache_writes_leave_ram_at_release(disk):
    """write_from through the page cache (an unaligned buffer: no O_DIRECT), then
    release(mapped=False), as the offloaded step does for its ragged pieces."""
    swap = SwapFile(disk / "x.f32", NUMEL)
    data = np.random.default_rng(1).standard_normal(NUMEL + 1).astype(np.float32)[1:]
    assert data.__array_interface__["data"][0] % PAGE  # not aligned: the cached path
    swap.write_from(0, data)
    assert swap.bytes_direct == 0 and cached_pages(swap.path) > NUMEL * 4 // PAGE // 2
    swap.release(mapped=False)
    assert cached_pages(swap.path) <= EDGE_PAGES, "written back, yet still in the page cache"
    assert mapped_rss(swap.array) <= EDGE_PAGES * PAGE
    assert np.array_equal(read_back(swap.path, NUMEL), data)
    swap.close()


def test_releasing_a_range_drops_that_range(disk):
    """The step releases sub-group by sub-group: each range's pages go, whatever the
    rest of the file does. Ranges with ragged ends keep at most their edge pages."""
    swap = SwapFile(disk / "x.f32", NUMEL)
    swap.array[:] = 1.0
    lo, numel = 12_345, NUMEL // 3  # not page-aligned at either end
    swap.release(lo, numel)
    inside = cached_pages(swap.path, lo * 4, (lo + numel) * 4)
    assert inside <= EDGE_PAGES, f"{inside} pages of the released range still cached"
    swap.release()
    assert cached_pages(swap.path) <= EDGE_PAGES
    assert np.array_equal(read_back(swap.path, NUMEL), np.ones(NUMEL, np.float32))
    swap.close()


@pytest.mark.parametrize("offload_param", ["none", "nvme"])
def test_after_offloaded_steps_no_swap_file_is_in_the_page_cache(disk, offload_param):
    """The whole offloaded step at stage 3 (optimizer state, and parameters, in swap
    files): the initial fill, two steps and their write-back leave none of the swap
    files' pages cached (at most 2%), though they hold 24-28 MB, far more than the pool."""
    units = [(f"u{i}", [("w", (500, 1000))]) for i in range(4)]
    model = ReplayModel(units)
    config = ZeroConfig(
        stage=3,
        deterministic=True,
        mixed_precision=MixedPrecisionConfig(dtype="bf16"),
        offload=OffloadConfig(
            optimizer="nvme", param=offload_param, nvme_path=str(disk), sub_group_size=1 << 16
        ),
    )
    engine = make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))
    for step in range(2):
        engine.train_step(model.contexts(1, step, 1, 1)[:, 0], np.zeros((1, 1)))
        for swap in engine.nvme.files:
            pages = swap.nbytes // PAGE
            cached = cached_pages(swap.path)
            assert cached <= pages // 50, f"{swap.path.name}: {cached} of {pages} pages cached"
            assert mapped_rss(swap.array) <= pages // 50 * PAGE
    engine.close()
