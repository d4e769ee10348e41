"""The gradient shard on disk (zero_ref/engine/grad_shard.py) holds bitwise what the
shard in RAM holds after the same buckets land, micro-step after micro-step, through
strips that move down the file and carry their ragged block; its norm and NaN/Inf
position, taken as the buckets land, are the in-RAM ones; no page of it stays cached."""

from __future__ import annotations

import ctypes
import mmap

import ml_dtypes
import numpy as np
import pytest

from zero_ref.engine.compute import HostCompute
from zero_ref.engine.grad_shard import GradShardInRam, GradShardOnDisk
from zero_ref.engine.memory import MemoryLedger
from zero_ref.engine.placement import HostPlacement
from zero_ref.layout.buckets import plan_buckets
from zero_ref.offload.nvme import NvmeStore

# Unit slices of awkward sizes (a zero-size one, a single element), so that buckets
# and strips start off the disk blocks; 1.3M elements: the 1 MiB strip moves a few times.
UNITS = [333_333, 1, 0, 977_777]
DIVISOR = np.float32(6.0)


def land_all(store, plan, values, k: int) -> None:
    """Every bucket of every micro-step, in the order backward fires them."""
    for micro in range(k):
        for bucket in plan:
            out = store.target(bucket, micro)
            lo = bucket.shard_offset
            out[...] = values[micro][lo : lo + bucket.shard_numel]
            store.landed(bucket, out, micro)


def stores(tmp_path, dtype, k: int, exact: bool, widest: int):
    numel = sum(UNITS)
    ledger = MemoryLedger()
    place = HostPlacement(ledger)
    ram = GradShardInRam(place, numel, dtype, k, widest)
    nvme = NvmeStore(str(tmp_path), 0, MemoryLedger(), 0)
    disk = GradShardOnDisk(nvme, place, numel, dtype, k, widest, lambda: DIVISOR, exact)
    return ram, disk, nvme


def cached_pages(array: np.ndarray) -> int:
    """Pages of a swap file's mapping in the page cache (mincore(2) on the mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = -(-array.nbytes // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    address = array.__array_interface__["data"][0]
    if libc.mincore(address, array.nbytes, vec.ctypes.data) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int(np.count_nonzero(vec & 1))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("exact", [True, False])
def test_disk_shard_is_bitwise_the_ram_shard(tmp_path, dtype, k, exact):
    columns = 7_001  # buckets of an odd width: each one starts off a disk block
    offsets = np.concatenate([[0], np.cumsum(UNITS)[:-1]])
    plan = plan_buckets(UNITS, offsets, columns, 1)
    ram, disk, nvme = stores(tmp_path, dtype, k, exact, plan.widest())
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(sum(UNITS)).astype(dtype) for _ in range(k)]
    values[-1][123_456] = np.nan  # the last micro-step's NaN: the norm's and the search's
    land_all(ram, plan, values, k)
    land_all(disk, plan, values, k)
    assert np.array_equal(disk.array.view(np.uint8), ram.array.view(np.uint8))
    grads, compute = [ram.array], HostCompute()
    assert np.isnan(disk.norm(grads, DIVISOR, compute, None, exact))
    assert not disk.from_file  # the partials, not a read of the file
    assert disk.first_nonfinite([disk.array], compute) == 123_456
    values[-1][123_456] = 1.0
    land_all(ram, plan, values, k)
    land_all(disk, plan, values, k)
    expected = ram.norm(grads, DIVISOR, compute, None, exact)
    norm = disk.norm(grads, DIVISOR, compute, None, exact)
    if exact:
        assert norm == expected  # integer bins: any order, bitwise
    else:
        assert norm == pytest.approx(expected, rel=1e-12)  # float64 partials per bucket
    assert disk.first_nonfinite([disk.array], compute) is None
    swap = nvme.files[0]
    assert swap.bytes_written == 2 * k * swap.nbytes  # each micro-step writes the shard once
    # ... and each after the first reads it back (a strip's reads overlap by < a bucket)
    assert 2 * (k - 1) * swap.nbytes <= swap.bytes_read <= 2.1 * (k - 1) * swap.nbytes
    if swap.direct_fd is not None:  # whole blocks around the page cache: all but the top
        assert swap.bytes_direct >= 0.99 * (swap.bytes_written + swap.bytes_read)
    nvme.close()


@pytest.mark.parametrize("direct", [True, False])
def test_no_page_of_the_file_stays_cached(tmp_path, direct):
    """Written around the page cache (O_DIRECT) or through it (a filesystem without
    O_DIRECT): after the micro-steps no page of the gradient file is in memory."""
    offsets = np.concatenate([[0], np.cumsum(UNITS)[:-1]])
    plan = plan_buckets(UNITS, offsets, 4_096, 1)
    _, disk, nvme = stores(tmp_path, np.float32, 2, True, plan.widest())
    if not direct:
        nvme.files[0].direct_fd = None
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(sum(UNITS)).astype(np.float32) for _ in range(2)]
    land_all(disk, plan, values, 2)
    assert cached_pages(disk.array) == 0
    nvme.close()


def test_a_gradient_written_through_the_mapping_is_read_for_the_norm(tmp_path):
    """No bucket landed (a benchmark fills the shard directly): one read of the file."""
    _, disk, nvme = stores(tmp_path, np.float32, 1, True, 16)
    disk.array[:] = 2.0
    compute = HostCompute()
    expected = compute.grad_norm([disk.array.copy()], DIVISOR, None, True)
    assert disk.norm([disk.array], DIVISOR, compute, None, True) == expected
    assert disk.from_file
    nvme.close()
