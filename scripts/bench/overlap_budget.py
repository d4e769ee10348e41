"""Where an overlapped step's time goes on the slow link, and the best any schedule could do.

    sudo python scripts/bench/overlap_budget.py               # stages 1-3, 300 and 100 Mbit/s
    sudo python scripts/bench/overlap_budget.py --stages 2 --rates 100 --steps 8
    sudo python scripts/bench/overlap_budget.py --record      # docs/results/overlap_budget.json

The two hosts of scripts/bench/bench_overlap.py (2 x 2 ranks, ranks in blocks, tbf on the
veth), the sweep's GPT (--model-flags), each stage run with --overlap-comm and --trace on
the unlimited link and at each rate. From each rank's trace, per step (after the first
SKIP_FIRST; a step ends where its optimizer step ends), in ms:

  forward, backward   the units' compute spans (a gather's wait lies outside them)
  optimizer           the AdamW step
  waits               time blocked waiting for a collective in flight, by kind
  blocking            blocking collectives (the loss's and the norm's all-reduces)
  other               the rest of the step (Python between the spans)

each the median over ranks. Beside them, per kind, the link time of its bytes: the
link's measured bytes per step (busier direction) shared out by the ledger's bytes per
kind, over the link's measured rate. From those, the *dependency bound*: the least step
time any schedule of these collectives could reach given what each waits for, the
unlimited link's step (compute alone, its waits for other ranks included) plus the link
time no compute can cover:

  stages 1-2  + max(0, t_allgather - F) + max(0, t_reduce_scatter - B)
              (updated parameters are gathered after the step and read by the next
              forward; gradients are reduced during backward and read by the step)
  stage 3     + max(0, t_allgather / 2 - F) + max(0, t_allgather / 2 + t_reduce_scatter - B)
              (forward's gathers under forward; backward's gathers and reductions under
              backward)

with F and B the unlimited link's forward and backward. It ignores that the first
reduction waits for the first full bucket and the first forward for the first gather,
and that the link's traffic takes CPU from compute, so it is a lower bound. Also:
compute inflation, the forward + backward + optimizer time at the rate minus that on the
unlimited link (CPU the traffic takes from compute: 4 ranks and the kernel's TCP on 2
cores).

Prints the table and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.bench_overlap import parse_list, stop
from scripts.bench.netns_pair import NetnsError, NetnsPair
from scripts.bench.overlap_report import OVERLAP_TARGET
from scripts.bench.overlap_runs import SKIP_FIRST, link_rate, read_log, run_train

COMPUTE, COLLECTIVES, OPTIMIZER = 0, 1, 3  # zero_ref/io/trace.py's lane numbers
NOT_IN_STEP = ("sample",)  # lane-1 events outside training steps


# ---- pure parts: a trace's phases per step, the bound
def step_phases(events: list[dict], skip_first: int = SKIP_FIRST) -> list[dict]:
    """Per step of one rank's events (after skip_first): its length and phases, in s."""
    done = [e for e in events if e.get("ph") == "X" and e.get("tid") == OPTIMIZER]
    ends = sorted(e["ts"] + e["dur"] for e in done)
    steps = []
    for k in range(max(skip_first, 1), len(ends)):
        lo, hi = ends[k - 1], ends[k]
        inside = [e for e in events if e.get("ph") == "X" and lo < e["ts"] + e["dur"] <= hi]
        steps.append(phases_of(inside, (hi - lo) / 1e6))
    return steps


def phases_of(inside: list[dict], step_s: float) -> dict:
    """One step's events shared out into forward, backward, optimizer, waits by kind,
    blocking collectives and the rest."""
    p = {"step": step_s, "forward": 0.0, "backward": 0.0, "optimizer": 0.0, "blocking": 0.0}
    waits: dict[str, float] = defaultdict(float)
    for e in inside:
        s, lane, name = e["dur"] / 1e6, e.get("tid"), e["name"]
        if lane == COMPUTE:
            p["forward" if name.startswith("forward") else "backward"] += s
        elif lane == OPTIMIZER:
            p["optimizer"] += s
        elif lane == COLLECTIVES and name.startswith("wait "):
            waits[name.removeprefix("wait ")] += s
        elif lane == COLLECTIVES and not name.startswith(NOT_IN_STEP):
            p["blocking"] += s
    p["waits"] = dict(waits)
    p["wait"] = sum(waits.values())
    p["other"] = step_s - sum(p[k] for k in ("forward", "backward", "optimizer", "blocking"))
    p["other"] -= p["wait"]
    return p


