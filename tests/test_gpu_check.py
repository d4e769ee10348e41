"""scripts/tools/gpu_check.sh --rehearse: the GPU check's every phase, run as on a lent GPU
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
SCRIPT = REPO / "scripts" / "tools" / "gpu_check.sh"
PHASES = ["env", "tests", "oracle_stage3_bf16", "oracle_stage2_fp16_offload", "gpu_vs_cpu"]
PHASES += ["checkpoint", "bench", "bench_train"]
KERNELS = {"adamw", "unscale_and_clip", "round_fp16", "round_bf16", "embedding_backward"}
TRAIN_RUNS = {"stage0_fp32_1rank", "stage0_fp32", "stage3_bf16", "stage3_bf16_cpu_offload"}
TRAIN_RUNS |= {"stage3_bf16_big"}
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
    logs = {"runs.jsonl", "bench_runs.jsonl", "summary.json"}
    assert {phase["file"] for phase in summary["phases"].values()} | logs == {
        p.name for p in entries
    }


def test_the_runs_jsonl_logs_are_kept_tagged_with_their_run(rehearsal):
    out = rehearsal[1]
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    names = {"oracle_stage3_bf16", "oracle_stage2_fp16_offload", "checkpoint_first"}
    names |= {"checkpoint_resumed", "checkpoint_resharded"}
    assert {r["run"] for r in runs} == names
    assert sum(1 for r in runs if r.get("final")) == len(names)  # each log whole
    bench = [json.loads(x) for x in (out / "bench_runs.jsonl").read_text().splitlines()]
    assert {r["run"] for r in bench} == {f"train_{name}" for name in TRAIN_RUNS}


def test_the_summary_holds_each_phase_figures(rehearsal):
    phases = rehearsal[2]["phases"]
    env = phases["env"]["figures"]
    assert env["cuda"]["simulator"] is True and env["missing"] == []
    assert env["mpi"]["library"] and env["packages"]["numpy"]
    real = env["real_target"]  # the real target was tried (CI: no driver, so unavailable)
    assert real["exit"] == 0 and set(real["compiled"]) | set(real.get("unavailable", {})) == KERNELS
    tests = phases["tests"]["figures"]
    assert tests["finished"] and tests["passed"] > 50 and tests["failed"] == tests["errors"] == 0
    for name in ("oracle_stage3_bf16", "oracle_stage2_fp16_offload"):
        oracle = phases[name]["figures"]
        assert oracle["bitwise_per_step"] == {"1": True, "2": True} and oracle["all_bitwise"]
        assert oracle["world_size"] == 2
    versus = phases["gpu_vs_cpu"]["figures"]
    assert versus["bitwise"] and versus["world_size"] == 2 and versus["numel"] > 0
    assert versus["memory"]["simulator"] and versus["memory"]["ledger_device_bytes"] > 0
    ckpt = phases["checkpoint"]["figures"]
    assert ckpt["saved"] == ["step_000001"] and ckpt["first_steps"] == [1]
    assert ckpt["resumed_steps"] == [2] and ckpt["resumed_export_bitwise_uninterrupted"]
    assert ckpt["resumed_steps_equal_uninterrupted"] and ckpt["resharded_world_size"] == 1
    assert ckpt["resharded_bitwise_per_step"] == {"2": True} and ckpt["resharded_export_bytes"]
    assert ckpt["sample"]
    bench = phases["bench"]["figures"]
    assert bench["simulator"] is True and bench["fraction_of_copy"]["adamw"] > 0
    assert set(bench["staging_gb_per_s"]) == {"device_to_host", "host_to_device"}
    train = phases["bench_train"]["figures"]["train"]
    assert set(train) == TRAIN_RUNS
    for name, run in train.items():
        assert run["median_step_s"] > 0 and run["steps_timed"] == 1, run
        assert run["world_size"] == (1 if name.endswith("1rank") else 2), run
    assert train["stage3_bf16_big"]["numel_padded"] > train["stage3_bf16"]["numel_padded"]


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


def script_module(name: str):
    import importlib.util

    (path,) = (REPO / "scripts").glob(f"*/{name}.py")  # tools/ or bench/ (bench_gpu)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report_module():
    return script_module("gpu_check_report")


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


def test_a_line_cut_short_in_a_log_is_left_out_and_the_summary_still_written(tmp_path):
    """A run killed mid-line (or a full disk) leaves half a JSON line: the steps before it
    still count, and bench_train's runs that ended still show, each from its own line."""
    report = report_module()
    rows = ["oracle_stage3_bf16\toracle.txt\tpass\t0\t1.0\t2.0\t40"]
    rows.append("bench_train\tbench.txt\ttimeout\t124\t2.0\t9.0\t145")
    (tmp_path / "phases.tsv").write_text("\n".join(rows) + "\n")
    steps = [json.dumps({"step": s, "oracle_max_abs_diff": 0.0, "loss": 1.0}) for s in (1, 2)]
    (tmp_path / "oracle_stage3_bf16.jsonl").write_text("\n".join(steps) + '\n{"step": 3, "lo')
    ran = json.dumps({"train_run": "stage0_fp32", "median_step_s": 0.5, "command": "x"})
    (tmp_path / "bench_train.log").write_text(f"=== train stage0_fp32\n{ran}\n" + '{"train_ru')
    phases = report.summarize(tmp_path, "gpu", {"oracle_stage3_bf16": 2}, 0.0)["phases"]
    oracle = phases["oracle_stage3_bf16"]
    assert oracle["status"] == "pass", oracle
    assert oracle["figures"]["bitwise_per_step"] == {"1": True, "2": True}
    train = phases["bench_train"]["figures"]
    assert train["train"] == {"stage0_fp32": {"median_step_s": 0.5}}
    assert train["finished"] is False and phases["bench_train"]["status"] == "timeout"


