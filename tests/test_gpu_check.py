"""scripts/gpu_check.sh --rehearse: the GPU check's every phase, run as on a lent GPU
machine but in numba-cuda's simulator at tiny sizes, offline, so that the check cannot
rot before a GPU is lent (docs/gpu.md, "On a lent machine").

Not gpu-marked: the check's own tests phase runs `pytest -m gpu`, which must not run
the check again. A pip that records its calls and fails stands first on PATH and on
PYTHONPATH (`python -m pip`), and pip's index is an unreachable address: the rehearsal
must call neither.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"
PHASES = ["env", "tests", "oracle_stage3_bf16", "oracle_stage2_fp16_offload", "checkpoint"]
PHASES += ["bench", "bench_train"]
RECORDING_PIP = """import sys
with open({calls!r}, "a") as f:
    f.write(" ".join(sys.argv) + "\\n")
sys.exit(3)
"""


def offline_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This Python's environment with pip replaced by a recorder and no index to reach."""
    guard = tmp / "guard"
    (guard / "pip").mkdir(parents=True, exist_ok=True)
    (guard / "pip" / "__init__.py").write_text("")
    (guard / "pip" / "__main__.py").write_text(RECORDING_PIP.format(calls=str(tmp / "pip_calls")))
    (guard / "bin").mkdir(exist_ok=True)
    for name in ("pip", "pip3"):
        tool = guard / "bin" / name
        tool.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{guard / "pip" / "__main__.py"}" "$@"\n'
        )
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_PHASES")}
    path = os.pathsep.join([str(guard / "bin"), str(Path(sys.executable).parent), env["PATH"]])
    pythonpath = os.pathsep.join(p for p in (str(guard), env.get("PYTHONPATH")) if p)
    unreachable = "http://127.0.0.1:9"
    return (
        env
        | {
            "PATH": path,
            "PYTHONPATH": pythonpath,
            "PYTHON": sys.executable,
            "PIP_INDEX_URL": unreachable + "/simple",
            "http_proxy": unreachable,
            "https_proxy": unreachable,
        }
        | extra
    )


