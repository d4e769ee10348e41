"""What a run writes and prints: output paths checked before the first step, a
metrics log that is live and survives a dead run, stale temporaries cleaned up,
and --quiet hiding progress only (warnings and asked-for results still print)."""

from __future__ import annotations

import os

import pytest

from tests.mpi_pool import mpi_env, mpirun_command, run_watched
from zero_ref.app.cli import UsageError, parse_args
from zero_ref.app.output_paths import check_output_paths, remove_stale_temporaries
from zero_ref.io.metrics_log import JsonlLog, read_jsonl

MLP = ("--model", "mlp", "--steps", "6", "--batch-size", "8", "--sample-chars", "0")


def train(world: int, *flags: str, env: dict | None = None):
    return run_watched(mpirun_command(world, "-m", "zero_ref.train", *MLP, *flags), env=env)


# ---- output paths, before any work


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--export", "/nonexistent/dir/x.safetensors"],
            "the folder /nonexistent/dir does not exist",
        ),
        (["--export", "{tmp}/x.npz"], "the extension must be .safetensors"),
        (["--log-jsonl", "{tmp}/log.txt"], "the extension must be .jsonl"),
        (["--log-jsonl", "{tmp}"], "the extension must be .jsonl"),
        (["--log-jsonl", "{tmp}/sub.jsonl"], "is a folder"),
    ],
)
def test_bad_output_paths_are_refused_before_training(flags, message, tmp_path):
    (tmp_path / "sub.jsonl").mkdir()
    flags = [f.format(tmp=tmp_path) for f in flags]
    with pytest.raises(UsageError, match=message):
        check_output_paths(parse_args(flags).run)


def test_an_unwritable_export_fails_in_seconds_with_one_message():
    job = train(4, "--steps", "100000", "--export", "/nonexistent/dir/x.safetensors")
    assert job.returncode == 2
    assert job.stderr.count("does not exist") == 1, job.stderr
    assert "step" not in job.stdout and "Traceback" not in job.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_folder_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    with pytest.raises(UsageError, match="not writable"):
        check_output_paths(parse_args(["--export", str(tmp_path / "x.safetensors")]).run)


# ---- the metrics log


def test_the_log_is_written_at_its_real_path_as_steps_end(tmp_path):
    path = tmp_path / "log.jsonl"
    log = JsonlLog(path)
    log.write({"step": 1})
    assert read_jsonl(path) == [{"step": 1}]  # visible before the run ends: tail -f works
    log.write({"step": 2})
    assert log.close() == path and read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_line_cut_short_is_skipped(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_jsonl(path) == [{"step": 1}, {"step": 2}]


def test_a_killed_run_keeps_every_step_it_logged(tmp_path):
    log = tmp_path / "run.jsonl"
    env = {**mpi_env(), "ZERO_REF_INJECT_FAULT": "kill:rank=1:step=5"}
    job = train(4, "--log-jsonl", str(log), env=env)
    assert job.returncode != 0
    assert [r["step"] for r in read_jsonl(log)] == [1, 2, 3, 4]


def test_stale_temporaries_are_removed_at_the_next_start(tmp_path):
    export = tmp_path / "model.safetensors"
    dead = 2**22 + 12345  # above the kernel's default pid_max: no such process
    stale = [tmp_path / f".model.safetensors.tmp-{dead}", tmp_path / f".run.jsonl.partial-{dead}"]
    mine = tmp_path / f".model.safetensors.tmp-{os.getpid()}"  # a live writer's: kept
    for p in [*stale, mine]:
        p.write_bytes(b"half")
    assert remove_stale_temporaries(export) == [stale[0]]
    assert not stale[0].exists() and mine.exists()
    job = train(2, "--export", str(export), "--log-jsonl", str(tmp_path / "run.jsonl"))
    assert job.returncode == 0, job.stderr
    assert f"removed {stale[1]}" in job.stdout and not stale[1].exists()


# ---- --quiet hides progress, never warnings or results


def test_quiet_keeps_config_warnings_and_the_oracle_summary(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"bogus_key_xyz": 1, "wall_clock_breakdown": true, "steps_per_print": 10}')
    job = train(2, "--quiet", "--config", str(config), "--check-oracle", "--deterministic")
    assert job.returncode == 0, job.stderr
    out = job.stdout
    assert "unknown key bogus_key_xyz" in out
    assert "wall_clock_breakdown is accepted, no effect here" in out
    assert "steps_per_print is accepted, no effect here" in out
    assert "oracle check: 6 steps" in out and "bitwise" in out
    assert "loss" not in out.split("oracle check")[0]  # no progress lines
