"""Which events of a --trace file make up one training step, and how long each rank's
collectives waited for the others: what scripts/docs/plot_trace.py draws.

A step is what train_step does: forward and backward, the optimizer step, then the
loss all-reduce that reports the step's loss (zero_ref/engine/step.py). So step i runs
from the end of step i-1's loss all-reduce to the end of its own; a window cut at the
optimizer step's end would begin with the previous step's loss all-reduce instead.
"""

from __future__ import annotations

from pathlib import Path

WARMUP_STEPS = 5  # left out of :median, as scripts/bench/bench_train.py leaves them out


def parse_spec(spec: str) -> tuple[Path, int | str | None, bool]:
    """A spec FILE, FILE:N, FILE:median, FILE:optimizer or FILE:N:optimizer as (the
    trace, the run's step N, "median" or None for the last, whether to draw the
    optimizer step alone)."""
    rest, zoom = spec, spec.endswith(":optimizer")
    if zoom:
        rest = spec[: -len(":optimizer")]
    path, _, step = rest.rpartition(":")
    if path and step.isdigit():
        return Path(path), int(step), zoom
    if path and step == "median":
        return Path(path), step, zoom
    return Path(rest), None, zoom


def median_spec(spec: str) -> str:
    """FILE as FILE:median, FILE:optimizer as FILE:median:optimizer; a step given stays."""
    path, step, zoom = parse_spec(spec)
    return spec if step is not None else f"{path}:median" + (":optimizer" if zoom else "")


def rank_events(events: list[dict], rank: int) -> list[dict]:
    return [e for e in events if e.get("pid") == rank and e.get("ph") == "X"]


def end(e: dict) -> float:
    return e["ts"] + e["dur"]


def step_bounds(mine: list[dict]) -> list[tuple[dict, float, float]]:
    """(optimizer event, start, end) of each step of one rank's events, in order: a
    step ends with the loss all-reduce that follows its optimizer step (or with the
    optimizer step, where none follows), and starts where the step before it ended."""
    steps = sorted((e for e in mine if e["cat"] == "optimizer"), key=lambda e: e["ts"])
    losses = sorted(
        (e for e in mine if e["cat"] == "collectives" and e["name"] == "loss"),
        key=lambda e: e["ts"],
    )
    bounds, start = [], 0.0
    for i, opt in enumerate(steps):
        before = steps[i + 1]["ts"] if i + 1 < len(steps) else float("inf")
        after = [e for e in losses if end(opt) <= e["ts"] + 0.5 and e["ts"] < before]
        stop = end(after[0]) if after else end(opt)  # +0.5: times are rounded to 1 us
        bounds.append((opt, start, stop))
        start = stop
    return bounds


def median_step(events: list[dict], rank: int = 0) -> int:
    """The run's step of median length on `rank`, after WARMUP_STEPS: the typical step,
    as the benchmarks' medians are."""
    lengths = sorted(
        (stop - start, int(opt["name"].split()[-1]))
        for opt, start, stop in step_bounds(rank_events(events, rank))[1:]
        if int(opt["name"].split()[-1]) > WARMUP_STEPS
    )
    if not lengths:
        raise SystemExit(f"median: the trace has no step after the {WARMUP_STEPS} warm-up steps")
    return lengths[(len(lengths) - 1) // 2][1]


def step_events(
    events: list[dict], step: int | None, zoom: bool = False, rank: int = 0
) -> tuple[list[dict], float]:
    """Rank's events of the run's step `step` (None: the last), and when that step began
    (us): step_bounds' window, or (zoom) the optimizer step's own span. The optimizer
    event is named after the step."""
    mine = rank_events(events, rank)
    bounds = step_bounds(mine)
    names = [opt["name"] for opt, _, _ in bounds]
    wanted = f"optimizer step {step or ''}"
    if not bounds or (step is not None and wanted not in names):
        held = f"{names[0]} .. {names[-1]}" if names else "no optimizer step"
        raise SystemExit(f"{wanted}: the trace holds {held}")
    opt, start, stop = bounds[-1] if step is None else bounds[names.index(wanted)]
    if zoom:
        start, stop = opt["ts"], end(opt)
    return [e for e in mine if start <= e["ts"] < stop], start


def blocking_calls(events: list[dict], rank: int) -> list[dict]:
    """Rank's blocking collectives in the order it called them (a "wait X" of
    --overlap-comm is a wait on a call in flight, not a call)."""
    calls = [
        e
        for e in rank_events(events, rank)
        if e["cat"] == "collectives" and not e["name"].startswith("wait ")
    ]
    return sorted(calls, key=lambda e: e["ts"])


def collective_waits(events: list[dict], rank: int = 0) -> dict[int, float]:
    """id(event) -> the microseconds at the start of each of rank's blocking collectives
    spent waiting for the other ranks to arrive: its duration minus the shortest any
    rank took in the same call (the last rank to arrive waits for nobody). Every rank
    makes the same blocking calls in the same order (MPI requires it), so the calls
    pair up by position; ranks' clocks are not compared. {} for a one-rank trace or
    ranks whose calls do not pair up."""
    ranks = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    calls = {r: blocking_calls(events, r) for r in ranks}
    names = [[e["name"] for e in c] for c in calls.values()]
    if len(ranks) < 2 or any(n != names[0] for n in names):
        return {}
    waits = {}
    for j, e in enumerate(calls[rank]):
        fastest = min(calls[r][j]["dur"] for r in ranks)
        waits[id(e)] = e["dur"] - fastest
    return waits


def compute_spread(events: list[dict], rank: int = 0) -> dict[str, list[float]]:
    """The ms of forward and of backward in each step after WARMUP_STEPS on `rank`, as
    [least, median, most] over those steps: how much one drawn step's bars can differ
    from another's of the same run (the noise, before any comparison between runs)."""
    mine = rank_events(events, rank)
    totals: dict[str, list[float]] = {"forward_ms": [], "backward_ms": []}
    for opt, start, stop in step_bounds(mine):
        if int(opt["name"].split()[-1]) <= WARMUP_STEPS:
            continue
        inside = [e for e in mine if e["cat"] == "compute" and start <= e["ts"] < stop]
        for kind in ("forward", "backward"):
            ms = sum(e["dur"] for e in inside if e["name"].startswith(kind)) / 1e3
            totals[f"{kind}_ms"].append(ms)
    return {
        k: [round(min(v), 2), round(sorted(v)[(len(v) - 1) // 2], 2), round(max(v), 2)]
        for k, v in totals.items()
        if v
    }
