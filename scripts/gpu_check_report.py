"""What scripts/gpu_check.sh found: the machine's facts, and each phase's figures.

    python scripts/gpu_check_report.py env --require gpu|simulator   # a JSON line
    python scripts/gpu_check_report.py summary WORK RESULTS --mode gpu|rehearse

`env` prints what the GPU path will run on (Python, the packages zero_ref needs and
their versions, the MPI library mpi4py loaded, the GPU or the simulator) as one JSON
line, and exits 1 when what --require names is missing. `summary` reads the phase
table gpu_check.sh wrote (WORK/phases.tsv: name, file, status, exit code, start, end,
limit) and each phase's own logs, and writes RESULTS/summary.json, the check's last
file: every phase with pass/fail/timeout, its seconds and its figures (test counts,
the oracle's bitwise verdict per step, the checkpoint's files, bench_gpu's JSON). A
phase whose command passed but whose figures are missing is marked fail, with why.
It imports nothing of zero_ref, so it runs wherever the check's logs are.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
import re
import sys
import time
from pathlib import Path

PACKAGES = (  # zero_ref's dependencies, the test extra's, and the GPU extra's (either CUDA)
    "numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "mpi4py", "mpich",
    "ml_dtypes", "safetensors", "tqdm", "threadpoolctl", "pytest", "hypothesis",
)  # fmt: skip


# ---- env: the machine


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def mpi_facts() -> dict:
    """The MPI library mpi4py loads, or why it cannot (a singleton: no mpirun needed)."""
    try:
        from mpi4py import MPI

        return {"library": MPI.Get_library_version().splitlines()[0].strip()}
    except Exception as e:  # the report says why instead
        return {"error": f"{type(e).__name__}: {e}"}


def cuda_facts() -> dict:
    """numba's view of the device (the simulator's, or the GPUs'), and CuPy's."""
    import numba
    from numba import cuda

    facts: dict = {"simulator": bool(numba.config.ENABLE_CUDASIM)}
    try:
        facts["available"] = bool(cuda.is_available())
        if facts["available"] and not facts["simulator"]:
            facts["gpus"] = [_name(g.name) for g in cuda.gpus]
    except Exception as e:
        facts["error"] = f"{type(e).__name__}: {e}"
    try:
        cp = importlib.import_module("cupy")
        facts["cupy"] = cp.__version__
        if not facts["simulator"]:
            facts["cupy_devices"] = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # absent in the simulator: the GPU path uses NumPy there
        facts["cupy_error"] = f"{type(e).__name__}: {e}"
    return facts


def _name(name) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def env_facts() -> dict:
    import zero_ref

    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "zero_ref": str(Path(zero_ref.__file__).parent),
        "packages": {name: version(name) for name in PACKAGES},
        "mpi": mpi_facts(),
        "cuda": cuda_facts(),
    }


def missing(facts: dict, require: str) -> list[str]:
    """What the run needs and this machine lacks: on a GPU numba's device and CuPy;
    in a rehearsal the simulator; everywhere an MPI library mpi4py can load."""
    cuda, lacking = facts["cuda"], []
    if "error" in facts["mpi"]:
        lacking.append(f"mpi4py cannot load an MPI library ({facts['mpi']['error']})")
    if require == "simulator" and not cuda["simulator"]:
        lacking.append("NUMBA_ENABLE_CUDASIM=1 (numba-cuda's simulator)")
    if require == "gpu":
        if cuda["simulator"] or not cuda.get("available"):
            lacking.append("a CUDA GPU numba can use (NUMBA_ENABLE_CUDASIM=0)")
        if "cupy" not in cuda:
            lacking.append(f"CuPy ({cuda.get('cupy_error')})")
    return lacking


# ---- summary: each phase's figures


def tests_figures(log: str) -> dict:
    """pytest's counts: its final line when it finished, else the -v lines so far."""
    final = re.findall(r"=+ (.*\d+ (?:passed|failed|error|errors|skipped).*) in [\d.]+s", log)
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    if final:
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)", final[-1]):
            counts["errors" if what.startswith("error") else what] = int(n)
        return counts | {"finished": True}
    for what, key in (("PASSED", "passed"), ("FAILED", "failed"), ("ERROR", "errors")):
        counts[key] = len(re.findall(rf"::\S+ {what}\b", log))
    counts["skipped"] = len(re.findall(r"::\S+ SKIPPED\b", log))
    return counts | {"finished": False}


def jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def oracle_figures(log: Path, records: list[dict], steps: int) -> dict:
    """Per step: bitwise (oracle_max_abs_diff 0) or not; a step the run stopped at (its
    OracleMismatchError names it) is not bitwise."""
    per_step = {
        str(r["step"]): r.get("oracle_max_abs_diff") == 0.0
        for r in records
        if "step" in r and not r.get("final")
    }
    text = log.read_text() if log.exists() else ""
    mismatch = re.search(r"OracleMismatchError: (.*)", text)
    if mismatch:
        stopped = re.search(r"step (\d+)", mismatch.group(1))
        if stopped:
            per_step[stopped.group(1)] = False
    final = next((r for r in records if r.get("final")), {})
    figures = {
        "steps_expected": steps,
        "bitwise_per_step": per_step,
        "all_bitwise": len(per_step) == steps and all(per_step.values()),
        "world_size": final.get("world_size"),
        "final_loss": next((r["loss"] for r in reversed(records) if "loss" in r), None),
    }
    if mismatch:
        figures["mismatch"] = mismatch.group(1)[:400]
    return figures


