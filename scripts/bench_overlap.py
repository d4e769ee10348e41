"""Overlap on a network that costs (issue 23, item 5): ZeRO's collectives across two hosts.

    sudo python scripts/bench_overlap.py                       # stages 1-3, 400/100/30 Mbit/s
    sudo python scripts/bench_overlap.py --rates 100 --stages 3 --steps 10
    sudo python scripts/bench_overlap.py --record              # docs/results/bench_overlap.json

Two network-namespace hosts joined by a veth (scripts/netns_pair.py), 2 ranks on each,
UCX over TCP on the veth, the link rate-limited with tbf on both ends. For each link
(unlimited, then each --rates value) the link's real rate is measured (one TCP stream)
and one tiny all-gather's time (scripts/allgather_latency.py); then for each stage one
`python -m zero_ref.train` with --log-jsonl, blocking, and the same run with the overlap
flags (OVERLAP_FLAGS) where zero_ref.train knows them (else overlapped is null, and the
reason is printed). Stage 0 runs too (blocking) on the unlimited link and at 100 Mbit/s,
for the issue's reference. Per run, after the first SKIP_FIRST steps:

- step time (median), and the bytes over the link per step: the veth counters read as
  each step's --log-jsonl line appears (the difference from step SKIP_FIRST to the last,
  over the steps between), both directions;
- compute: the same run's step time on the unlimited link;
- communication: the busier direction's bytes per step over the measured link rate
  (an estimate from bytes alone), beside the ledger's seconds in collectives on the last
  step (median over ranks: link time, per-message cost and waiting for slower ranks) and
  its collectives per step; messages: that count times one tiny all-gather's time;
- blocking / max(compute, communication) and overlapped / max(compute, communication).

Targets (issue 23): overlapped <= 1.15 x max wherever blocking >= 1.3 x max; at
100 Mbit/s, overlapped stage 3 <= 1.2 x stage 0's step time. Prints the table, which
targets hold, and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_common import add_record_flag, emit, load_average
from netns_pair import NetnsError, NetnsPair

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
SKIP_FIRST = 2  # steps left out: the first steps pay one-off costs
PER_HOST = 2  # ranks on each of the two hosts
REFERENCE_MBIT = 100.0  # the reference link: stage 3 vs stage 0 there
# The flags that turn overlap on, per stage (stage 3: with prefetch). The one place to
# adjust them; a stage whose flags zero_ref.train does not know gets overlapped = null.
OVERLAP_FLAGS: dict[int, tuple[str, ...]] = {
    1: ("--overlap-comm",),
    2: ("--overlap-comm",),
    3: ("--overlap-comm", "--prefetch-depth", "1"),
}
OVERLAP_TARGET = 1.15  # overlapped <= this x max(compute, comm) ...
BLOCKING_SLOW = 1.3  # ... wherever blocking >= this x max
STAGE3_VS_STAGE0 = 1.2  # at 100 Mbit/s, overlapped stage 3 <= this x stage 0
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="400,100,30", help="tbf rates, Mbit/s, comma-separated")
    p.add_argument("--stages", default="1,2,3", help="stages to sweep (0-3)")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")
    p.add_argument("--model-flags", default="", help="extra zero_ref.train flags (model size)")
    p.add_argument(
        "--burst",
        type=int,
        default=1600,
        help="tbf burst, bytes (default 1600: one frame, no free burst)",
    )
    p.add_argument(
        "--probe-numel",
        type=int,
        default=117376,
        help="float32 values per probed collective (default: the default GPT's)",
    )
    p.add_argument("--prefix", default="zrn_", help="namespace/veth name prefix (default zrn_)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per training run")
    add_record_flag(p, "bench_overlap")
    a = p.parse_args()
    a.rates = parse_list(p, "--rates", a.rates, float)
    a.stages = parse_list(p, "--stages", a.stages, int)
    if any(r <= 0 for r in a.rates):
        p.error(f"--rates {a.rates}: every rate must be > 0 Mbit/s")
    if any(s not in (0, 1, 2, 3) for s in a.stages):
        p.error(f"--stages {a.stages}: allowed are 0, 1, 2, 3")
    if a.steps < SKIP_FIRST + 2:
        p.error(f"--steps {a.steps}: at least {SKIP_FIRST + 2} (the first {SKIP_FIRST} skipped)")
    return a


def parse_list(p: argparse.ArgumentParser, flag: str, text: str, kind: type) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} {text!r}: a comma-separated list of numbers")


# ---- the link: its rate and one message's cost


def link_rate(pair: NetnsPair, seconds: float = 0.5) -> float:
    """Bytes per second of one TCP stream from the second host to the first."""
    nbytes = int(max(2e6, (pair.rate_mbit or 8000) * 1e6 / 8 * seconds))
    port = 5201
    server = (
        "import socket,time,sys\n"
        f"s=socket.create_server(('{pair.addr[0]}',{port}));print('up',flush=True)\n"
        "c,_=s.accept();n=0;t0=time.perf_counter()\n"
        f"while n<{nbytes}:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\n"
        "print(n/(time.perf_counter()-t0))\n"
    )
    rx = subprocess.Popen(
        pair.host_cmd(0, [sys.executable, "-c", server]), stdout=subprocess.PIPE, text=True
    )
    assert rx.stdout is not None
    rx.stdout.readline()  # listening
    sender = (
        "import socket\n"
        f"c=socket.create_connection(('{pair.addr[0]}',{port}))\n"
        f"b=b'x'*(1<<20);n={nbytes}\n"
        "while n>0:\n c.sendall(b[:n]);n-=len(b)\n"
        "c.close()\n"
    )
    subprocess.run(pair.host_cmd(1, [sys.executable, "-c", sender]), check=True, timeout=120)
    out, _ = rx.communicate(timeout=120)
    return float(out.strip())


def link_probe(pair: NetnsPair, env: dict[str, str], numel: int) -> dict:
    """scripts/link_probe.py across the hosts (2 x PER_HOST ranks): one tiny all-gather's
    time, and each collective kind's seconds and link bytes per call of numel values."""
    argv = [sys.executable, str(SCRIPTS / "link_probe.py"), "--numel", str(numel)]
    argv += ["--dev", pair.dev]
    done = subprocess.run(
        pair.mpiexec(PER_HOST, argv, env), capture_output=True, text=True, env=env, timeout=120
    )
    if done.returncode:
        raise SystemExit(f"link_probe.py failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- one training run


def rank_env() -> dict[str, str]:
    """This environment for the ranks, less the thread budget importing zero_ref may have
    set here (each rank sets its own from the ranks on its host)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    for var in THREAD_VARS:
        env.pop(var, None)
    return env


class StepWatcher(threading.Thread):
    """Reads the veth counters each time a step's line appears in the --log-jsonl log
    (rank 0 writes and flushes it as each step ends)."""

    def __init__(self, pair: NetnsPair, log: Path, poll_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.pair, self.log, self.poll_s = pair, log, poll_s
        self.at_step: dict[int, tuple[int, int]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        offset, partial = 0, ""
        while not self.done.is_set():
            time.sleep(self.poll_s)
            try:
                with open(self.log, encoding="utf-8") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            counters = self.pair.counters()
            offset += len(chunk.encode())
            *lines, partial = (partial + chunk).split("\n")
            records = [json.loads(line) for line in lines if line.strip()]
            # several lines at once: the counters belong to the last of them only (the
            # earlier ones were read late); with the final record, to none of them
            steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
            if steps and not any(r.get("final") for r in records):
                self.at_step[steps[-1]] = counters


def train_flags(stage: int, a: argparse.Namespace, overlap: tuple[str, ...]) -> list[str]:
    return [
        *("-m", "zero_ref.train", "--stage", str(stage), "--steps", str(a.steps)),
        *("--sample-chars", "0", "--quiet", *a.model_flags.split(), *overlap),
    ]


def run_train(pair: NetnsPair, flags: list[str], log: Path, timeout_s: float) -> dict:
    """One run across the hosts: step time, link bytes per step, the ledger's last step."""
    log.unlink(missing_ok=True)
    env = rank_env()
    cmd = pair.mpiexec(PER_HOST, [sys.executable, *flags, "--log-jsonl", str(log)], env)
    watcher = StepWatcher(pair, log)
    watcher.start()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(flags)} timed out after {timeout_s:g} s") from None
    finally:
        watcher.done.set()
        watcher.join()
    if done.returncode:
        raise SystemExit(
            f"{' '.join(flags)} failed (rc {done.returncode}):\n"
            f"{(done.stderr or done.stdout)[-3000:]}"
        )
    return summarize(read_log(log), watcher.at_step)


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def link_bytes_per_step(at_step: dict[int, tuple[int, int]], last: int) -> tuple[float, float]:
    """(rx, tx) bytes per step: the slope of the counters against the step number, from
    step SKIP_FIRST to the last (a fit, so one late read of the counters moves it little)."""
    seen = sorted(s for s in at_step if SKIP_FIRST <= s <= last)
    if len(seen) < 2 or seen[-1] - seen[0] < (last - SKIP_FIRST) / 2:
        raise SystemExit(f"the counters were read at steps {seen} only, of {SKIP_FIRST}-{last}")
    rx = statistics.linear_regression(seen, [at_step[s][0] for s in seen]).slope
    tx = statistics.linear_regression(seen, [at_step[s][1] for s in seen]).slope
    return rx, tx


