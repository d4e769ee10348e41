"""A before/after capture of what zero_ref's runs write: exports, JSONL logs and traces, for a
matrix of stages, precisions, world sizes and options (issue 32 item 6: a refactor changes no
behaviour). Each case runs `python -m zero_ref.train --deterministic` under mpirun and keeps
a digest of each file it wrote, with what a run cannot repeat taken out first:

  export  the safetensors file byte for byte (the parameters after the last step)
  log     every JSONL record less its clock readings (tokens_per_s, *_time_s, *_s) and the
          process's RSS figures (rss_*): losses, norms, bytes sent, memory ledger, skips
  trace   every event's name, phase, rank and lane and its args, in order per (rank, lane),
          less ts and dur (the clock) and args that are clock readings; in a lane a thread
          pool feeds (the offload pipeline's swap reads and writes) the events sorted and
          the thread's name left out, since which thread runs each, and when, is the OS's
  stdout  what the run prints, less lines of times or rates and the resident-set rows

    python scripts/tools/behaviour_capture.py --out runs/capture_before
    python scripts/tools/behaviour_capture.py --out runs/capture_after
    python scripts/tools/behaviour_capture.py --compare runs/capture_before runs/capture_after

JSON line last: {"cases": n, "files": n} for a capture, {"same": bool, "differ": [...]} for
a comparison (exit 1 when anything differs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "gpt", "--d-model", "16", "--n-layer", "2", "--n-head", "2"]
TINY += ["--context", "16", "--batch-size", "12", "--steps", "3", "--log-every", "1"]

CASES: dict[str, tuple[int, list[str]]] = {  # name -> (ranks, flags)
    **{f"s{s}_fp32_w2": (2, ["--stage", str(s)]) for s in range(4)},
    **{f"s{s}_bf16_w3": (3, ["--stage", str(s), "--precision", "bf16"]) for s in range(4)},
    "s1_fp16_accum2_w2": (2, ["--stage", "1", "--precision", "fp16", "--grad-accum", "2"]),
    "s3_fp16_accum2_w2": (2, ["--stage", "3", "--precision", "fp16", "--grad-accum", "2"]),
    "s0_accum2_w3": (3, ["--stage", "0", "--grad-accum", "2"]),
    "s1_overlap_w2": (2, ["--stage", "1", "--overlap-comm"]),
    "s2_overlap_w3": (3, ["--stage", "2", "--overlap-comm"]),
    "s3_overlap_prefetch_w3": (3, ["--stage", "3", "--overlap-comm", "--prefetch-numel", "5000"]),
    "s3_nvme_w2": (2, ["--stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme"]),
    "s2_nvme_bf16_w2": (2, ["--stage", "2", "--offload-optimizer", "nvme", "--precision", "bf16"]),
    "s3_qwz_hpz_w4": (4, ["--stage", "3", "--quantized-weights", "--hpz-partition-size", "2"]),
    "s2_qgz_w4": (4, ["--stage", "2", "--quantized-gradients"]),
    "s3_hybrid_w4": (4, ["--stage", "3", "--hybrid-shard-size", "2"]),
    "s1_ckpt_act_accum2_w2": (2, ["--stage", "1", "--checkpoint-activations", "--grad-accum", "2"]),
    "s3_oracle_w2": (2, ["--stage", "3", "--check-oracle", "--precision", "bf16"]),
}
CLOCK_SUFFIXES = ("_s", "_per_s", "_ms", "_us")


def is_clock(key: str) -> bool:
    """A key whose value a run cannot repeat: a time, a rate, or the process's RSS."""
    return key.endswith(CLOCK_SUFFIXES) or "rss" in key or key in ("ts", "dur", "seconds")


