"""Calibrate zero_ref/formulas/step_model.py on the two namespace hosts and check it against them.

    sudo python scripts/bench/step_model_check.py --record     # measure, fit, check
    sudo python scripts/bench/step_model_check.py --raw-out /tmp/sweep1.json  # one sweep
    python scripts/bench/step_model_check.py --from-raw /tmp/sweep*.json --record  # repeats

The default GPT on 2 hosts x 2 ranks (scripts/bench/step_model_runs.py): on the unlimited
veth and at 300, 100 and 30 Mbit/s (tbf, burst one frame), ranks in blocks and cyclic,
stages 0-3 blocking, stages 1-3 overlapped, and stage 3 with ZeRO++ (qwZ + hpZ + qgZ; with
ranks cyclic hpZ over the host's ranks and qgZ in one hop, step_model_runs.ZEROPP_CYCLIC),
all with flat collectives; and stage 1, stage 3 and stage 3 overlapped with the two-level
ones (`--collectives hierarchical`, the *_hier configurations).
The model's constants are fitted by least squares (of relative errors, every constant
>= 0) on the blocking runs in blocks of stage 0, stage 3 and stage 3 with ZeRO++ (FIT_SET,
at every rate), where the model is linear in them once the share of the calls the link
hides is held (fit_linear: held, fitted, redone until it stays). Measured, not fitted:
alpha, half the link's tiny all-gather over the 4 ranks (two messages, link_probe.py) on
each link; the rate inside a host, taken as the unlimited veth's one-stream rate (a fit
cannot tell a host's shared-memory bytes from compute here: every configuration moves
0.45-0.69 MB of them). Fitted:

  compute_s     forward + backward + optimizer of one rank (split 1:2 for overlap; the
                optimizer's full step at stage 0 against its quarter at stage 3 is not
                told apart from the rest by these runs, so it is not a constant of its own)
  link_factor   measured step seconds per second of link bytes at the link's measured
                one-stream TCP rate (1 = the link runs at that rate)
  quantize_s_per_numel  ZeRO++'s (de)quantization on the CPU
  call_s        the rank's own seconds a collective call (zero_ref's Python, mpi4py,
                the ledger and the buffers' copies around each call), less the share
                the link hides (step_model.exposed_call_seconds: no constant of its own)
  overlap_efficiency    per link: the share of a phase's compute the collectives behind
                it run under (0-1, a grid), fitted apart on the overlapped runs in blocks
                (OVERLAP_FIT) with the constants above held

Every other case (stages 1-2 blocking in blocks, every run with ranks cyclic, every run
with the two-level collectives) is predicted, not fitted. Prints the table and one JSON line last.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import signal
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.cli import parse_args as train_args
from zero_ref.app.rank_estimate import model_for
from zero_ref.app.run_finish import _qgz_blocks
from zero_ref.engine.gathered_unit import gathers_per_step
from zero_ref.formulas.memory import prefetch_plan
from zero_ref.formulas.step_model import (
    Cluster,
    Link,
    Workload,
    host_link_bytes,
    predict,
    waited_share,
)
from zero_ref.layout.flat import layout_align, model_layout

FIT_SET = ("s0", "s3", "s3_zeropp")  # blocking, ranks in blocks, every rate
OVERLAP_FIT = ("s1_overlap", "s2_overlap", "s3_overlap", "s3_zeropp_overlap")  # in blocks
CONSTANTS = ("compute_s", "link_factor", "quantize_s_per_numel", "call_s")
FIXED_POINT_ROUNDS = 100
GOAL = 0.15
HOSTS, PER_HOST = 2, 2
# the kinds that book one call a gradient bucket: flat, two-level (its host hop), qgZ's
REDUCE_KINDS = (
    "reduce_scatter",
    "reduce_scatter_local",
    "allreduce",
    "reduce_scatter_int8_local",
    "reduce_scatter_int8",
)


@functools.cache
def shape_of(stage: int, flags: tuple[str, ...]) -> Workload:
    """What the run's flags fix (its units, prefetch plan and ZeRO++ options), every
    fitted constant 0: parsed and laid out once per configuration, as the fit asks for
    the same cases many times."""
    world = HOSTS * PER_HOST
    parsed = train_args(["--stage", str(stage), *flags], world)
    zero = parsed.zero
    units = tuple(
        u.padded_numel
        for u in model_layout(model_for(parsed, world), world, layout_align(zero)).units
    )
    hpz = zero.zeropp.hpz_partition_size not in (None, 1)
    overlap = "--overlap-comm" in flags
    gathers = None
    if stage == 3 and not (hpz or zero.zeropp.quantized_weights):  # the plan's gathers
        ov = zero.overlap
        plan = prefetch_plan(
            units, overlap, ov.prefetch_numel, ov.max_live_numel, ov.persistence_numel
        )
        gathers = tuple(gathers_per_step(plan, list(units), zero.grad_accum))
    return Workload(
        stage=stage,
        unit_numels=units,
        forward_s=0.0,
        backward_s=0.0,
        overlap=overlap,
        gathers=gathers,
        qwz_block=zero.zeropp.quantize_block if zero.zeropp.quantized_weights else None,
        hpz=hpz,
        qgz_blocks=_qgz_blocks(zero, list(units), world),
        qgz_hops=1 if zero.zeropp.quantized_gradient_local_size == "world" else 2,
    )


def workload_of(case: dict, theta: dict) -> Workload:
    """The case's model and options, with the fitted constants."""
    buckets = sum(case["kinds"].get(k, {}).get("calls", 0) for k in REDUCE_KINDS)
    return dataclasses.replace(
        shape_of(case["stage"], tuple(case["flags"])),
        forward_s=theta["compute_s"] / 3,
        backward_s=theta["compute_s"] * 2 / 3,
        optimizer_s=0.0,  # inside compute_s (module docstring)
        reduce_buckets=buckets or None,
        quantize_s_per_numel=theta["quantize_s_per_numel"],
        overlap_efficiency=efficiency_of(case, theta),
        call_s=theta["call_s"],
    )


