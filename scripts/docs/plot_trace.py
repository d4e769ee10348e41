"""Draw one training step of --trace files as timelines, one row of lanes per file.

    python scripts/docs/plot_trace.py runs/trace_stage*.json --median \
        --out docs/img/stages_timeline.png
    python scripts/docs/plot_trace.py runs/trace_fp16.json:3 runs/trace_fp16.json:4 --out f.png

For each trace (a run of `python -m zero_ref.train --trace FILE`), rank 0's last
step, or with FILE:N the run's step N (a resumed run's trace starts after step 1), or with
FILE:median (--median: every FILE without a step) the step of median length after 5
warm-up steps (the benchmarks' statistic),
or with ":optimizer"
after either only that step's optimizer step, on its own time scale (the whole
step's panel then leaves the offload lanes to it): its units'
forward and backward (lane "compute"), its collectives, colored by kind, with their
bytes in the title (lane "collectives"; with --overlap-comm the waits there, and each
call from issue to completion in lane "in flight", calls in flight together one above
the other), and the optimizer step (lane "optimizer").
Lanes only some runs have are drawn when a trace holds them: host<->device copies
(--device gpu: lane "copies", their bytes in the title), the offloaded optimizer's
swap-file reads, AdamW sub-groups and writes (--offload-optimizer nvme), and
checkpoint files written or read (lane "checkpoint": a save after the previous step,
or a resume's reads before step 1). With a --log-jsonl log beside the trace
(FILE.jsonl for FILE.json) the title says the step's loss scale and whether it was
skipped.

A step runs from the end of the previous step's loss all-reduce to the end of its own
(scripts/docs/trace_steps.py), so it opens with its own work. The first part of each
blocking collective's bar that was spent waiting for the other ranks to arrive (its
length minus the shortest any rank took in the same call) is hatched, and the title
sums it: with more ranks than cores that wait is mostly a rank descheduled, not the
network. Times are from the start of that step; whole steps share one time axis, and
each title gives its step's length. --order draws the events in the order they
began, one slot each, instead of by time: for numba-cuda's simulator, where a kernel
takes seconds and a copy microseconds. Every figure is checked for anything drawn
outside its axes before it is saved (scripts/docs/plot_run.py).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import sys

import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.docs.plot_run import save  # beside this script: the same axes check
from scripts.docs.trace_steps import (  # which events are one step, and the waits
    collective_waits,
    compute_spread,
    median_spec,
    median_step,
    parse_spec,
    step_events,
)

LANES = (  # bottom to top; a trace's lanes are drawn only if it has events in them
    "checkpoint",
    "optimizer",
    "swap writes",
    "adamw sub-groups",
    "swap reads",
    "copies",
    "collectives",
    "in flight",
    "compute",
)
COLORS = {
    "allgather": "tab:blue",
    "reduce_scatter": "tab:purple",
    "allreduce": "tab:orange",
    "norm": "tab:red",
    "nonfinite": "magenta",
    "loss": "tab:green",
}
COPY_COLORS = {
    "device_to_host": "tab:brown",
    "host_to_device": "tab:pink",
    "offload_grads_to_host": "goldenrod",
    "offload_params_to_device": "teal",
}
SWAP_COLORS = {"swap reads": "navy", "adamw sub-groups": "darkorange", "swap writes": "darkgreen"}
IO_COLORS = {**SWAP_COLORS, "checkpoint": "sienna"}


def color_of(e: dict) -> str:
    if e["cat"] in ("collectives", "in flight"):  # a wait is colored as what it waits for
        return COLORS.get(e["name"].removeprefix("wait "), "0.5")
    if e["cat"] == "copies":
        return COPY_COLORS[e["name"]]
    if e["cat"] == "compute":
        return "tab:cyan" if e["name"].startswith("forward") else "tab:olive"
    return IO_COLORS.get(e["cat"], "0.3")


def placed(events: list[dict], start: float, order: bool) -> list[tuple[dict, float, float]]:
    """(event, x, width) per event: ms from `start`, or (order) slots in the order the
    events began, an optimizer step spanning the slots of the events inside it."""
    if not order:
        return [(e, (e["ts"] - start) / 1e3, max(e["dur"] / 1e3, 1e-3)) for e in events]
    ordered = sorted(events, key=lambda e: (e["ts"], e["cat"] != "optimizer"))
    out = []
    for slot, e in enumerate(ordered):
        began = [s for s, o in enumerate(ordered) if o["ts"] < e["ts"] + e["dur"]]
        width = max(began) - slot + 1 if e["cat"] == "optimizer" else 1  # to its last inner
        out.append((e, float(slot), float(width)))
    return out


def sub_rows(bars: list[tuple[dict, float, float]]) -> dict[int, tuple[int, int]]:
    """id(event) -> (its sub-row, the sub-rows of its lane) for the offload pipeline's
    sub-group events and the collectives in flight (--overlap-comm): each bar goes in the
    lowest sub-row free when it starts, so reads (or writes) that the two I/O threads run
    at once, or calls in flight together, are drawn one above the other."""
    found, ends = {}, defaultdict(list)  # ends: lane -> each sub-row's last end
    for e, x, width in sorted(bars, key=lambda bar: bar[1]):
        if "sub_group" in e["args"] or e["cat"] == "in flight":
            lane = ends[e["cat"]]
            row = next((i for i, end in enumerate(lane) if end <= x), len(lane))
            if row == len(lane):
                lane.append(0.0)
            lane[row] = x + width
            found[id(e)] = (row, e["cat"])
    return {key: (row, len(ends[lane])) for key, (row, lane) in found.items()}


def bar_span(e: dict, row: int, subs: dict[int, tuple[int, int]]) -> tuple[float, float]:
    """(bottom, height) of an event's bar: its lane's row, or its sub-row there."""
    sub, count = subs.get(id(e), (0, 1))
    return row - 0.35 + 0.7 * sub / count, 0.7 / count


WAIT_HATCH = "////"  # the part of a collective's bar spent waiting for slower ranks
FLIGHT_EDGES = {"edgecolor": "white", "linewidth": 0.8}  # calls one after another, apart


def draw_bar(ax, e: dict, x: float, width: float, span: tuple, wait: float, **edges) -> None:
    """One event's bar; a blocking collective's first `wait` ms (collective_waits: the
    time it waited for the other ranks to arrive) hatched and faded, the rest solid."""
    wait = min(wait, width)
    if wait > 0:
        ax.broken_barh([(x, wait)], span, facecolor=color_of(e), alpha=0.35, hatch=WAIT_HATCH)
        x, width = x + wait, width - wait
    ax.broken_barh([(x, width)], span, color=color_of(e), **edges)


def draw(
    ax,
    events: list[dict],
    start: float,
    order: bool = False,
    hidden: tuple[str, ...] = (),
    waits: dict[int, float] | None = None,
) -> dict[str, dict]:
    """The lanes of one step on ax but the `hidden` ones (drawn in a zoomed panel);
    returns its bytes, hidden lanes included: "sent" per collective kind, "copied" per
    copy kind, "swap" read and written, "checkpoint" per verb (write, verify, read); and
    "waited": the blocking collectives' milliseconds in all ("calls") and waiting for
    slower ranks ("waiting"), from `waits` (collective_waits, in us; not drawn by order)."""
    waits = {} if order or waits is None else waits
    moved = {k: defaultdict(int) for k in ("sent", "copied", "swap", "checkpoint", "waited")}
    lanes = [lane for lane in LANES if lane not in hidden and any(e["cat"] == lane for e in events)]
    rows = {lane: row for row, lane in enumerate(lanes)}
    right = 0.0
    bars = placed(events, start, order)
    edges = {"edgecolor": "white", "linewidth": 1.0} if order else {}  # slots apart
    subs = sub_rows(bars)
    for e, x, width in bars:
        if e["cat"] in rows:
            span = bar_span(e, rows[e["cat"]], subs)
            apart = FLIGHT_EDGES if e["cat"] == "in flight" and not edges else edges
            draw_bar(ax, e, x, width, span, waits.get(id(e), 0.0) / 1e3, **apart)
            bottom, height = span
            if id(e) in waits:
                moved["waited"]["calls"] += e["dur"] / 1e3
                moved["waited"]["waiting"] += waits[id(e)] / 1e3
            if "sub_group" in e["args"]:  # which sub-group, as bench_offload.py labels them
                where = (x + width / 2, bottom + height / 2)
                label = str(e["args"]["sub_group"])
                ax.annotate(label, where, ha="center", va="center", size=6, color="white")
            right = max(right, x + width)
        if e["cat"] in ("collectives", "in flight") and not e["name"].startswith("wait "):
            moved["sent"][e["name"]] += e["args"].get("sent_bytes", 0)  # a wait sent nothing
        elif e["cat"] == "copies":
            moved["copied"][e["name"]] += e["args"]["bytes"]
        elif e["cat"] in ("swap reads", "swap writes"):
            moved["swap"][e["cat"]] += e["args"]["bytes"]
        elif e["cat"] == "checkpoint":
            moved["checkpoint"][e["name"].split()[0]] += e["args"].get("bytes", 0)
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_xlim(0, right * 1.02)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    return {k: dict(v) for k, v in moved.items()}


def step_record(path: Path, step: int | None) -> dict | None:
    """The --log-jsonl record of that step, from FILE.jsonl beside FILE.json, if any."""
    log = path.with_suffix(".jsonl")
    if not log.exists():
        return None
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "step" in r and not r.get("final")]
    return steps[-1] if step is None else next(r for r in steps if r["step"] == step)


def listed(nbytes: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n:,} B" for kind, n in sorted(nbytes.items()))


def title(
    path: Path,
    step: int | None,
    zoom: bool,
    moved: dict[str, dict],
    span_ms: float | None = None,
    median: bool = False,
) -> str:
    which = "last step" if step is None else f"{'median ' if median else ''}step {step}"
    if span_ms is not None:
        which += f" ({span_ms:.1f} ms)"
    if zoom:
        which = f"the optimizer in its {which}"
    record = step_record(path, step)
    if record is not None and record.get("skipped"):
        which += f" (skipped, loss scale {record['loss_scale']:,.0f})"
    elif record is not None and record.get("loss_scale", 1) != 1:
        which += f" (loss scale {record['loss_scale']:,.0f})"
    lines = [f"{path.stem}: rank 0, {which}; sent {listed(moved['sent'])}"]
    if moved["copied"]:
        lines.append(f"copied {listed(moved['copied'])}")
    if moved["swap"]:
        lines.append(listed(moved["swap"]))
    if moved["checkpoint"]:
        lines.append(f"checkpoint {listed(moved['checkpoint'])}")
    if moved["waited"]:
        w = moved["waited"]
        lines.append(
            f"blocking collectives {w['calls']:.1f} ms, of which {w['waiting']:.1f} ms (hatched) "
            "waiting for slower ranks to arrive"
        )
    return "\n".join(lines)


COMPUTE_COLORS = {"forward": "tab:cyan", "backward": "tab:olive", "optimizer step": "0.3"}


def legend_entries(events: list[dict]) -> dict[str, str]:
    """Label -> color of every kind of bar drawn: forward, backward, the optimizer step,
    each collective and copy kind, each I/O lane."""
    entries = {}
    for e in events:
        if e["cat"] == "compute":
            kind = "forward" if e["name"].startswith("forward") else "backward"
            entries[kind] = COMPUTE_COLORS[kind]
        elif e["cat"] == "optimizer":
            entries["optimizer step"] = COMPUTE_COLORS["optimizer step"]
        elif e["cat"] in ("collectives", "copies", "in flight"):
            entries[e["name"].removeprefix("wait ")] = color_of(e)  # a wait: its kind's
        elif e["cat"] in IO_COLORS:
            entries[e["cat"]] = IO_COLORS[e["cat"]]
    return entries


def zoomed_lanes(drawn: list[tuple[Path, int | None, bool]], i: int) -> tuple[str, ...]:
    """The lanes panel i leaves to a zoomed panel of the same step: the offloaded
    optimizer's sub-group lanes, which would be squeezed into its last milliseconds."""
    path, step, zoom = drawn[i]
    if not zoom and any(z and (p, s) == (path, step) for p, s, z in drawn):
        return tuple(SWAP_COLORS)
    return ()