def median_phases(per_rank: list[list[dict]]) -> dict:
    """Each phase's median over a rank's steps, then over ranks."""
    keys = ("step", "forward", "backward", "optimizer", "blocking", "wait", "other")
    ranks = [{k: statistics.median(s[k] for s in steps) for k in keys} for steps in per_rank]
    out = {k: statistics.median(r[k] for r in ranks) for k in keys}
    kinds = {kind for steps in per_rank for s in steps for kind in s["waits"]}
    out["waits"] = {
        kind: statistics.median(
            statistics.median(s["waits"].get(kind, 0.0) for s in steps) for steps in per_rank
        )
        for kind in sorted(kinds)
    }
    return out


def kind_link_seconds(link_bytes: float, kind_bytes: dict[str, float], rate: float) -> dict:
    """The link's bytes per step shared out by each kind's share of the ledger's bytes,
    over the link's rate (bytes per second)."""
    total = sum(kind_bytes.values())
    return {k: link_bytes * b / total / rate for k, b in kind_bytes.items()} if total else {}


def dependency_bound(stage: int, compute: dict, t: dict[str, float]) -> float:
    """The least step time a schedule of these collectives could reach (module docstring)."""
    f, b = compute["forward"], compute["backward"]
    ag, rs = t.get("allgather", 0.0), t.get("reduce_scatter", 0.0)
    if stage == 3:
        return compute["step"] + max(0.0, ag / 2 - f) + max(0.0, ag / 2 + rs - b)
    return compute["step"] + max(0.0, ag - f) + max(0.0, rs - b)


def compute_of(p: dict) -> float:
    return p["forward"] + p["backward"] + p["optimizer"]


