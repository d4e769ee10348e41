"""ZeRO++ measured (issue 24, item 6): what qwZ, hpZ and qgZ keep off the link between
two hosts, what that does to the step time, and how far each moves the loss.

    sudo python scripts/bench/bench_zeropp.py --parts link --record bench_zeropp_link
    python scripts/bench/bench_zeropp.py --parts loss --record bench_zeropp_loss
    python scripts/bench/bench_zeropp.py --parts link --configs "stage 3,all three" --steps 8
    python scripts/bench/bench_zeropp.py --markdown docs/results/bench_zeropp_link_hops.json

bf16 stage 3 of the default GPT, and the same with each of scripts/bench/zeropp_report.py's
SETUPS (plain, +qwZ, +hpZ with host groups, +qgZ, all three; rows added there, picked
with --configs; a row whose flags zero_ref.train does not know yet is recorded as
skipped, with the reason). Two parts:

- link (root): scripts/bench/netns_pair.py's two namespace hosts x 2 ranks, ranks in blocks
  (Hydra's default), UCX over TCP on the veth, tbf on both ends; on the unlimited link
  and at each --rates value (default 100, 30, 10 Mbit/s): each configuration's median
  step time after the first 2 steps and its link bytes per step each way (the veth
  counters' slope, read as each step's --log-jsonl line appears: scripts/bench/overlap_runs.py's
  run_train), beside the last step's ledger by kind (rank 0), the paper's cross-node
  bytes and our formula for the link (zeropp_report.link_formula);
- loss: 4 ranks on this host (the loss does not depend on the network), --steps-loss
  steps (800, zero_ref.train's defaults otherwise) per configuration and seed: the
  final loss (the mean of the last 50 steps), its mean and spread over the seeds, and
  the first seed's loss at every step (docs/img/zeropp_loss_hops.png, scripts/docs/plot_zeropp.py).

Targets (issue 24): all three <= 0.3 x stage 3's link bytes; at a rate where stage 3 is
communication-bound, all three's step <= 0.6 x stage 3's; each final loss within 2 % of
stage 3's. Prints the tables, which targets hold, and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.bench_overlap import medians, parse_list, stop, train_help
from scripts.bench.netns_pair import NetnsError, NetnsPair
from scripts.bench.overlap_runs import SKIP_FIRST, link_rate, rank_env, read_log, run_train
from scripts.bench.zeropp_report import (
    HOSTS,
    PER_HOST,
    RATES_MBIT,
    Setup,
    bytes_table,
    checks_text,
    final_loss,
    link_formula,
    link_targets,
    loss_summary,
    loss_table,
    loss_targets,
    paper_bytes,
    rate_key,
    setups_named,
    times_table,
    train_flags,
    unknown_flags,
)

PARTS = ("link", "loss")
QUIET = ("--sample-chars", "0", "--quiet")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="link,loss", help="link, loss or both (default: both)")
    p.add_argument("--configs", default="all", help="names from zeropp_report.SETUPS, or all")
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES_MBIT), help="Mbit/s")
    p.add_argument("--steps", type=int, default=20, help="steps per link run (default: 20)")
    p.add_argument(
        "--repeats", type=int, default=1, help="link runs of each, interleaved (median; 1)"
    )
    p.add_argument("--steps-loss", type=int, default=800, help="steps per loss run (800)")
    p.add_argument("--seeds", default="0,1,2", help="the loss part's seeds (default: 0,1,2)")
    p.add_argument(
        "--quantize-block",
        type=int,
        default=256,
        help="qwZ/qgZ block (default 256: the default GPT's units are a few thousand "
        "elements, and qwZ pads each to a multiple of 4 x block, docs/zeropp.md)",
    )
    p.add_argument("--model-flags", default="", help="flags added to every run (tests: tiny)")
    p.add_argument("--burst", type=int, default=1600, help="tbf burst, bytes (default 1600)")
    p.add_argument("--prefix", default="zrzp", help="names: namespaces P_h1, P_h2, veth P0")
    p.add_argument("--subnet", default="10.87.0", help="the link's addresses, a.b.c")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per training run")
    p.add_argument("--markdown", metavar="JSON", help="print a recorded result's tables")
    add_record_flag(p, "bench_zeropp")
    a = p.parse_args()
    a.parts = [x for x in a.parts.split(",") if x]
    if not a.parts or any(x not in PARTS for x in a.parts):
        p.error(f"--parts {a.parts}: one or more of {', '.join(PARTS)}")
    try:
        a.setups = setups_named(a.configs)
    except ValueError as exc:
        p.error(str(exc))
    a.rates = parse_list(p, "--rates", a.rates, float)
    a.seeds = parse_list(p, "--seeds", a.seeds, int)
    if any(r <= 0 for r in a.rates):
        p.error(f"--rates {a.rates}: every rate must be > 0 Mbit/s")
    if not a.seeds:
        p.error("--seeds: at least one seed")
    if a.steps < SKIP_FIRST + 3:
        p.error(f"--steps {a.steps}: at least {SKIP_FIRST + 3} (the first {SKIP_FIRST} skipped)")
    if a.steps_loss < 50:
        p.error(f"--steps-loss {a.steps_loss}: at least 50 (the final loss is the last 50's mean)")
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: at least 1")
    if a.quantize_block < 1:
        p.error(f"--quantize-block {a.quantize_block}: at least 1")
    return a


def flags_of(setup: Setup, a: argparse.Namespace) -> list[str]:
    return [*train_flags(setup, a.quantize_block), *a.model_flags.split(), *QUIET]


# ---- the link part


def ledger_of(log: Path) -> tuple[dict, dict[str, int], bool]:
    """The run's final --log-jsonl record, rank 0's last-step ledger (sent bytes by
    kind), and whether every rank's equals it."""
    final = read_log(log)[-1]
    per_rank = [
        {k: v["sent_bytes"] for k, v in r["comm_last_step"].items()} for r in final["ranks"]
    ]
    return final, per_rank[0], all(x == per_rank[0] for x in per_rank)