def summarize(records: list[dict], at_step: dict[int, tuple[int, int]]) -> dict:
    steps = [r for r in records if "step_time_s" in r and not r.get("final")]
    final = records[-1]
    if not final.get("final"):
        raise SystemExit("the last --log-jsonl record is not the final one")
    rx, tx = link_bytes_per_step(at_step, steps[-1]["step"])
    comm = [r["comm_last_step"] for r in final["ranks"]]
    return {
        "step_s": statistics.median(s["step_time_s"] for s in steps[SKIP_FIRST:]),
        "link_rx_bytes": rx,
        "link_tx_bytes": tx,
        "ledger_comm_s": statistics.median(sum(k["seconds"] for k in c.values()) for c in comm),
        "collectives": sum(k["calls"] for k in comm[0].values()),
        "ledger_sent_bytes": steps[-1]["sent_bytes"],
        "numel_padded": final["numel_padded"],
    }


# ---- the sweep


def overlap_flags(stage: int, known: str) -> tuple[tuple[str, ...] | None, str]:
    """(flags, '') where zero_ref.train knows every flag; (None, why) where it does not."""
    flags = OVERLAP_FLAGS.get(stage, ())
    if not flags:
        return None, f"no overlap flags for stage {stage}"
    missing = [f for f in flags if f.startswith("--") and f not in known]
    if missing:
        return None, f"zero_ref.train does not know {', '.join(missing)} yet"
    return flags, ""