# ---- the runs
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rates", default="300,100", help="tbf rates, Mbit/s (default 300,100)")
    p.add_argument("--stages", default="1,2,3", help="stages (1-3)")
    p.add_argument("--model-flags", default="--batch-size 128", help="the GPT's flags")
    p.add_argument("--extra", default="", help="more flags for every run (--prefetch-numel N)")
    p.add_argument("--steps", type=int, default=10, help="steps per run (default 10)")
    p.add_argument("--burst", type=int, default=1600, help="tbf burst, bytes")
    p.add_argument("--prefix", default="zrb", help="namespace names (scripts/bench/netns_pair.py)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    add_record_flag(p, "overlap_budget")
    a = p.parse_args()
    a.rates = parse_list(p, "--rates", a.rates, float)
    a.stages = parse_list(p, "--stages", a.stages, int)
    if any(s not in (1, 2, 3) for s in a.stages):
        p.error(f"--stages {a.stages}: overlap exists at stages 1, 2 and 3")
    if a.steps < SKIP_FIRST + 2:
        p.error(
            f"--steps {a.steps}: at least {SKIP_FIRST + 2} (the first {SKIP_FIRST} are left out)"
        )
    return a


def traced_run(pair: NetnsPair, stage: int, a: argparse.Namespace, tmp: Path) -> dict:
    """One overlapped run with --trace: its phases, link bytes and ledger bytes per kind."""
    trace, log = tmp / "trace.json", tmp / "log.jsonl"
    flags = ["--stage", str(stage), "--steps", str(a.steps), "--sample-chars", "0", "--quiet"]
    flags += [*a.model_flags.split(), "--overlap-comm", *a.extra.split(), "--trace", str(trace)]
    summary = run_train(pair, flags, log, a.timeout)
    events = json.loads(trace.read_text())["traceEvents"]
    per_rank = [step_phases([e for e in events if e.get("pid") == r]) for r in range(4)]
    final = read_log(log)[-1]
    kinds = final["ranks"][0]["comm_last_step"]
    return {
        "phases": median_phases(per_rank),
        "link_bytes": max(summary["link_rx_bytes"], summary["link_tx_bytes"]),
        "kind_sent_bytes": {k: v["sent_bytes"] for k, v in kinds.items()},
        "step_s_log": summary["step_s"],
    }


def row_for(stage: int, rate: float, link_s: float, run: dict, base: dict) -> dict:
    """One (stage, rate): the phases, each kind's link time, the bound and the targets."""
    t = kind_link_seconds(run["link_bytes"], run["kind_sent_bytes"], link_s)
    compute, comm = base["phases"], sum(t.values())
    bound = dependency_bound(stage, compute, t)
    p, most = run["phases"], max(compute["step"], comm)
    return {
        "stage": stage,
        "rate_mbit": rate,
        "link_bytes_s": link_s,
        "phases": p,
        "compute_phases": compute,
        "kind_link_s": t,
        "comm_s": comm,
        "max_s": most,
        "dependency_bound_s": bound,
        "target_s": OVERLAP_TARGET * most,
        "bound_over_max": bound / most,
        "overlapped_over_max": p["step"] / most,
        "overlapped_over_bound": p["step"] / bound,
        "compute_inflation_s": compute_of(p) - compute_of(compute),
        "target_reachable": bound <= OVERLAP_TARGET * most,
    }


def measure(a: argparse.Namespace) -> tuple[list[dict], dict]:
    tmp = Path(f"/tmp/{a.prefix}budget_{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    rows, links = [], {}
    with NetnsPair(a.prefix) as pair:
        base = {}
        for rate in [None, *a.rates]:
            pair.set_rate(rate, a.burst)
            links[str(rate)] = link_s = link_rate(pair)
            print(f"link {rate or 'unlimited'}: {link_s / 1e6:.1f} MB/s", flush=True)
            for stage in a.stages:
                run = traced_run(pair, stage, a, tmp)
                if rate is None:
                    base[stage] = run
                else:
                    rows.append(row_for(stage, rate, link_s, run, base[stage]))
                print(f"  stage {stage}: {run['phases']['step'] * 1e3:.1f} ms", flush=True)
    return rows, links


def print_table(rows: list[dict]) -> None:
    ms = 1e3
    print(
        "stage  Mbit  overl   max  bound  1.15max | fwd  bwd  opt  wait  block other | "
        "infl | t_ag  t_rs | reachable"
    )
    for r in rows:
        p = r["phases"]
        print(
            f"{r['stage']:5d} {r['rate_mbit']:5g} {p['step'] * ms:6.1f} {r['max_s'] * ms:5.1f} "
            f"{r['dependency_bound_s'] * ms:6.1f} {r['target_s'] * ms:7.1f} | "
            f"{p['forward'] * ms:4.0f} {p['backward'] * ms:4.0f} {p['optimizer'] * ms:4.0f} "
            f"{p['wait'] * ms:5.0f} {p['blocking'] * ms:5.0f} {p['other'] * ms:5.0f} | "
            f"{r['compute_inflation_s'] * ms:4.0f} | "
            f"{r['kind_link_s'].get('allgather', 0) * ms:5.0f} "
            f"{r['kind_link_s'].get('reduce_scatter', 0) * ms:5.0f} | {r['target_reachable']}"
        )


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    a = parse_args()
    try:
        rows, links = measure(a)
    except NetnsError as exc:
        raise SystemExit(f"overlap_budget.py: cannot make the two hosts: {exc}") from None
    print_table(rows)
    settings = {k: getattr(a, k) for k in ("rates", "stages", "model_flags", "extra", "steps")}
    settings |= {"burst_bytes": a.burst, "skip_first": SKIP_FIRST, "ranks": 4, "hosts": 2}
    emit(
        {"rows": rows, "links": links, "settings": settings, "load_average": load_average()},
        a.record,
    )


if __name__ == "__main__":
    main()
