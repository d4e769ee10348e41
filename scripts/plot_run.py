"""Plot one or more --log-jsonl logs of zero_ref.train into PNG files.

    python scripts/plot_run.py runs/stage*.jsonl --out docs/img/run

writes <out>_loss.png (loss curves), <out>_memory.png (each rank's bytes by
category, stacked, with the fp32 formula as a line) and <out>_comm.png (bytes
sent per rank per step, by stage, beside the paper's volume).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CATEGORIES = ("params", "grads", "optimizer", "buffers")


def read_log(path: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in records if not r.get("final")]
    final = next((r for r in records if r.get("final")), None)
    if final is None:
        raise SystemExit(f"{path}: no final record (was the run finished?)")
    return steps, final


def label(path: Path, final: dict) -> str:
    return f"{final['model']} stage {final['stage']} ({path.stem})"


def plot_loss(logs, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for path, steps, final in logs:
        ax.plot(
            [r["step"] for r in steps], [r["loss"] for r in steps], label=label(path, final), lw=1
        )
    ax.set(xlabel="step", ylabel="loss (nats/char)", title="training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    return out


def plot_memory(logs, out: Path) -> Path:
    fig, axes = plt.subplots(1, len(logs), figsize=(3.2 * len(logs), 4), squeeze=False, sharey=True)
    for ax, (_, _, final) in zip(axes[0], logs, strict=True):
        ranks = final["ranks"]
        bottom = [0.0] * len(ranks)
        for cat in CATEGORIES:
            mib = [r["memory_bytes"][cat] / 2**20 for r in ranks]
            ax.bar([r["rank"] for r in ranks], mib, bottom=bottom, label=cat)
            bottom = [b + m for b, m in zip(bottom, mib, strict=True)]
        formula = sum(final["formula_bytes"].values()) / 2**20
        ax.axhline(formula, color="k", ls="--", lw=1, label="formula (params+grads+optim)")
        ax.set_ylim(0, 1.12 * max(max(bottom), formula))
        ax.set(title=f"stage {final['stage']}", xlabel="rank")
    axes[0][0].set_ylabel("MiB held")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("memory each rank really holds")
    fig.tight_layout()
    fig.savefig(out)
    return out


def plot_comm(logs, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [f"stage {final['stage']}" for _, _, final in logs]
    measured = [steps[-1]["sent_bytes"] / 2**20 for _, steps, _ in logs]
    paper = [final["paper_sent_bytes"] / 2**20 for _, _, final in logs]
    xs = range(len(logs))
    ax.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured (rank 0, last step)")
    ax.bar([x + 0.2 for x in xs], paper, width=0.4, label="paper, Sec. 7")
    ax.set_xticks(list(xs), names)
    ax.set(ylabel="MiB sent per rank per step", title="communication per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--out", default="run", help="prefix of the PNG files")
    a = p.parse_args()
    logs = [(path, *read_log(path)) for path in a.logs]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    written = [
        plot_loss(logs, Path(f"{a.out}_loss.png")),
        plot_memory(logs, Path(f"{a.out}_memory.png")),
        plot_comm(logs, Path(f"{a.out}_comm.png")),
    ]
    print(json.dumps({"written": [str(w) for w in written]}))


if __name__ == "__main__":
    main()
