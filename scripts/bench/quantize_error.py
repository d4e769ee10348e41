"""qwZ's quantization error per block, and the padding its block alignment costs.

    python scripts/bench/quantize_error.py [--weights W.safetensors] [--block 2048] [--world 4]
                                     [--record [NAME]]

For the default GPT (or the flags given after --): every unit's parameters (the
initial draws of its seed, or a trained run's from --weights, e.g. a checkpoint
consolidated by `python -m zero_ref.app.consolidate`), rounded to the run's precision,
cut into blocks of --block elements of the unit (zero_ref/numerics/quantize.py: the blocks
stage 3's qwZ gathers, at any world size), quantized and dequantized; per block the
relative error max |x - x'| / amax, whose bound is 0.5 / 127 (half an int8 step;
float32's roundings add ~1e-7). Then the padding: elements of the layout aligned to
world * block per unit against the plain one (a multiple of the world size), at
1, 2, 4 and 8 ranks. Prints a table, then one JSON line.
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
from zero_ref.app.rank_estimate import model_for
from zero_ref.layout.flat import model_layout
from zero_ref.models.unit import full_name, init_params
from zero_ref.numerics.dtypes import dtype_of, rounded
from zero_ref.numerics.quantize import quantized_copy


def block_errors(flat: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """max |x - x'| / amax, and the root-mean-square |x - x'| / amax, of each block
    holding a nonzero value (padding zeros count in the last block's mean)."""
    back = quantized_copy(flat, block)
    n = -(-flat.size // block) * block
    x, xq = np.zeros(n, np.float64), np.zeros(n, np.float64)
    x[: flat.size], xq[: flat.size] = flat, back
    return relative_errors(x.reshape(-1, block), xq.reshape(-1, block))


def unit_flats(model, params: dict, precision: str) -> dict[str, np.ndarray]:
    """Each unit's parameters, flat, in layout order, rounded to the run's precision."""
    out = {}
    for unit in model.units:
        parts = [params[full_name(unit, s)].reshape(-1) for s in unit.param_specs()]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        out[unit.name] = rounded(flat.astype(np.float32), dtype_of(precision))
    return out


def padding(model, block: int) -> list[dict]:
    rows = []
    for world in (1, 2, 4, 8):
        plain, aligned = model_layout(model, world), model_layout(model, world, block)
        rows.append(
            {
                "world": world,
                "numel": plain.numel,
                "plain_padded": plain.full_numel,
                "aligned_padded": aligned.full_numel,
                "extra_zeros": aligned.full_numel - plain.full_numel,
                "extra_fraction": (aligned.full_numel - plain.full_numel) / plain.numel,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", help="a safetensors file of the model's float32 weights")
    p.add_argument("--block", type=int, default=2048)
    p.add_argument("--world", type=int, default=4)
    add_record_flag(p, "quantize_error")
    args, extra = p.parse_known_args()
    parsed = parse_args([a for a in extra if a != "--"], args.world)
    model = model_for(parsed, args.world)
    if args.weights:
        from safetensors.numpy import load_file

        params, source = load_file(args.weights), args.weights
    else:
        params, source = init_params(model, parsed.run.seed), f"initial (seed {parsed.run.seed})"
    both = {
        name: block_errors(flat, args.block)
        for name, flat in unit_flats(model, params, parsed.zero.mixed_precision.dtype).items()
    }
    errors = {name: e for name, (e, _) in both.items()}
    every = np.concatenate([e for e in errors.values() if e.size]) if errors else np.zeros(0)
    rms = np.concatenate([r for _, r in both.values() if r.size]) if both else np.zeros(0)
    precision = parsed.zero.mixed_precision.dtype
    print(f"{source}: {every.size} blocks of {args.block}, precision {precision}")
    print(f"{'unit':>14} {'blocks':>7} {'max err/amax':>13} {'mean':>10}")
    for name, e in errors.items():
        if e.size:
            print(f"{name:>14} {e.size:>7} {e.max():>13.6f} {e.mean():>10.6f}")
    pads = padding(model, args.block)
    for r in pads:
        print(
            f"W={r['world']}: {r['plain_padded']:,} padded elements plain, "
            f"{r['aligned_padded']:,} aligned to W x {args.block} "
            f"(+{r['extra_zeros']:,}, {100 * r['extra_fraction']:.1f} % of the parameters)"
        )
    emit(
        {
            "script": "quantize_error",
            "source": source,
            "block": args.block,
            "precision": parsed.zero.mixed_precision.dtype,
            "blocks": int(every.size),
            "max_rel_error": float(every.max()) if every.size else 0.0,
            "mean_rel_error": float(every.mean()) if every.size else 0.0,
            "median_rel_error": float(np.median(every)) if every.size else 0.0,
            "mean_rms_rel_error": float(rms.mean()) if rms.size else 0.0,
            "bound": 0.5 / 127,
            "padding": pads,
            "load_average": load_average(),
        },
        args.record,
    )


if __name__ == "__main__":
    sys.exit(main())