def kind_seconds(final: dict) -> dict[str, float]:
    """The last step's seconds in each collective kind, the median over ranks."""
    per_rank = [r["comm_last_step"] for r in final["ranks"]]
    return {k: statistics.median(c[k]["seconds"] for c in per_rank) for k in per_rank[0]}


def link_part(setups: list[Setup], known: str, a: argparse.Namespace) -> tuple[list, list]:
    """Every configuration on the unlimited link, then at each rate: (links, rows)."""
    rows = [{"config": s.name, "flags": flags_of(s, a), "skipped": unknown_flags(s, known)}
            for s in setups]  # fmt: skip
    log = Path(f"/tmp/{a.prefix}bench_zeropp_{os.getpid()}.jsonl")
    links = []
    try:
        with NetnsPair(a.prefix, a.subnet) as pair:
            for rate in [None, *sorted(a.rates, reverse=True)]:
                pair.set_rate(rate, a.burst)
                link = {"rate_mbit": rate, "link_bytes_s": link_rate(pair)}
                links.append(link)
                print(f"link {rate_key(rate)}: {link['link_bytes_s'] / 1e6:.1f} MB/s", flush=True)
                runs: dict[str, list[dict]] = {}
                for _ in range(a.repeats):  # configurations interleaved: a busy spell hits all
                    for setup, row in zip(setups, rows, strict=True):
                        if not row["skipped"]:
                            runs.setdefault(setup.name, []).append(
                                link_run(pair, setup, row, rate, log, a)
                            )
                for row in rows:
                    if not row["skipped"]:
                        row.setdefault("runs", {})[rate_key(rate)] = medians(runs[row["config"]])
    except NetnsError as exc:
        raise SystemExit(f"bench_zeropp.py: cannot make the two hosts: {exc}") from None
    finally:
        log.unlink(missing_ok=True)
    return links, rows


