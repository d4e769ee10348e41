"""AdamW on a CUDA device (numba.cuda): the twin of zero_ref/optim/adamw.py's kernel,
bitwise (tests/test_gpu_kernels.py). ZeRO's update phase (Sec. 5) run where the shard
lives; each operation rounds as NumPy's does (zero_ref/numerics/cuda_math.py).
"""

from __future__ import annotations

from numba import cuda

from zero_ref.numerics.cuda_math import THREADS, add, blocks, div, mul, sqrt, sub
from zero_ref.optim.adamw import AdamWScalars


# ---- AdamW (twin: zero_ref.optim.adamw.adamw_reference, the same steps in order)
@cuda.jit
def _adamw(param, grad, exp_avg, exp_avg_sq, s):  # pragma: no cover - compiled
    decay, w, from_end, one_minus_w, beta2, one_minus_beta2, step_size, bc2_sqrt, eps = s
    i = cuda.grid(1)
    if i < param.shape[0]:
        g = grad[i]
        p = mul(param[i], decay)  # decoupled weight decay
        if from_end:  # m <- lerp(m, g, 1 - beta1), with torch's choice of formula
            m = sub(g, mul(sub(g, exp_avg[i]), one_minus_w))
        else:
            m = add(exp_avg[i], mul(w, sub(g, exp_avg[i])))
        v = add(mul(exp_avg_sq[i], beta2), mul(mul(one_minus_beta2, g), g))
        denom = add(div(sqrt(v), bc2_sqrt), eps)
        param[i] = sub(p, mul(step_size, div(m, denom)))
        exp_avg[i] = m
        exp_avg_sq[i] = v


def adamw(param, grad, exp_avg, exp_avg_sq, s: AdamWScalars) -> None:
    """AdamW in place on four float32 device arrays of one length."""
    n = param.shape[0]
    if n == 0:
        return
    _adamw[blocks(n), THREADS](param, grad, exp_avg, exp_avg_sq, s.kernel_args())