def train_help() -> str:
    cmd = [sys.executable, "-m", "zero_ref.train", "--help"]
    return subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), check=True).stdout


def link_runs(
    pair: NetnsPair, rate: float | None, a: argparse.Namespace, known: str, log: Path
) -> list[dict]:
    """Every stage's runs on one link setting."""
    pair.set_rate(rate, a.burst)
    link = {"rate_mbit": rate, "burst_bytes": a.burst if rate else None}
    link["link_bytes_s"] = link_rate(pair)
    probe = link_probe(pair, rank_env(), a.probe_numel)
    link["allgather_s"], link["probe_kinds"] = probe["allgather_tiny_s"], probe["kinds"]
    print(
        f"link {rate or 'unlimited'} Mbit/s: {link['link_bytes_s'] / 1e6:.1f} MB/s measured, "
        f"tiny all-gather {link['allgather_s'] * 1e6:.0f} us",
        flush=True,
    )
    for kind, k in link["probe_kinds"].items():
        print(
            f"  one {kind} of {a.probe_numel * 4 / 1e6:.2f} MB: {k['seconds'] * 1e3:.1f} ms, "
            f"{max(k['link_rx_bytes'], k['link_tx_bytes']) / 1e6:.3f} MB over the link",
            flush=True,
        )
    stages = list(a.stages)
    if rate is None or rate == REFERENCE_MBIT:
        stages = sorted({0, *stages})
    rows = []
    for stage in stages:
        row = {
            **link,
            "stage": stage,
            "blocking": run_train(pair, train_flags(stage, a, ()), log, a.timeout),
        }
        flags, why = overlap_flags(stage, known) if stage else (None, "stage 0: not swept")
        row["overlap_flags"] = list(flags) if flags else None
        row["overlapped"] = (
            run_train(pair, train_flags(stage, a, flags), log, a.timeout) if flags else None
        )
        row["overlapped_null_reason"] = why or None
        print(
            f"  stage {stage}: blocking {row['blocking']['step_s'] * 1e3:.1f} ms"
            + (
                f", overlapped {row['overlapped']['step_s'] * 1e3:.1f} ms"
                if flags
                else f", overlapped null ({why})"
            ),
            flush=True,
        )
        rows.append(row)
    return rows


def derive(rows: list[dict]) -> None:
    """Compute (the unlimited link's step time), communication and the ratios, per row."""
    unlimited = {r["stage"]: r for r in rows if r["rate_mbit"] is None}
    for r in rows:
        b, base = r["blocking"], unlimited[r["stage"]]
        r["compute_s"] = base["blocking"]["step_s"]
        busier = max(b["link_rx_bytes"], b["link_tx_bytes"])
        r["comm_bytes_s"] = busier / r["link_bytes_s"]
        r["messages_s"] = b["collectives"] * r["allgather_s"]
        r["comm_over_compute"] = r["comm_bytes_s"] / r["compute_s"]
        bound = max(r["compute_s"], r["comm_bytes_s"])
        r["max_s"] = bound
        r["blocking_over_max"] = b["step_s"] / bound
        o = r["overlapped"]
        r["overlapped_over_max"] = o["step_s"] / bound if o else None


