"""zero_ref.check's torch watcher: the zoo of real bugs (one 2-rank gloo job), the watched
run bitwise the unwatched one, and the watcher's refusals (one process, no torch.distributed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from tests.mpi_pool import REPO  # noqa: E402
from tests.torch_zoo import BUGGY, CASES, CLEAN  # noqa: E402


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def zoo(records) -> dict:
    """Every case of the zoo in one job (about 30 s on 2 cores), and a few recorded."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "torch_zoo_job.py"), "--records", str(records)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [c.name for c in CLEAN])
def test_clean_loop_passes_50_steps_with_no_alarm(zoo, case):
    result = zoo["cases"][case]
    assert result["flagged"] is None, result
    assert result["steps"] == CASES[case].loop.steps == 50


@pytest.mark.parametrize("case", [c.name for c in BUGGY])
def test_buggy_loop_is_flagged_at_its_first_affected_step_and_named(zoo, case):
    spec, result = CASES[case], zoo["cases"][case]
    assert result["flagged"] == spec.first, result
    assert spec.bug in result["diagnoses"], result
    assert spec.bug in result["message"] and f"step {spec.first}:" in result["message"]
    assert zoo["cases"][spec.twin]["flagged"] is None  # its twin, without the bug, passes


def test_the_bound_says_what_it_assumes_bf16_reduction_declared_or_not(zoo):
    """FSDP2 reducing in bf16: within the bound declared reduce_dtype='bfloat16' (50
    steps), flagged at step 1 when the watcher is told float32 (so the run really
    reduces in bf16, and the bf16 bound is what lets it pass)."""
    assert zoo["cases"]["fsdp2_bf16"]["flagged"] is None
    assert zoo["cases"]["fsdp2_bf16_said_fp32"]["flagged"] == 1


def test_every_buggy_case_has_a_twin_and_the_zoo_covers_ten_bugs():
    assert all(c.twin in CASES and CASES[c.twin].bug is None for c in BUGGY)
    assert len({c.bug for c in BUGGY}) >= 10
    assert {CASES[c.twin].loop.framework for c in BUGGY} >= {"ddp", "fsdp2"}


@pytest.mark.parametrize("framework", ["ddp", "fsdp2", "fsdp1"])
def test_watched_run_trains_bitwise_as_unwatched(zoo, framework):
    assert zoo["bitwise"][framework] is True


@pytest.mark.parametrize("case", ["fsdp2", "ddp_grad_scaler", "clip_shard", "not_divided"])
def test_records_written_by_the_watcher_are_checked_offline_by_the_cli(zoo, records, case):
    """python -m zero_ref.check on the folder a watcher wrote (check=False): the same
    outcome as checking while training (exit 0 clean, 1 flagged at the case's step)."""
    done = subprocess.run(
        [sys.executable, "-m", "zero_ref.check", str(records / case), "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    spec = CASES[case]
    if spec.bug is None:
        assert (done.returncode, summary["flagged_steps"]) == (0, []), done.stdout
        assert summary["steps_checked"] == 8
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert summary["first_flagged"] == spec.first and spec.bug in summary["diagnoses"]


# --- one process: what watch() refuses, with names ------------------------------------


def _plain():
    from tests.torch_zoo_loops import MLP

    torch.manual_seed(0)
    model = MLP()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"normalization": "token"}, "normalization='token'; allowed: mean, sum, weighted"),
        ({"on_mismatch": "warn"}, "on_mismatch='warn'; allowed: raise, report"),
        ({"check": False}, "nothing to do"),
        ({"optimizer_kind": "lion"}, "optimizer_kind='lion'"),
    ],
)
def test_watch_refuses_bad_options_by_name(options, words):
    from zero_ref.check.torch_watch import watch

    model, opt = _plain()
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        watch(model, opt, **options)


def test_watch_refuses_an_optimizer_it_cannot_model():
    from zero_ref.check.torch_watch import watch

    model, _ = _plain()
    with pytest.raises(ValueError, match="amsgrad=True"):
        watch(model, torch.optim.Adam(model.parameters(), amsgrad=True))
    with pytest.raises(ValueError, match="pass optimizer_kind="):
        watch(model, torch.optim.RMSprop(model.parameters()))
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="a parameter the watched model does not have"):
        watch(model, torch.optim.AdamW(list(model.parameters()) + list(other.parameters())))


def test_loss_must_be_declared_before_backward_and_weights_only_when_weighted():
    from tests.torch_zoo_loops import batch
    from zero_ref.check.torch_watch import watch

    model, opt = _plain()
    w = watch(model, opt, keep_records=True, check=False)
    x, y = batch(0, 1, 0)
    with pytest.raises(RuntimeError, match="before watch.loss"):
        torch.nn.functional.mse_loss(model(x, False), y).backward()
    loss = torch.nn.functional.mse_loss(model(x, False), y)
    with pytest.raises(ValueError, match="weight= is given with normalization='weighted'"):
        w.loss(loss, weight=3.0)
    with pytest.raises(ValueError, match="scalar loss tensor"):
        w.loss(loss.detach())
    w.close()


def test_one_process_records_what_backward_and_step_saw():
    """World 1: micro_grads / loss_grad averaged over the micro-steps is the gradient
    optimizer.step was given (no clipping), and loss_grad is the 1/A the loop applied."""
    import numpy as np

    from tests.torch_zoo_loops import batch
    from zero_ref.check.torch_watch import watch

    model, opt = _plain()
    w = watch(model, opt, keep_records=True)
    for step in (1, 2):
        for j in range(3):
            x, y = batch(0, step, j)
            loss = w.loss(torch.nn.functional.mse_loss(model(x, j == 1), y))
            (loss / 3).backward()
        opt.step()
        opt.zero_grad()
    w.close()
    assert [v.ok for v in w.verdicts] == [True, True]
    record = w.records[1]
    assert record.loss_grad == [[pytest.approx(1 / 3)]] * 3
    assert sorted(record.micro_grads[1][0]) == sorted(record.applied_grads)
    assert "aux.weight" not in record.micro_grads[0][0]  # used at micro-step 1 only
    for name, applied in record.applied_grads.items():
        mean = sum(
            m[0].get(name, 0) / c[0]
            for m, c in zip(record.micro_grads, record.loss_grad, strict=True)
        )
        np.testing.assert_allclose(mean / 3, applied, rtol=1e-5, atol=1e-7)
