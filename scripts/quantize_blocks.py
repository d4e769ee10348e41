"""ZeRO++'s quantization error block by block, from one run: qwZ's weight blocks and qgZ's
gradient blocks, recorded for docs/img/zeropp_quantize_error.png (scripts/plot_zeropp.py).

    python scripts/quantize_blocks.py [--world 4] [--steps 20] [--record [NAME]] [-- flags]

The default GPT in bf16 with qwZ and qgZ in blocks of 256 (scripts/bench_zeropp.py's
"all three" less hpZ, which changes which weights backward reads, not the blocks), or
the zero_ref.train flags after --, trained --steps steps by the single-rank oracle
(exactly what the engine computes, zero_ref/oracle.py); then every block of the
weights forward gathers (scripts/quantize_error.py's block_errors on the bf16
parameters) and every destination block of the next step's gradients of each of the
--world ranks (scripts/qgz_error.py's block_errors on the buckets' layout): per block
max |x - x'| / amax and the RMS over amax. The bound on the first is half an int8
step, 0.5 / 127. Prints a summary, then one JSON line with every block's figures.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from bench_common import add_record_flag, emit, load_average
from qgz_error import block_errors as gradient_block_errors
from qgz_error import rank_gradients, shard_matrix, trained_oracle
from quantize_error import block_errors as weight_block_errors
from quantize_error import unit_flats

from zero_ref.app.cli import parse_args
from zero_ref.layout.flat import build_layout
from zero_ref.oracle import Oracle

FLAGS = ("--stage", "3", "--precision", "bf16", "--quantized-weights", "--quantized-gradients",
         "--quantize-block", "256")  # fmt: skip


def rounded_list(x: np.ndarray) -> list[float]:
    return [float(f"{v:.6g}") for v in x]


def weight_blocks(oracle: Oracle, model, precision: str, block: int) -> dict:
    """Every unit's blocks of forward's quantized weights, in layout order."""
    maxes, rmss, units = [], [], []
    for name, flat in unit_flats(model, oracle.model_parameters(), precision).items():
        e, rms = weight_block_errors(flat, block)
        maxes.append(e)
        rmss.append(rms)
        units += [name] * e.size
    return {"max_rel": np.concatenate(maxes), "rms_rel": np.concatenate(rmss), "unit": units}


def gradient_blocks(oracle: Oracle, model, task, step: int, world: int, zero) -> dict:
    """Every destination block of each rank's gradients at the given step, rank by rank."""
    grads = rank_gradients(oracle, task, step, world)
    gb = oracle.gradient_blocks
    layout = build_layout(gb.units, world, gb.align)
    maxes, rmss, ranks = [], [], []
    for r, g in enumerate(grads):
        m = shard_matrix(oracle, layout, oracle.flatten(g))
        bits = zero.quantized_gradient_bits  # the run's own qgZ bits
        e, rms, _ = gradient_block_errors(m, layout, zero.bucket_numel, zero.quantize_block, bits)
        maxes.append(e)
        rmss.append(rms)
        ranks += [r] * e.size
    return {"max_rel": np.concatenate(maxes), "rms_rel": np.concatenate(rmss), "rank": ranks}


def as_json(blocks: dict) -> dict:
    out = {k: rounded_list(v) if isinstance(v, np.ndarray) else v for k, v in blocks.items()}
    out["blocks"] = len(out["max_rel"])
    out["max_of_max_rel"] = float(blocks["max_rel"].max())
    out["mean_rms_rel"] = float(blocks["rms_rel"].mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    add_record_flag(p, "zeropp_quantize_blocks")
    args, extra = p.parse_known_args()
    flags = [a for a in extra if a != "--"] or list(FLAGS)
    if args.steps < 0 or args.world < 1:
        p.error(f"--steps {args.steps} >= 0 and --world {args.world} >= 1 required")
    parsed = parse_args(flags, args.world)
    zero = parsed.zero
    if not (zero.quantized_weights and zero.quantized_gradients):
        p.error("the flags must turn on both --quantized-weights and --quantized-gradients")
    task, oracle, loss = trained_oracle(parsed, args.world, args.steps)
    model = task.model
    weights = weight_blocks(oracle, model, zero.precision, zero.quantize_block)
    grads = gradient_blocks(oracle, model, task, args.steps, args.world, zero)
    for what, b in (("weights", weights), ("gradients", grads)):
        print(f"{what}: {b['max_rel'].size} blocks, max err/amax {b['max_rel'].max():.7f}, "
              f"mean RMS/amax {b['rms_rel'].mean():.5f}")  # fmt: skip
    emit(
        {
            "script": "quantize_blocks",
            "flags": flags,
            "world": args.world,
            "steps": args.steps,
            "loss": loss if args.steps else None,
            "block": zero.quantize_block,
            "precision": zero.precision,
            "bound": 0.5 / 127,
            "weights": as_json(weights),
            "gradients": as_json(grads),
            "load_average": load_average(),
        },
        args.record,
    )


if __name__ == "__main__":
    sys.exit(main())
