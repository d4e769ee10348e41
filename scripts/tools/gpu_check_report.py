"""What scripts/tools/gpu_check.sh found: each phase's figures, into summary.json.

    python scripts/tools/gpu_check_report.py summary WORK RESULTS --mode gpu|rehearse

`summary` reads the phase table gpu_check.sh wrote (WORK/phases.tsv: name, file,
status, exit code, start, end, limit) and each phase's own logs, and writes
RESULTS/summary.json (after every phase; the last one is the check's last file): every
phase with pass/fail/timeout, its seconds and its figures (the machine's facts that
scripts/tools/gpu_check_env.py printed, test counts, the oracle's bitwise verdict per step,
the GPU against the CPU and the device's memory, the checkpoint's comparisons,
bench_gpu's JSON). A phase whose command passed but whose figures are missing is marked
fail, with why. It imports nothing of zero_ref, so it runs wherever the check's logs are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path


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
    """A run's JSONL records; a line it did not finish writing (killed mid-line) is
    left out, so the rest still counts."""
    records = []
    for line in _lines(path):
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in records if isinstance(r, dict)]


def last_json(lines: list[str]) -> dict | None:
    """The last line that reads as a JSON object (scripts print theirs last)."""
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


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


def same_bytes(a: Path, b: Path) -> bool | None:
    """Whether two files hold the same bytes; None when either is missing."""
    if not (a.exists() and b.exists()):
        return None
    return a.read_bytes() == b.read_bytes()


STEP_KEYS = ("loss", "grad_norm", "skipped", "loss_scale")


def step_records(records: list[dict]) -> dict[int, tuple]:
    return {
        r["step"]: tuple(repr(r.get(k)) for k in STEP_KEYS)
        for r in records
        if "step" in r and not r.get("final")
    }


def checkpoint_figures(work: Path, steps: int, save_steps: int) -> dict:
    """The save halfway, the resume at the same ranks against the uninterrupted oracle
    run (its export bitwise, its steps' losses, norms, skips and scales equal), and the
    resume at other ranks: its steps, the oracle's verdict on each, its sample."""
    first = jsonl(work / "checkpoint_first.jsonl")
    resumed = step_records(jsonl(work / "checkpoint_resumed.jsonl"))
    resharded = jsonl(work / "checkpoint_resharded.jsonl")
    uninterrupted = step_records(jsonl(work / "oracle_stage3_bf16.jsonl"))
    later = {s: v for s, v in uninterrupted.items() if s > save_steps}
    log = "\n".join(_lines(work / "checkpoint.log"))
    sample = log.split("sample:\n", 1)[1][:80] if "sample:\n" in log else None
    resharded_steps = [r for r in resharded if "step" in r and not r.get("final")]
    final = next((r for r in resharded if r.get("final")), {})
    return {
        "saved": sorted(p.name for p in (work / "ckpt").glob("step_*")),
        "first_steps": [r["step"] for r in first if "step" in r and not r.get("final")],
        "resumed_steps": sorted(resumed),
        "steps_expected": steps,
        "resumed_export_bitwise_uninterrupted": same_bytes(
            work / "resumed.safetensors", work / "oracle_stage3_bf16.safetensors"
        ),
        "resumed_steps_equal_uninterrupted": bool(later) and resumed == later,
        "resharded_world_size": final.get("world_size"),
        "resharded_bitwise_per_step": {
            str(r["step"]): r.get("oracle_max_abs_diff") == 0.0 for r in resharded_steps
        },
        "resharded_export_bytes": _size(work / "resharded.safetensors"),
        "sample": sample,
    }


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def bench_figures(log: Path, train: bool) -> dict:
    """bench_gpu.py's JSON line (its last): the kernels' figures; with train, the
    training runs', from its last line or, cut short, from each run's own line."""
    lines = _lines(log)
    found = last_json(lines) or {}
    if not train:
        return found
    runs = found.get("train")
    if runs is None:  # cut short: the runs that ended, each printed as it did
        runs = {}
        for line in lines:
            one = last_json([line]) if line.startswith('{"train_run"') else None
            if one:
                runs[one.pop("train_run")] = one
        found = found | {"finished": False}
    for run in runs.values():
        run.pop("command", None)
    return {k: found[k] for k in ("simulator", "device", "finished") if k in found} | {
        "train": runs
    }


def gpu_vs_cpu_figures(log: Path) -> dict:
    """scripts/tools/gpu_step_check.py's JSON line, less the step records it compared."""
    found = last_json(_lines(log)) or {}
    return {k: v for k, v in found.items() if k not in ("cpu_steps",)}


def figures_missing(name: str, figures: dict) -> str | None:
    """Why a phase whose command exited 0 still did not show what it is for."""
    if name == "env":
        return "; ".join(figures.get("missing", [])) or None
    if name == "tests":
        return None if figures["passed"] > 0 else "no test passed"
    if name.startswith("oracle"):
        return None if figures["all_bitwise"] else "not every step is bitwise the oracle"
    if name == "gpu_vs_cpu":
        if not figures.get("bitwise"):
            return "the GPU's steps are not bitwise the CPU's"
        memory = figures.get("memory", {})
        if not memory.get("simulator") and not memory.get("ledger_within_numba_allocations"):
            return "the ledger counts more device bytes than numba allocated (or no figures)"
        return None
    if name == "checkpoint":
        return checkpoint_missing(figures)
    if name == "bench":
        return None if "fraction_of_copy" in figures else "no JSON line from bench_gpu.py"
    if name == "bench_train":
        if not figures.get("train"):
            return "no training runs in bench_gpu.py's JSON line"
        failed = [k for k, run in figures["train"].items() if "failed" in run]
        return f"training runs failed: {failed}" if failed else None
    return None


def checkpoint_missing(figures: dict) -> str | None:
    if not figures["saved"] or not figures["resumed_steps"]:
        return "no save and resume"
    if not figures["resumed_export_bitwise_uninterrupted"]:
        return "the resumed run's export is not bitwise the uninterrupted run's (or is missing)"
    if not figures["resumed_steps_equal_uninterrupted"]:
        return "the resumed run's steps differ from the uninterrupted run's"
    per_step = figures["resharded_bitwise_per_step"]
    if not per_step or not all(per_step.values()) or not figures["resharded_export_bytes"]:
        return "the resharded resume is not bitwise its oracle at every step, or not exported"
    return None


def phase_figures(name: str, work: Path, expect: dict, save_steps: int) -> dict:
    """A phase's figures, from its log in WORK (gpu_check.sh copies each into RESULTS)."""
    if name == "env":
        found = last_json(_lines(work / "env.log"))
        return found or {"missing": ["no facts line in env.txt"]}
    if name == "tests":
        return tests_figures("\n".join(_lines(work / "tests.log")))
    if name.startswith("oracle"):
        return oracle_figures(work / f"{name}.log", jsonl(work / f"{name}.jsonl"), expect[name])
    if name == "gpu_vs_cpu":
        return gpu_vs_cpu_figures(work / "gpu_vs_cpu.log")
    if name == "checkpoint":
        return checkpoint_figures(work, expect[name], save_steps)
    if name.startswith("bench"):
        return bench_figures(work / f"{name}.log", train=name == "bench_train")
    return {}


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def summarize(work: Path, mode: str, expect: dict, started: float, save_steps: int = 0) -> dict:
    phases = {}
    for row in _lines(work / "phases.tsv"):
        name, file, status, rc, start, end, limit = row.split("\t")
        figures = phase_figures(name, work, expect, save_steps)
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
    summary = sub.add_parser("summary", help="write RESULTS/summary.json")
    summary.add_argument("work", type=Path)
    summary.add_argument("results", type=Path)
    summary.add_argument("--mode", choices=("gpu", "rehearse"), required=True)
    summary.add_argument("--started", type=float, required=True, help="the check's start")
    summary.add_argument("--expect", default="{}", help="JSON: steps each phase must show")
    summary.add_argument("--save-steps", type=int, default=0, help="the checkpoint's save step")
    a = p.parse_args()
    result = summarize(a.work, a.mode, json.loads(a.expect), a.started, a.save_steps)
    written = a.results / "summary.json.tmp"  # a reader never sees half a summary
    written.write_text(json.dumps(result, indent=1) + "\n")
    written.replace(a.results / "summary.json")
    print(json.dumps({k: v["status"] for k, v in result["phases"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