def link_run(pair, setup: Setup, row: dict, rate, log: Path, a: argparse.Namespace) -> dict:
    """One configuration's run on the current link; on the unlimited one, its ledger too."""
    flags = [*row["flags"], "--steps", str(a.steps)]
    run = run_train(pair, flags, log, a.timeout, "block")
    final, ledger, equal = ledger_of(log)
    seconds = row.setdefault("kind_seconds", {}).setdefault(rate_key(rate), [])
    seconds.append(kind_seconds(final))
    if rate is None:
        row.update(
            ledger=ledger,
            ledger_ranks_equal=equal,
            numel_padded=final["numel_padded"],
            expected_sent_bytes=final["expected_sent_bytes"],
            link_formula=link_formula(ledger, PER_HOST * HOSTS, setup.groups_in_host),
            paper_bytes=paper_bytes(setup, final["numel_padded"]),
        )
    print(
        f"  {setup.name} at {rate_key(rate)}: {run['step_s'] * 1e3:.1f} ms, link "
        f"{run['link_rx_bytes']:,.0f} / {run['link_tx_bytes']:,.0f} bytes a step",
        flush=True,
    )
    return run


# ---- the loss part


def mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def loss_run(flags: list[str], seed: int, a: argparse.Namespace, log: Path) -> list[dict]:
    """One run on this host, 4 ranks: its --log-jsonl step records."""
    log.unlink(missing_ok=True)
    argv = [mpiexec(), "-n", str(PER_HOST * HOSTS), sys.executable, "-m", "zero_ref.train"]
    argv += [*flags, "--seed", str(seed), "--steps", str(a.steps_loss), "--log-jsonl", str(log)]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=rank_env(), timeout=a.timeout
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(argv)} timed out after {a.timeout:g} s") from None
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{(done.stderr or done.stdout)[-3000:]}")
    return [r for r in read_log(log) if "loss" in r and not r.get("final")]


def loss_part(setups: list[Setup], known: str, a: argparse.Namespace) -> list[dict]:
    """Seed by seed, every configuration (a busy spell then hits all alike)."""
    rows = [{"config": s.name, "flags": flags_of(s, a), "skipped": unknown_flags(s, known),
             "seeds": a.seeds, "final_loss": [], "step_s": []} for s in setups]  # fmt: skip
    log = Path(f"/tmp/{a.prefix}bench_zeropp_loss_{os.getpid()}.jsonl")
    try:
        for seed in a.seeds:
            for row in rows:
                if row["skipped"]:
                    continue
                steps = loss_run(row["flags"], seed, a, log)
                losses = [s["loss"] for s in steps]
                row["final_loss"].append(final_loss(losses))
                row["step_s"].append(statistics.median(s["step_time_s"] for s in steps[2:]))
                if seed == a.seeds[0]:
                    row["curve_seed"], row["curve"] = seed, losses
                print(f"  {row['config']} seed {seed}: final loss "
                      f"{row['final_loss'][-1]:.4f}", flush=True)  # fmt: skip
    finally:
        log.unlink(missing_ok=True)
    for row in rows:
        if not row["skipped"]:
            row.update(loss_summary(row["final_loss"]))
    return rows


# ---- the whole


def report(result: dict) -> str:
    parts = []
    if "link_rows" in result:
        parts += [
            bytes_table(result["link_rows"]),
            times_table(result["link_rows"], result["links"]),
        ]
    if "loss_rows" in result:
        parts.append(loss_table(result["loss_rows"]))
    parts.append(checks_text(result["targets"]))
    return "\n\n".join(parts)


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    a = parse_args()
    if a.markdown:
        print(report(json.loads(Path(a.markdown).read_text())))
        return
    known = train_help()
    result: dict = {"targets": []}
    if "link" in a.parts:
        links, rows = link_part(a.setups, known, a)
        result.update(links=links, link_rows=rows)
        result["targets"] += link_targets(rows, links)
    if "loss" in a.parts:
        rows = loss_part(a.setups, known, a)
        result["loss_rows"] = rows
        result["targets"] += loss_targets(rows)
    result["settings"] = {
        "parts": a.parts,
        "steps": a.steps,
        "repeats": a.repeats,
        "steps_loss": a.steps_loss,
        "seeds": a.seeds,
        "quantize_block": a.quantize_block,
        "model_flags": a.model_flags,
        "burst_bytes": a.burst,
        "skip_first": SKIP_FIRST,
        "ranks": PER_HOST * HOSTS,
        "placement": "block",
    }
    result["load_average"] = load_average()
    print(report(result))
    emit(result, a.record)


if __name__ == "__main__":
    main()
