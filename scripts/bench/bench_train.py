"""Tokens per second of the default GPT at each ZeRO stage, side by side in one run.

    python scripts/bench/bench_train.py --world 4 --steps 40 [--record]

Runs `mpirun -n W python -m zero_ref.train --stage S --quiet --log-jsonl ...` for
each stage (interleaved over --rounds, so a noisy neighbour hurts all stages
alike), takes the median step time after --warmup steps, and prints a table and,
last, one JSON line with tokens/s per stage and the stage 3 / stage 0 step-time
ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average


def run_stage(stage: int, a: argparse.Namespace, log: Path) -> list[dict]:
    beside = Path(sys.executable).with_name("mpirun")  # where the mpich wheel puts it
    cmd = [
        str(beside) if beside.exists() else "mpirun",
        "-n",
        str(a.world),
        sys.executable,
        "-m",
        "zero_ref.train",
        "--stage",
        str(stage),
        "--steps",
        str(a.steps),
        "--quiet",
        "--sample-chars",
        "0",
        "--log-jsonl",
        str(log),
        *a.extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"stage {stage} failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in log.read_text().splitlines()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("extra", nargs="*", help="more flags for zero_ref.train (after --)")
    add_record_flag(p, "bench_train")
    a = p.parse_args()
    times: dict[int, list[float]] = {s: [] for s in a.stages}
    tokens_per_step, sent, numel = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for stage in a.stages:
                records = run_stage(stage, a, Path(tmp) / f"s{stage}r{r}.jsonl")
                steps = [x for x in records if "step" in x][a.warmup :]
                times[stage] += [x["step_time_s"] for x in steps]
                tokens_per_step[stage] = steps[0]["tokens_per_s"] * steps[0]["step_time_s"]
                sent[stage] = steps[-1]["sent_bytes"]
                numel[stage] = records[-1]["numel_padded"]
    median = {s: statistics.median(t) for s, t in times.items()}
    print(f"{'stage':>5} {'median step ms':>15} {'tokens/s':>10} {'sent MiB/step':>14}")
    for s in a.stages:
        tps = tokens_per_step[s] / median[s]
        print(f"{s:>5} {median[s] * 1e3:>15.1f} {tps:>10,.0f} {sent[s] / 2**20:>14.3f}")
    result = {
        "world_size": a.world,
        "steps": a.steps,
        "warmup": a.warmup,
        "rounds": a.rounds,
        "extra_flags": a.extra,
        "numel_padded": numel,
        "median_step_s": median,
        "tokens_per_s": {s: tokens_per_step[s] / median[s] for s in a.stages},
        "sent_bytes_per_step": sent,
    }
    if 0 in median and 3 in median:
        result["stage3_over_stage0_step_time"] = median[3] / median[0]
    result["load_average"] = load_average()
    emit(result, a.record)


if __name__ == "__main__":
    main()
