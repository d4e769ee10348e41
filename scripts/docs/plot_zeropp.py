"""docs/zeropp.md's figures, drawn from recorded results:

    python scripts/docs/plot_zeropp.py --loss docs/results/bench_zeropp_loss_hops.json \\
        --out docs/img/zeropp_loss_hops.png
    python scripts/docs/plot_zeropp.py --summed docs/results/qgz_error_block256.json \\
        docs/results/qgz_error_trained.json --out docs/img/zeropp_quantize_error.png

--loss: scripts/bench/bench_zeropp.py's loss part, one curve per configuration (its first
seed's loss at every step, smoothed over 25 steps, the raw steps faint) and a panel of
the last 200 steps against plain stage 3's, where the configurations part if they do;
the legend gives each one's final loss over the seeds. --summed: scripts/bench/qgz_error.py's
records, the error the optimizer sees: the summed gradient's relative L2 error of each
tensor, in int8 and int4 (the same gradients), one colour per record, a line at the
whole gradient's. (A block's error over its own amax, the older figure, is at its bound
in every block and hides this.) Every figure is checked for anything drawn outside its
axes before it is saved (scripts/docs/plot_run.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import sys

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.docs.plot_run import save  # the same axes check as the other figures

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


def summed_figure(results: list[dict]) -> plt.Figure:
    """qgZ's error where it matters: the summed gradient's relative L2 error per tensor,
    int8 and int4 on the same gradients, one colour per recorded run (its block)."""
    fig, ax = plt.subplots(figsize=(11, 4.8))
    names = list(results[0]["per_tensor"])
    x = np.arange(len(names))
    for i, r in enumerate(results):
        for bits, f, marker in ((8, r, "o"), (4, r["int4"], "^")):
            err = [100 * f["per_tensor"][n] for n in names]
            whole = 100 * f["summed_grad_rel_l2_error"]
            ax.scatter(x + 0.15 * i, err, s=14, marker=marker, color=f"C{i}",
                       label=f"int{bits}, blocks of <= {r['block']}: whole gradient "
                       f"{whole:.2f} %")  # fmt: skip
            ax.plot([-0.5, len(names) - 0.5], [whole, whole], color=f"C{i}", linewidth=0.8,
                    linestyle="--" if bits == 8 else ":")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(x, [n.replace(".weight", ".w") for n in names], rotation=70, fontsize=7)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("||sum q(g_r) - sum g_r|| / ||sum g_r||, %")
    ax.grid(alpha=0.3, which="both", axis="y")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    r = results[0]
    fig.suptitle(f"qgZ: the summed gradient's relative error per tensor, {r['world']} ranks' "
                 f"gradients after {r['steps']} steps (the default GPT, {r['precision']}); "
                 "lines: the whole gradient", fontsize=10)  # fmt: skip
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--loss", type=Path, help="bench_zeropp.py's recorded loss part")
    what.add_argument("--summed", type=Path, nargs="+", help="qgz_error.py's recorded runs")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    a = p.parse_args()
    if a.out.suffix != ".png":
        p.error(f"--out {a.out}: a .png file")
    if a.loss:
        fig = loss_figure(json.loads(a.loss.read_text()))
    else:
        fig = summed_figure([json.loads(path.read_text()) for path in a.summed])
    print(f"wrote {save(fig, a.out)}")


if __name__ == "__main__":
    main()