def rehearse(tmp: Path, **extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--rehearse", str(out)],
        cwd=tmp,
        env=offline_env(tmp, **extra),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, out


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_check")
    done, out = rehearse(tmp)
    summary = json.loads((out / "summary.json").read_text())
    return done, out, summary, tmp


def test_every_phase_ran_and_passed(rehearsal):
    done, out, summary, _ = rehearsal
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary["mode"] == "rehearse" and summary["all_passed"] is True
    assert list(summary["phases"]) == PHASES
    for name, phase in summary["phases"].items():
        assert phase["status"] == "pass", (name, phase)
        assert 0 < phase["seconds"] <= phase["limit_s"], (name, phase)


def test_at_most_8_files_directly_in_the_folder_summary_last(rehearsal):
    _, out, summary, _ = rehearsal
    entries = list(out.iterdir())
    assert len(entries) <= 8 and all(p.is_file() for p in entries), entries
    last = max(entries, key=lambda p: p.stat().st_mtime_ns)
    assert last.name == "summary.json"
    assert {phase["file"] for phase in summary["phases"].values()} | {"summary.json"} == {
        p.name for p in entries
    }


def test_the_summary_holds_each_phase_figures(rehearsal):
    phases = rehearsal[2]["phases"]
    env = phases["env"]["figures"]
    assert env["cuda"]["simulator"] is True and env["missing"] == []
    assert env["mpi"]["library"] and env["packages"]["numpy"]
    tests = phases["tests"]["figures"]
    assert tests["finished"] and tests["passed"] > 50 and tests["failed"] == tests["errors"] == 0
    for name in ("oracle_stage3_bf16", "oracle_stage2_fp16_offload"):
        oracle = phases[name]["figures"]
        assert oracle["bitwise_per_step"] == {"1": True, "2": True} and oracle["all_bitwise"]
        assert oracle["world_size"] == 2
    ckpt = phases["checkpoint"]["figures"]
    assert ckpt["saved"] == ["step_000002"] and ckpt["resumed_steps"] == [3]
    assert ckpt["resumed_from"].endswith("step_000002") and ckpt["export_bytes"] > 0
    assert ckpt["sample"]
    bench = phases["bench"]["figures"]
    assert bench["simulator"] is True and bench["fraction_of_copy"]["adamw"] > 0
    assert set(bench["staging_gb_per_s"]) == {"device_to_host", "host_to_device"}
    train = phases["bench_train"]["figures"]["train"]
    assert len(train) == 4
    for run in train.values():
        assert run["median_step_s"] > 0 and run["steps_timed"] == 1, run


def test_the_rehearsal_called_no_pip(rehearsal):
    tmp = rehearsal[3]
    assert not (tmp / "pip_calls").exists(), (tmp / "pip_calls").read_text()


def test_the_pip_guard_records_a_call(tmp_path):
    """The guard above works: `python -m pip` under its environment is recorded."""
    subprocess.run([sys.executable, "-m", "pip", "--version"], env=offline_env(tmp_path))
    assert "--version" in (tmp_path / "pip_calls").read_text()


def test_a_phase_past_its_limit_is_recorded_and_the_next_one_runs(tmp_path):
    # limits no run can meet (a 2-step oracle run on a quiet machine took under a second)
    limits = {"GPU_CHECK_LIMIT_TESTS": "0.05", "GPU_CHECK_LIMIT_ORACLE": "0.05"}
    done, out = rehearse(tmp_path, GPU_CHECK_PHASES="tests oracle", **limits)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    statuses = {name: phase["status"] for name, phase in summary["phases"].items()}
    assert statuses == {
        "env": "pass",
        "tests": "timeout",
        "oracle_stage3_bf16": "timeout",
        "oracle_stage2_fp16_offload": "timeout",
    }
    assert summary["all_passed"] is False
    assert sorted(p.name for p in out.iterdir()) == [
        "env.txt",
        "oracle.txt",
        "summary.json",
        "tests.txt",
    ]


def report_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_check_report", REPO / "scripts" / "gpu_check_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_the_oracle_refused_is_not_bitwise(tmp_path):
    report = report_module()
    log = tmp_path / "oracle.log"
    log.write_text("zero_ref.app.oracle_check.OracleMismatchError: --check-oracle: step 3: ...\n")
    steps = [{"step": s, "oracle_max_abs_diff": 0.0} for s in (1, 2)]
    figures = report.oracle_figures(log, steps, 10)
    assert figures["bitwise_per_step"] == {"1": True, "2": True, "3": False}
    assert not figures["all_bitwise"] and "step 3" in figures["mismatch"]
    assert not report.oracle_figures(tmp_path / "none.log", steps, 3)["all_bitwise"]


def test_pytest_counts_survive_a_timeout():
    report = report_module()
    log = "tests/a.py::x PASSED  [ 1%]\ntests/a.py::y[1-2] FAILED  [ 2%]\ntests/a.py::z SKIPPED\n"
    assert report.tests_figures(log) == {
        "passed": 1, "failed": 1, "errors": 0, "skipped": 1, "finished": False,
    }  # fmt: skip
    done = log + "==== 1 failed, 1 passed, 1 skipped, 2 warnings in 3.20s ====\n"
    assert report.tests_figures(done)["finished"] is True


def test_a_phase_that_exited_0_without_its_figures_fails(tmp_path):
    report = report_module()
    (tmp_path / "phases.tsv").write_text("bench\tbench.txt\tpass\t0\t1.0\t2.5\t110\n")
    (tmp_path / "bench.log").write_text("no JSON here\n")
    phase = report.summarize(tmp_path, "gpu", {}, 0.0)["phases"]["bench"]
    assert phase["status"] == "fail" and phase["why"] == "no JSON line from bench_gpu.py"
    assert phase["seconds"] == 1.5 and phase["log_tail"] == ["no JSON here"]
