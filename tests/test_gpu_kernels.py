"""The device kernels against their NumPy twins, element by element, at awkward sizes.

In CI they run in numba-cuda's simulator (tests/conftest.py sets NUMBA_ENABLE_CUDASIM=1);
scripts/tools/gpu_check.sh runs the same tests on a real GPU, where the libdevice `_rn`
spelling is what keeps them bitwise (zero_ref/numerics/cuda_math.py). Each kernel sits
beside its twin: zero_ref/numerics/rounding_cuda.py,
zero_ref/optim/{adamw,gradnorm,nonfinite}_cuda.py, zero_ref/models/layers_cuda.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from zero_ref.config import AdamWConfig
from zero_ref.numerics import cuda_math, rounding_cuda
from zero_ref.numerics.dtypes import round_into
from zero_ref.optim import adamw_cuda, gradnorm_cuda, nonfinite_cuda
from zero_ref.optim.adamw import adamw_reference, adamw_scalars
from zero_ref.optim.gradnorm import sumsq_bins_reference, unscale_and_clip
from zero_ref.optim.nonfinite import first_nonfinite

pytestmark = pytest.mark.gpu
SIZES = [0, 1, 7, 13, 257]


def awkward(n: int, seed: int) -> np.ndarray:
    """float32 values of many magnitudes, a few subnormals and exact ties among them."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    if n > 3:
        x[1] = np.float32(1e-40)  # subnormal
        x[2] = np.float32(1.0) + np.float32(2.0**-8)  # a bf16 tie
    return x


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("beta1", [0.9, 0.3])  # both of torch's lerp formulas
@pytest.mark.parametrize("step", [1, 5])
def test_adamw_is_bitwise_its_twin(n, beta1, step):
    rng = np.random.default_rng(n)
    param, grad = rng.standard_normal((2, n)).astype(np.float32)
    m = rng.standard_normal(n).astype(np.float32) * 0.1
    v = np.abs(rng.standard_normal(n)).astype(np.float32) * 0.01
    s = adamw_scalars(AdamWConfig(lr=1e-3, betas=(beta1, 0.999), weight_decay=0.01), step)
    device = [cuda.to_device(a) for a in (param, grad, m, v)]
    adamw_cuda.adamw(*device, s)
    adamw_reference(param, grad, m, v, s)
    for host, dev in zip((param, grad, m, v), device, strict=True):
        assert np.array_equal(bits(host), bits(dev.copy_to_host()))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_unscale_and_clip_is_bitwise_its_twin(n, coef):
    grad = awkward(n, 1)
    divisor, c = np.float32(12.0), np.float32(coef)
    out = cuda.device_array(n, np.float32)
    gradnorm_cuda.unscale_and_clip(cuda.to_device(grad), out, divisor, c)
    assert np.array_equal(bits(out.copy_to_host()), bits(unscale_and_clip(grad, divisor, c)))


@pytest.mark.parametrize("n", SIZES)
def test_sumsq_bins_are_its_twins(n):
    x = awkward(n, 2)
    if n > 6:
        x[[4, 5, 6]] = [np.inf, -np.inf, np.nan]
    assert np.array_equal(gradnorm_cuda.sumsq_bins(cuda.to_device(x)), sumsq_bins_reference(x))


@pytest.mark.parametrize("bad", [[], [5], [9, 3, 11]])
def test_first_nonfinite_is_its_twins(bad):
    x = awkward(13, 3)
    x[bad] = np.nan if len(bad) == 1 else np.inf
    assert nonfinite_cuda.first_nonfinite(cuda.to_device(x)) == first_nonfinite([x])


