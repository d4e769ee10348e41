"""Bad input that used to cost a run or a checkpoint (issue 21, item 5): an output
path inside a checkpoint, a save folder too small, NVMe swap space shared by the
ranks of a host, and the CPU path's `offload_optimizer.device: cpu`.

Where a small filesystem is what is tested, it is a real one: a tmpfs of a few
hundred KiB mounted for the test (root only; elsewhere the test is skipped and
says why). The free-space hooks the production code exposes (`free_bytes`) are
used where a number, not a filesystem, is the point."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from mpi4py import MPI

from tests.mpi_pool import REPO, mpirun_command, run_watched
from zero_ref.app.cli import UsageError, parse_args
from zero_ref.app.failure import FailureGuard, step_started
from zero_ref.app.output_paths import check_output_paths
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.space import run_peak, save_steps
from zero_ref.engine.memory import MemoryLedger  # before offload.nvme: engine imports it
from zero_ref.offload.nvme import (
    NvmeStore,
    Sharer,
    check_shared_space,
    check_space,
    sharing_ranks,
)
from zero_ref.offload.swap_file import OffloadIOError, OffloadSetupError

GPT = ["--model", "gpt", "--d-model", "16", "--n-layer", "2", "--n-head", "2", "--context", "8"]
QUIET = ["--batch-size", "8", "--quiet", "--sample-chars", "0"]
DEAD_PID = 999_999_999  # above any pid_max: no such process
ERROR = "zero_ref.train: error:"


def train(world: int, *flags: str):
    return run_watched(mpirun_command(world, "-m", "zero_ref.train", *flags))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def small_tmpfs(folder: Path, size: str):
    """A tmpfs of `size` at `folder` (made), unmounted at the end; skips the test,
    saying why, where this process cannot mount one (not root, no mount syscall)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        reason = f"cannot mount a {size} tmpfs here: {done.stderr.strip() or done.returncode}"
        print(reason)
        pytest.skip(reason)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


# ---- 1. an output path inside a checkpoint