def without_clocks(value):
    """`value` (a JSON value) with every clock key taken out, at any depth."""
    if isinstance(value, dict):
        return {k: without_clocks(v) for k, v in value.items() if not is_clock(k)}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def normal_log(path: Path) -> str:
    """The JSONL records, clock keys out, one a line."""
    records = [without_clocks(json.loads(line)) for line in path.read_text().splitlines()]
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def normal_trace(path: Path) -> str:
    """Events in order within each (rank, lane), clock fields out, one a line."""
    lanes: dict[str, list] = {}
    for event in json.loads(path.read_text())["traceEvents"]:
        key = f"{event.get('pid')}/{event.get('tid')}"
        lanes.setdefault(key, []).append(without_clocks(event))
    for lane, events in lanes.items():  # a lane a thread pool feeds: which thread ran
        if any("thread" in e.get("args", {}) for e in events):  # each, and when, is the OS's
            for e in events:
                e.get("args", {}).pop("thread", None)
            lanes[lane] = sorted(events, key=lambda e: json.dumps(e, sort_keys=True))
    return "".join(
        f"{lane} {json.dumps(event, sort_keys=True)}\n"
        for lane in sorted(lanes)
        for event in lanes[lane]
    )


def run_case(name: str, ranks: int, flags: list[str], work: Path, out: Path) -> dict[str, str]:
    folder = work / name
    folder.mkdir()
    outputs = ["--export", str(folder / "export.safetensors")]
    outputs += ["--log-jsonl", str(folder / "log.jsonl"), "--trace", str(folder / "trace.json")]
    if "nvme" in flags:
        (folder / "swap").mkdir()
        outputs += ["--nvme-path", str(folder / "swap")]
    cmd = ["mpirun", "-n", str(ranks), sys.executable, "-m", "zero_ref.train", "--deterministic"]
    cmd += ["--quiet", *TINY, *flags, *outputs]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"case {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    kept = {  # what is compared, kept beside the digests so that a difference can be read
        "log": normal_log(folder / "log.jsonl"),
        "trace": normal_trace(folder / "trace.json"),
        "stdout": without_clock_lines(done.stdout),
    }
    for kind, text in kept.items():
        (out / f"{name}.{kind}.txt").write_text(text)
    return {
        "export": digest((folder / "export.safetensors").read_bytes()),
        **{kind: digest(text.encode()) for kind, text in kept.items()},
    }


def without_clock_lines(text: str) -> str:
    """stdout less the lines that report times or rates ("... s", "/s", "ms") and the rows
    of the "ledger vs process" table (each rank's resident set: the process's, not the
    engine's)."""
    keep, in_rss_rows = [], False
    for line in text.splitlines():
        if in_rss_rows and re.match(r"\s+\d+\s", line):
            continue
        in_rss_rows = "real init" in line
        if any(word in line for word in (" s ", " s,", " s)", "/s", " ms", "tok/s", "RSS")):
            continue
        keep.append(line)
    return "\n".join(keep)


def capture(out: Path, only: list[str] | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "capture.json"
    result = json.loads(path.read_text()) if path.exists() else {}  # --only adds to it
    with tempfile.TemporaryDirectory() as tmp:
        for name in only or list(CASES):
            ranks, flags = CASES[name]
            result[name] = run_case(name, ranks, flags, Path(tmp), out)
            path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
            print(f"{name}: {result[name]['export'][:12]}", flush=True)
    return result


def compare(a: Path, b: Path) -> list[str]:
    before = json.loads((a / "capture.json").read_text())
    after = json.loads((b / "capture.json").read_text())
    differ = [f"{name}: missing" for name in before if name not in after]
    for name, files in before.items():
        for kind, sha in files.items():
            if name in after and after[name].get(kind) != sha:
                differ.append(f"{name}: {kind}")
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="the folder the capture's digests go to")
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="these cases alone")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.compare:
        differ = compare(*args.compare)
        for line in differ:
            print(line)
        print(json.dumps({"same": not differ, "differ": differ}))
        raise SystemExit(1 if differ else 0)
    if args.out is None:
        ap.error("--out FOLDER (or --compare BEFORE AFTER)")
    result = capture(args.out, args.only)
    print(json.dumps({"cases": len(result), "files": sum(len(v) for v in result.values())}))


if __name__ == "__main__":
    main()
