"""Draw all-reduce = reduce-scatter + all-gather on 4 ranks, from the numbers themselves.

    python scripts/docs/plot_allreduce.py --out docs/img/allreduce_rs_ag.png

Each rank starts with its own gradient, cut into 4 blocks (one per rank). A
reduce-scatter leaves rank r with the sum over ranks of block r (each rank sends
3 of its 4 blocks); an all-gather then gives every rank every summed block (each
rank sends its 1 block to 3 others). The picture's cells are the values NumPy
computes for the two steps, checked against a direct sum before drawing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import sys

import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.docs.plot_run import save  # beside this script: the same axes check

W = 4


def steps() -> list[tuple[str, np.ndarray]]:
    """(title, (W ranks, W blocks) values; NaN where a rank holds nothing) per stage."""
    grads = np.arange(1, W * W + 1, dtype=float).reshape(W, W)  # rank r, block b
    total = grads.sum(axis=0)  # what all-reduce gives every rank
    scattered = np.full((W, W), np.nan)
    for r in range(W):
        scattered[r, r] = grads[:, r].sum()  # reduce-scatter: rank r owns block r's sum
    gathered = np.tile(np.diag(scattered), (W, 1))  # all-gather of the owned blocks
    assert np.array_equal(gathered, np.tile(total, (W, 1)))  # = all-reduce
    return [
        ("each rank's gradient (4 blocks)", grads),
        ("after reduce-scatter: rank r holds the sum of block r", scattered),
        ("after all-gather: every rank holds every sum = all-reduce", gathered),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    for ax, (title, values) in zip(axes, steps(), strict=True):
        shown = np.where(np.isnan(values), 0, values)
        ax.imshow(np.where(np.isnan(values), np.nan, shown), cmap="Blues", vmin=0, vmax=60)
        for r in range(W):
            for b in range(W):
                if not np.isnan(values[r, b]):
                    ax.text(b, r, f"{values[r, b]:g}", ha="center", va="center", fontsize=9)
        ax.set_xticks(range(W), [f"block {b}" for b in range(W)], fontsize=7)
        ax.set_yticks(range(W), [f"rank {r}" for r in range(W)], fontsize=7)
        ax.set_title(title, fontsize=8)
    fig.suptitle(
        "all-reduce = reduce-scatter + all-gather: each sends (W-1)/W of the buffer per rank",
        fontsize=9,
    )
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, a.out)
    print(f'{{"written": "{a.out}"}}')


if __name__ == "__main__":
    main()
