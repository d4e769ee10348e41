"""qgZ's quantization error per block, on a real run's gradients.

    python scripts/bench/qgz_error.py [--world 4] [--steps 20] [--record [NAME]] [-- train flags]

The default GPT (or the flags after --) trained for --steps steps by the single-rank
oracle with qgZ (zero_ref/oracle/single_rank.py: exactly what the engine computes; int8 unless the
flags say --quantized-gradient-bits 4), then one more step's gradients of each of the
--world ranks, laid out as the engine's buckets see them (zero_ref/layout/grad_blocks.py's
blocks of --quantize-block) and quantized per destination block, in int8 and in int4,
the same gradients. Per block: max |g - g'| / amax (the bound is half a step: 0.5 / 127
in int8, 0.5 / 7 in int4) and the RMS over amax; and for the summed gradient (what the
optimizer gets) the relative L2 error ||sum q(g_r) - sum g_r|| / ||sum g_r||, over the
whole gradient and per tensor ("per_tensor", in layout order: what
scripts/docs/plot_zeropp.py --summed draws). Prints a table, then one JSON line (int8's
figures at the top level, as before; "int4" beside).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
from scripts.bench.bench_common import add_record_flag, emit, load_average
from scripts.bench.block_error import relative_errors
from zero_ref.app.cli import parse_args
from zero_ref.app.data import encode_corpus, load_text
from zero_ref.app.tasks import build_task
from zero_ref.layout.buckets import plan_buckets
from zero_ref.layout.flat import build_layout, rank_rows, tensor_views
from zero_ref.layout.grad_blocks import bucket_block_starts
from zero_ref.models.unit import init_params
from zero_ref.numerics.quantize import LEVELS, quantized_rows
from zero_ref.oracle.single_rank import Oracle


def shard_matrix(oracle: Oracle, layout, row: np.ndarray) -> np.ndarray:
    """One rank's flat gradient (oracle order) as the (W, shard_numel) staging space."""
    full = np.zeros(layout.full_numel, np.float32)
    full[oracle._full_index(layout)] = row
    return np.concatenate([rank_rows(full[u.full_slice()], u) for u in layout.units], axis=1)


def block_errors(matrix: np.ndarray, layout, bucket_numel: int, block: int, bits: int):
    """Per block (every destination row of every bucket), quantized in `bits`: max err /
    amax, RMS / amax; and the dequantized matrix."""
    units = layout.units
    plan = plan_buckets(
        [u.shard_numel for u in units], [u.shard_offset for u in units], bucket_numel,
        layout.world_size,
    )  # fmt: skip
    back = matrix.copy()
    maxes, rmss = [], []
    for bucket in plan:
        cols = slice(bucket.shard_offset, bucket.shard_offset + bucket.shard_numel)
        starts = bucket_block_starts(layout, bucket, block)
        q = quantized_rows(matrix[:, cols], starts, bits)
        back[:, cols] = q
        ends = [*starts[1:], bucket.shard_numel]
        for lo, hi in zip(starts, ends, strict=True):
            worst, rms = relative_errors(matrix[:, cols][:, lo:hi], q[:, lo:hi])
            maxes.append(worst)
            rmss.append(rms)
    return np.concatenate(maxes), np.concatenate(rmss), back


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    add_record_flag(p, "qgz_error")
    args, extra = p.parse_known_args()
    if args.steps < 0 or args.world < 1:
        p.error(f"--steps {args.steps} >= 0 and --world {args.world} >= 1 required")
    flags = [a for a in extra if a != "--"]
    parsed = parse_args(["--quantized-gradients", "--stage", "3", *flags], args.world)
    zero = parsed.zero
    task, oracle, loss = trained_oracle(parsed, args.world, args.steps)
    grads = rank_gradients(oracle, task, args.steps, args.world)
    rows = np.stack([oracle.flatten(g) for g in grads])
    gb = oracle.gradient_blocks
    layout = build_layout(gb.units, args.world, gb.align)
    matrices = [shard_matrix(oracle, layout, rows[r]) for r in range(args.world)]
    figures = {bits: errors(matrices, layout, zero, bits) for bits in (8, 4)}
    print(
        f"{args.steps} steps (loss {loss:.4f}, trained in int{gb.bits}), W={args.world}, "
        f"block {zero.zeropp.quantize_block}, bucket {zero.bucket_numel}: "
        f"{figures[8]['blocks']} blocks"
    )
    for bits, f in figures.items():
        print(f"int{bits}: max err/amax {f['max_rel_error']:.7f}  mean {f['mean_rel_error']:.7f}"
              f"  RMS/amax {f['mean_rms_rel_error']:.5f}  summed gradient rel L2 error "
              f"{f['summed_grad_rel_l2_error']:.2e}  (bound {f['bound']:.7f})")  # fmt: skip
    emit(
        {
            "script": "qgz_error",
            "world": args.world,
            "steps": args.steps,
            "loss": float(loss) if args.steps else None,
            "block": zero.zeropp.quantize_block,
            "bucket_numel": zero.bucket_numel,
            "precision": zero.mixed_precision.dtype,
            "trained_bits": gb.bits,
            **figures[8],
            "int4": figures[4],
            "load_average": load_average(),
        },
        args.record,
    )