def test_the_env_phase_fails_with_the_cause_when_the_cuda_target_cannot_compile(tmp_path):
    """tests/gpu_ptx_check.py's probe, as gpu_check.sh's env phase leaves it in WORK: a
    compiler that is there and broken (numba-cuda on NumPy 2.5 before the shim) fails env
    in both modes, naming the exception; a missing toolchain fails only on a GPU."""
    env = script_module("gpu_check_env")
    probe = tmp_path / "probe"
    error = "AttributeError: module 'numpy' has no attribute 'row_stack'"
    probe.with_suffix(".rc").write_text("1\n")
    probe.with_suffix(".json").write_text("")
    probe.with_suffix(".err").write_text(f"Traceback (most recent call last):\n  ...\n{error}\n")
    broken = env.probe_facts(probe)
    assert broken == {"exit": 1, "error": error}
    numba_says = ["Traceback", "x", "numba.cuda.cudadrv.error.CudaSupportError: at init:", ":"]
    assert env.exception_text(numba_says) == numba_says[2] + " :"  # its message's lines too
    for require in ("gpu", "simulator"):
        (why,) = env.real_target_missing(broken, require)
        assert error in why, why
    no_driver = {"exit": 0, "compiled": ["adamw"], "unavailable": {"round_fp16": "no driver"}}
    assert env.real_target_missing(no_driver, "simulator") == []
    lacking = env.real_target_missing(no_driver, "gpu")
    assert lacking[0] == "round_fp16 did not compile: no driver" and "libdevice" in lacking[1]
    ran = {"exit": 0, "compiled": sorted(KERNELS), "launch": {"bitwise": True, "device": "H200"}}
    assert env.real_target_missing(ran, "gpu") == []
    wrong = ran | {"launch": {"bitwise": False}}
    assert "not bitwise" in env.real_target_missing(wrong, "gpu")[0]
    facts = {"mpi": {"library": "MPICH"}, "cuda": {"simulator": True}, "real_target": broken}
    assert env.missing(facts, "simulator") == env.real_target_missing(broken, "simulator")


def mpi_library(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    """A bash that sourced scripts/tools/gpu_check_mpi.sh runs `script`."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    full = {**os.environ, "WORK": str(work), "REPO": str(REPO), "PY": sys.executable} | env
    return subprocess.run(
        ["bash", "-c", f". {REPO / 'scripts' / 'tools' / 'gpu_check_mpi.sh'}; {script}"],
        env=full, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


HYDRA = ("HYDRA build details:", "mpirun -hosts localhost")  # what `mpirun --version` says


def fake_mpirun(tmp_path: Path, says: str) -> str:
    """A PATH whose mpirun prints `says` for --version and succeeds at anything else: the
    launcher is what is under test here, not MPI (the rehearsal runs the real one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = f'#!/bin/sh\n[ "$1" = --version ] && echo "{says}"\nexit 0\n'
    (bin_dir / "mpirun").write_text(script)
    (bin_dir / "mpirun").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("says, launcher", [HYDRA, ("mpirun (Open MPI) 5.0", "mpirun")])
def test_hydra_is_told_localhost_and_lookups_give_up_fast_in_every_later_phase(
    tmp_path, says, launcher
):
    """mpi_setup (the machine's MPI runs: nothing installed) leaves in WORK/env.sh, for
    every later phase, the launcher, RES_OPTIONS and (Hydra) the host file."""
    env = {"PATH": fake_mpirun(tmp_path, says), "REHEARSE": "0"}
    done = mpi_library(tmp_path, "mpi_setup", **{k: v for k, v in env.items()})
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp_path / "work"
    later = mpi_library(
        tmp_path,
        f"env -i bash -c '. {work / 'env.sh'}; echo \"$GPU_CHECK_MPIRUN|$RES_OPTIONS|"
        "${HYDRA_HOST_FILE:-}\"'",
    )
    hosts = str(work / "hosts") if launcher.endswith("localhost") else ""
    assert later.stdout.strip() == f"{launcher}|timeout:1 attempts:1|{hosts}", later.stdout
    if hosts:
        assert (work / "hosts").read_text() == "localhost\n"


def fake_wheel(folder: Path, version: str, who: str) -> Path:
    """A pure-Python wheel named mpi4py: what pip does with it is what it does with the
    real one (the test is of the install, not of MPI)."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel, info = folder / f"mpi4py-{version}-py3-none-any.whl", f"mpi4py-{version}.dist-info"
    files = {
        "mpi4py/__init__.py": f"WHO = {who!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: mpi4py\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def machine_python(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A Python environment holding its own mpi4py `version` (the lent machine's) and pip
    (this one's, linked in): its interpreter and its site-packages."""
    import sysconfig
    import venv

    root = tmp_path / "machine"
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    (site / "pip").symlink_to(Path(sysconfig.get_paths()["purelib"]) / "pip")
    own = fake_wheel(tmp_path / "own", version, "machine")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(own)], check=True
    )
    return python, site


