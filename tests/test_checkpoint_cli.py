"""Checkpoints end to end, through `python -m zero_ref.train` and
`python -m zero_ref.app.consolidate` (docs/checkpoints.md).

A run of 2k steps and a run stopped after k steps and resumed for k more (at
another stage) export the same bits; a save killed half-way, or between its
rename and `latest`, leaves the previous checkpoint loadable; a damaged or
foreign checkpoint is one message from rank 0 and exit 2; consolidation writes
what --export writes. tests/test_checkpoint_parity.py proves the same resumes
against the oracle in-process; here it is the command line, its files and its
messages.

The jobs are tiny (a 2-layer GPT of 10,016 parameters, 6 steps, 2-3 ranks) and
share their runs through module-scoped fixtures: mpirun's start-up, not the
training, is what they cost."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.mpi_pool import REPO, Finished, mpi_env, mpirun_command, run_watched
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.io.tensor_io import load_named

MODEL = ["--model", "gpt", "--d-model", "16", "--n-layer", "2", "--n-head", "2", "--context", "8"]
# cosine schedule, accumulation and clipping: everything a resume must carry over
RUN = [
    "--steps",
    "6",
    "--deterministic",
    "--quiet",
    "--sample-chars",
    "0",
    "--lr-schedule",
    "cosine",
    "--grad-accum",
    "2",
    "--clip",
    "0.5",
]
FLAGS = [*MODEL, *RUN, "--batch-size", "8"]
STEPS, STOP = 6, 3
FAULT_FIRED = "zero_ref fault:"  # the line a fault prints as it fires
ERROR = "zero_ref.train: error:"


def train(world: int, *flags: str, env: dict[str, str] | None = None) -> Finished:
    cmd = mpirun_command(world, "-m", "zero_ref.train", *flags)
    if env is None:
        return run_watched(cmd)
    # a killed rank ends the job: it must end soon after the fault, not hang
    return run_watched(cmd, env={**mpi_env(), **env}, end_after=(FAULT_FIRED, 60.0))


def consolidate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zero_ref.app.consolidate", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ok(p: Finished | subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


def assert_bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32, name
        assert a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


def step_records(log: Path) -> list[dict]:
    """The per-step records of a JSONL log (not the resume, save or final ones)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in records if "loss" in r and not r.get("final")]


def latest(folder: Path) -> str:
    return (folder / "latest").read_text().strip()


def one_error(p: Finished) -> str:
    """The single error line rank 0 printed for a job refused with exit 2."""
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    assert p.stderr.count(ERROR) == 1, p.stderr
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    return next(line for line in p.stderr.splitlines() if ERROR in line)


@dataclass
class Baseline:
    """One uninterrupted 6-step run: its export, its log and its checkpoints."""

    export: Path
    log: Path
    saves: Path
    run: Finished


@dataclass
class Split:
    """The first half of a split run: 3 steps at 2 ranks, stage 3, then saved."""

    saves: Path
    log: Path
    run: Finished


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Baseline:
    d = tmp_path_factory.mktemp("baseline")
    export, log, saves = d / "full.safetensors", d / "full.jsonl", d / "ck"
    p = train(
        2,
        *FLAGS,
        "--stage",
        "2",
        "--export",
        str(export),
        "--log-jsonl",
        str(log),
        "--save-dir",
        str(saves),
        "--save-every",
        "2",
        "--keep-last",
        "2",
    )
    ok(p)
    return Baseline(export, log, saves, p)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Split:
    d = tmp_path_factory.mktemp("split")
    saves, log = d / "ck", d / "split.jsonl"
    p = train(
        2,
        *FLAGS,
        "--stage",
        "3",
        "--save-dir",
        str(saves),
        "--stop-at-step",
        str(STOP),
        "--log-jsonl",
        str(log),
    )
    ok(p)
    return Split(saves, log, p)


# ---- exact resume