def checkpoint_figures(work: Path, steps: int) -> dict:
    """The save's step folders, the resumed run's steps, the export's bytes, the sample."""
    ckpt, export = work / "ckpt", work / "resumed.safetensors"
    resumed = jsonl(work / "resume.jsonl")
    log = (work / "checkpoint.log").read_text() if (work / "checkpoint.log").exists() else ""
    sample = log.split("sample:\n", 1)[1][:80] if "sample:\n" in log else None
    return {
        "saved": sorted(p.name for p in ckpt.glob("step_*")) if ckpt.exists() else [],
        "resumed_from": next((r["resumed_from"] for r in resumed if "resumed_from" in r), None),
        "resumed_steps": [r["step"] for r in resumed if "step" in r and not r.get("final")],
        "steps_expected": steps,
        "export_bytes": export.stat().st_size if export.exists() else 0,
        "sample": sample,
    }


def bench_figures(log: Path, train: bool) -> dict:
    """bench_gpu.py's JSON line (its last): the kernels' figures, or with train only the
    training runs' (less their commands, which are in bench.txt)."""
    found = next((json.loads(x) for x in reversed(_lines(log)) if x.startswith("{")), None)
    if found is None:
        return {}
    if not train:
        return found
    for run in found.get("train", {}).values():
        run.pop("command", None)
    return {k: found[k] for k in ("simulator", "device", "train") if k in found}


def figures_missing(name: str, figures: dict) -> str | None:
    """Why a phase whose command exited 0 still did not show what it is for."""
    if name == "env":
        return "; ".join(figures.get("missing", [])) or None
    if name == "tests":
        return None if figures["passed"] > 0 else "no test passed"
    if name.startswith("oracle"):
        return None if figures["all_bitwise"] else "not every step is bitwise the oracle"
    if name == "checkpoint":
        steps_ok = len(figures["resumed_steps"]) > 0 and figures["saved"]
        return None if steps_ok and figures["export_bytes"] > 0 else "no save/resume/export"
    if name == "bench":
        return None if "fraction_of_copy" in figures else "no JSON line from bench_gpu.py"
    if name == "bench_train":
        if not figures.get("train"):
            return "no training runs in bench_gpu.py's JSON line"
        failed = [k for k, run in figures["train"].items() if "failed" in run]
        return f"training runs failed: {failed}" if failed else None
    return None


def phase_figures(name: str, work: Path, expect: dict) -> dict:
    """A phase's figures, from its log in WORK (gpu_check.sh copies each into RESULTS)."""
    if name == "env":
        facts = [json.loads(x) for x in _lines(work / "env.log") if x.startswith("{")]
        return facts[-1] if facts else {"missing": ["no facts line in env.txt"]}
    if name == "tests":
        return tests_figures((work / "tests.log").read_text())
    if name.startswith("oracle"):
        return oracle_figures(work / f"{name}.log", jsonl(work / f"{name}.jsonl"), expect[name])
    if name == "checkpoint":
        return checkpoint_figures(work, expect[name])
    if name.startswith("bench"):
        return bench_figures(work / f"{name}.log", train=name == "bench_train")
    return {}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def summarize(work: Path, mode: str, expect: dict, started: float) -> dict:
    phases = {}
    for row in _lines(work / "phases.tsv"):
        name, file, status, rc, start, end, limit = row.split("\t")
        figures = phase_figures(name, work, expect)
        phase = {"status": status, "exit": int(rc), "seconds": round(float(end) - float(start), 1)}
        limit_s = int(limit) if limit.isdigit() else float(limit)  # timeout takes fractions
        phase |= {"limit_s": limit_s, "file": file, "figures": figures}
        why = figures_missing(name, figures) if status == "pass" or name == "env" else None
        if why:  # env's is what the machine lacks, whichever way it ended
            phase |= {"status": "fail" if status == "pass" else status, "why": why}
        if phase["status"] != "pass":  # the log's last lines: usually the error
            phase["log_tail"] = [x for x in _lines(work / f"{name}.log") if x.strip()][-4:]
        phases[name] = phase
    return {
        "mode": mode,
        "all_passed": bool(phases) and all(p["status"] == "pass" for p in phases.values()),
        "seconds": round(time.time() - started, 1),
        "phases": phases,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="the machine's facts, one JSON line")
    env.add_argument("--require", choices=("gpu", "simulator"), required=True)
    summary = sub.add_parser("summary", help="write RESULTS/summary.json")
    summary.add_argument("work", type=Path)
    summary.add_argument("results", type=Path)
    summary.add_argument("--mode", choices=("gpu", "rehearse"), required=True)
    summary.add_argument("--started", type=float, required=True, help="the check's start")
    summary.add_argument("--expect", default="{}", help="JSON: steps each phase must show")
    a = p.parse_args()
    if a.command == "env":
        facts = env_facts()
        facts["missing"] = missing(facts, a.require)
        print(json.dumps(facts), flush=True)
        return 1 if facts["missing"] else 0
    result = summarize(a.work, a.mode, json.loads(a.expect), a.started)
    (a.results / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v["status"] for k, v in result["phases"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
