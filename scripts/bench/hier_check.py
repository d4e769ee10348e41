"""Issue 33's measurement: node-aware collectives against flat ones, on the two namespace hosts.

    python scripts/bench/hier_check.py --record          # as root: namespaces and tbf

The default GPT on 2 hosts x 2 ranks (scripts/bench/netns_pair.py, UCX over TCP on a
tbf-limited veth), ranks in blocks (what `-ppn`, `-hosts h1:2,h2:2` and cluster launchers
give) unless a case says cyclic. Per case, one `python -m zero_ref.train` run
(scripts/bench/step_model_runs.py's one_case: median step time after the first steps,
the veth's bytes per step); the cases of one round run side by side, and the round is
repeated, so each figure is the median of its repeats measured under the same load.

  link bytes   stage 3's bytes per step on the link, hierarchical in blocks against flat
               with ranks placed cyclically (each host's bytes cross once: the least)
  step ratios  stage 3 / stage 0 step time at 100 Mbit/s in blocks, overlapped and
               blocking, hierarchical against flat
  one host     4 ranks on one machine: `--collectives auto` (which is flat there) against
               `--collectives flat`, to show the default changes nothing on one host

Prints a table and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.netns_pair import NetnsPair, unavailable
from scripts.bench.overlap_runs import REPO, rank_env
from scripts.bench.step_model_runs import one_case

RATE_MBIT = 100.0
BURST = 1600
GOALS = {"bytes_within": 0.05, "overlap_ratio": 1.2, "blocking_ratio": 1.7}
# name -> (placement, config of step_model_runs.CONFIGS, --collectives)
CASES: dict[str, tuple[str, str, str]] = {
    "s0_block": ("block", "s0", "flat"),
    "s3_block_flat": ("block", "s3", "flat"),
    "s3_block_hier": ("block", "s3", "hierarchical"),
    "s3o_block_flat": ("block", "s3_overlap", "flat"),
    "s3o_block_hier": ("block", "s3_overlap", "hierarchical"),
    "s3_cyclic_flat": ("cyclic", "s3", "flat"),
    "s3_block_auto": ("block", "s3", "auto"),
}


def two_host_round(pair: NetnsPair, steps: int, log: Path) -> dict[str, dict]:
    """Every case once, on the current link."""
    out = {}
    for name, (placement, config, collectives) in CASES.items():
        case = one_case(pair, config, placement, steps, log, ("--collectives", collectives))
        out[name] = case
        print(
            f"  {name}: {case['step_s'] * 1e3:.1f} ms, "
            f"{(case['link_rx_bytes'] + case['link_tx_bytes']) / 1e3:.1f} kB/step on the link",
            flush=True,
        )
    return out


def one_host_run(collectives: str, steps: int) -> float:
    """4 ranks on this machine, stage 3 overlapped: the median step seconds of one run."""
    log = Path(f"/tmp/hier_check_one_host_{collectives}.jsonl")
    log.unlink(missing_ok=True)
    argv = [
        "mpirun", "-n", "4", sys.executable, "-m", "zero_ref.train", "--stage", "3",
        "--overlap-comm", "--steps", str(steps), "--sample-chars", "0", "--quiet",
        "--collectives", collectives, "--log-jsonl", str(log),
    ]  # fmt: skip
    env = {**os.environ, **rank_env(), "PYTHONPATH": str(REPO)}
    subprocess.run(argv, check=True, capture_output=True, env=env, cwd=REPO, timeout=600)
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    times = [r["step_time_s"] for r in records if "step_time_s" in r and not r.get("final")]
    return statistics.median(times[2:])


def median_of(rounds: list[dict[str, dict]], name: str, key: str) -> float:
    if key == "link_bytes":  # both ways: what the link carries per step
        return statistics.median(
            r[name]["link_rx_bytes"] + r[name]["link_tx_bytes"] for r in rounds
        )
    return statistics.median(r[name][key] for r in rounds)


def summary(rounds: list[dict[str, dict]], one_host: dict[str, list[float]]) -> dict:
    step = {n: median_of(rounds, n, "step_s") for n in CASES}
    link = {n: median_of(rounds, n, "link_bytes") for n in CASES}
    flat_host = statistics.median(one_host["flat"])
    auto_host = statistics.median(one_host["auto"])
    result = {
        "rate_mbit": RATE_MBIT,
        "step_s": step,
        "link_bytes_per_step": link,
        "s3_hier_bytes_over_cyclic": link["s3_block_hier"] / link["s3_cyclic_flat"],
        "s3_flat_bytes_over_cyclic": link["s3_block_flat"] / link["s3_cyclic_flat"],
        "overlap_s3_over_s0": {
            "hierarchical": step["s3o_block_hier"] / step["s0_block"],
            "flat": step["s3o_block_flat"] / step["s0_block"],
        },
        "blocking_s3_over_s0": {
            "hierarchical": step["s3_block_hier"] / step["s0_block"],
            "flat": step["s3_block_flat"] / step["s0_block"],
        },
        "auto_is_hierarchical_bytes": link["s3_block_auto"] / link["s3_block_hier"],
        "one_host_step_s": {"flat": flat_host, "auto": auto_host},
        "one_host_runs_s": one_host,  # every run's median step: the spread
        "one_host_auto_over_flat": auto_host / flat_host,
        "repeats": len(rounds),
        "goals": GOALS,
    }
    result["goals_met"] = {
        "bytes": abs(result["s3_hier_bytes_over_cyclic"] - 1) <= GOALS["bytes_within"],
        "overlap": result["overlap_s3_over_s0"]["hierarchical"] <= GOALS["overlap_ratio"],
        "blocking": result["blocking_s3_over_s0"]["hierarchical"] <= GOALS["blocking_ratio"],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps per run (default 12)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every case")
    add_record_flag(parser, "hier_check")
    args = parser.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"hier_check: {why}")
    t0, load0 = time.time(), load_average()
    rounds: list[dict[str, dict]] = []
    one_host: dict[str, list[float]] = {"flat": [], "auto": []}
    log = Path("/tmp/hier_check.log.jsonl")
    with NetnsPair("zrq", "10.83.0") as pair:
        pair.set_rate(RATE_MBIT, BURST)
        for k in range(args.repeats):
            print(f"round {k + 1} of {args.repeats} at {RATE_MBIT:g} Mbit/s", flush=True)
            rounds.append(two_host_round(pair, args.steps, log))
    for _ in range(args.repeats):
        for collectives in ("flat", "auto"):
            one_host[collectives].append(one_host_run(collectives, args.steps))
    result = summary(rounds, one_host)
    result |= {"load_before": load0, "load_after": load_average(), "wall_s": time.time() - t0}
    print(json.dumps({k: result[k] for k in ("goals_met",)}), flush=True)
    emit(result, args.record)  # not under mpirun: it starts its own jobs


if __name__ == "__main__":
    main()
