"""docs/zeropp.md's figures, drawn from recorded results:

    python scripts/plot_zeropp.py --loss docs/results/bench_zeropp_loss.json \\
        --out docs/img/zeropp_loss.png
    python scripts/plot_zeropp.py --blocks docs/results/zeropp_quantize_blocks.json \\
        --out docs/img/zeropp_quantize_error.png

--loss: scripts/bench_zeropp.py's loss part, one curve per configuration (its first
seed's loss at every step, smoothed over 25 steps, the raw steps faint) and a panel of
the last 200 steps against plain stage 3's, where the configurations part if they do;
the legend gives each one's final loss over the seeds. --blocks: scripts/quantize_blocks.py's
blocks, one panel for qwZ's weight blocks and one for qgZ's gradient blocks: each
block's max |x - x'| / amax and RMS / amax in the order the model lays them out, and
the bound (half an int8 step). Every figure is checked for anything drawn outside its
axes before it is saved (scripts/plot_run.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from plot_run import save  # noqa: E402  (the same axes check as the other figures)

SMOOTH = 25  # steps in the loss curves' running mean
TAIL = 200  # steps in the zoomed panel


def running_mean(x: list[float], n: int = SMOOTH) -> np.ndarray:
    """The mean of each window of n steps (a shorter window at the start)."""
    c = np.cumsum(np.insert(np.asarray(x, np.float64), 0, 0.0))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - n)
    return (c[i] - c[lo]) / (i - lo)


def loss_figure(result: dict) -> plt.Figure:
    """The loss curves of every configuration run (the first seed's)."""
    rows = [r for r in result["loss_rows"] if not r.get("skipped")]
    legend_in = 0.3 + 0.19 * -(-len(rows) // 2)  # inches under the axes: two columns
    fig, (whole, tail) = plt.subplots(1, 2, figsize=(11, 3.6 + legend_in))
    for i, r in enumerate(rows):
        color, style = f"C{i}", ("-", "--", ":", "-.")[i % 4]  # identical curves stay visible
        steps = np.arange(1, len(r["curve"]) + 1)
        smooth = running_mean(r["curve"])
        label = (f"{r['config']}: final {r['mean']:.4f} "
                 f"(spread {r['spread']:.4f}, {len(r['final_loss'])} seeds)")  # fmt: skip
        whole.plot(steps, r["curve"], color=color, alpha=0.15, linewidth=0.5)
        whole.plot(steps, smooth, color=color, linestyle=style, linewidth=1.2, label=label)
        tail.plot(steps[-TAIL:], smooth[-TAIL:], color=color, linestyle=style, linewidth=1.2)
    s = result["settings"]
    seed = rows[0].get("curve_seed", 0)
    whole.set_title(f"bf16 stage 3, 4 ranks, seed {seed}: loss per step "
                    f"({SMOOTH}-step mean; raw faint)", fontsize=9)  # fmt: skip
    tail.set_title(f"the last {TAIL} steps ({SMOOTH}-step mean)", fontsize=9)
    for ax in (whole, tail):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    whole.set_ylabel("training loss (mini-batch)")
    whole.set_ylim(0, None)
    tail.autoscale(axis="y")
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"ZeRO++ options, quantize block {s['quantize_block']}, {s['steps_loss']} "
                 "steps: final loss = mean of the last 50", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, legend_in / (3.6 + legend_in), 1, 0.95))
    return fig


def blocks_figure(result: dict) -> plt.Figure:
    """Per block: max error and RMS error over amax, weights and gradients."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 6.2))
    bound = result["bound"]
    parts = (
        ("weights", "qwZ: forward's weight blocks", "unit"),
        ("gradients", f"qgZ: gradient blocks of {result['world']} ranks", "rank"),
    )
    for ax, (key, title, group) in zip(axes, parts, strict=True):
        b = result[key]
        x = np.arange(b["blocks"])
        ax.scatter(x, b["max_rel"], s=3, color="C0", label="max |x - x'| / amax")
        ax.scatter(x, b["rms_rel"], s=3, color="C1", label="RMS |x - x'| / amax")
        ax.axhline(bound, color="tab:red", linestyle="--", linewidth=0.9, zorder=3,
                   label=f"bound 0.5/127 = {bound:.5f}")  # fmt: skip
        edges = [i for i in range(1, b["blocks"]) if b[group][i] != b[group][i - 1]]
        top = 1.15 * bound
        for e in edges:  # in data coordinates, so the axes check sees them
            ax.plot([e - 0.5, e - 0.5], [0, top], color="0.8", linewidth=0.6)
        ax.set_xlim(-1, b["blocks"])
        ax.set_ylim(0, top)
        ax.set_ylabel("error / block amax")
        ax.set_title(f"{title}: {b['blocks']:,} blocks of <= {result['block']} "
                     f"(grey lines: a new {group})", fontsize=9)  # fmt: skip
        ax.legend(loc="lower right", fontsize=7, markerscale=3)
    axes[-1].set_xlabel("block, in the model's layout order")
    fig.suptitle(f"int8 block quantization error, the default GPT ({result['precision']}) "
                 f"after {result['steps']} steps", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--loss", type=Path, help="bench_zeropp.py's recorded loss part")
    what.add_argument("--blocks", type=Path, help="quantize_blocks.py's recorded blocks")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    a = p.parse_args()
    if a.out.suffix != ".png":
        p.error(f"--out {a.out}: a .png file")
    source = a.loss or a.blocks
    result = json.loads(source.read_text())
    fig = loss_figure(result) if a.loss else blocks_figure(result)
    print(f"wrote {save(fig, a.out)}")


if __name__ == "__main__":
    main()
