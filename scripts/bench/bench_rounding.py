"""The 16-bit conversions, NumPy's / ml_dtypes' casts against the kernels of
zero_ref/numerics/rounding.py.

    python scripts/bench/bench_rounding.py                  # 2^20 elements, median of 7
    python scripts/bench/bench_rounding.py --numel 4194304

For each conversion (float32 -> fp16, float32 -> bf16, fp16 -> float32, bf16 -> float32)
and each kind of input (ordinary values ~N(0, 1); values whose fp16 results are
subnormal, ~N(0, 1e-6); values that overflow fp16, ~N(0, 1e6)), the median time per
element of the cast (`dst[...] = src`, what zero_ref did before) and of the kernel
on the same arrays, and whether their bits agree (NaN-free inputs: the two differ
only on NaNs). Then the engine's per-bucket calls (zero_ref/numerics/dtypes.py, with their Python):
a bucket of 8192 elements at 4 ranks packed into its (4, 2048) staging slice from
strided rows of a unit's gradient (float32 copy, fp16 and bf16 rounding), and the
fused 16-bit sum of its (4, 2048) words, microseconds a call (the best of 5 medians).
One thread; prints the tables, then one JSON line last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: scripts.* import by path
import zero_ref  # noqa: F401  (the thread budget, before NumPy)
from scripts.bench.bench_common import add_record_flag, emit, load_average
from zero_ref.numerics import rounding as R
from zero_ref.numerics.dtypes import HOST

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


def per_call_us(fn, calls: int = 400) -> float:
    """The least over 5 runs of the median of `calls` calls' times, in microseconds."""
    fn()
    best = []
    for _ in range(5):
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best.append(statistics.median(times))
    return min(best) * 1e6


def bucket_calls(seed: int, world: int = 4, columns: int = 2048) -> list[dict]:
    """The engine's calls on one bucket (bucket_numel 8192 at 4 ranks, the default)."""
    rng = np.random.default_rng(seed)
    unit = (rng.standard_normal((world, columns + 300)) * 1e-3).astype(np.float32)
    rows = unit[:, 100 : 100 + columns]  # (W, columns) of a wider unit: strided rows
    calls = []
    for dtype in (np.dtype(np.float32), FP16, BF16):
        staging = np.zeros((world, columns), dtype)
        pack = per_call_us(lambda: HOST.round_into(staging, rows))  # noqa: B023
        row = {"dtype": dtype.name, "pack_us": pack, "sum_us": None}
        if dtype.itemsize == 2:
            out = np.empty(columns, np.float32)
            row["sum_us"] = per_call_us(lambda: HOST.sum_widened_rows(staging, out))  # noqa: B023
        calls.append(row)
    return calls


def bucket_table(calls: list[dict]) -> str:
    lines = ["one bucket (4 x 2048), us per call: pack = round_into its staging, sum = the"]
    lines.append("fused 16-bit sum over its 4 rows (sum_widened_rows)")
    for c in calls:
        total = "" if c["sum_us"] is None else f"   sum {c['sum_us']:6.2f}"
        lines.append(f"{c['dtype']:>10}  pack {c['pack_us']:6.2f}{total}")
    return "\n".join(lines)


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
    bucket = bucket_calls(a.seed)
    print(bucket_table(bucket), flush=True)
    settings = {"numel": a.numel, "repeats": a.repeats, "seed": a.seed}
    result = {"settings": settings, "load_average": load_average(), "rows": rows}
    emit({**result, "bucket": bucket}, a.record)


if __name__ == "__main__":
    main()