def test_k_plus_k_steps_through_the_cli_equal_2k_steps_bitwise(baseline, split, tmp_path):
    assert latest(split.saves) == "step_000003"
    assert [r["step"] for r in step_records(split.log)] == [1, 2, 3]
    export = tmp_path / "resumed.safetensors"
    p = train(
        2,
        *FLAGS,
        "--stage",
        "1",
        "--resume",
        str(split.saves),
        "--log-jsonl",
        str(split.log),
        "--export",
        str(export),
    )
    ok(p)
    assert "resuming from" in p.stdout and "after step 3" in p.stdout  # shown with --quiet too
    assert_bitwise_equal(load_named(export), load_named(baseline.export))
    resumed, single = step_records(split.log), step_records(baseline.log)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in single]
    assert [r["lr"] for r in resumed] == [r["lr"] for r in single]
    assert json.loads(split.log.read_text().splitlines()[-1])["final"]


def test_resume_at_three_ranks_and_stage_0_passes_the_oracle(split):
    """Saved by 2 ranks at stage 3, resumed by 3 at stage 0: the oracle starts from the
    restored parameters, m, v and step count and must agree bitwise at every step.
    (8 does not split over 3 ranks x 2 micro-steps, so the batch is given per rank.)"""
    p = train(
        3,
        *MODEL,
        *RUN,
        "--micro-batch-size",
        "2",
        "--stage",
        "0",
        "--resume",
        str(split.saves / "step_000003"),
        "--check-oracle",
    )
    ok(p)
    assert "saved by 2 ranks at stage 3; now 3 ranks at stage 0" in p.stdout
    assert f"oracle check: {STEPS - STOP} steps" in p.stdout, p.stdout
    assert "bitwise equal" in p.stdout


# ---- saves and kills


def test_keep_last_keeps_the_newest_tags(baseline):
    """--save-every 2 --keep-last 2 over 6 steps: saves 2, 4, 6 and keeps 4 and 6."""
    tags = sorted(p.name for p in baseline.saves.iterdir())
    assert tags == ["latest", "step_000004", "step_000006"]
    assert latest(baseline.saves) == "step_000006"
    assert Checkpoint(baseline.saves).step == STEPS


def test_killed_saves_leave_the_previous_checkpoint_and_a_resume_finishes(baseline, tmp_path):
    saves = tmp_path / "ck"
    save = ["--save-dir", str(saves), "--save-every", "2"]
    # 1. rank 0 dies after step 4's tag folder is in place, before `latest` names it
    p = train(
        2,
        *FLAGS,
        *save,
        "--stage",
        "1",
        "--stop-at-step",
        "4",
        env={"ZERO_REF_INJECT_FAULT": "publish_kill:rank=0:step=4"},
    )
    assert p.returncode != 0 and FAULT_FIRED in p.stderr, p.stderr
    assert latest(saves) == "step_000002"
    published = Checkpoint(saves / "step_000004")
    assert published.step == 4 and published.verify(range(2)) == []

    # 2. resumed from `latest` (step 2); rank 1 dies half-way through its file in step 4's save
    p = train(
        2,
        *FLAGS,
        *save,
        "--stage",
        "3",
        "--resume",
        str(saves),
        env={"ZERO_REF_INJECT_FAULT": "save_kill:rank=1:step=4"},
    )
    assert p.returncode != 0 and FAULT_FIRED in p.stderr, p.stderr
    assert "resuming from" in p.stdout and "after step 2" in p.stdout
    assert latest(saves) == "step_000002"
    assert (saves / ".step_000004.partial").is_dir()
    previous = Checkpoint(saves)
    assert previous.step == 2 and previous.verify(range(2)) == []

    # 3. resumed from `latest` again: cleans up, saves 4 (replacing job 1's tag) and 6, and
    #    ends where the uninterrupted run ended
    export = tmp_path / "resumed.safetensors"
    p = train(2, *FLAGS, *save, "--stage", "2", "--resume", str(saves), "--export", str(export))
    ok(p)
    assert "removed .step_000004.partial, left by a save that was killed" in p.stdout  # --quiet
    assert sorted(p.name for p in saves.iterdir()) == [
        "latest",
        "step_000002",
        "step_000004",
        "step_000006",
    ]
    assert latest(saves) == "step_000006"
    assert_bitwise_equal(load_named(export), load_named(baseline.export))


