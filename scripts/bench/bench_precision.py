"""Mixed precision (issue 10): fp32 vs fp16 vs bf16, speed, bytes and loss, at each ZeRO stage.

    python scripts/bench/bench_precision.py                    # both parts, 4 ranks
    python scripts/bench/bench_precision.py --skip-loss        # part (a) only
    python scripts/bench/bench_precision.py --d-model 128 --n-layer 4 --loss-steps 200
    python scripts/bench/bench_precision.py --repeats 3        # part (a) three times over

(a) Per precision (fp32, fp16, bf16) and stage (0-3), one `mpirun -n 4 python -m
zero_ref.train` of a larger GPT (--d-model 256 --n-layer 8, context 64, --steps 12,
--batch-size 4 and --checkpoint-activations, so that model states rather than
activations dominate the real peak; other flags default) with --log-jsonl: the median
step time and bytes sent per step (steps after the first 2), the ledger's bytes per
padded parameter per rank (max over ranks, all categories) beside the run's own
formula and the paper's K=12 formula, whether each rank's params + grads + optimizer
equal the run's formula exactly, the real peak resident set above the baseline per
parameter (max over ranks and phases, as scripts/bench/bench_memory.py), and each
precision's sent bytes and step time as a ratio of fp32's at the same stage (16-bit
should send about half). With --repeats R, R rounds in which each stage's three
precisions run back to back: step times are medians over rounds, and each ratio is
the median of the rounds' own ratios (a busy machine slows a round's pair alike);
beside it, the least step time over rounds as a ratio of fp32's least (bursts of
other work that hit one run of a pair and not the other do not move it).

(b) Per precision, the default run (`python -m zero_ref.train`: the default GPT, 800
steps, default stage) with only --precision added: the final step's loss, the mean
of the last 50 steps, skipped steps, the final loss scale, and whether that mean is
below the default corpus's unigram entropy.

Prints the tables, then one JSON line last (rows, settings, load average, targets).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.app.data import encode_corpus, load_text, unigram_entropy
from zero_ref.engine.memory import paper_formula_bytes
from zero_ref.io.metrics_log import read_jsonl

PRECISIONS = ("fp32", "fp16", "bf16")
STATE_KEYS = ("params", "grads", "optimizer")
SKIP_FIRST = 2  # steps left out of the step-time and sent-bytes medians
LAST_N = 50  # steps in the loss mean of part (b)
DEFAULT_LOSS_STEPS = 800  # the default GPT run's --steps


def mpirun() -> str:
    """The mpirun beside this Python (where the mpich wheel puts it), else on PATH."""
    beside = Path(sys.executable).with_name("mpirun")
    return str(beside) if beside.exists() else "mpirun"


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def run_env() -> dict[str, str]:
    """This process's environment for the ranks, less the thread budget importing
    zero_ref set here for one rank: each rank sets its own (cores / ranks on the
    host); inheriting this one would oversubscribe the cores several times over."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    for var in THREAD_VARS:
        env.pop(var, None)
    return env


def run_train(flags: list[str], ranks: int, timeout_s: float, log: Path) -> list[dict]:
    """One mpirun of zero_ref.train; returns every JSONL record (the final one last).
    A failed or timed-out run prints its stderr tail and exits non-zero."""
    log.unlink(missing_ok=True)
    cmd = [mpirun(), "-n", str(ranks), sys.executable, "-m", "zero_ref.train", *flags]
    cmd += ["--log-jsonl", str(log)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=run_env())
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        print(f"{' '.join(cmd)} timed out after {timeout_s:g} s:\n{tail}", file=sys.stderr)
        raise SystemExit(1) from None
    if done.returncode:
        print(f"{' '.join(cmd)} failed (rc {done.returncode}):", file=sys.stderr)
        print(done.stderr[-3000:] or done.stdout[-3000:], file=sys.stderr)
        raise SystemExit(1)
    return read_jsonl(log)


def split(records: list[dict]) -> tuple[list[dict], dict]:
    """(per-step records, final record)."""
    final = records[-1]
    if not final.get("final"):
        raise SystemExit("the last --log-jsonl record is not the final one")
    return [r for r in records if "step" in r and not r.get("final")], final


