"""Overlap on a network that costs (issue 23, item 5): ZeRO's collectives across two hosts.

    sudo python scripts/bench/bench_overlap.py  # reference; sweep at 300, 100, 30 Mbit/s
    sudo python scripts/bench/bench_overlap.py --parts sweep --stages 3 --rates 100 --steps 10
    sudo python scripts/bench/bench_overlap.py --record           # docs/results/bench_overlap.json
    python scripts/bench/bench_overlap.py --markdown docs/results/bench_overlap.json  # its table

Two network-namespace hosts joined by a veth (scripts/bench/netns_pair.py), 2 ranks on each,
UCX over TCP on the veth, the link limited with tbf on both ends (burst one frame, so no
message crosses for free). Two parts:

- reference: the issue's setup, the default GPT, stages 0 and 3, on the unlimited link
  and at 100 Mbit/s, with ranks placed in blocks (ranks 0-1 on the first host, Hydra's
  default) and cyclically (even ranks on the first host);
- sweep: a GPT whose compute is comparable to its communication here (--model-flags),
  stages 1-3, on the unlimited link and at each --rates value, ranks in blocks.

On each link: its real rate (one TCP stream) and, per placement, one tiny all-gather's
time and the link bytes of one all-reduce, all-gather and reduce-scatter of the default
GPT's size (scripts/bench/link_probe.py). Each run is one `python -m zero_ref.train` with
--log-jsonl (scripts/bench/overlap_runs.py), blocking, and again with OVERLAP_FLAGS where
zero_ref.train knows them (else overlapped is null, with the reason). Per run, after the
first steps: the median step time; the link bytes per step, each way (the veth counters
as each step's log line appears); compute: the same run's step time on the unlimited
link; communication: the busier direction's bytes per step over the measured rate,
beside the ledger's seconds in collectives and their count (last step); and blocking and
overlapped over max(compute, communication).

Targets (issue 23): overlapped <= 1.15 x max wherever blocking >= 1.3 x max; at
100 Mbit/s on the reference, overlapped stage 3 <= 1.2 x stage 0's step time. Prints the
table, which targets hold, and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.netns_pair import PLACEMENTS, NetnsError, NetnsPair
from scripts.bench.overlap_report import (
    REFERENCE_MBIT,
    busier,
    derive,
    markdown,
    print_table,
    rate_text,
    targets,
)
from scripts.bench.overlap_runs import (
    PER_HOST,
    SKIP_FIRST,
    link_probe,
    link_rate,
    rank_env,
    run_train,
)

DEFAULT_GPT_NUMEL = 117376  # the default GPT's padded parameters: the probe's buffer
# The flags that turn overlap on, per stage: the one place to adjust them. Stage 3's
# --overlap-comm prefetches one unit ahead by default (add --prefetch-numel N for more);
# a stage whose flags zero_ref.train does not know gets overlapped = null.
OVERLAP_FLAGS: dict[int, tuple[str, ...]] = {
    1: ("--overlap-comm",),
    2: ("--overlap-comm",),
    3: ("--overlap-comm",),
}
PARTS = ("reference", "sweep")


@dataclass(frozen=True)
class Part:
    """One family of runs: a model, its stages, its rates (besides the unlimited link)
    and its rank placements."""

    name: str
    model_flags: tuple[str, ...]
    stages: tuple[int, ...]
    rates: tuple[float, ...]
    placements: tuple[str, ...]

    def runs_at(self, rate: float | None) -> bool:
        return rate is None or rate in self.rates


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="300,100,30", help="sweep's tbf rates, Mbit/s")
    p.add_argument("--stages", default="1,2,3", help="sweep's stages (0-3)")
    p.add_argument("--model-flags", default="--batch-size 128", help="sweep's model flags")
    p.add_argument("--parts", default="reference,sweep", help="parts to run (default: both)")
    p.add_argument("--placement", default="block", choices=PLACEMENTS, help="sweep's ranks")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each (median; default 1)")
    p.add_argument("--burst", type=int, default=1600, help="tbf burst, bytes (default 1600)")
    p.add_argument(
        "--probe-numel",
        type=int,
        default=DEFAULT_GPT_NUMEL,
        help="float32 values per probed collective (default: the default GPT's)",
    )
    p.add_argument(
        "--overlap-extra",
        default="",
        help="flags added to every overlapped run (e.g. '--prefetch-numel 1000000', a "
        "deeper stage-3 prefetch); recorded with the result",
    )
    p.add_argument("--prefix", default="zrn", help="names: namespaces P_h1, P_h2, veth P0")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per training run")
    p.add_argument(
        "--markdown", metavar="JSON", help="print a recorded result's table, run nothing"
    )
    add_record_flag(p, "bench_overlap")
    a = p.parse_args()
    for stage, flags in OVERLAP_FLAGS.items():
        OVERLAP_FLAGS[stage] = (*flags, *a.overlap_extra.split())
    a.rates = parse_list(p, "--rates", a.rates, float)
    a.stages = parse_list(p, "--stages", a.stages, int)
    if any(r <= 0 for r in a.rates):
        p.error(f"--rates {a.rates}: every rate must be > 0 Mbit/s")
    a.parts = [x for x in a.parts.split(",") if x]
    if not a.parts or any(x not in PARTS for x in a.parts):
        p.error(f"--parts {a.parts}: one or more of {', '.join(PARTS)}")
    if a.probe_numel < 1:
        p.error(f"--probe-numel {a.probe_numel}: at least 1")
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats}: at least 1")
    if not a.stages or any(s not in (0, 1, 2, 3) for s in a.stages):
        p.error(f"--stages {a.stages}: one or more of 0, 1, 2, 3")
    if a.steps < SKIP_FIRST + 3:
        p.error(f"--steps {a.steps}: at least {SKIP_FIRST + 3} (the first {SKIP_FIRST} skipped)")
    return a


def parse_list(p: argparse.ArgumentParser, flag: str, text: str, kind: type) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        p.error(f"{flag} {text!r}: a comma-separated list of numbers")


def plan(a: argparse.Namespace) -> list[Part]:
    parts = {
        "reference": Part("reference", (), (0, 3), (REFERENCE_MBIT,), PLACEMENTS),
        "sweep": Part(
            "sweep", tuple(a.model_flags.split()), tuple(a.stages), tuple(a.rates), (a.placement,)
        ),
    }
    return [parts[name] for name in PARTS if name in a.parts]


# ---- the runs


def overlap_flags(stage: int, known: str) -> tuple[tuple[str, ...] | None, str]:
    """(flags, '') where zero_ref.train knows every flag; (None, why) where it does not."""
    flags = OVERLAP_FLAGS.get(stage, ())
    if not flags:
        return None, f"no overlap flags for stage {stage} (OVERLAP_FLAGS)"
    missing = [f for f in flags if f.startswith("--") and f not in known]
    if missing:
        return None, f"zero_ref.train does not know {', '.join(missing)} yet"
    return flags, ""


def train_help() -> str:
    cmd = [sys.executable, "-m", "zero_ref.train", "--help"]
    return subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), check=True).stdout


def measure_link(pair: NetnsPair, rate: float | None, placements: set[str], numel: int) -> dict:
    """The link's rate, and per placement what one collective costs on it."""
    link = {"rate_mbit": rate, "link_bytes_s": link_rate(pair), "probes": {}}
    print(f"link {rate_text(link)}: {link['link_bytes_s'] / 1e6:.1f} MB/s (one TCP stream)")
    for placement in sorted(placements):
        probe = link_probe(pair, rank_env(), numel, placement)
        link["probes"][placement] = probe
        kinds = ", ".join(
            f"{kind} {k['seconds'] * 1e3:.1f} ms {busier(k) / 1e6:.3f} MB"
            for kind, k in probe["kinds"].items()
        )
        print(
            f"  {placement}: tiny all-gather {probe['allgather_tiny_s'] * 1e6:.0f} us; "
            f"of {numel * 4 / 1e6:.2f} MB: {kinds}",
            flush=True,
        )
    return link


