"""Optimizer offload to swap files (zero_ref/offload/): the same results as in RAM,
RAM bounded by the buffer pool, and every failure one message naming the file."""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from tests.mpi_pool import mpirun_command, run_watched
from zero_ref.comm.choose import comm_for
from zero_ref.config import LossScaleConfig, MixedPrecisionConfig, OffloadConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.models.unit import init_params
from zero_ref.offload.nvme import NvmeStore, check_space
from zero_ref.offload.pipeline import plan_sub_groups
from zero_ref.offload.swap_file import ALIGN, OffloadIOError, OffloadSetupError, SwapFile
from zero_ref.testing.engine_state import full_parameters
from zero_ref.testing.replay import ReplayModel

UNITS = [("u0", [("w", (30, 50)), ("s", ())]), ("u1", [("b", (70,)), ("c", (0,))])]


IN_RAM = OffloadConfig()
NVME = OffloadConfig(optimizer="nvme")  # the swap folder: each run's tmp_path


def run(
    tmp_path: Path,
    steps: int = 3,
    units=UNITS,
    precision: str = "fp32",
    loss_scale: LossScaleConfig | None = None,
    offload: OffloadConfig = IN_RAM,
    **cfg,
) -> tuple[np.ndarray, object]:
    """Parameters after `steps` deterministic steps on one rank, and the engine; swap
    files (with an `offload` to "nvme") under tmp_path."""
    model = ReplayModel(units)
    mixed = MixedPrecisionConfig(dtype=precision, loss_scale=loss_scale or LossScaleConfig())
    config = ZeroConfig(
        deterministic=True,
        mixed_precision=mixed,
        offload=replace(offload, nvme_path=str(tmp_path)),
        **cfg,
    )
    engine = make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))
    k = config.grad_accum
    for step in range(steps):
        engine.train_step(model.contexts(1, step, k, 1)[:, 0], np.zeros((k, 1)))
    flat = np.concatenate([v.ravel() for v in full_parameters(engine).values()])
    return flat, engine


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_offloaded_run_is_bitwise_the_in_ram_run(tmp_path, stage, precision):
    common = dict(stage=stage, precision=precision, grad_accum=2, clip=0.5)
    in_ram, a = run(tmp_path, **common)
    offloaded, b = run(tmp_path, offload=replace(NVME, sub_group_size=64, buffer_count=3), **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    assert b.memory.bytes_by_category()["optimizer"] == 0
    assert (
        b.memory.disk_bytes_by_category()["optimizer"] == a.memory.bytes_by_category()["optimizer"]
    )
    folder = b.nvme.folder
    a.close()
    b.close()
    assert not folder.exists(), "swap files are scratch: removed at close"


def test_sub_groups_moved_with_o_direct_are_bitwise_too(tmp_path):
    """Sub-groups of 2048 elements (8 KiB, aligned in the pool): their I/O goes around
    the page cache, ragged unit tails through it; the results do not change."""
    units = [("u0", [("w", (3, 7))]), ("u1", [("b", (20_000,))])]  # u1 starts off a block
    common = dict(units=units, stage=2, precision="bf16", grad_accum=2, clip=0.5)
    in_ram, a = run(tmp_path, **common)
    offloaded, b = run(tmp_path, offload=replace(NVME, sub_group_size=2048), **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    if any(f.direct_fd is not None for f in b.nvme.files):
        # u1's sub-groups start off a block; their buffers start as far into one, so each
        # 8 KiB sub-group still moves a whole 4 KiB block direct (none, before they did)
        moved = sum(f.bytes_read + f.bytes_written for f in b.nvme.files)
        assert sum(f.bytes_direct for f in b.nvme.files) > 0.4 * moved
    a.close()
    b.close()


def direct_middle(start: int, nbytes: int) -> int:
    """The bytes of a range at byte `start` that O_DIRECT can move: its whole ALIGN blocks."""
    head = (-start) % ALIGN
    return max(0, nbytes - head) // ALIGN * ALIGN


@pytest.mark.parametrize(
    "stage, precision", [(2, "fp32"), (2, "fp16"), (2, "bf16"), (3, "fp32")]
)  # each gradient dtype
def test_every_whole_block_of_a_gradient_read_moves_with_o_direct(tmp_path, stage, precision):
    """The gradient on disk (stages 2-3 with the optimizer offloaded) is read into a pool
    row that starts where its range does within a block, in bytes of its own dtype: so
    every whole block of every sub-group's read goes around the page cache, for each
    dtype, the ranges starting off a block (u1 starts at element 21)."""
    units = [("u0", [("w", (3, 7))]), ("u1", [("b", (20_000,))])]
    low = LossScaleConfig(initial_scale_power=2)  # fp16: no step overflows, each one reads
    common = dict(units=units, stage=stage, precision=precision, clip=0.5, steps=1, loss_scale=low)
    in_ram, a = run(tmp_path, **common)
    offloaded, b = run(tmp_path, offload=replace(NVME, sub_group_size=8192), **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    swap, _ = b.nvme.locate(b.shard_grads)
    if swap.direct_fd is None:
        a.close()
        b.close()
        pytest.skip("this filesystem has no O_DIRECT")
    item = swap.dtype.itemsize
    assert item == {"fp32": 4, "fp16": 2, "bf16": 2}[precision]
    grads = [o[1] for o in b.owned_slices()]
    expected = 0
    for group in plan_sub_groups([g.size for g in grads], 8192):
        offset = swap.offset_of(grads[group.index])
        expected += direct_middle((offset + group.lo) * item, (group.hi - group.lo) * item)
    assert expected > 0.5 * swap.nbytes  # most of each read is whole blocks
    assert swap.bytes_read == swap.nbytes  # the step read the gradient once
    assert swap.bytes_read_direct == expected, (
        f"{precision} gradient: {swap.bytes_read_direct} of {swap.bytes_read} bytes read "
        f"with O_DIRECT, where its whole blocks are {expected}: the pool row is not "
        "aligned as the file's range is"
    )
    a.close()
    b.close()


def test_sub_groups_larger_than_the_in_ram_chunk_are_bitwise_too(tmp_path):
    """A sub-group wider than the in-RAM step's chunk (2^18): the whole piece is updated."""
    wide = [("u0", [("w", (700, 1000))])]
    common = dict(units=wide, stage=3, precision="bf16", steps=2)
    in_ram, a = run(tmp_path, **common)
    offloaded, b = run(tmp_path, offload=replace(NVME, sub_group_size=1 << 19), **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    a.close()
    b.close()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["none", "nvme"])
def test_stage3_parameter_offload_is_bitwise_the_in_ram_run(tmp_path, precision, optimizer):
    common = dict(stage=3, precision=precision, grad_accum=2, clip=0.5)
    in_ram, a = run(tmp_path, **common)
    offload = OffloadConfig(optimizer=optimizer, param="nvme", sub_group_size=64)
    offloaded, b = run(tmp_path, offload=offload, **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    assert b.memory.bytes_by_category()["params"] == 0
    assert b.memory.disk_bytes_by_category()["params"] == a.memory.bytes_by_category()["params"]
    a.close()
    b.close()


def test_parameter_offload_needs_stage_3(tmp_path):
    with pytest.raises(ValueError, match="offload_param='nvme'.*below stage 3"):
        ZeroConfig(stage=2, offload=OffloadConfig(param="nvme", nvme_path=str(tmp_path)))


def rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssFile in /proc/self/status")


def test_ram_stays_bounded_while_the_state_is_many_times_the_pool(tmp_path):
    """1.5M parameters in bf16: 18 MB of master, m and v on disk; the pool is 3 sets of
    3 x 2048 elements, each with 1024 of alignment slack (111 kB). After steps, the swap
    pages are not resident."""
    big = [(f"u{i}", [("w", (500, 1000))]) for i in range(3)]
    run(tmp_path, steps=1, stage=3, precision="bf16", offload=NVME)[1].close()
    before = rss_file_bytes()  # after a first run: kernels and libraries already mapped
    _, engine = run(
        tmp_path,
        units=big,
        stage=3,
        precision="bf16",
        offload=replace(NVME, sub_group_size=2048, buffer_count=3),
    )
    on_disk = engine.memory.disk_bytes_by_category()["optimizer"]
    pool = engine.memory.held["buffers"]["offload_pool"].nbytes
    assert on_disk == 12 * 1_500_000 and on_disk > 100 * pool
    grown = rss_file_bytes() - before
    assert grown < on_disk / 10, f"file-backed RSS grew {grown:,} bytes; state {on_disk:,}"
    engine.close()


class SamplingInit:
    """RandomInit that records the file-backed resident set before each unit it fills."""

    def __init__(self, model) -> None:
        from zero_ref.engine.init_source import RandomInit

        self.inner, self.samples = RandomInit(model, 0), []

    def fill_unit(self, unit, out, lo, hi) -> None:
        self.samples.append(rss_file_bytes())
        self.inner.fill_unit(unit, out, lo, hi)


@pytest.mark.parametrize("stage", [1, 3])
def test_filling_offloaded_state_holds_one_unit_at_a_time(tmp_path, stage):
    """The initial fill writes master weights (and stage 3's 16-bit parameters) through
    their mappings: each unit's pages leave RAM before the next unit is filled, so the
    resident set does not grow with the model during init (nor a resume's load)."""
    units = [(f"u{i}", [("w", (500, 1000))]) for i in range(6)]
    model = ReplayModel(units)
    offload = OffloadConfig(optimizer="nvme", nvme_path=str(tmp_path))
    config = ZeroConfig(
        stage=stage,
        mixed_precision=MixedPrecisionConfig(dtype="bf16"),
        offload=replace(offload, param="nvme") if stage == 3 else offload,
    )
    source = SamplingInit(model)
    engine = make_engine(model, source, config, comm_for(MPI.COMM_SELF, config))
    unit_bytes = 500_000 * (4 + 2)  # one unit's master and 16-bit parameters
    grown = max(source.samples) - source.samples[0]
    assert grown < 2 * unit_bytes, f"file-backed RSS grew {grown:,} bytes over 6 units"
    engine.close()


def test_space_and_folder_are_checked_before_anything_is_created(tmp_path, monkeypatch):
    with pytest.raises(OffloadSetupError, match="no such folder"):
        check_space(str(tmp_path / "missing"), 10)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(OffloadSetupError, match="1,000 bytes free, the swap files need 4,000"):
        check_space(str(tmp_path), 4000)


def test_a_missing_nvme_path_is_one_message_and_exit_2(tmp_path):
    """Bad input, found on every rank before anything is created: one line from rank 0."""
    job = run_watched(
        mpirun_command(
            2, "-m", "zero_ref.train", "--model", "mlp", "--steps", "1", "--stage", "2",
            "--offload-optimizer", "nvme", "--nvme-path", str(tmp_path / "missing"),
        )
    )  # fmt: skip
    assert job.returncode == 2, job.stderr[-2000:]
    assert job.stderr.count("no such folder") == 1, job.stderr[-2000:]


def test_an_io_error_names_the_file_and_the_operation(tmp_path, monkeypatch):
    _, engine = run(tmp_path, steps=1, stage=2, offload=replace(NVME, sub_group_size=16))

    def failing(*args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    model = engine.model
    with pytest.raises(OffloadIOError, match=r"swap file .*exp_avg\.f32: read of \d+ bytes"):
        engine.train_step(model.contexts(1, 1, 1, 1)[:, 0], np.zeros((1, 1)))
    engine.close()


def test_a_killed_runs_swap_folder_is_found_and_removed(tmp_path):
    stale = tmp_path / "zero_ref_swap_r0_p999999999"
    stale.mkdir()
    (stale / "exp_avg.f32").write_bytes(b"\0" * 64)
    alive = tmp_path / f"zero_ref_swap_r0_p{os.getppid()}"  # a running process's: kept
    alive.mkdir()
    store = NvmeStore(str(tmp_path), 0, engine_ledger(), 0)
    assert store.stale == [stale] and not stale.exists() and alive.exists()
    store.close()


def engine_ledger():
    from zero_ref.engine.memory import MemoryLedger

    return MemoryLedger()


def test_swap_file_ranges_round_trip(tmp_path):
    swap = SwapFile(tmp_path / "x.f32", 10)
    swap.write_from(3, np.arange(4, dtype=np.float32))
    out = np.empty(5, np.float32)
    swap.read_into(2, out)
    assert out.tolist() == [0, 0, 1, 2, 3]
    assert swap.array[3:7].tolist() == [0, 1, 2, 3]  # the mapping sees the same bytes
    assert swap.offset_of(swap.array[4:6]) == 4
    swap.release()
    swap.close()
    assert not (tmp_path / "x.f32").exists()


def aligned(numel: int) -> np.ndarray:
    from zero_ref.engine.memory import MemoryLedger
    from zero_ref.engine.placement import HostPlacement

    return HostPlacement(MemoryLedger()).aligned_zeros("buffers", "b", numel, np.float32, 4096)


def test_aligned_ranges_go_around_the_page_cache_and_ragged_ends_through_it(tmp_path):
    swap = SwapFile(tmp_path / "x.f32", 10_000)
    if swap.direct_fd is None:
        swap.close()
        pytest.skip("this filesystem has no O_DIRECT")
    buf = aligned(4096)
    assert buf.__array_interface__["data"][0] % 4096 == 0
    buf[:] = np.arange(4096)
    swap.write_from(2048, buf)  # byte 8192, 16 KiB, from an aligned buffer: all direct
    assert swap.bytes_direct == buf.nbytes and not swap.cached_writes
    piece = buf[3:3003]  # address and file offset agree mod 4096: a ragged head and tail
    swap.write_from(3, piece)
    assert swap.cached_writes and 0 < swap.bytes_direct - buf.nbytes < piece.nbytes
    out = aligned(10_000)
    swap.read_into(0, out)
    expected = np.zeros(10_000, np.float32)
    expected[2048:6144] = np.arange(4096)
    expected[3:3003] = np.arange(3, 3003)
    assert np.array_equal(out, expected)
    assert np.array_equal(swap.array, expected)  # the mapping sees what O_DIRECT wrote
    unaligned = np.arange(2000, dtype=np.float32)[1:]  # address not as the offset: cached
    before = swap.bytes_direct
    swap.write_from(5, unaligned)
    swap.read_into(5, out[:1999])
    assert swap.bytes_direct == before and np.array_equal(out[:1999], unaligned)
    swap.release(mapped=False)
    assert not swap.cached_writes
    swap.close()


def test_a_filesystem_that_refuses_o_direct_after_all_gets_the_page_cache(tmp_path, monkeypatch):
    """EINVAL from the direct descriptor (another alignment wanted): the piece is moved
    through the page cache instead, and the file gives up O_DIRECT; nothing is lost."""
    swap = SwapFile(tmp_path / "x.f32", 4096)
    if swap.direct_fd is None:
        swap.close()
        pytest.skip("this filesystem has no O_DIRECT")
    refused, real = swap.direct_fd, os.pwritev

    def pwritev(fd, buffers, offset):
        if fd == refused:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    data = aligned(4096)
    data[:] = np.arange(4096)
    swap.write_from(0, data)
    assert swap.direct_fd is None and swap.bytes_direct == 0 and swap.cached_writes
    assert np.array_equal(swap.array, data)
    swap.close()


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_gradient_shard_on_disk_is_bitwise_the_in_ram_run(tmp_path, stage, precision):
    """With the optimizer on NVMe at stages 2-3 the gradient shard is a swap file too:
    none of it in RAM, its bytes on disk, accumulated over 3 micro-steps and clipped,
    bitwise the in-RAM run; the space check asks for every file's bytes, its own too."""
    from zero_ref.engine.memory import swap_file_bytes

    common = dict(stage=stage, precision=precision, grad_accum=3, clip=0.5)
    offload = replace(NVME, sub_group_size=64, buffer_count=3)
    if stage == 3:
        offload = replace(offload, param="nvme")
    in_ram, a = run(tmp_path, **common)
    offloaded, b = run(tmp_path, offload=offload, **common)
    assert np.array_equal(in_ram.view(np.uint8), offloaded.view(np.uint8))
    assert b.memory.bytes_by_category()["grads"] == 0
    assert b.memory.disk_bytes_by_category()["grads"] == a.memory.bytes_by_category()["grads"]
    files = sum(f.nbytes for f in b.nvme.files)
    asked = swap_file_bytes(
        stage, "nvme", offload.param, b.layout.shard_numel,
        b.precision.bytes,
    )  # fmt: skip
    assert asked == files
    a.close()
    b.close()


def test_stage1_gradients_stay_in_ram(tmp_path):
    """Stage 1's backward writes a full gradient buffer: its gradients stay in RAM."""
    _, engine = run(tmp_path, steps=1, stage=1, grad_accum=2, offload=NVME)
    assert engine.memory.disk_bytes_by_category()["grads"] == 0
    assert engine.memory.bytes_by_category()["grads"] > 0
    engine.close()


def mapped_resident_bytes(array: np.ndarray) -> int:
    """Bytes of a swap file's mapping resident in this process (/proc/self/smaps' Rss)."""
    start, mapping = array.__array_interface__["data"][0], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0] if line.split() else ""
        if "-" in first and all(c in "0123456789abcdef-" for c in first):
            mapping = int(first.split("-")[0], 16)
        elif mapping == start and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("the swap file's mapping is not in /proc/self/smaps")


def test_no_parameter_page_stays_mapped_after_forward_and_backward(tmp_path):
    """Each gather reads a unit's slice through the mapping; the kernel's fault-around
    also maps the prefetched neighbours' pages near its ends: after forward and backward
    none of the parameter file is left in this process (it was, a few pages per unit
    boundary, until the optimizer step)."""
    units = [(f"u{i}", [("w", (300, 1001))]) for i in range(8)]  # 1.2 MB, off the pages
    model = ReplayModel(units)
    config = ZeroConfig(
        stage=3, offload=OffloadConfig(param="nvme", optimizer="nvme", nvme_path=str(tmp_path))
    )
    engine = make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))
    engine.train_step(model.contexts(1, 0, 1, 1)[:, 0], np.zeros((1, 1)))
    engine.forward_backward(model.contexts(1, 1, 1, 1)[0, 0], np.zeros(1), 0)
    assert mapped_resident_bytes(engine.shard_params) == 0
    engine.close()
