"""zero_ref.check's record folder and `python -m zero_ref.check`: a run written with
records_io reads back as the same StepRecords, the CLI's exit status says clean (0),
flagged (1) or records that do not fit (2), and every way records can fail to fit gets a
message naming it, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.check_sim import SimRun, initial_params, simulate
from zero_ref.check import records_io as rio
from zero_ref.check.__main__ import main
from zero_ref.check.record import RecordError


def _write(folder: Path, run: SimRun, steps: int) -> list:
    rio.write_spec(folder, run.spec(), initial_params(run))
    records = list(simulate(run, steps))
    for rec in records:
        for r in range(run.world):
            micro = [rec.micro_grads[j][r] for j in range(run.accum)]
            rio.write_rank_step(folder, rec.step, r, micro, [c[r] for c in rec.loss_grad])
        rio.write_step(
            folder,
            rec.step,
            rec.groups,
            rec.applied_grads,
            rec.params_after,
            scale=rec.scale,
            skipped=rec.skipped,
            reported_norm=rec.reported_norm,
            extra=rec.extra,
        )
    return records


def test_records_read_back_as_written(tmp_path):
    run = SimRun(scaler=True, overflow_steps=(2,), schedule=(1.0, 0.5, 0.25))
    written = _write(tmp_path, run, 3)
    spec, initial, records = rio.read_run(tmp_path)
    assert spec == run.spec()
    for k, v in initial_params(run).items():
        np.testing.assert_array_equal(initial[k], v)
    for a, b in zip(written, records, strict=True):
        assert (a.step, a.groups, a.scale, a.skipped, a.reported_norm) == (
            b.step,
            b.groups,
            b.scale,
            b.skipped,
            b.reported_norm,
        )
        assert a.loss_grad == b.loss_grad and b.extra["shards"]["w1"] == [
            list(s) for s in a.extra["shards"]["w1"]
        ]
        for j in range(run.accum):
            for r in range(run.world):
                assert a.micro_grads[j][r].keys() == b.micro_grads[j][r].keys()
                for k in a.micro_grads[j][r]:
                    assert a.micro_grads[j][r][k].tobytes() == b.micro_grads[j][r][k].tobytes()
        for k in a.params_after:
            assert a.params_after[k].tobytes() == b.params_after[k].tobytes()
        assert a.applied_grads.keys() == b.applied_grads.keys()


def test_cli_exit_status_and_summary(tmp_path, capsys):
    _write(tmp_path / "clean", SimRun(), 3)
    assert main([str(tmp_path / "clean")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1]) == {
        "steps_checked": 3,
        "flagged_steps": [],
        "first_flagged": None,
        "diagnoses": [],
    }
    _write(tmp_path / "bug", SimRun(bugs=frozenset({"world_not_divided"})), 3)
    assert main([str(tmp_path / "bug"), "--stop-at-first"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1])["diagnoses"] == ["world_not_divided"]
    assert out[0].startswith("step 1: ") and len(out) == 2  # stopped after step 1


def _broken(tmp_path: Path, how: str) -> Path:
    folder = tmp_path / how
    run = SimRun()
    _write(folder, run, 3)
    step2 = rio.step_dir(folder, 2)
    if how == "no folder":
        return tmp_path / "nothing here"
    if how == "no spec":
        (folder / "spec.json").unlink()
    elif how == "other format":
        meta = json.loads((folder / "spec.json").read_text())
        (folder / "spec.json").write_text(json.dumps({**meta, "format": "other/9"}))
    elif how == "bad spec field":
        meta = json.loads((folder / "spec.json").read_text())
        meta["spec"]["optimizer"] = "lion"
        (folder / "spec.json").write_text(json.dumps(meta))
    elif how == "missing step":
        for p in step2.iterdir():
            p.unlink()
        step2.rmdir()
    elif how == "missing rank":
        (step2 / "rank_1.safetensors").unlink()
    elif how == "unfinished step":
        (rio.step_dir(folder, 3) / "step.json").unlink()
    elif how == "unknown name":
        g = rio._load(step2 / "rank_0.safetensors")
        g["j0/w9"] = g.pop("j0/w1")
        save_file(g, str(step2 / "rank_0.safetensors"))
    elif how == "other shape":
        p = rio._load(step2 / "params.safetensors")
        p["w1"] = p["w1"][:, :4].copy()
        save_file(p, str(step2 / "params.safetensors"))
    elif how == "float16":
        p = rio._load(step2 / "params.safetensors")
        p["b1"] = p["b1"].astype(np.float16)
        save_file(p, str(step2 / "params.safetensors"))
    elif how == "not safetensors":
        (step2 / "applied.safetensors").write_bytes(b"\x00" * 5)
    elif how == "micro-step counts differ":
        meta = json.loads((step2 / "rank_1.json").read_text())
        meta["loss_grad"] = meta["loss_grad"][:2]
        g = rio._load(step2 / "rank_1.safetensors")
        save_file(
            {k: v for k, v in g.items() if not k.startswith("j2/")},
            str(step2 / "rank_1.safetensors"),
        )
        (step2 / "rank_1.json").write_text(json.dumps(meta))
    elif how == "initial names differ":
        p = rio._load(folder / "initial.safetensors")
        p.pop("b2")
        save_file(p, str(folder / "initial.safetensors"))
    elif how in ("schedule too short", "weighted without weights"):
        meta = json.loads((folder / "spec.json").read_text())
        if how == "schedule too short":
            meta["spec"]["lr_schedule"] = [1.0, 1.0]
        else:
            meta["spec"]["normalization"] = "weighted"
        (folder / "spec.json").write_text(json.dumps(meta))
    elif how == "bad shards":
        meta = json.loads((step2 / "step.json").read_text())
        meta["extra"]["shards"]["w1"] = [[0, 20], [20, 99]]
        (step2 / "step.json").write_text(json.dumps(meta))
    elif how == "bad json":
        (step2 / "step.json").write_text("{")
    return folder


BROKEN = {
    "no folder": "no such folder",
    "no spec": "spec.json: missing",
    "other format": "this reader reads",
    "bad spec field": "RunSpec.optimizer = 'lion'",
    "missing step": "steps [2] missing",
    "missing rank": "rank 1's rank_1.safetensors is missing",
    "unfinished step": "did not finish this step",
    "unknown name": "names not in the run ['w9']",
    "other shape": "w1 has shape (7, 4), the run's is (7, 5)",
    "float16": "b1 is float16; records hold float32 only",
    "not safetensors": "not a readable safetensors file",
    "micro-step counts differ": "different numbers of micro-steps [2, 3]",
    "bad json": "not readable JSON",
    "initial names differ": "initial parameters: missing ['b2']",
    "schedule too short": "step 3: RunSpec.lr_schedule has 2 entries",
    "weighted without weights": "normalization 'weighted' needs finite weights",
    "bad shards": "extra['shards'] must map every parameter",
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_records_that_do_not_fit_are_named(tmp_path, capsys, how):
    folder = _broken(tmp_path, how)
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert BROKEN[how] in err and "Traceback" not in err, err


def test_writers_refuse_what_the_format_cannot_hold(tmp_path):
    run = SimRun()
    with pytest.raises(ValueError, match="w1 is float64; records hold float32"):
        rio.write_spec(tmp_path, run.spec(), {"w1": np.zeros((7, 5))})
    with pytest.raises(ValueError, match="one loss_grad"):
        rio.write_rank_step(tmp_path, 1, 0, [{}, {}], [1.0])


def test_checker_refuses_steps_out_of_order():
    from zero_ref.check.checker import Checker

    run = SimRun()
    records = list(simulate(run, 3))
    checker = Checker(run.spec(), initial_params(run))
    checker.check(records[0])
    with pytest.raises(RecordError, match="step 3 after step 1"):
        checker.check(records[2])


def test_the_checker_and_the_cli_need_no_torch():
    """Reading and checking records imports nothing of torch (the extra stays optional)."""
    import subprocess
    import sys

    code = (
        "import sys; import zero_ref.check.__main__, zero_ref.check.checker, "
        "zero_ref.check.records_io; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