# The simulator casts in its own threads, where NumPy warns that an fp16 overflow became
# Inf; that Inf is the point (the loss scaler's signal), so the warning is not news here.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("n", SIZES)
def test_16_bit_rounding_and_widening_are_their_twins(dtype, n):
    src = awkward(n, 4)
    if n > 6:
        src[[4, 5, 6]] = [np.float32(3.4e38), np.float32(-70000.0), np.nan]  # overflow, NaN
    expected = round_into(np.empty(n, dtype), src)
    dst = cuda.device_array(n, dtype)
    rounding_cuda.round_into(dst, cuda.to_device(src), np.dtype(dtype).name)
    got = dst.copy_to_host()
    assert np.array_equal(bits(got), bits(expected))  # NaN too: torch's canonical quiet NaN
    wide = cuda.device_array(n, np.float32)
    rounding_cuda.widen(wide, dst, np.dtype(dtype).name)
    assert np.array_equal(bits(wide.copy_to_host()), bits(got.astype(np.float32)))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_16_bit_roundings_of_the_hard_values_are_the_cpu_kernels_bits(dtype):
    """Ties both ways, overflow to Inf, both formats' subnormals, float32 subnormals,
    +-0, +-Inf, quiet and signalling NaNs with payloads (tests/test_rounding.py's list):
    the device's bits are the CPU kernels' (zero_ref/numerics/rounding.py), NaN rule and all;
    and fp16 widening of every special 16-bit result and of fp16's NaNs is exact."""
    from tests.test_rounding import SPECIAL_BITS, awkward_bits

    src = np.concatenate([SPECIAL_BITS, awkward_bits(64, 3)])
    expected = round_into(np.empty(src.size, dtype), src.view(np.float32))
    dst = cuda.device_array(src.size, dtype)
    rounding_cuda.round_into(dst, cuda.to_device(src.view(np.float32)), np.dtype(dtype).name)
    assert np.array_equal(bits(dst.copy_to_host()), bits(expected))
    more = np.array([0x7C01, 0xFC01, 0x7DFF, 0x0001, 0x83FF, 0x7F81, 0xFFFF], np.uint16)
    halves = np.concatenate([expected.view(np.uint16), more])
    wide = cuda.device_array(halves.size, np.float32)
    rounding_cuda.widen(wide, cuda.to_device(halves.view(dtype)), np.dtype(dtype).name)
    want = halves.view(dtype).astype(np.float32)
    assert np.array_equal(bits(wide.copy_to_host()), bits(want))


@pytest.mark.parametrize("n", [0, 1, 7, 13, 257])
@pytest.mark.parametrize("columns", [1, 5])
def test_the_embedding_backward_kernel_is_the_cpu_kernel_bitwise(n, columns):
    """Repeated ids (a batch of characters has them): the device kernel adds each
    table element's rows in order, so its sums are the CPU Numba kernel's bits."""
    from zero_ref.models.layers import embedding_backward as on_cpu
    from zero_ref.models.layers_cuda import embedding_backward

    rng = np.random.default_rng(n)
    ids = rng.integers(0, 4, n)  # few rows: many repeats
    rows = (rng.standard_normal((n, columns)) * 10.0 ** rng.integers(-3, 4, (n, 1))).astype(
        np.float32
    )
    want, got = np.empty((4, columns), np.float32), np.full((4, columns), np.nan, np.float32)
    on_cpu(ids, rows, want)
    embedding_backward(ids, rows, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bench_gpu_runs_and_ends_with_json():
    """scripts/bench/bench_gpu.py end to end (in the simulator a tiny array, flagged as such)."""
    import json
    import subprocess
    import sys

    from tests.mpi_pool import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench" / "bench_gpu.py"), "--repeats", "1"],
        cwd=REPO / "scripts" / "bench",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["gb_per_s"]) == {"copy", "adamw", "unscale", "norm_bins"}
    assert result["simulator"] is cuda_math.SIMULATOR


def test_on_hardware_the_float_kernels_hold_no_fma_and_only_correctly_rounded_ops():
    """The kernels compiled for a real GPU (NVVM, no GPU needed; skipped without NVVM):
    AdamW and unscale must use mul.rn/add.rn/sub.rn/div.rn/sqrt.rn, never a fused
    multiply-add or an approximate divide or square root, or they could not be bitwise
    their NumPy twins; the 16-bit roundings are integer steps on the bits (no cvt, whose
    NaNs are the hardware's, not the twins')."""
    import json
    import os
    import subprocess
    import sys

    from tests.mpi_pool import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "gpu_ptx_check.py")],
        cwd=REPO,
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # a broken compiler fails, never skips
    ops = json.loads(done.stdout.strip().splitlines()[-1])
    unavailable = ops.pop("unavailable", {})  # only a missing NVVM or driver lands here
    if not ops:
        pytest.skip(f"cannot compile for a GPU here: {str(unavailable)[:200]}")
    for name in {"adamw", "unscale_and_clip"} & set(ops):
        floats = [op for op in ops[name] if op.endswith(".f32")]
        assert not [op for op in floats if op.startswith("fma")], (name, floats)
        assert all(".rn." in op for op in floats), (name, floats)
        assert not [op for op in ops[name] if op.startswith(("rcp", "rsqrt"))], (name, ops[name])
    if "adamw" in ops:
        assert {"sqrt.rn.f32", "div.rn.f32", "mul.rn.f32"} <= set(ops["adamw"])
    for name in {"round_fp16", "round_bf16"} & set(ops):  # these ask for the driver
        assert not [op for op in ops[name] if op.endswith((".f16", ".f32"))], (name, ops[name])
    if "embedding_backward" in ops:  # in-order adds, no atomics: deterministic
        embedding = [op for op in ops["embedding_backward"] if op.endswith(".f32")]
        assert embedding == ["add.rn.f32"], embedding