@pytest.mark.parametrize("machine_version", ["4.1.2", "4.0.0"])  # the carried one's, another
def test_the_carried_mpi4py_goes_into_the_prefix_and_the_machines_stays(tmp_path, machine_version):
    """gpu_check.sh's fallback when the machine's mpi4py cannot load the carried MPICH:
    the carried wheel into WORK/site, whatever the machine holds; the machine's copy
    untouched (without --ignore-installed pip installs nothing over the same version and
    uninstalls another)."""
    python, site = machine_python(tmp_path, machine_version)
    wheels = tmp_path / "whl"
    fake_wheel(wheels, "4.1.2", "carried")
    prefix = tmp_path / "work" / "site"
    done = mpi_library(
        tmp_path, f"install_wheels {prefix} mpi4py", PY=str(python), WHEELS=str(wheels)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    carried = list(prefix.rglob("site-packages/mpi4py/__init__.py"))
    assert [p.read_text() for p in carried] == ["WHO = 'carried'\n"], done.stdout
    assert (site / "mpi4py" / "__init__.py").read_text() == "WHO = 'machine'\n"
    assert (site / f"mpi4py-{machine_version}.dist-info").is_dir()


def test_device_memory_is_set_beside_the_ledger_and_a_ledger_above_it_fails():
    """gpu_step_check's sums over ranks (numba's pinned host buffers are not device
    memory), and the summary's verdict when the ledger claims more than numba holds."""
    step_check = script_module("gpu_step_check")
    rank = {
        "ledger_device_bytes": 100,
        "numba_allocations_bytes": {"AutoFreePointer": 120, "PinnedMemory": 1000},
        "cupy_pool_held_bytes": 30,
    }
    memory = step_check.memory_report([rank, rank], baseline=1000, after=1600)
    assert memory["ledger_device_bytes"] == 200 and memory["numba_device_allocations_bytes"] == 240
    assert memory["cupy_pool_held_bytes"] == 60 and memory["device_used_growth_bytes"] == 600
    assert memory["ledger_within_numba_allocations"] is True
    report = report_module()
    assert report.figures_missing("gpu_vs_cpu", {"bitwise": True, "memory": memory}) is None
    over = memory | {"ledger_within_numba_allocations": False}
    assert "ledger" in report.figures_missing("gpu_vs_cpu", {"bitwise": True, "memory": over})
    assert "bitwise" in report.figures_missing("gpu_vs_cpu", {"bitwise": False, "memory": memory})
    simulated = step_check.memory_report([{"ledger_device_bytes": 5}], None, None)
    assert simulated == {"ranks": [{"ledger_device_bytes": 5}], "ledger_device_bytes": 5,
                         "simulator": True}  # fmt: skip


def test_a_training_run_past_its_limit_is_stopped_with_the_processes_it_started(
    tmp_path, monkeypatch
):
    """bench_gpu's runs each have a limit: past it the run and what it started (mpirun's
    ranks) are killed, and the next run goes on (their JSON lines print as they end)."""
    import time

    bench = script_module("bench_gpu")
    child = tmp_path / "child.pid"
    started = time.monotonic()
    rc, output = bench.run_limited(["bash", "-c", f"sleep 60 & echo $! > {child}; wait"], 1.0)
    assert rc is None and output.endswith("(stopped after 1.0 s)"), output
    assert time.monotonic() - started < 20
    assert not _still_sleeping(child.read_text().strip())
    assert bench.run_limited(["bash", "-c", "echo done"], 10.0) == (0, "done\n")


def _still_sleeping(pid: str) -> bool:
    """Is the process with this pid the test's `sleep 60`, and not a zombie? Gone, a
    zombie, or a new process that took the pid (a busy machine reuses pids fast) is no."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        command = (proc / "cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and command[:2] == [b"sleep", b"60"]