def speed_flags(precision: str, stage: int, a: argparse.Namespace) -> list[str]:
    return [
        *("--precision", precision, "--stage", str(stage)),
        *("--d-model", str(a.d_model), "--n-layer", str(a.n_layer)),
        *("--steps", str(a.steps), "--context", str(a.context)),
        *("--batch-size", str(a.batch_size), "--sample-chars", "0", "--quiet"),
        *(["--checkpoint-activations"] if a.checkpoint_activations else []),
    ]


def ledger_equals_formula(final: dict) -> bool:
    """Every rank's params, grads and optimizer bytes equal the run's formula exactly."""
    formula = final["formula_bytes"]
    return all(all(r["memory_bytes"][k] == formula[k] for k in STATE_KEYS) for r in final["ranks"])


def speed_row(precision: str, steps: list[dict], final: dict) -> dict:
    """Part (a)'s measurements of one run."""
    stage, numel, world = final["stage"], final["numel_padded"], final["world_size"]
    timed = steps[SKIP_FIRST:] or steps
    ranks = final["ranks"]
    formula = sum(final["formula_bytes"].values()) / numel
    paper = paper_formula_bytes(stage, numel, world, k=12) / numel
    return {
        "precision": precision,
        "stage": stage,
        "numel_padded": numel,
        "element_bytes": final["element_bytes"],
        "step_time_s": statistics.median(s["step_time_s"] for s in timed),
        "sent_bytes": statistics.median(s["sent_bytes"] for s in timed),
        "ledger_per_param": max(sum(r["memory_bytes"].values()) for r in ranks) / numel,
        "formula_per_param": formula,
        "paper_k12_per_param": paper,
        "formula_equals_paper_k12": sum(final["formula_bytes"].values())
        == paper_formula_bytes(stage, numel, world, k=12),
        "ledger_equals_formula": ledger_equals_formula(final),
        "real_peak_per_param": max(max(r["rss_peak_bytes"].values()) for r in ranks) / numel,
        "skipped_steps": final["skipped_steps"],
    }


def add_ratios(rows: list[dict]) -> None:
    """Each row's sent bytes and step time over fp32's at the same stage."""
    fp32 = {r["stage"]: r for r in rows if r["precision"] == "fp32"}
    for r in rows:
        base = fp32.get(r["stage"])
        r["comm_ratio"] = r["sent_bytes"] / base["sent_bytes"] if base else None
        r["time_ratio"] = r["step_time_s"] / base["step_time_s"] if base else None


def merge_repeats(repeats: list[list[dict]]) -> list[dict]:
    """One row per (precision, stage) from several rounds of runs: the first round's
    row, with the median step time over rounds and the median of each round's own
    time ratio (paired with the fp32 run beside it, so a busy moment that slows one
    round slows both sides of its ratio), and the least real peak over rounds (a
    run that compiled a Numba kernel, its cache stale, holds the compiler's memory)."""
    rows = []
    for i, first in enumerate(repeats[0]):
        times = [rnd[i]["step_time_s"] for rnd in repeats]
        ratios = [rnd[i]["time_ratio"] for rnd in repeats]
        peak = min(rnd[i]["real_peak_per_param"] for rnd in repeats)
        row = dict(first, step_time_s=statistics.median(times), step_time_s_repeats=times)
        row.update(real_peak_per_param=peak, step_time_s_least=min(times))
        if first["time_ratio"] is not None:
            row.update(time_ratio=statistics.median(ratios), time_ratio_repeats=ratios)
        rows.append(row)
    add_least_ratios(rows)
    return rows


def add_least_ratios(rows: list[dict]) -> None:
    """Each row's least step time over rounds against fp32's least at the same stage.
    Other processes on a shared machine only ever add time, and in bursts that can
    cover a whole run (steps of 0.15 s taking 0.5-2 s in one round and not the next),
    so a pair of runs in one round can both be quiet or either be hit: the least over
    rounds is the estimate of each run's own time that such bursts do not move."""
    fp32 = {r["stage"]: r["step_time_s_least"] for r in rows if r["precision"] == "fp32"}
    for r in rows:
        base = fp32.get(r["stage"])
        r["time_ratio_least"] = r["step_time_s_least"] / base if base else None