def efficiency_of(case: dict, theta: dict) -> float:
    """The case's link's fitted overlap_efficiency (1 before it is fitted)."""
    return theta.get("overlap_efficiency", {}).get(str(case["rate_mbit"]), 1.0)


def cluster_of(case: dict, theta: dict) -> Cluster:
    intra_rate = case["intra_bytes_s"] if theta.get("intra", True) else math.inf
    inter_rate = (
        case["link_bytes_s"] / theta["link_factor"] if theta["link_factor"] > 0 else math.inf
    )
    return Cluster(
        HOSTS,
        PER_HOST,
        Link(case["alpha_s"], intra_rate),
        Link(case["alpha_s"], inter_rate),
        case["placement"],
        collectives_of(case),
    )


def collectives_of(case: dict) -> str:
    """The run's --collectives (the last given wins, as argparse takes it)."""
    flags = case["flags"]
    at = [i for i, f in enumerate(flags) if f == "--collectives"]
    return flags[at[-1] + 1] if at else "flat"


def scalars_of(case: dict) -> int:
    return sum(case["kinds"].get(k, {}).get("calls", 0) for k in ("loss", "norm"))


def predicted(case: dict, theta: dict):
    return predict(workload_of(case, theta), cluster_of(case, theta), scalars_of(case))


def latency_s(case: dict) -> float:
    """The blocking step's alpha and inside-host part, from what was measured (every
    fitted constant 0)."""
    return predicted(replace_flags(case), dict.fromkeys(CONSTANTS, 0.0)).step_s


def features(case: dict) -> list[float]:
    """The blocking step's coefficient of each constant with every call paid (the model
    is linear in them without overlap once the share of the calls the link hides is held,
    fit_linear): predict with that constant 1 and the others 0, less the alpha part."""
    row, base = [], latency_s(case)
    for name in CONSTANTS:
        theta = dict.fromkeys(CONSTANTS, 0.0) | {name: 1.0}
        row.append(predicted(replace_flags(case), theta).step_s - base)
    return row


def replace_flags(case: dict) -> dict:
    return {**case, "flags": [f for f in case["flags"] if f != "--overlap-comm"]}


def nonnegative_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every constant >= 0 (each is seconds or a factor): the best of
    the fits over each subset of the constants, the others held at 0 (exact for these
    few columns; a plain fit can go negative where two constants explain the same runs)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y**2))
    for free in itertools.product((False, True), repeat=a.shape[1]):
        cols = [i for i, f in enumerate(free) if f]
        if not cols:
            continue
        sub, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if (sub < 0).any():
            continue
        theta = np.zeros(a.shape[1])
        theta[cols] = sub
        err = float(np.sum((a @ theta - y) ** 2))
        if err < best_err:
            best, best_err = theta, err
    return best


