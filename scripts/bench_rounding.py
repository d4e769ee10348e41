"""The 16-bit conversions, NumPy's / ml_dtypes' casts against zero_ref/rounding.py's kernels.

    python scripts/bench_rounding.py                  # 2^20 elements, median of 7
    python scripts/bench_rounding.py --numel 4194304

For each conversion (float32 -> fp16, float32 -> bf16, fp16 -> float32, bf16 -> float32)
and each kind of input (ordinary values ~N(0, 1); values whose fp16 results are
subnormal, ~N(0, 1e-6); values that overflow fp16, ~N(0, 1e6)), the median time per
element of the cast (`dst[...] = src`, what zero_ref did before) and of the kernel
on the same arrays, and whether their bits agree (NaN-free inputs: the two differ
only on NaNs). One thread; prints a table, then one JSON line last.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np
from bench_common import add_record_flag, emit, load_average

import zero_ref  # noqa: F401  (the thread budget, before NumPy)
from zero_ref import rounding as R

FP16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
INPUTS = {"ordinary": 1.0, "fp16 subnormal": 1e-6, "fp16 overflow": 1e6}


def per_element_ns(fn, numel: int, repeats: int) -> float:
    fn()  # compiled, pages touched
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / numel * 1e9


def cast(dst: np.ndarray, src: np.ndarray):
    def run():
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            dst[...] = src

    return run


def compare(conversion: str, kind: str, src, dst_dtype, kernel, numel: int, repeats: int):
    """One row: src cast into a new dst_dtype array against kernel on the same bits."""
    by_cast, by_kernel = np.empty(numel, dst_dtype), np.empty(numel, dst_dtype)
    bits = {2: np.uint16, 4: np.uint32}
    src_bits = src.view(bits[src.itemsize])[np.newaxis]
    dst_bits = by_kernel.view(bits[by_kernel.itemsize])[np.newaxis]
    row = {
        "conversion": conversion,
        "input": kind,
        "cast_ns": per_element_ns(cast(by_cast, src), numel, repeats),
        "kernel_ns": per_element_ns(lambda: kernel(src_bits, dst_bits), numel, repeats),
        "bits_agree": bool(np.array_equal(by_cast.view(dst_bits.dtype), dst_bits[0])),
    }
    row["speedup"] = row["cast_ns"] / row["kernel_ns"]
    return row, by_kernel


def measure(numel: int, repeats: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for kind, scale in INPUTS.items():
        x = (rng.standard_normal(numel) * scale).astype(np.float32)
        for dtype, kernel, widen in (
            (FP16, R.round_fp16_kernel, R.widen_fp16_kernel),
            (BF16, R.round_bf16_kernel, R.widen_bf16_kernel),
        ):
            row, narrow = compare(
                f"float32 -> {dtype.name}", kind, x, dtype, kernel, numel, repeats
            )
            back, _ = compare(
                f"{dtype.name} -> float32", kind, narrow, np.float32, widen, numel, repeats
            )
            rows += [row, back]
    return rows


def table(rows: list[dict], numel: int) -> str:
    lines = [
        f"{numel:,} elements, ns per element (median), one thread",
        f"{'conversion':>20} {'input':>15} {'cast':>8} {'kernel':>8} {'x':>7}  bits agree",
    ]
    for r in rows:
        lines.append(
            f"{r['conversion']:>20} {r['input']:>15} {r['cast_ns']:>8.2f} {r['kernel_ns']:>8.2f}"
            f" {r['speedup']:>7.1f}  {r['bits_agree']}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    add_record_flag(p, "bench_rounding")
    a = p.parse_args()
    if a.numel < 1 or a.repeats < 1:
        p.error(f"--numel {a.numel} and --repeats {a.repeats}: both must be >= 1")
    rows = measure(a.numel, a.repeats, a.seed)
    print(table(rows, a.numel), flush=True)
    settings = {"numel": a.numel, "repeats": a.repeats, "seed": a.seed}
    emit({"settings": settings, "load_average": load_average(), "rows": rows}, a.record)


if __name__ == "__main__":
    main()
