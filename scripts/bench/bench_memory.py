"""Bytes per parameter per rank at each ZeRO stage: measured, in the ledger, in the formulas.

    python scripts/bench/bench_memory.py                       # ~10M and ~50M GPT, 4 ranks
    python scripts/bench/bench_memory.py --sizes 256x12 --stages 0 3 --no-plot

For each GPT size (D_MODELxN_LAYER) and stage, runs `mpirun -n 4 python -m
zero_ref.train` for a few steps (context 64, micro-batch 1 per rank, --export
to a temporary directory) and reads the final --log-jsonl record: each rank's
real peak resident set above its baseline, per phase (init, train, finish:
the export is part of finish), and its ledger. Per stage it prints, in bytes
per (padded) parameter per rank, max over ranks: the real peaks, the ledger's
peak, zero_ref's fp32 formula, the paper's mixed-precision formula, the
estimate of zero_ref.app.estimate and its error against the real peak, and the
largest model whose real peak would fit --budget-gib per rank, extrapolated
from the measured bytes per parameter. Then it checks the targets of issue 8
on the largest size, draws runs/memory_per_param.png (--plot docs/img/memory_per_param.png
redraws the docs' picture on purpose), and prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit
from zero_ref.app.cli import parse_args
from zero_ref.app.estimate import estimate_for, model_for
from zero_ref.engine.memory import formula_bytes, paper_formula_bytes
from zero_ref.io.metrics_log import read_jsonl

PHASES = ("init", "train", "finish")
PLOT = Path("runs") / "memory_per_param.png"  # scratch: the docs' copy is redrawn on purpose


def train_flags(size: str, stage: int, a: argparse.Namespace) -> list[str]:
    """The zero_ref.train flags of one run (without the output paths)."""
    d_model, n_layer = size.split("x")
    return [
        *("--stage", str(stage), "--d-model", d_model, "--n-layer", n_layer),
        *("--context", str(a.context), "--micro-batch-size", "1", "--steps", str(a.steps)),
        *("--quiet", "--sample-chars", "0"),
        *(("--checkpoint-activations",) if a.checkpoint_activations else ()),
    ]


def run_one(flags: list[str], a: argparse.Namespace, tmp: Path) -> dict:
    """One mpirun; returns the final JSONL record (every rank's report)."""
    beside = Path(sys.executable).with_name("mpirun")  # where the mpich wheel puts it
    log, export = tmp / "run.jsonl", tmp / "model.safetensors"
    cmd = [
        str(beside) if beside.exists() else "mpirun",
        *("-n", str(a.ranks), sys.executable, "-m", "zero_ref.train", *flags),
        *("--log-jsonl", str(log)),
        *(("--export", str(export)) if a.export else ()),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    final = read_jsonl(log)[-1]
    export.unlink(missing_ok=True)
    return final


def per_param(final: dict, flags: list[str], a: argparse.Namespace) -> dict:
    """Bytes per padded parameter per rank (max over ranks) of one run, and the estimate."""
    stage, numel, world = final["stage"], final["numel_padded"], final["world_size"]
    ranks = final["ranks"]
    real = {p: max(r["rss_peak_bytes"][p] for r in ranks) / numel for p in PHASES}
    parsed = parse_args([*flags, *(("--export", "x.safetensors") if a.export else ())], world)
    est = estimate_for(parsed, model_for(parsed, world), world)
    peak = max(real.values())
    return {
        "stage": stage,
        "numel_padded": numel,
        "real": real,
        "real_peak": peak,
        "ledger": max(r["peak_bytes"] for r in ranks) / numel,
        "fp32_formula": sum(formula_bytes(stage, numel, world, 1).values()) / numel,
        "paper": paper_formula_bytes(stage, numel, world) / numel,
        "estimate": est.total / numel,
        "estimate_activations": est.activations / numel,
        "estimate_error": est.total / numel / peak - 1,
        "untracked": peak - max(r["peak_bytes"] for r in ranks) / numel,
        "fits_budget_params": a.budget_gib * 2**30 / peak,
    }


def measure(a: argparse.Namespace) -> dict[str, list[dict]]:
    """Every size and stage, one run each."""
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes:
            results[size] = []
            for stage in a.stages:
                flags = train_flags(size, stage, a)
                results[size].append(per_param(run_one(flags, a, Path(tmp)), flags, a))
                print(f"  {size} stage {stage} done", file=sys.stderr, flush=True)
    return results


def table(size: str, rows: list[dict], a: argparse.Namespace) -> str:
    numel = rows[0]["numel_padded"]
    lines = [
        f"GPT {size} ({numel / 1e6:.1f}M params), {a.ranks} ranks, context {a.context}, "
        f"micro-batch 1: bytes/param/rank (real: peak RSS above baseline, max over ranks)",
        f"{'stage':>5}{'init':>7}{'train':>7}{'finish':>7}{'real':>7}{'ledger':>7}{'fp32':>7}"
        f"{'paper':>7}{'untrk':>7}{'est':>7}{'error':>7}  fits {a.budget_gib:g} GiB/rank",
    ]
    for r in rows:
        cells = [*(r["real"][p] for p in PHASES), r["real_peak"], r["ledger"], r["fp32_formula"]]
        cells += [r["paper"], r["untracked"], r["estimate"]]
        lines.append(
            f"{r['stage']:>5}"
            + "".join(f"{c:>7.2f}" for c in cells)
            + f"{r['estimate_error']:>+7.1%}  {r['fits_budget_params'] / 1e9:.2f}B params"
        )
    lines.append("fits: the largest model whose real peak fits, extrapolated from bytes/param")
    return "\n".join(lines)


def targets(rows: list[dict]) -> dict:
    """Issue 8's targets on one size: stage 3's peak, the capacity ratio, the estimate."""
    by = {r["stage"]: r for r in rows}
    out: dict = {"max_estimate_error": max(abs(r["estimate_error"]) for r in rows)}
    out["estimate_within_15pct"] = out["max_estimate_error"] <= 0.15
    if 3 in by:
        s3 = by[3]
        out["stage3_real_peak"] = s3["real_peak"]
        out["stage3_le_5"] = s3["real_peak"] <= 5.0
        bound = 1.25 * s3["fp32_formula"] + s3["estimate_activations"]
        out["stage3_bound_1p25_formula_plus_activations"] = bound
        out["stage3_le_bound"] = s3["real_peak"] <= bound
    if 0 in by and 3 in by:
        out["capacity_ratio_3_over_0"] = by[0]["real_peak"] / by[3]["real_peak"]
        out["capacity_ratio_ge_3p5"] = out["capacity_ratio_3_over_0"] >= 3.5
    return out


def plot(results: dict[str, list[dict]], ranks: int, out: Path) -> None:
    """Per size, per stage: bars of the real peak, the ledger and both formulas, and
    the estimate as a marker over the real peak's bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = (
        ("real_peak", "real peak (RSS)"),
        ("ledger", "ledger"),
        ("fp32_formula", "fp32 formula"),
        ("paper", "paper, mixed precision"),
    )
    width = 0.2
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.4), squeeze=False)
    for ax, (size, rows) in zip(axes[0], results.items(), strict=True):
        for j, (key, name) in enumerate(series):
            xs = [r["stage"] + (j - 1.5) * width for r in rows]
            bars = ax.bar(xs, [r[key] for r in rows], width=width, label=name)
            ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
        xs = [r["stage"] - 1.5 * width for r in rows]
        ax.plot(xs, [r["estimate"] for r in rows], "k_", markersize=14, mew=2, label="estimate")
        top = max(max(r[k] for k, _ in series) for r in rows)
        ax.set_ylim(0, top * 1.4)  # room above the tallest bar for its label and the legend
        ax.set_xticks([r["stage"] for r in rows], [f"stage {r['stage']}" for r in rows])
        numel = rows[0]["numel_padded"] / 1e6
        ax.set_title(f"GPT {size} ({numel:.1f}M params), {ranks} ranks: max over ranks")
        ax.set_ylabel("bytes / parameter / rank")
        ax.legend(loc="upper right", fontsize=8, ncols=3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["256x12", "512x16"], help="D_MODELxN_LAYER")
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory per rank")
    p.add_argument("--no-export", dest="export", action="store_false")
    p.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="train with activation checkpointing (each unit keeps only its input)",
    )
    p.add_argument("--plot", type=Path, default=PLOT)
    p.add_argument("--no-plot", dest="plot", action="store_const", const=None)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per mpirun")
    p.add_argument("--from-json", type=Path, help="no runs: tables and plot from a JSON line")
    add_record_flag(p, "bench_memory")
    a = p.parse_args()
    if a.from_json:  # the measurements of an earlier run, with its settings
        saved = read_result(a.from_json)
        results = saved.pop("sizes")
        for key in ("ranks", "context", "steps", "export", "budget_gib", "load_average"):
            setattr(a, key, saved[key])
        a.sizes = list(results)
    else:
        results, a.load_average = measure(a), os.getloadavg()[0]
    for size, rows in results.items():
        print(table(size, rows, a))
    checked = targets(results[a.sizes[-1]])
    print(
        f"targets on GPT {a.sizes[-1]}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in checked.items())
    )
    if a.plot:
        plot(results, a.ranks, a.plot)
        print(f"plot: {a.plot}")
    out = {"ranks": a.ranks, "context": a.context, "steps": a.steps, "export": a.export}
    out["checkpoint_activations"] = a.checkpoint_activations
    out.update(budget_gib=a.budget_gib, load_average=a.load_average, targets=checked)
    emit({**out, "sizes": results}, None if a.from_json else a.record)


def read_result(path: Path) -> dict:
    """A recorded result (docs/results/*.json) or a run's output, its JSON line last."""
    text = path.read_text().strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.splitlines()[-1])


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