def measure_speed(a: argparse.Namespace, tmp: Path) -> list[dict]:
    """--repeats rounds; in each, every stage's precisions run back to back."""
    repeats = []
    for rnd in range(a.repeats):
        by = {}
        for stage in a.stages:
            for precision in a.precisions:
                flags = speed_flags(precision, stage, a)
                records = run_train(flags, a.ranks, a.timeout_s, tmp / "a.jsonl")
                by[precision, stage] = speed_row(precision, *split(records))
                print(f"  (a) round {rnd + 1}: {precision} stage {stage} done", file=sys.stderr)
        rows = [by[p, st] for p in a.precisions for st in a.stages]
        add_ratios(rows)
        repeats.append(rows)
    return merge_repeats(repeats)


def loss_flags(precision: str, a: argparse.Namespace) -> list[str]:
    steps = () if a.loss_steps == DEFAULT_LOSS_STEPS else ("--steps", str(a.loss_steps))
    return ["--precision", precision, "--quiet", "--sample-chars", "0", *steps]


def loss_row(precision: str, steps: list[dict], final: dict, entropy: float) -> dict:
    """Part (b)'s measurements of one run."""
    last = [s["loss"] for s in steps[-LAST_N:]]
    mean = statistics.fmean(last)
    return {
        "precision": precision,
        "stage": final["stage"],
        "numel_padded": final["numel_padded"],
        "steps": len(steps),
        "final_loss": steps[-1]["loss"],
        "last_mean_loss": mean,
        "last_n": len(last),
        "skipped_steps": final["skipped_steps"],
        "loss_scale": final["loss_scale"],
        "median_step_time_s": statistics.median(s["step_time_s"] for s in steps[SKIP_FIRST:]),
        "below_unigram": mean < entropy,
    }


def measure_loss(a: argparse.Namespace, tmp: Path, entropy: float) -> list[dict]:
    rows = []
    for precision in a.precisions:
        records = run_train(loss_flags(precision, a), a.ranks, a.timeout_s, tmp / "b.jsonl")
        rows.append(loss_row(precision, *split(records), entropy))
        print(f"  (b) {precision} done", file=sys.stderr, flush=True)
    return rows


def default_unigram_entropy() -> float:
    """The default corpus's unigram entropy, nats/char (what the trainer prints)."""
    return unigram_entropy(encode_corpus(load_text(None))[1])


def _ratio(x: float | None) -> str:
    return f"{x:>7.3f}" if x is not None else f"{'-':>7}"


def speed_table(rows: list[dict], a: argparse.Namespace) -> str:
    numel = rows[0]["numel_padded"]
    lines = [
        f"(a) GPT d_model {a.d_model} x {a.n_layer} layers ({numel / 1e6:.2f}M padded params), "
        f"{a.ranks} ranks, context {a.context}, {a.steps} steps (medians over steps "
        f"{SKIP_FIRST + 1}-{a.steps}, then over {a.repeats} round(s)); bytes/param/rank, "
        "max over ranks",
        f"{'prec':>5}{'stage':>6}{'step s':>8}{'sent/step':>12}{'ledger':>8}{'formula':>8}"
        f"{'paperK12':>9}{'led==f':>7}{'real':>7}{'comm/32':>8}{'time/32':>8}{'least/32':>9}"
        f"{'skip':>5}",
    ]
    for r in rows:
        lines.append(
            f"{r['precision']:>5}{r['stage']:>6}{r['step_time_s']:>8.3f}{r['sent_bytes']:>12,.0f}"
            f"{r['ledger_per_param']:>8.2f}{r['formula_per_param']:>8.2f}"
            f"{r['paper_k12_per_param']:>9.2f}{str(r['ledger_equals_formula']):>7}"
            f"{r['real_peak_per_param']:>7.2f} {_ratio(r['comm_ratio'])} {_ratio(r['time_ratio'])}"
            f"  {_ratio(r['time_ratio_least'])}{r['skipped_steps']:>5}"
        )
    lines.append(
        "ledger: all categories (buffers too); formula: the run's params+grads+optimizer; "
        "real: peak RSS above baseline; led==f: every rank's model states == formula; "
        "time/32: median of the rounds' ratios; least/32: least step time over rounds / fp32's"
    )
    return "\n".join(lines)