def targets(rows: list[dict]) -> list[dict]:
    """The issue's targets, each with whether it holds (None: not measured)."""
    out = []
    for r in rows:
        if r["stage"] == 0 or r["blocking_over_max"] < BLOCKING_SLOW:
            continue
        ratio = r["overlapped_over_max"]
        out.append(
            {
                "target": f"stage {r['stage']} at {rate_text(r)}: overlapped <= {OVERLAP_TARGET} x "
                f"max (blocking is {r['blocking_over_max']:.2f} x)",
                "value": ratio,
                "holds": None if ratio is None else ratio <= OVERLAP_TARGET,
            }
        )
    ref = {r["stage"]: r for r in rows if r["rate_mbit"] == REFERENCE_MBIT}
    if 0 in ref and 3 in ref:
        o = ref[3]["overlapped"]
        ratio = o["step_s"] / ref[0]["blocking"]["step_s"] if o else None
        out.append(
            {
                "target": f"at {REFERENCE_MBIT:g} Mbit/s: overlapped stage 3 <= {STAGE3_VS_STAGE0} "
                "x stage 0's step time",
                "value": ratio,
                "holds": None if ratio is None else ratio <= STAGE3_VS_STAGE0,
                "blocking_value": ref[3]["blocking"]["step_s"] / ref[0]["blocking"]["step_s"],
            }
        )
    return out


def rate_text(r: dict) -> str:
    return "unlimited" if r["rate_mbit"] is None else f"{r['rate_mbit']:g} Mbit/s"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def print_table(rows: list[dict], checks: list[dict]) -> None:
    head = (
        f"{'link':>10} {'MB/s':>6} {'stg':>3} {'block ms':>8} {'overl ms':>8} "
        f"{'comp ms':>7} {'comm ms':>7} {'c/c':>5} {'ledger ms':>9} {'calls':>5} "
        f"{'msgs ms':>7} {'link MB':>7} {'blk/max':>7} {'ovl/max':>7}"
    )
    print(head)
    for r in rows:
        b, o = r["blocking"], r["overlapped"]
        ovl = r["overlapped_over_max"]
        print(
            f"{rate_text(r):>10} {r['link_bytes_s'] / 1e6:>6.1f} {r['stage']:>3} "
            f"{ms(b['step_s']):>8} {ms(o and o['step_s']):>8} {ms(r['compute_s']):>7} "
            f"{ms(r['comm_bytes_s']):>7} {r['comm_over_compute']:>5.2f} "
            f"{ms(b['ledger_comm_s']):>9} {b['collectives']:>5} {ms(r['messages_s']):>7} "
            f"{max(b['link_rx_bytes'], b['link_tx_bytes']) / 1e6:>7.3f} "
            f"{r['blocking_over_max']:>7.2f} {'-' if ovl is None else f'{ovl:.2f}':>7}"
        )
    print(
        "(comm: the busier direction's link bytes per step / the measured rate; ledger: "
        "seconds in collectives, last step; msgs: collectives x one tiny all-gather)"
    )
    for c in checks:
        state = {True: "holds", False: "FAILS", None: "not measured (overlapped is null)"}
        value = "-" if c["value"] is None else f"{c['value']:.2f}"
        print(f"target {c['target']}: {value} -> {state[c['holds']]}")


def main() -> None:
    a = parse_args()
    known = train_help()
    log = Path(f"/tmp/{a.prefix}bench_overlap_{os.getpid()}.jsonl")
    rows: list[dict] = []
    try:
        with NetnsPair(a.prefix) as pair:
            for rate in [None, *sorted(a.rates, reverse=True)]:
                rows += link_runs(pair, rate, a, known, log)
    except NetnsError as exc:
        raise SystemExit(f"bench_overlap.py: cannot make the two hosts: {exc}") from None
    finally:
        log.unlink(missing_ok=True)
    derive(rows)
    checks = targets(rows)
    print_table(rows, checks)
    emit(
        {
            "rows": rows,
            "targets": checks,
            "settings": {
                "steps": a.steps,
                "skip_first": SKIP_FIRST,
                "ranks": 2 * PER_HOST,
                "hosts": 2,
                "model_flags": a.model_flags,
                "overlap_flags": {str(k): list(v) for k, v in OVERLAP_FLAGS.items()},
            },
            "load_average": load_average(),
        },
        a.record,
    )


if __name__ == "__main__":
    main()