def fit_linear(a: np.ndarray, y: np.ndarray, scale: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """The constants (a: features' rows, y the steps less latency), the model being
    linear in them but for the share of the calls' seconds the link hides (waited_share:
    the waited link seconds over the step, which the constants set): the shares held,
    the constants fitted by least squares, the shares redone from them, until they stay.
    A fixed point of least squares with the shares held, not the least squares of the
    whole model; a few rounds on the recorded runs."""
    share = np.zeros(len(y))
    for _ in range(FIXED_POINT_ROUNDS):
        rows = a.copy()
        rows[:, 3] = a[:, 3] * (1 - share)  # call_s's column: the calls a step
        theta = nonnegative_lstsq(rows * scale[:, None], y * scale)
        rest = latency + a[:, :3] @ theta[:3]  # compute, quantization and link: all but calls
        link = theta[1] * a[:, 1]  # a blocking step waits on all its link seconds
        own = theta[3] * a[:, 3]
        now = np.array([waited_share(*x) for x in zip(link, rest, own, strict=True)])
        if np.max(np.abs(now - share)) < 1e-12:
            return theta
        share = now
    raise SystemExit(
        f"the fit's share of hidden calls did not settle in {FIXED_POINT_ROUNDS} rounds: "
        "the runs given are too few or too unlike for these constants"
    )


def fit(cases: list[dict]) -> dict:
    chosen = [c for c in cases if c["config"] in FIT_SET and c["placement"] == "block"]
    if not chosen:
        raise SystemExit(
            f"no run of {', '.join(FIT_SET)} with ranks in blocks to fit on: merge this "
            "sweep with one that has them (--from-raw A.json B.json)"
        )
    a = np.array([features(c) for c in chosen])
    latency = np.array([latency_s(c) for c in chosen])
    y = np.array([c["step_s"] for c in chosen]) - latency
    # relative errors (rows over the measured step), the check's own measure: a slow
    # link's long step would otherwise outweigh the fast ones
    scale = 1 / np.array([c["step_s"] for c in chosen])
    theta = fit_linear(a, y, scale, latency)
    constants = dict(zip(CONSTANTS, map(float, theta), strict=True))
    overlapped = [c for c in cases if c["config"] in OVERLAP_FIT and c["placement"] == "block"]
    constants["overlap_efficiency"] = {}
    for rate in dict.fromkeys(str(c["rate_mbit"]) for c in overlapped):
        here = [c for c in overlapped if str(c["rate_mbit"]) == rate]

        def misfit(e: float, here: list[dict] = here, rate: str = rate) -> float:
            th = constants | {"overlap_efficiency": {rate: e}}
            return sum((predicted(c, th).step_s / c["step_s"] - 1) ** 2 for c in here)

        constants["overlap_efficiency"][rate] = min((k / 100 for k in range(101)), key=misfit)
    return {"constants": constants, "cases": len(chosen) + len(overlapped)}


def check(cases: list[dict], theta: dict) -> list[dict]:
    rows = []
    for c in cases:
        row = {k: c.get(k) for k in ("config", "placement", "rate_mbit", "stage")}
        if "error" in c:
            rows.append(row | {"error": c["error"]})
            continue
        p = predicted(c, theta)
        fitted = c["config"] in (*FIT_SET, *OVERLAP_FIT) and c["placement"] == "block"
        row |= {
            "fitted": fitted,
            "measured_s": c["step_s"],
            "predicted_s": p.step_s,
            "compute_s": p.compute_s,
            "exposed_s": p.exposed_s,
            "hidden_s": p.hidden_s,
            "error": p.step_s / c["step_s"] - 1,
            "repeats_s": c.get("step_s_repeats", [c["step_s"]]),
            "link_bytes_measured": max(c["link_rx_bytes"], c["link_tx_bytes"]),
            # the ledger's seconds in collectives, and the link bytes' own at the rate
            # the run's sweep measured: what the first holds beyond the second is the
            # calls' own cost less what of it ran while the link was busy
            # (docs/step_model.md)
            "ledger_comm_s": c["ledger_comm_s"],
            "link_s": max(c["link_rx_bytes"], c["link_tx_bytes"])
            / c.get("sweep_link_bytes_s", c["link_bytes_s"]),
            "link_bytes_predicted": sum(
                host_link_bytes(f, cluster_of(c, theta)) for f in p.flights
            ),
        }
        row["within_goal"] = abs(row["error"]) <= GOAL
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print("config              placement  Mbit   measured  predicted  error  fitted")
    for r in rows:
        rate = r["rate_mbit"] or "inf"
        if isinstance(r.get("error"), str):
            print(f"{r['config']:19s} {r['placement']:9s} {rate!s:>5}  did not run")
            continue
        print(
            f"{r['config']:19s} {r['placement']:9s} {rate!s:>5} {r['measured_s'] * 1e3:9.1f} "
            f"{r['predicted_s'] * 1e3:10.1f} {r['error'] * 100:+6.1f}%  {r['fitted']}"
        )


def merged(sweeps: list[dict]) -> dict:
    """Several sweeps as one: per case (rate, placement, config) the least of its repeats'
    median step times (every repeat kept): on a 2-core machine other work only ever adds
    time, and the model predicts a step undisturbed; per link the median rate and tiny
    all-gather."""
    links = []
    for rate in dict.fromkeys(x["rate_mbit"] for s in sweeps for x in s["links"]):
        same = [x for s in sweeps for x in s["links"] if x["rate_mbit"] == rate]
        keys = ("link_bytes_s", "allgather_tiny_s")
        links.append({"rate_mbit": rate} | {k: statistics.median(x[k] for x in same) for k in keys})
    rate_of = {x["rate_mbit"]: x["link_bytes_s"] for x in links}
    cases = []
    for key in dict.fromkeys(
        (c["rate_mbit"], c["placement"], c["config"]) for s in sweeps for c in s["cases"]
    ):
        same = [
            c
            for s in sweeps
            for c in s["cases"]
            if (c["rate_mbit"], c["placement"], c["config"]) == key
        ]
        ran = [c for c in same if "error" not in c]
        if not ran:
            cases.append(same[0])
            continue
        # the least step's run gives the case's other measures (its ledger, its bytes,
        # its own sweep's link rate); the model is given the links' median rate
        least = min(ran, key=lambda c: c["step_s"])
        case = dict(least, link_bytes_s=rate_of[key[0]])
        case["sweep_link_bytes_s"] = least.get("link_bytes_s", rate_of[key[0]])
        case["step_s_repeats"] = [c["step_s"] for c in ran]
        cases.append(case)
    return {"links": links, "cases": cases, "sweeps": len(sweeps)}


def configs_of(text: str | None) -> list[str]:
    """--configs as a list, each checked against step_model_runs.CONFIGS."""
    from scripts.bench.step_model_runs import CONFIGS

    if text is None:
        return list(CONFIGS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in CONFIGS]
    if unknown or not names:
        raise SystemExit(
            f"--configs {text!r}: unknown {', '.join(unknown) or '(none given)'}; "
            f"allowed are {', '.join(CONFIGS)}"
        )
    return names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--from-raw",
        nargs="+",
        help="sweeps step_model_runs.measure wrote (JSON): fit their medians, run nothing",
    )
    p.add_argument("--rates", default="300,100,30", help="tbf rates besides unlimited, Mbit/s")
    p.add_argument("--steps", type=int, default=10, help="steps per run (default 10)")
    p.add_argument("--prefix", default="zrm", help="namespace names")
    p.add_argument("--subnet", default="10.81.0", help="the link's subnet a.b.c")
    p.add_argument("--raw-out", help="also write the measured sweep (for --from-raw) here")
    p.add_argument(
        "--configs", help="the configurations to run, comma-separated (default: all of them)"
    )
    add_record_flag(p, "step_model_check")
    a = p.parse_args()
    if a.from_raw:
        raw = merged([json.loads(Path(f).read_text()) for f in a.from_raw])
    else:
        from scripts.bench.bench_overlap import stop
        from scripts.bench.step_model_runs import measure

        signal.signal(signal.SIGTERM, stop)
        rates = [None, *(float(x) for x in a.rates.split(","))]
        progress = Path(f"/tmp/{a.prefix}_step_model_progress.jsonl")
        links, cases = measure(
            a.prefix, a.subnet, rates, ["block", "cyclic"], configs_of(a.configs), a.steps,
            1600, progress,
        )  # fmt: skip
        if a.raw_out:
            Path(a.raw_out).write_text(json.dumps({"links": links, "cases": cases}))
        raw = merged([{"links": links, "cases": cases}])
    alpha = {str(x["rate_mbit"]): x["allgather_tiny_s"] / 2 for x in raw["links"]}
    unlimited = next(x["link_bytes_s"] for x in raw["links"] if x["rate_mbit"] is None)
    for c in raw["cases"]:
        c["alpha_s"] = alpha[str(c["rate_mbit"])]
        c["intra_bytes_s"] = unlimited
    good = [c for c in raw["cases"] if "error" not in c]
    fitted = fit(good)
    rows = check(raw["cases"], fitted["constants"])
    print_table(rows)
    errors = [abs(r["error"]) for r in rows if isinstance(r.get("error"), float)]
    summary = {
        "cases": len(errors),
        "within_goal": sum(e <= GOAL for e in errors),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
        "did_not_run": sum(isinstance(r.get("error"), str) for r in rows),
    }
    print(summary)
    emit(
        {
            "fit": fitted,
            "goal": GOAL,
            "summary": summary,
            "rows": rows,
            "links": raw["links"],
            "fit_set": list(FIT_SET),
            "overlap_fit": list(OVERLAP_FIT),
            "sweeps": raw["sweeps"],
            "load_average": load_average(),
        },
        a.record,
    )


if __name__ == "__main__":
    main()
