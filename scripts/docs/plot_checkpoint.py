"""Draw what each rank's checkpoint file holds, and what each rank of a resume reads.

    mpirun -n 3 python -m zero_ref.train --resume runs/ckpt_stage3 --stage 3 \\
        --micro-batch-size 8 --steps 3 --trace runs/resume_stage3.json
    python scripts/docs/plot_checkpoint.py runs/resume_stage3.json runs/resume_stage1.json \\
        --out docs/img/checkpoint_reshard.png

Each JSON is the --trace of a resumed run: its "resume" event describes the
checkpoint as saved (zero_ref/checkpoint/reader.py's saved_layout) and who resumes
it, and its "checkpoint" lane holds every range each new rank read, with the old
rank file it came from. The top panel is the checkpoint they read, from its
manifest's layout: rank r of the W ranks that saved it holds slice r of every unit
(the same slices at every stage). Below it, one panel per resume: each new rank's
row has a bar for every range it read, at that range's place in the model, colored
by the old rank whose file it came from. The x-axis is the model's elements, unit
after unit (padding left out). Every figure is checked for anything drawn outside
its axes before it is saved (scripts/docs/plot_run.py).
"""

from __future__ import annotations

import argparse
import json
from itertools import accumulate
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import sys

import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.docs.plot_run import save  # beside this script: the same axes check

RANK_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
KINDS = {"param": "param", "exp_avg": "m", "exp_avg_sq": "v"}


def unit_starts(units: list[dict]) -> dict[str, int]:
    """Where each unit's real elements start on the x-axis (units back to back)."""
    starts = accumulate((u["numel"] for u in units), initial=0)
    return {u["name"]: start for u, start in zip(units, starts, strict=False)}


def draw_saved(ax, saved: dict) -> None:
    """One row per saving rank: its slice of every unit."""
    starts = unit_starts(saved["units"])
    for r in range(saved["world_size"]):
        for u in saved["units"]:
            w = u["shard_numel"]
            lo, hi = r * w, min((r + 1) * w, u["numel"])
            if hi > lo:
                ax.broken_barh([(starts[u["name"]] + lo, hi - lo)], (r - 0.35, 0.7),
                               color=RANK_COLORS[r])  # fmt: skip
    rows = [f"rank {r}: {f['file']}" for r, f in enumerate(saved["files"])]
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    size = ", ".join(sorted({f"{f['bytes']:,} B" for f in saved["files"]}))
    ax.set_title(
        f"saved by {saved['world_size']} ranks at stage {saved['stage']}: each rank file "
        f"({size}) holds param, m and v of its slice of every unit",
        fontsize=8,
    )


def rows_of(reads: list[dict]) -> list[tuple[str, list[dict]]]:
    """One rank's reads as rows: one for all kinds when they read the same ranges,
    else one per group of kinds that do."""
    ranges: dict[str, set] = {}
    for r in reads:
        key = (r["unit"], r["start"], r["numel"], r["from_rank"])
        ranges.setdefault(r["kind"], set()).add(key)
    groups: list[tuple[list[str], set]] = []
    for kind, keys in ranges.items():
        same = next((g for g in groups if g[1] == keys), None)
        if same:
            same[0].append(kind)
        else:
            groups.append(([kind], keys))
    return [
        (", ".join(KINDS[k] for k in kinds), [r for r in reads if r["kind"] == kinds[0]])
        for kinds, _ in groups
    ]


def draw_resume(ax, record: dict, stem: str) -> None:
    """One row per new rank (and kinds that read differently): each range it read."""
    starts = unit_starts(record["saved"]["units"])
    labels, row = [], 0
    for rank, reads in enumerate(record["reads"]):
        for kinds, mine in rows_of(reads):
            for r in mine:
                ax.broken_barh([(starts[r["unit"]] + r["start"], r["numel"])],
                               (row - 0.35, 0.7), color=RANK_COLORS[r["from_rank"]])  # fmt: skip
            labels.append(f"new rank {rank}: {kinds}")
            row += 1
    ax.set_yticks(range(row), labels, fontsize=7)
    new, old = record["resumed"], record["saved"]
    per_rank = {4 * sum(r["numel"] for r in reads) for reads in record["reads"]}
    read = " or ".join(f"{b:,}" for b in sorted(per_rank))
    ax.set_title(
        f"{stem}: resumed by {new['world_size']} ranks at stage {new['stage']} from "
        f"{old['world_size']} rank files: each new rank read {read} B (color: the file)",
        fontsize=8,
    )


def resume_record(path: Path) -> dict:
    """A resumed run's trace as {"saved", "resumed", "reads": per new rank, each range it
    read (kind, unit, start, numel, from_rank, ...)}: its "resume" event and its reads."""
    events = json.loads(path.read_text())["traceEvents"]
    on_lane = [e for e in events if e.get("cat") == "checkpoint"]
    resume = next((e["args"] for e in on_lane if e["name"] == "resume"), None)
    if resume is None:
        raise SystemExit(f"{path}: no resume in this trace (a --trace of a --resume run?)")
    world = resume["resumed"]["world_size"]
    reads = [
        [e["args"] for e in on_lane if e["pid"] == rank and "from_rank" in e["args"]]
        for rank in range(world)
    ]
    return {**resume, "reads": reads}


def figure(paths: list[Path]) -> plt.Figure:
    records = [resume_record(p) for p in paths]
    saved = records[0]["saved"]
    rows = [saved["world_size"]] + [
        sum(len(rows_of(reads)) for reads in r["reads"]) for r in records
    ]
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(10, 0.9 + 0.32 * sum(rows) + 0.6 * len(rows)),
        gridspec_kw={"height_ratios": rows}, squeeze=False,
    )  # fmt: skip
    draw_saved(axes[0, 0], saved)
    for ax, record, path in zip(axes[1:, 0], records, paths, strict=True):
        draw_resume(ax, record, path.stem)
    starts = unit_starts(saved["units"])
    total = sum(u["numel"] for u in saved["units"])
    for ax, n in zip(axes[:, 0], rows, strict=True):
        ax.set_xlim(0, total)
        ax.set_ylim(n - 0.5, -0.5)  # rank 0 on top
        ax.set_xticks(list(starts.values()), list(starts), fontsize=7)
    axes[-1, 0].set_xlabel("the model's elements, unit after unit (ticks: where a unit starts)")
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("resumes", nargs="+", type=Path, help="--trace files of --resume runs")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    fig = figure(a.resumes)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    save(fig, a.out)
    print(json.dumps({"written": str(a.out)}))


if __name__ == "__main__":
    main()