def figure(specs: list[str], order: bool = False) -> tuple[plt.Figure, dict]:
    """The figure of one step per spec (parse_spec), and the bytes it shows per spec.

    Whole steps drawn by time share one time axis (the longest step's), so their
    lengths compare; a zoomed optimizer step has its own, labelled so."""
    drawn, steps, medians, waits = [parse_spec(s) for s in specs], [], set(), []
    for i, (path, step, zoom) in enumerate(drawn):
        events = json.loads(path.read_text())["traceEvents"]
        waits.append(collective_waits(events))
        if step == "median":
            step = median_step(events)
            drawn[i], _ = (path, step, zoom), medians.add(i)
        steps.append(step_events(events, step, zoom))
    hidden = [zoomed_lanes(drawn, i) for i in range(len(drawn))]
    lanes = [{e["cat"] for e in ev} - set(h) for (ev, _), h in zip(steps, hidden, strict=True)]
    heights = [0.6 + 0.45 * len(cats) for cats in lanes]
    fig, axes = plt.subplots(
        len(drawn), 1, figsize=(10, sum(heights) + 0.6), squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    summary, entries, shared = {}, {}, []
    for i, (ax, (path, step, zoom), (events, start)) in enumerate(
        zip(axes[:, 0], drawn, steps, strict=True)
    ):
        moved = draw(ax, events, start, order, hidden[i], waits[i])
        span = None if order else max(e["ts"] + e["dur"] for e in events) / 1e3 - start / 1e3
        text = title(path, step, zoom, moved, span, median=i in medians)
        if hidden[i]:
            text += "\n(its optimizer step's swap and AdamW lanes: the panel below)"
        ax.set_title(text, fontsize=8)
        if zoom:
            ax.set_xlabel("ms into the optimizer step (its own scale)", fontsize=8)
        elif not order:
            shared.append(ax)
        label = "median" if i in medians else step or "last"
        summary[f"{path.stem}:{label}{':optimizer' if zoom else ''}"] = moved
        entries.update(legend_entries([e for e in events if e["cat"] not in hidden[i]]))
    right = max((ax.get_xlim()[1] for ax in shared), default=0.0)
    for ax in shared:
        ax.set_xlim(0, right)  # one time scale for every whole step
    unit = "events in the order they began (one slot each)" if order else "ms into the step"
    if len(shared) > 1:
        unit += ", one scale for every panel"
    if not drawn[-1][2]:  # a zoomed panel has its own label
        axes[-1, 0].set_xlabel(unit)
    known = [*COMPUTE_COLORS, *COLORS, *COPY_COLORS, *IO_COLORS, *entries]  # legend order
    entries = {k: entries[k] for k in dict.fromkeys(known) if k in entries}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in entries.values()]
    labels = list(entries)
    if any(moved.get("waited") for moved in summary.values()):
        labels.append("waiting for slower ranks")
        handles.append(plt.Rectangle((0, 0), 1, 1, fc="0.6", alpha=0.35, hatch=WAIT_HATCH))
    ncol = min(len(labels), 6)
    fig.legend(handles, labels, loc="upper right", ncol=ncol, fontsize=7)
    top = 1 - 0.25 * (1 + (len(labels) - 1) // 6) / (sum(heights) + 0.6)
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig, summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "traces",
        nargs="+",
        help="FILE (its last step), FILE:N (step N), FILE:median (the median step after "
        "5 warm-up steps); :optimizer after any: that optimizer step alone",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--order", action="store_true", help="x: the events' order, not time")
    p.add_argument("--median", action="store_true", help="FILE alone means FILE:median")
    a = p.parse_args()
    specs = [median_spec(t) if a.median else t for t in a.traces]
    fig, summary = figure(specs, a.order)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, a.out)
    spread = {}  # each run's forward and backward ms over its steps after the warm-up
    for path in dict.fromkeys(parse_spec(s)[0] for s in specs):
        spread[path.stem] = compute_spread(json.loads(path.read_text())["traceEvents"])
    print(json.dumps({"written": str(a.out), "bytes": summary, "compute_spread": spread}))


if __name__ == "__main__":
    main()