# ---- bad checkpoints and bad flags


def _rank_file(tag: Path) -> Path:
    return tag / "rank_00001.safetensors"


def _edit_manifest(tag: Path, edit) -> Path:
    path = tag / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    return path


def missing(tag: Path) -> Path:
    _rank_file(tag).unlink()
    return _rank_file(tag)


def truncated(tag: Path) -> Path:
    path = _rank_file(tag)
    path.write_bytes(path.read_bytes()[:-100])
    return path


def one_bit_flipped(tag: Path) -> Path:
    path = _rank_file(tag)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # in the tensors, not the header: only the CRC-32 sees it
    path.write_bytes(bytes(data))
    return path


def format_version_2(tag: Path) -> Path:
    return _edit_manifest(tag, lambda m: m.update(format_version=2))


def not_json(tag: Path) -> Path:
    path = tag / "manifest.json"
    path.write_text(path.read_text()[:-40])  # cut off mid-object
    return path


def layout_edited(tag: Path) -> Path:
    def edit(m: dict) -> None:
        m["layout"]["units"][1]["tensors"][0]["offset"] += 4

    return _edit_manifest(tag, edit)


@pytest.mark.parametrize(
    "damage, what",
    [
        (missing, "missing"),
        (truncated, "truncated"),
        (one_bit_flipped, "CRC-32"),
        (format_version_2, "format version 2"),
        (not_json, "not valid JSON"),
        (layout_edited, "the layout's offsets or sizes are not those of its own tensors"),
    ],
)
def test_a_damaged_checkpoint_is_one_message_naming_the_file(split, damage, what, tmp_path):
    tag = tmp_path / "step_000003"
    shutil.copytree(split.saves / "step_000003", tag)
    bad = damage(tag)
    p = train(2, *FLAGS, "--resume", str(tag))
    line = one_error(p)
    assert str(bad) in line and what in line, line


def test_a_checkpoint_of_another_model_names_the_tensor_and_the_flag(split):
    flags = [*FLAGS]
    flags[flags.index("--d-model") + 1] = "8"
    line = one_error(train(2, *flags, "--resume", str(split.saves)))
    assert "saved for another model" in line and str(split.saves / "step_000003") in line
    tensor = r"embed\.token\.weight \(\d+, 16\) there, embed\.token\.weight \(\d+, 8\) here"
    assert re.search(tensor, line), line
    assert "--d-model 16 there, 8 here" in line, line


def test_a_resume_past_the_run_is_refused_and_one_at_its_end_trains_nothing(split, tmp_path):
    flags = [*FLAGS]
    flags[flags.index("--steps") + 1] = "2"  # the checkpoint is after step 3
    line = one_error(train(2, *flags, "--resume", str(split.saves)))
    assert "saved after step 3, past --steps 2" in line, line
    saves = tmp_path / "ck"
    shutil.copytree(split.saves, saves)
    before = sorted(p.name for p in saves.iterdir())
    p = train(2, *FLAGS, "--stop-at-step", "3", "--resume", str(saves), "--save-dir", str(saves))
    ok(p)
    assert "nothing to train" in p.stdout + p.stderr
    assert sorted(q.name for q in saves.iterdir()) == before  # nothing saved again


