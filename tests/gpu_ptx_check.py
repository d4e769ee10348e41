"""Compiles zero_ref's CUDA kernels (zero_ref/optim/*_cuda.py, zero_ref/numerics/rounding_cuda.py,
zero_ref/models/layers_cuda.py) to PTX for a real GPU (no GPU needed, only NVVM) and
prints, as JSON, the floating-point instructions each one contains; run by
tests/test_gpu_kernels.py as

    NUMBA_ENABLE_CUDASIM=0 python tests/gpu_ptx_check.py

This is the evidence behind the kernels' rounding claim: on hardware the AdamW and
unscale kernels must hold no fused multiply-add and only correctly rounded division
and square root, as their NumPy twins compute.

A kernel that cannot be compiled because the toolchain is missing (no NVVM, or no CUDA
driver where the compile asks for the device) is listed under "unavailable"; any other
error (numba-cuda broken by this NumPy, say) is raised, and the script exits 1.

    NUMBA_ENABLE_CUDASIM=0 python tests/gpu_ptx_check.py --launch

also compiles one tiny kernel through libdevice (zero_ref.numerics.cuda_math's fdiv_rn and
fsqrt_rn) and runs it on the GPU, and exits 1 unless its result is bitwise NumPy's:
scripts/tools/gpu_check.sh's env phase, so that a compiler break fails in seconds, with its
cause, before any other phase spends the lease on it.
"""

from __future__ import annotations

import json
import os
import re
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

import numpy as np  # noqa: E402
from numba import cuda, types  # noqa: E402

from zero_ref.models import layers_cuda  # noqa: E402

# cuda_math (which every kernel imports) restores np.row_stack for numba-cuda on NumPy 2.5
from zero_ref.numerics import cuda_math, rounding_cuda  # noqa: E402
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
# numba-cuda's errors for a missing toolchain (all ImportErrors): the only ones that mean
# "cannot check here" rather than "broken"
TOOLCHAIN_MISSING = ("CudaSupportError", "NvvmSupportError", "NvrtcSupportError")


def toolchain_missing(error: BaseException) -> bool:
    """Whether `error` says this machine lacks NVVM or the CUDA driver (a skip), as
    opposed to a compiler that is there and broken (a failure)."""
    return type(error).__name__ in TOOLCHAIN_MISSING


def compiled_ops() -> dict:
    """Each kernel's floating-point PTX instructions; "unavailable": {kernel: why} for
    those the missing toolchain could not compile. Any other error propagates."""
    out: dict = {}
    for name, (kernel, signature) in SIGNATURES.items():
        try:
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(8, 0))
        except Exception as e:
            if not toolchain_missing(e):
                raise
            out.setdefault("unavailable", {})[name] = f"{type(e).__name__}: {e}"[:300]
            continue
        out[name] = sorted(set(FLOAT_OP.findall(ptx)))
    return out


@cuda.jit
def _libdevice_probe(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = cuda_math.sqrt(cuda_math.div(x[i], np.float32(3.0)))


def launch() -> dict:
    """One tiny kernel through libdevice on the GPU, bitwise against NumPy's float32."""
    x = np.array([0.0, 1e-40, 1.0, 2.0, 3.0, 7.5, 1e30], dtype=np.float32)
    expected = np.sqrt(x / np.float32(3.0))
    device_out = cuda.device_array(x.size, np.float32)
    _libdevice_probe[cuda_math.blocks(x.size), cuda_math.THREADS](cuda.to_device(x), device_out)
    got = device_out.copy_to_host()
    name = cuda.get_current_device().name
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "bitwise": bool(np.array_equal(got.view(np.uint32), expected.view(np.uint32))),
        "got": [float(v) for v in got],
        "numpy": [float(v) for v in expected],
    }


def main() -> int:
    out = compiled_ops()
    if "--launch" in sys.argv[1:]:
        out["launch"] = launch()
        print(json.dumps(out), flush=True)
        missing = out.get("unavailable")
        return 0 if out["launch"]["bitwise"] and not missing else 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