def loss_table(rows: list[dict], entropy: float) -> str:
    lines = [
        f"(b) default run per precision (stage {rows[0]['stage']}, {rows[0]['steps']} steps); "
        f"unigram entropy {entropy:.3f} nats/char",
        f"{'prec':>5}{'final':>8}{'last' + str(LAST_N):>8}{'skipped':>8}{'scale':>10}"
        f"{'step s':>8}  below unigram",
    ]
    for r in rows:
        lines.append(
            f"{r['precision']:>5}{r['final_loss']:>8.3f}{r['last_mean_loss']:>8.3f}"
            f"{r['skipped_steps']:>8}{r['loss_scale']:>10g}{r['median_step_time_s']:>8.3f}"
            f"  {r['below_unigram']}"
        )
    return "\n".join(lines)


def targets(speed: list[dict], loss: list[dict]) -> dict:
    half = [r for r in speed if r["precision"] != "fp32"]
    ratios = [r["comm_ratio"] for r in half if r["comm_ratio"] is not None]
    out: dict = {
        "ledger_equals_formula_all": all(r["ledger_equals_formula"] for r in speed),
        "mixed_formula_equals_paper_k12": bool(half)
        and all(r["formula_equals_paper_k12"] for r in half),
        "comm_ratio_16bit_max": max(ratios) if ratios else None,
    }
    for p in ("fp16", "bf16"):  # the worst stage, by each statistic
        for key in ("time_ratio", "time_ratio_least"):
            got = [r[key] for r in speed if r["precision"] == p and r.get(key) is not None]
            out[f"{p}_{key}_max"] = max(got) if got else None
    by = {r["precision"]: r["below_unigram"] for r in loss}
    for p in ("fp16", "bf16", "fp32"):
        out[f"{p}_below_unigram"] = by.get(p)
    return out


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--d-model", type=int, default=256, help="part (a)'s GPT width")
    p.add_argument("--n-layer", type=int, default=8, help="part (a)'s GPT depth")
    p.add_argument("--steps", type=int, default=12, help="part (a)'s steps per run")
    p.add_argument("--context", type=int, default=64, help="part (a)'s context")
    p.add_argument(
        "--loss-steps", type=int, default=DEFAULT_LOSS_STEPS, help="part (b)'s steps per run"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="part (a)'s global batch (4: one sequence per rank, so model states, not "
        "activations, dominate the real peak, as in scripts/bench/bench_memory.py)",
    )
    p.add_argument(
        "--no-checkpoint-activations",
        dest="checkpoint_activations",
        action="store_false",
        help="part (a) without activation checkpointing (default: with)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="part (a)'s rounds: step times are medians over them, ratios medians of "
        "each round's (for a busy machine)",
    )
    p.add_argument("--skip-loss", action="store_true", help="skip part (b)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per mpirun")
    add_record_flag(p, "bench_precision")
    a = p.parse_args()
    if a.repeats < 1:
        p.error(f"--repeats {a.repeats} is not allowed: it must be >= 1")
    return a


def main() -> None:
    a = parse()
    entropy = default_unigram_entropy()
    with tempfile.TemporaryDirectory() as tmp:
        speed = measure_speed(a, Path(tmp))
        print(speed_table(speed, a), flush=True)
        loss = [] if a.skip_loss else measure_loss(a, Path(tmp), entropy)
    if loss:
        print(loss_table(loss, entropy), flush=True)
    checked = targets(speed, loss)
    print("targets: " + ", ".join(f"{k} {v}" for k, v in checked.items()))
    names = ("ranks", "precisions", "stages", "d_model", "n_layer", "steps", "context", "repeats")
    settings = {k: getattr(a, k) for k in (*names, "batch_size", "checkpoint_activations")}
    settings.update(loss_steps=a.loss_steps)
    settings.update(skip_loss=a.skip_loss, unigram_entropy=entropy)
    emit(
        {
            "settings": settings,
            "load_average": load_average(),
            "targets": checked,
            "speed": speed,
            "loss": loss,
        },
        a.record,
    )


if __name__ == "__main__":
    main()
