"""Plot one or more --log-jsonl logs of zero_ref.train into PNG files.

    python scripts/docs/plot_run.py runs/stage*.jsonl --out docs/img/gpt4

writes <out>_loss.png (loss curves beside the unigram entropy), <out>_memory.png
(each rank's ledger by category, stacked, its peak, and the formula, one panel per
stage on one y-axis) and <out>_comm.png (bytes rank 0 sent in the last step, by
collective, beside the paper's volume as a ring moves it, 2 (N-1)/N Psi or at stage 3
3 (N-1)/N Psi). Before saving, every figure is checked (`outside_axes`): no bar,
line or marker may lie outside its axes, or the script fails rather than draw a
misleading picture.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

CATEGORIES = ("params", "grads", "optimizer", "buffers")
COPIES = ("device_to_host", "host_to_device", "offload_grads_to_host", "offload_params_to_device")
STYLES = ["-", "--", ":", "-."]


def read_log(path: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if not r.get("final")]
    final = next((r for r in records if r.get("final")), None)
    if final is None:
        raise SystemExit(f"{path}: no final record (was the run finished?)")
    return steps, final


def label(path: Path, final: dict) -> str:
    return f"{final['model']} stage {final['stage']} ({path.stem})"


def plot_loss(logs) -> plt.Figure:
    """Each run's loss; runs that agree draw on top of each other, so each gets its own
    line style and width (the widest underneath) and the legend says which overlap."""
    fig, ax = plt.subplots(figsize=(7, 4))
    curves = [[r["loss"] for r in steps] for _, steps, _ in logs]
    for i, (path, steps, final) in enumerate(logs):
        same = [j for j in range(len(logs)) if j != i and curves[j] == curves[i]]
        note = " (identical to " + ", ".join(f"stage {logs[j][2]['stage']}" for j in same) + ")"
        ax.plot(
            [r["step"] for r in steps],
            curves[i],
            STYLES[i % len(STYLES)],
            lw=1 + 1.5 * (len(logs) - 1 - i),
            label=label(path, final) + (note if same else ""),
        )
    entropy = logs[0][2].get("unigram_entropy")
    if entropy is not None:
        ax.axhline(entropy, color="k", lw=0.8, ls=(0, (1, 3)), label="unigram entropy")
    ax.set(xlabel="step", ylabel="loss (nats/char)", title="training loss")
    ax.legend(fontsize=7)
    return fig


def plot_memory(logs) -> plt.Figure:
    """Per stage, each rank's ledger by category (stacked), its peak (a marker) and the
    formula for the stage (a line), all panels on one y-axis; the legend below them."""
    fig, axes = plt.subplots(1, len(logs), figsize=(3.2 * len(logs), 4.4), squeeze=False)
    top = 0.0
    for ax, (_, _, final) in zip(axes[0], logs, strict=True):
        ranks = final["ranks"]
        bottom = [0.0] * len(ranks)
        for cat in CATEGORIES:
            mib = [r["memory_bytes"][cat] / 2**20 for r in ranks]
            ax.bar([r["rank"] for r in ranks], mib, bottom=bottom, label=cat)
            bottom = [b + m for b, m in zip(bottom, mib, strict=True)]
        peaks = [r["peak_bytes"] / 2**20 for r in ranks]
        ax.plot([r["rank"] for r in ranks], peaks, "kv", ms=5, label="ledger peak")
        formula = sum(final["formula_bytes"].values()) / 2**20
        ax.axhline(formula, color="k", ls="--", lw=1, label="formula (model states)")
        ax.set(title=f"stage {final['stage']}", xlabel="rank")
        top = max(top, *bottom, *peaks, formula)
    for ax in axes[0]:
        ax.set_ylim(0, 1.1 * top)  # one scale for every stage, set after all are drawn
    axes[0][0].set_ylabel("MiB held (ledger)")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=6, fontsize=7)
    fig.suptitle("memory each rank holds, by stage")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def paper_volume_label(final: dict) -> str:
    """What the paper's bar is: Sec. 7's 2 Psi (3 Psi at stage 3) as a ring moves it."""
    times = 3 if final["stage"] == 3 else 2
    return f"{times}(N-1)/N Psi"


def plot_comm(logs) -> plt.Figure:
    """Bytes rank 0 sent in the last step, stacked by collective, beside the paper's
    volume as a ring moves it (its (N-1)/N factor included), each bar labelled."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = list(range(len(logs)))
    steps = [final["ranks"][0]["comm_last_step"] for _, _, final in logs]
    kinds = sorted({k for s in steps for k in s} - set(COPIES))
    bottom = [0.0] * len(logs)
    for kind in kinds:
        sent = [s.get(kind, {}).get("sent_bytes", 0) for s in steps]
        ax.bar([x - 0.2 for x in xs], sent, width=0.4, bottom=bottom, label=kind)
        bottom = [b + m for b, m in zip(bottom, sent, strict=True)]
    paper = [final["paper_sent_bytes"] for _, _, final in logs]
    world = logs[0][2]["world_size"]
    label = f"paper, Sec. 7, as a ring moves it (N = {world})"
    ax.bar([x + 0.2 for x in xs], paper, width=0.4, color="0.6", label=label)
    for x, value, (_, _, final) in zip(xs, paper, logs, strict=True):
        text = f"{paper_volume_label(final)}\n{value:,.0f} B"
        ax.annotate(text, (x + 0.2, value), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(xs, [f"stage {final['stage']}" for _, _, final in logs])
    ax.set_ylim(0, 1.35 * max(*bottom, *paper))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set(ylabel="bytes sent by rank 0 in the last step", title="communication per step")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    return fig


def outside_axes(fig: plt.Figure) -> list[str]:
    """Every bar, line and marker whose data lies outside its axes' limits."""
    problems = []
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())

        def inside(x: float, y: float, x0=x0, x1=x1, y0=y0, y1=y1) -> bool:
            return x0 <= x <= x1 and y0 <= y <= y1

        for patch in ax.patches:
            if isinstance(patch, Rectangle):
                x, y, w, h = patch.get_x(), patch.get_y(), patch.get_width(), patch.get_height()
                if not (inside(x, y) and inside(x + w, y + h)):
                    problems.append(f"{ax.get_title()}: a bar at x={x:.2f} up to y={y + h:.3g}")
        for line in ax.lines:
            xs, ys = line.get_xdata(), line.get_ydata()
            transform = line.get_transform()
            if transform != ax.transData:  # axhline: x in axes fraction, y in data
                ys = list(ys)
                xs = [x0] * len(ys)
            for x, y in zip(xs, ys, strict=True):
                if not inside(float(x), float(y)):
                    problems.append(f"{ax.get_title()}: {line.get_label()} at ({x}, {y})")
                    break
    return problems


def save(fig: plt.Figure, out: Path) -> Path:
    problems = outside_axes(fig)
    if problems:
        raise SystemExit(f"{out}: drawn outside its axes: " + "; ".join(problems))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--out", default="run", help="prefix of the PNG files")
    a = p.parse_args()
    logs = [(path, *read_log(path)) for path in a.logs]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    written = [
        save(plot_loss(logs), Path(f"{a.out}_loss.png")),
        save(plot_memory(logs), Path(f"{a.out}_memory.png")),
        save(plot_comm(logs), Path(f"{a.out}_comm.png")),
    ]
    print(json.dumps({"written": [str(w) for w in written]}))


if __name__ == "__main__":
    main()