def fake_checkpoint(tmp_path: Path) -> Path:
    """ckpt/latest naming step_000003, which holds a rank file and a manifest: enough
    for the path checks, which run before any checkpoint is opened."""
    ckpt = tmp_path / "ckpt"
    tag = ckpt / "step_000003"
    tag.mkdir(parents=True)
    (ckpt / "latest").write_text("step_000003\n")
    (tag / "rank_00000.safetensors").write_bytes(b"rank file")
    (tag / "manifest.json").write_text("{}")
    return ckpt


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--resume", "ckpt", "--export", "ckpt/step_000003/rank_00000.safetensors"],
            "lies inside the checkpoint --resume ckpt",
        ),
        (
            ["--resume", "ckpt/step_000003", "--trace", "ckpt/step_000003/manifest.json"],
            "lies inside the checkpoint --resume ckpt/step_000003",
        ),
        (
            ["--resume", "ckpt", "--export", "link/rank_00000.safetensors"],  # a folder link
            "lies inside the checkpoint --resume ckpt",
        ),
        (["--resume", "ckpt", "--export", "alias.safetensors"], "--resume ckpt"),  # a file link
        (
            ["--resume", "ckpt", "--export", "other/../ckpt/step_000003/rank_00000.safetensors"],
            "lies inside the checkpoint --resume ckpt",
        ),
        (["--save-dir", "ckpt", "--log-jsonl", "ckpt/log.jsonl"], "checkpoint --save-dir ckpt"),
        (
            ["--resume", "ckpt", "--save-dir", "ckpt/step_000003"],
            "--save-dir ckpt/step_000003: lies inside the checkpoint --resume ckpt (tag",
        ),
    ],
)
def test_an_output_inside_a_checkpoint_is_refused(tmp_path, monkeypatch, flags, message):
    ckpt = fake_checkpoint(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(ckpt / "step_000003")
    (tmp_path / "alias.safetensors").symlink_to(ckpt / "step_000003" / "rank_00000.safetensors")
    monkeypatch.chdir(tmp_path)
    run = parse_args(["--model", "mlp", *flags], world_size=2).run
    with pytest.raises(UsageError, match="writing there would destroy it") as refused:
        check_output_paths(run)
    assert message in str(refused.value)


def test_outputs_beside_a_checkpoint_are_allowed(tmp_path, monkeypatch):
    """Saving into the folder resumed from is how a run goes on; outputs beside it."""
    fake_checkpoint(tmp_path)
    monkeypatch.chdir(tmp_path)
    flags = ["--resume", "ckpt", "--save-dir", "ckpt", "--export", "ckpt_export.safetensors"]
    check_output_paths(parse_args(["--model", "mlp", *flags, "--log-jsonl", "x.jsonl"], 2).run)


def test_export_and_consolidate_into_a_rank_file_leave_the_checkpoint_intact(tmp_path):
    """The outside check: both used to replace the rank file, with exit 0."""
    ckpt = tmp_path / "ckpt"
    saved = train(2, *GPT, *QUIET, "--steps", "2", "--save-dir", str(ckpt))
    assert saved.returncode == 0, saved.stderr[-2000:]
    rank_file = ckpt / "step_000002" / "rank_00000.safetensors"
    before = digest(rank_file)
    again = ["--steps", "3", "--resume", str(ckpt), "--export", str(rank_file)]
    job = train(2, *GPT, *QUIET, *again)
    assert job.returncode == 2, job.stderr[-2000:]
    assert job.stderr.count(ERROR) == 1 and "lies inside the checkpoint" in job.stderr
    assert str(rank_file) in job.stderr and "Traceback" not in job.stderr
    out = subprocess.run(
        [sys.executable, "-m", "zero_ref.app.consolidate", str(ckpt), str(rank_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "lies inside the checkpoint" in out.stderr, out.stderr
    assert digest(rank_file) == before
    assert Checkpoint(ckpt).verify(range(2)) == []


# ---- 2. a save folder too small


def test_a_save_folder_too_small_is_refused_before_the_first_step(tmp_path):
    with small_tmpfs(tmp_path / "small", "64k") as small:
        job = train(2, *GPT, *QUIET, "--steps", "2", "--save-dir", str(small / "ckpt"))
        assert job.returncode == 2, job.stderr[-2000:]
        assert job.stderr.count(ERROR) == 1, job.stderr[-2000:]
        assert "bytes free, a checkpoint after step 2 needs" in job.stderr
        assert "Traceback" not in job.stderr and "memory" not in job.stdout  # nothing ran
        assert list((small / "ckpt").iterdir()) == []


def test_a_run_whose_saves_do_not_fit_together_is_refused_before_the_first_step(tmp_path):
    """Room for one save (about 130 KiB at 2 ranks of this model), not two: the second
    save is written while the first is still there (--keep-last prunes only after it
    is published). This used to pass the first check and fail at step 2, its steps
    lost; the same run fits where two saves do (the third replaces the first)."""
    flags = ["--steps", "3", "--save-every", "1", "--keep-last", "1"]
    with small_tmpfs(tmp_path / "small", "200k") as small:
        job = train(2, *GPT, *QUIET, *flags, "--save-dir", str(small / "ckpt"))
        assert job.returncode == 2, job.stderr[-2000:]
        assert job.stderr.count(ERROR) == 1 and "Traceback" not in job.stderr, job.stderr
        assert "this run's 3 checkpoint(s) (--keep-last 1) need" in job.stderr, job.stderr
        assert "bytes more than there is: the one after step 2 is written while 1 older" in (
            job.stderr
        )
        assert list((small / "ckpt").iterdir()) == []
    with small_tmpfs(tmp_path / "room", "320k") as room:
        job = train(2, *GPT, *QUIET, *flags, "--save-dir", str(room / "ckpt"))
        assert job.returncode == 0, job.stderr[-2000:]
        assert sorted(p.name for p in (room / "ckpt").iterdir()) == ["latest", "step_000003"]


def test_every_ranks_file_counts_in_the_room_a_save_needs(mpi_pools, tmp_path):
    """At 2 and 3 ranks the save's bytes on disk (every rank's file, the manifest and
    `latest`) are what the check asked for, to within a block."""
    from tests.test_parity import MLP, pinned, run

    block = os.statvfs(tmp_path).f_frsize
    for world in (2, 3):
        folder = tmp_path / f"w{world}"
        result = run(mpi_pools, pinned(MLP, world=world, steps=1, lrs=[None], save_to=str(folder)))
        files = list(folder.rglob("*.safetensors"))
        assert len(files) == world
        taken = sum(p.stat().st_blocks * 512 for p in folder.rglob("*"))
        assert taken <= result["save_need"] <= taken + block


def test_the_space_a_save_needs_covers_what_it_writes(tmp_path):
    """From the layout alone, before anything is written: at least the blocks the
    save then takes, and at most one block over; free_bytes decides."""
    from zero_ref.checkpoint.space import SaveSpaceError, check_save_space
    from zero_ref.checkpoint.writer import save_checkpoint

    engine = tiny_engine()
    training = {"note": "x" * 500}
    need = check_save_space(engine, tmp_path, 7, training)
    save_checkpoint(engine, tmp_path / "ckpt", 7, training)
    # the tag folder, its files and `latest`, in blocks (a folder takes none on tmpfs)
    taken = sum(p.stat().st_blocks * 512 for p in (tmp_path / "ckpt").rglob("*"))
    block = os.statvfs(tmp_path).f_frsize
    assert taken <= need <= taken + block
    check_save_space(engine, tmp_path, 7, training, free_bytes=lambda _: need)
    with pytest.raises(SaveSpaceError, match=f"{need - 1:,} bytes free, .* needs {need:,}"):
        check_save_space(engine, tmp_path, 7, training, free_bytes=lambda _: need - 1)
    # what a killed save or prune left is removed by the next save first: it counts as
    # free, and nothing else does
    for name in (".step_000008.partial", ".step_000002.pruned", ".step_000009.other"):
        leftover = tmp_path / "ckpt" / name
        leftover.mkdir()
        (leftover / "rank_00000.safetensors").write_bytes(b"\1" * block)
    short = lambda _: need - 2 * block  # noqa: E731 (the two leftovers make up for it)
    check_save_space(engine, tmp_path / "ckpt", 7, training, free_bytes=short)
    shorter = lambda _: need - 3 * block  # noqa: E731 (the third one is no save's)
    with pytest.raises(SaveSpaceError):
        check_save_space(engine, tmp_path / "ckpt", 7, training, free_bytes=shorter)
    engine.close()


@pytest.mark.parametrize(
    "first, last, every, steps",
    [(0, 3, 1, [1, 2, 3]), (0, 5, 2, [2, 4, 5]), (2, 6, 4, [4, 6]), (0, 4, None, [4])]
    + [(3, 3, 1, []), (4, 8, 4, [8]), (0, 1, 1, [1]), (0, 1, 5, [1])],
)
def test_the_steps_a_run_saves_after(first, last, every, steps):
    assert save_steps(first, last, every) == steps


@pytest.mark.parametrize(
    "steps, on_disk, keep_last, peak",
    [
        ([1, 2, 3], {}, None, (30, 3, 2)),  # every save stays
        ([1, 2, 3], {}, 1, (20, 2, 1)),  # the second is written beside the first
        ([1, 2, 3], {}, 2, (30, 3, 2)),
        ([1, 2, 3], {}, 3, (30, 3, 2)),
        ([1], {}, 1, (10, 1, 0)),
        ([6, 7], {5: 10}, 1, (10, 6, 1)),  # a resume: the old tag is pruned after step 6
        ([6, 7], {5: 10, 4: 10}, 2, (10, 6, 2)),
        ([6, 7], {6: 10}, None, (10, 6, 0)),  # step 6 saved again: replaced once published
        ([6, 8], {7: 25}, 2, (20, 8, 2)),  # a later tag is kept once the run passes it
        ([6, 8], {7: 25}, 1, (20, 8, 2)),  # (pruned only after step 8's save)
        ([6, 8, 10], {7: 25}, 1, (20, 8, 2)),
    ],
)
def test_the_room_a_run_needs_is_its_saves_on_disk_at_once(steps, on_disk, keep_last, peak):
    assert tuple(run_peak(steps, 10, on_disk, keep_last)) == peak


def test_the_whole_run_check_names_the_missing_room(tmp_path):
    from zero_ref.checkpoint.space import SaveSpaceError, check_run_space, save_bytes

    engine = tiny_engine()
    block = os.statvfs(tmp_path).f_frsize
    one = save_bytes(engine, 9, {}, block)
    (tmp_path / "step_000001").mkdir()  # an older checkpoint of 2 blocks: kept beside
    (tmp_path / "step_000001" / "rank_00000.safetensors").write_bytes(b"\1" * 2 * block)
    steps, need = [3, 6, 9], 2 * one - 2 * block  # step 1's tag is pruned after step 3's
    peak = check_run_space(engine, tmp_path, steps, 1, {}, free_bytes=lambda _: need)
    assert tuple(peak) == (need, 6, 1)
    with pytest.raises(SaveSpaceError) as refused:
        check_run_space(engine, tmp_path, steps, 1, {}, free_bytes=lambda _: need - 5)
    message = str(refused.value)
    assert f"{need - 5:,} bytes free, but this run's 3 checkpoint(s) (--keep-last 1)" in message
    assert f"need {need:,} at once, 5 bytes more than there is" in message
    assert "the one after step 6 is written while 1 older one(s) are still on disk" in message
    with pytest.raises(SaveSpaceError, match="3 checkpoint.s. .all of them. need"):
        check_run_space(engine, tmp_path, steps, None, {}, free_bytes=lambda _: 3 * one - 1)
    engine.close()


def tiny_engine():
    """A one-rank engine of two small units (COMM_SELF): what a save of it writes."""
    from zero_ref.comm.choose import comm_for
    from zero_ref.config import ZeroConfig
    from zero_ref.engine.ladder import make_engine
    from zero_ref.models.unit import init_params
    from zero_ref.testing.replay import ReplayModel

    model = ReplayModel([("u0", [("w", (30, 50)), ("s", ())]), ("u1", [("b", (70,))])])
    config = ZeroConfig(stage=2)
    return make_engine(model, init_params(model, 0), config, comm_for(MPI.COMM_SELF, config))


# ---- 3. NVMe swap space shared by the ranks of a host


def test_swap_space_is_checked_for_all_ranks_sharing_the_folder(tmp_path):
    """Each rank's 658 KB fits the 1 MiB filesystem; the two ranks' 1.3 MB do not.
    This used to pass the check and fail the first write with a traceback, leaving
    the swap folders behind."""
    with small_tmpfs(tmp_path / "swap", "1m") as swap:
        flags = ["--model", "mlp", "--d-hidden", "256", "--d-embed", "64", "--steps", "1"]
        flags += ["--stage", "2", "--offload-optimizer", "nvme", "--nvme-path", str(swap)]
        job = train(2, *flags, *QUIET)
        assert job.returncode == 2, job.stderr[-2000:]
        assert job.stderr.count(ERROR) == 1 and "Traceback" not in job.stderr, job.stderr
        assert "1,048,576 bytes free, the swap files of the 2 rank(s)" in job.stderr
        assert list(swap.iterdir()) == []


def test_a_dead_runs_swap_folders_are_removed_before_the_space_is_measured(tmp_path):
    """A killed 4-rank run's rank-3 folder fills the disk; a 1-rank run on it must
    find the room it frees (it used to see 0 bytes free and remove only rank 0's)."""
    with small_tmpfs(tmp_path / "swap", "1m") as swap:
        for comm in (None, MPI.COMM_SELF):
            stale = swap / f"zero_ref_swap_r3_p{DEAD_PID}"
            stale.mkdir()
            (stale / "exp_avg.f32").write_bytes(b"\0" * (1024 - 8) * 1024)
            store = NvmeStore(str(swap), 0, MemoryLedger(), 500_000, comm)
            assert store.stale == [stale] and not stale.exists()
            store.close()


def test_ranks_share_a_folder_by_host_and_filesystem():
    everyone = [Sharer("a", 1, 10), Sharer("a", 2, 20), Sharer("b", 1, 30), Sharer("a", 1, 40)]
    assert [sharing_ranks(everyone, r) for r in range(4)] == [[0, 3], [1], [2], [0, 3]]


def test_the_shared_check_takes_each_ranks_bytes_and_a_free_space_hook(tmp_path):
    free = lambda _: 1000  # noqa: E731
    folder, stale = check_shared_space(str(tmp_path), 1000, MPI.COMM_SELF, free)
    assert folder == tmp_path and stale == []
    with pytest.raises(OffloadSetupError, match="1,000 bytes free, .* need 1,001"):
        check_shared_space(str(tmp_path), 1001, MPI.COMM_SELF, free)


def test_a_failed_swap_write_on_a_full_disk_is_one_line(capfd):
    """The rank, the file and the bytes; no traceback (it was 93 lines); the job ends."""

    class OneRank:
        def Get_rank(self):  # noqa: N802 (mpi4py's names)
            return 0

        def Get_size(self):  # noqa: N802
            return 2

        def Dup(self):  # noqa: N802
            return self

        def Abort(self, code):  # noqa: N802
            raise SystemExit(f"aborted {code}")  # stands in for the end of the job

    message = "swap file /x/exp_avg.f32: write of 4096 bytes at byte 0 failed"
    with pytest.raises(SystemExit, match="aborted 1"), FailureGuard(OneRank(), "prog"):
        step_started(1)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise OffloadIOError(f"{message}: {e}") from e
    err = capfd.readouterr().err
    assert err.startswith("prog: rank 0 of 2 failed at step 1: OffloadIOError: " + message)
    assert err.count("\n") == 1 and "Traceback" not in err


# ---- 4. smaller


def test_cpu_offload_on_the_cpu_path_is_the_same_error_from_the_flag_and_the_key(tmp_path):
    import json

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}))
    common = ["--model", "mlp", "--stage", "2", "--precision", "bf16"]
    errors = []
    for flags in (["--offload-optimizer", "cpu"], ["--config", str(config)]):
        with pytest.raises(UsageError, match="needs device 'gpu'") as refused:
            parse_args([*common, *flags], world_size=2)
        errors.append(str(refused.value))
    assert errors[0] == errors[1]


def test_a_file_as_nvme_path_is_called_a_file(tmp_path):
    file = tmp_path / "swap.bin"
    file.write_bytes(b"")
    with pytest.raises(OffloadSetupError, match="is a file, not a folder"):
        check_space(str(file), 10)
    with pytest.raises(OffloadSetupError, match="is a file, not a folder"):
        check_shared_space(str(file), 10, MPI.COMM_SELF)
