"""--check-oracle in fast mode: a one-step bound that holds for any run length and
still catches real bugs at the step they happen (zero_ref/oracle/bound.py).

In-process, the oracle is raced against itself with the ranks summed in other
orders (each a legal MPI association): the bound must hold at every step. End
to end, 500 steps of a correct run never trip it, and an injected bug (one
rank's gradient dropped, a wrong bias correction) ends the run at that step."""

from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_pool import mpi_env, mpirun_command, run_watched
from zero_ref.config import AdamWConfig
from zero_ref.formulas.traffic import expected_sent_bytes
from zero_ref.io.metrics_log import read_jsonl
from zero_ref.oracle.bound import worst_violation
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.oracle_race import BUGS, race


@pytest.mark.parametrize("k, clip", [(1, None), (2, 1.0), (3, 0.05)])
def test_reordered_rank_sums_stay_inside_the_bound(k, clip):
    worst = race(k, clip, steps=60)
    assert 0 < worst < 1, worst  # 0 would mean the orders never differed: no test at all


@pytest.mark.parametrize("bug", BUGS.values(), ids=list(BUGS))
def test_a_real_bug_is_far_outside_the_bound_in_one_step(bug):
    assert race(2, 1.0, steps=1, mutate=bug) > 100


def test_bitwise_mode_names_any_last_bit_difference():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = a.copy()
    b[2] = np.nextafter(b[2], np.float32(4))
    v = worst_violation("parameter", b, a, None)
    assert v is not None and v.index == 2 and v.allowed == 0.0
    assert worst_violation("parameter", a, a.copy(), None) is None


def test_oracle_locates_flat_elements_by_name_and_index():
    oracle = Oracle(
        {"w": np.zeros((3, 2), np.float32), "s": np.zeros((), np.float32)}, AdamWConfig()
    )
    assert oracle.locate(0) == "w[0, 0]" and oracle.locate(5) == "w[2, 1]"
    assert oracle.locate(6) == "s[]"


# ---- end to end, 4 ranks

SMALL = ("--n-layer", "1", "--d-model", "32", "--n-head", "2", "--context", "16")
FLAGS = (*SMALL, "--batch-size", "8", "--lr", "3e-3", "--lr-schedule", "constant")
FLAGS += ("--warmup-steps", "0", "--sample-chars", "0", "--check-oracle")


def train(*flags: str, env: dict | None = None):
    return run_watched(mpirun_command(4, "-m", "zero_ref.train", *FLAGS, *flags), env=env)


def test_500_steps_of_a_correct_fast_run_never_trip_the_check(tmp_path):
    log = tmp_path / "run.jsonl"
    tiny = ("--d-model", "16", "--context", "8", "--batch-size", "4")  # later flags win
    steps = ("--steps", "500", "--log-every", "1", "--log-jsonl", str(log))
    job = train("--stage", "3", *tiny, *steps)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "oracle check: 500 steps" in job.stdout
    steps = [r for r in read_jsonl(log) if "step" in r]
    assert len(steps) == 500 and all(r["oracle_max_abs_diff"] < 1e-5 for r in steps)


@pytest.mark.parametrize(
    "stage, fault",
    [
        (3, "drop_grad:rank=1:step=3"),
        (2, "bias_correction:rank=2:step=4"),
        (1, "drop_grad:rank=0:step=2"),
    ],
)
def test_a_bug_ends_the_run_at_its_step_naming_tensor_and_element(stage, fault):
    job = train(
        "--stage", str(stage), "--steps", "8", env={**mpi_env(), "ZERO_REF_INJECT_FAULT": fault}
    )
    step = fault.rsplit("=", 1)[1]
    assert job.returncode == 1, job.stderr[-3000:]
    assert job.stderr.count(f"step {step} is not the oracle's") == 1, job.stderr[-3000:]
    assert "parameter " in job.stderr and "[" in job.stderr and "allowed" in job.stderr


def test_checking_traffic_stays_out_of_the_step_totals(tmp_path):
    """Stage 3 consolidates every step for the oracle; no step may be charged for it."""
    log = tmp_path / "run.jsonl"
    job = train("--stage", "3", "--steps", "4", "--log-jsonl", str(log))
    assert job.returncode == 0, job.stderr[-3000:]
    records = read_jsonl(log)
    final = records[-1]
    expected = expected_sent_bytes(3, final["unit_padded_numels"], 4, 1)
    small = 48 + 48  # the loss and the norm: one float64 each, all-reduced
    assert [r["sent_bytes"] for r in records[:-1]] == [expected + small] * 4
    assert all("consolidate" not in r["comm_last_step"] for r in final["ranks"])


@pytest.mark.parametrize("stage", [1, 3])
def test_fp16_run_with_overflows_is_bitwise_the_oracle_end_to_end(tmp_path, stage):
    """--precision fp16 starts at 2^16: the first steps overflow and are skipped by the
    engine and by the oracle alike; every step, skipped or not, is bitwise the
    oracle's, and the log records the scale each backward used."""
    log = tmp_path / "run.jsonl"
    job = train(
        "--stage", str(stage), "--steps", "8", "--precision", "fp16", "--deterministic",
        "--log-jsonl", str(log),
    )  # fmt: skip
    assert job.returncode == 0, job.stderr[-3000:]
    assert "bitwise equal to the single-rank oracle after every step" in job.stdout
    records = [r for r in read_jsonl(log) if "step" in r]
    assert records[0]["skipped"] and records[0]["loss_scale"] == 2.0**16
    assert not all(r["skipped"] for r in records)
    skipped = sum(r["skipped"] for r in records)
    assert f"{skipped} of 8 steps skipped" in job.stdout
