"""Draw one training step of --trace files as timelines, one row of lanes per file.

    python scripts/plot_trace.py runs/trace_stage*.json --out docs/img/stages_timeline.png

For each trace (a run of `python -m zero_ref.train --trace FILE`), rank 0's last
step: its units' forward and backward (lane "compute"), its collectives, colored by
kind, with their bytes in the legend (lane "collectives"), and the optimizer step
(lane "optimizer"). Times are from the start of that step. Every figure is checked
for anything drawn outside its axes before it is saved (scripts/plot_run.py).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from plot_run import save  # noqa: E402  (beside this script: the same axes check)

ROWS = {"optimizer": 0, "collectives": 1, "compute": 2}
COLORS = {
    "allgather": "tab:blue",
    "reduce_scatter": "tab:purple",
    "allreduce": "tab:orange",
    "norm": "tab:red",
    "loss": "tab:green",
}


def last_step(events: list[dict], rank: int = 0) -> tuple[list[dict], float]:
    """Rank's events of its last optimizer step, and when that step began (us): from
    the end of the previous optimizer step to the end of this one."""
    mine = [e for e in events if e.get("pid") == rank and e.get("ph") == "X"]
    steps = sorted((e for e in mine if e["cat"] == "optimizer"), key=lambda e: e["ts"])
    end = steps[-1]["ts"] + steps[-1]["dur"]
    start = steps[-2]["ts"] + steps[-2]["dur"] if len(steps) > 1 else 0.0
    return [e for e in mine if start <= e["ts"] < end], start


def draw(ax, events: list[dict], start: float, title: str) -> dict[str, int]:
    """The lanes of one step on ax; returns bytes sent per collective kind."""
    sent: dict[str, int] = defaultdict(int)
    end = max(e["ts"] + e["dur"] for e in events)
    for e in events:
        row = ROWS[e["cat"]]
        t0, dur = (e["ts"] - start) / 1e3, e["dur"] / 1e3  # ms
        if e["cat"] == "collectives":
            color = COLORS.get(e["name"], "0.5")
            sent[e["name"]] += e["args"].get("sent_bytes", 0)
        elif e["cat"] == "compute":
            color = "tab:cyan" if e["name"].startswith("forward") else "tab:olive"
        else:
            color = "0.3"
        ax.broken_barh([(t0, max(dur, 1e-3))], (row - 0.35, 0.7), color=color)
    ax.set_yticks(list(ROWS.values()), list(ROWS))
    ax.set_xlim(0, (end - start) / 1e3 * 1.02)
    ax.set_ylim(-0.6, len(ROWS) - 0.4)
    ax.set_title(title, fontsize=9)
    return sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    fig, axes = plt.subplots(len(a.traces), 1, figsize=(10, 1.9 * len(a.traces)), squeeze=False)
    summary = {}
    for ax, path in zip(axes[:, 0], a.traces, strict=True):
        events = json.loads(path.read_text())["traceEvents"]
        step, start = last_step(events)
        sent = draw(ax, step, start, "")
        kinds = ", ".join(f"{k} {v:,} B" for k, v in sorted(sent.items()))
        ax.set_title(f"{path.stem}: rank 0, last step; sent {kinds}", fontsize=8)
        summary[path.stem] = dict(sent)
    axes[-1, 0].set_xlabel("ms into the step (forward: cyan, backward: olive)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, list(COLORS), loc="upper right", ncol=5, fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, a.out)
    print(json.dumps({"written": str(a.out), "sent_bytes": summary}))


if __name__ == "__main__":
    main()