def test_latest_still_loads_after_a_kill_inside_a_same_step_save(split, tmp_path):
    """A kill between _publish's two renames leaves the tag as .step_X.replaced:
    --resume reads it there (and the next save puts it back)."""
    saves = tmp_path / "ck"
    shutil.copytree(split.saves, saves)
    (saves / "step_000003").rename(saves / ".step_000003.replaced")
    assert Checkpoint(saves).folder.name == ".step_000003.replaced"
    ok(train(2, *FLAGS, "--stage", "1", "--resume", str(saves), "--save-dir", str(saves)))
    assert latest(saves) == "step_000006"
    assert (saves / "step_000003").is_dir() and not (saves / ".step_000003.replaced").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--resume", "ck", "--init", "x.safetensors"], "--resume and --init both give"),
        (["--save-every", "2"], "--save-every needs --save-dir"),
        (["--stop-at-step", "7"], "--stop-at-step 7 is past --steps 6"),
        (["--save-dir", "{file}"], "is a file; give a folder"),
    ],
)
def test_bad_checkpoint_flags_are_one_message(flags, message, tmp_path):
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("")
    flags = [f.replace("{file}", str(a_file)) for f in flags]
    line = one_error(train(2, *FLAGS, *flags))
    assert message in line, line


# ---- consolidation


def test_consolidate_writes_what_export_writes(baseline, tmp_path):
    out = tmp_path / "weights.safetensors"
    p = consolidate(baseline.saves, out, "--json")
    ok(p)
    report = json.loads(p.stdout)
    assert report["step"] == STEPS and report["saved_world_size"] == 2
    exported = load_named(baseline.export)
    assert report["tensors"] == len(exported)
    assert_bitwise_equal(load_named(out), exported)
    assert_bitwise_equal(load_file(str(out)), exported)  # the safetensors library reads it

    both = tmp_path / "with_adam.safetensors"
    ok(consolidate(baseline.saves / "step_000006", both, "--optimizer-states", "--window", "7"))
    states = load_file(str(both))
    names = sorted(exported)
    assert sorted(states) == sorted(
        [*names, *(f"exp_avg.{n}" for n in names), *(f"exp_avg_sq.{n}" for n in names)]
    )
    assert_bitwise_equal({n: states[n] for n in names}, exported)
    for n in names:
        assert states[f"exp_avg.{n}"].shape == exported[n].shape
        assert (states[f"exp_avg_sq.{n}"] >= 0).all()
    assert any(np.any(states[f"exp_avg_sq.{n}"] > 0) for n in names)

    # --init takes it back: one step at learning rate 0 changes nothing, so the export
    # after it is the consolidated file, at another world size and stage
    back = tmp_path / "back.safetensors"
    p = train(
        3,
        *MODEL,
        "--stage",
        "3",
        "--steps",
        "1",
        "--lr",
        "0",
        "--min-lr",
        "0",
        "--batch-size",
        "6",
        "--quiet",
        "--sample-chars",
        "0",
        "--init",
        str(out),
        "--export",
        str(back),
    )
    ok(p)
    assert_bitwise_equal(load_named(back), exported)


def test_consolidate_refuses_a_damaged_checkpoint_and_another_format(baseline, tmp_path):
    tag = tmp_path / "step_000006"
    shutil.copytree(baseline.saves / "step_000006", tag)
    bad = one_bit_flipped(tag)
    out = tmp_path / "weights.safetensors"
    p = consolidate(tag, out)
    assert p.returncode == 2, p.stderr
    assert str(bad) in p.stderr and "CRC-32" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()

    npz = tmp_path / "weights.npz"
    p = consolidate(baseline.saves, npz)
    assert p.returncode == 2 and "must be a .safetensors file" in p.stderr, p.stderr
    assert not npz.exists()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["step_000006"]  # no temporaries


def test_a_manifest_file_entry_without_its_crc_is_refused_by_name(baseline, tmp_path):
    tag = tmp_path / "step_000006"
    shutil.copytree(baseline.saves / "step_000006", tag)
    manifest = _edit_manifest(tag, lambda m: m["files"][1].pop("crc32"))
    p = consolidate(tag, tmp_path / "weights.safetensors")
    assert p.returncode == 2 and str(manifest) in p.stderr and "Traceback" not in p.stderr
