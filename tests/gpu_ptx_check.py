"""Compiles zero_ref's CUDA kernels (zero_ref/optim/*_cuda.py, zero_ref/rounding_cuda.py,
zero_ref/models/layers_cuda.py) to PTX for a real GPU (no GPU needed, only NVVM) and
prints, as JSON, the floating-point instructions each one contains; run by
tests/test_gpu_kernels.py as

    NUMBA_ENABLE_CUDASIM=0 python tests/gpu_ptx_check.py

This is the evidence behind the kernels' rounding claim: on hardware the AdamW and
unscale kernels must hold no fused multiply-add and only correctly rounded division
and square root, as their NumPy twins compute."""

from __future__ import annotations

import json
import os
import re
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

from numba import cuda, types  # noqa: E402

from zero_ref import rounding_cuda  # noqa: E402
from zero_ref.models import layers_cuda  # noqa: E402
from zero_ref.optim import adamw_cuda, gradnorm_cuda  # noqa: E402

f32, F32 = types.float32, types.float32[::1]
SCALARS = types.Tuple([f32, f32, types.boolean, f32, f32, f32, f32, f32, f32])
SIGNATURES = {
    "adamw": (adamw_cuda._adamw, types.void(F32, F32, F32, F32, SCALARS)),
    "unscale_and_clip": (
        gradnorm_cuda._unscale_and_clip,
        types.void(F32, F32, f32, f32, types.boolean),
    ),
    "round_fp16": (rounding_cuda._round_fp16, types.void(types.uint32[::1], types.uint16[::1])),
    "round_bf16": (rounding_cuda._round_bf16, types.void(types.uint32[::1], types.uint16[::1])),
    "embedding_backward": (
        layers_cuda._embedding_backward_columns,
        types.void(types.int64[::1], types.float32[:, ::1], types.float32[:, ::1]),
    ),
}  # sumsq_bins and first_nonfinite are integer atomics (any order, same result); compiling
# an atomic asks the driver for the device, which a machine without a GPU lacks
FLOAT_OP = re.compile(r"^\s*((?:fma|mul|add|sub|div|sqrt|rsqrt|rcp|cvt|atom)[.\w]*)", re.M)


def main() -> None:
    try:
        out = {}
        for name, (kernel, signature) in SIGNATURES.items():
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(8, 0))
            out[name] = sorted(set(FLOAT_OP.findall(ptx)))
    except Exception as e:  # no NVVM on this machine: the test skips
        print(json.dumps({"unavailable": f"{type(e).__name__}: {e}"[:500]}))
        sys.exit(0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