def run_row(
    pair: NetnsPair,
    link: dict,
    part: Part,
    placement: str,
    stage: int,
    a: argparse.Namespace,
    known: str,
    log: Path,
) -> dict:
    """One (part, placement, stage) on the current link: blocking, then overlapped."""
    flags = ["--stage", str(stage), "--steps", str(a.steps), "--sample-chars", "0", "--quiet"]
    flags += part.model_flags
    row = {
        "part": part.name,
        "placement": placement,
        "stage": stage,
        "rate_mbit": link["rate_mbit"],
        "burst_bytes": a.burst if link["rate_mbit"] else None,
        "link_bytes_s": link["link_bytes_s"],
        "allgather_s": link["probes"][placement]["allgather_tiny_s"],
    }
    overlap, why = overlap_flags(stage, known)
    blocking, overlapped = [], []
    for _ in range(a.repeats):  # blocking and overlapped back to back: a busy spell hits both
        blocking.append(run_train(pair, flags, log, a.timeout, placement))
        if overlap:
            overlapped.append(run_train(pair, [*flags, *overlap], log, a.timeout, placement))
    row["blocking"] = medians(blocking)
    row["overlap_flags"] = list(overlap) if overlap else None
    row["overlapped"] = medians(overlapped) if overlap else None
    row["overlapped_null_reason"] = why or None
    o = row["overlapped"]
    print(
        f"  {part.name} {placement} stage {stage}: blocking "
        f"{row['blocking']['step_s'] * 1e3:.1f} ms, overlapped "
        + (f"{o['step_s'] * 1e3:.1f} ms" if o else f"null ({why})"),
        flush=True,
    )
    return row