def trained_oracle(parsed, world: int, steps: int):
    """(task, oracle, loss): the oracle of parsed's run after `steps` steps on its
    batches at `world` ranks (loss: the last step's, NaN for none)."""
    run, zero = parsed.run, parsed.zero
    vocab, tokens = encode_corpus(load_text(run.data))
    task = build_task(run, vocab, tokens, world, zero.grad_accum)
    oracle = Oracle.for_config(init_params(task.model, run.seed), zero, task.model)
    loss = float("nan")
    for step in range(steps):
        loss = oracle.model_step(task.model, *task.batches(step))
    return task, oracle, loss


def rank_gradients(oracle: Oracle, task, step: int, world: int) -> list:
    """Each rank's gradients (named) of the first micro-batch of `step`, at the oracle's
    parameters: what its qgZ reduce-scatter would send."""
    inputs, targets = task.batches(step)
    params = oracle.model_parameters()
    return [
        oracle.model_gradients(task.model, params, params, inputs[0, r], targets[0, r])[1]
        for r in range(world)
    ]


def errors(matrices: list[np.ndarray], layout, zero, bits: int) -> dict:
    """Every rank's (W, shard_numel) gradient quantized in `bits`: the per-block figures
    over all of them, and the summed gradient's relative L2 error."""
    maxes, rmss, exact, quant = [], [], 0, 0
    for m in matrices:
        e, rms, back = block_errors(m, layout, zero.bucket_numel, zero.zeropp.quantize_block, bits)
        maxes.append(e)
        rmss.append(rms)
        exact, quant = exact + m.astype(np.float64), quant + back.astype(np.float64)
    every, rms = np.concatenate(maxes), np.concatenate(rmss)
    return {
        "blocks": int(every.size),
        "max_rel_error": float(every.max()),
        "mean_rel_error": float(every.mean()),
        "mean_rms_rel_error": float(rms.mean()),
        "summed_grad_rel_l2_error": float(np.linalg.norm(quant - exact) / np.linalg.norm(exact)),
        "bound": 0.5 / LEVELS[bits],
        "per_tensor": per_tensor(layout, exact, quant),
    }


def per_tensor(layout, exact: np.ndarray, quant: np.ndarray) -> dict[str, float]:
    """The summed gradient's relative L2 error of each tensor, in layout order, from the
    (W, shard_numel) sums: a unit's W rows, one after another, are its flat range."""
    out = {}
    for u in layout.units:
        cols = slice(u.shard_offset, u.shard_offset + u.shard_numel)
        e, q = (tensor_views(m[:, cols].reshape(-1), u) for m in (exact, quant))
        for name, view in e.items():
            norm = np.linalg.norm(view)
            if norm > 0:  # a tensor with no gradient (none here) has no relative error
                out[f"{u.name}.{name}"] = float(np.linalg.norm(q[name] - view) / norm)
    return out


if __name__ == "__main__":
    sys.exit(main())