def medians(runs: list[dict]) -> dict:
    """Each measurement's median over the repeats, and every repeat's step time."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["step_s_repeats"] = [r["step_s"] for r in runs]
    return out


def sweep(pair: NetnsPair, parts: list[Part], a: argparse.Namespace) -> tuple[list, list]:
    """Every part's runs, link by link (unlimited first, then slower): (links, rows)."""
    known = train_help()
    log = Path(f"/tmp/{a.prefix}bench_overlap_{os.getpid()}.jsonl")
    links, rows = [], []
    rates = sorted({r for p in parts for r in p.rates}, reverse=True)
    try:
        for rate in [None, *rates]:
            pair.set_rate(rate, a.burst)
            here = [p for p in parts if p.runs_at(rate)]
            placements = {pl for p in here for pl in p.placements}
            link = measure_link(pair, rate, placements, a.probe_numel)
            links.append(link)
            for part in here:
                for placement in part.placements:
                    for stage in part.stages:
                        rows.append(run_row(pair, link, part, placement, stage, a, known, log))
    finally:
        log.unlink(missing_ok=True)
    return links, rows


def stop(signum: int, _frame) -> None:
    """SIGTERM (or SIGINT, ignored in a background job) ends the bench through SystemExit,
    so `with NetnsPair` removes the hosts."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    a = parse_args()
    if a.markdown:  # render a recorded result, run nothing
        print(markdown(json.loads(Path(a.markdown).read_text())["rows"]))
        return
    parts = plan(a)
    try:
        with NetnsPair(a.prefix) as pair:
            links, rows = sweep(pair, parts, a)
    except NetnsError as exc:
        raise SystemExit(f"bench_overlap.py: cannot make the two hosts: {exc}") from None
    derive(rows)
    checks = targets(rows)
    print_table(rows, checks)
    settings = {
        "steps": a.steps,
        "repeats": a.repeats,
        "skip_first": SKIP_FIRST,
        "ranks": 2 * PER_HOST,
        "hosts": 2,
        "burst_bytes": a.burst,
        "parts": [vars(p) for p in parts],
        "overlap_flags": {str(k): list(v) for k, v in OVERLAP_FLAGS.items()},
    }
    emit(
        {
            "links": links,
            "rows": rows,
            "targets": checks,
            "settings": settings,
            "load_average": load_average(),
        },
        a.record,
    )


if __name__ == "__main__":
    main()
