"""Layer math as pure functions: forward and hand-written backward in NumPy and Numba.

Every function works in the dtype it is given (float32 in training, float64
in the finite-difference checks). Shape comments: B batch, T time, C channels,
N = B * T rows. Where the fast version is not the textbook formula (a
rearranged formula, or a Numba kernel), the textbook NumPy version sits beside
it as a `*_reference` twin with the same signature, and the tests compare them
element by element. Given device arrays (the GPU path, zero_ref/numerics/array_module.py)
a function runs its twin in the arrays' module instead of the Numba kernel: each
such function says so once, `@numba_on_host(twin)`, and its twin sits above it.

The Numba kernels here run on one thread and loop over rows in order, so
their sums do not depend on the thread count. Two settings let LLVM vectorize
their loops: error_model="numpy" (a division by zero gives inf, as in NumPy,
instead of a Python exception checked at every division), and, where a row is
summed, `fastmath` limited to reassociating sums and fusing multiply-adds. The
results are the same on every run on one machine; they differ from the
twins' in the last bits.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from zero_ref.numerics.array_module import array_module, numba_on_host

LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)  # GPT-2's tanh approximation of x * Phi(x)
_GELU_K = 0.044715


# --- linear and embedding ---------------------------------------------------


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y = x @ w + b, with x (..., C_in), w (C_in, C_out), b (C_out,)."""
    # One 2-D GEMM over all rows: a 3-D @ 2-D matmul would call BLAS once per batch.
    y = x.reshape(-1, x.shape[-1]) @ w  # (N, C_out)
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], w.shape[1])


def linear_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, dw: np.ndarray, db: np.ndarray | None
) -> np.ndarray:
    """Write dL/dw and dL/db into the given views; return dL/dx."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C_in)
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C_out)
    matmul_into(x2.T, dy2, dw)
    if db is not None:
        sum_rows_into(dy2, db)  # down the rows (NumPy: a plain vector add loop)
    return (dy2 @ w.T).reshape(x.shape)


def _matmul_assigned(a, b, out) -> None:
    """out[...] = a @ b through a temporary: a device module's matmul may not write into
    a strided view."""
    out[...] = a @ b


@numba_on_host(_matmul_assigned, arg=2)
def matmul_into(a, b, out) -> None:
    """out[...] = a @ b, written straight into `out` (a view) when NumPy can."""
    np.matmul(a, b, out=out)


def sum_rows_into(a, out) -> None:
    """out[...] = the sum of a's rows (axis 0), in a's module."""
    array_module(a).sum(a, axis=0, out=out)


def embedding_forward(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Look up rows: ids (...) int -> (..., C). Host ids are copied to a device table's
    device (a no-op for NumPy)."""
    return table[array_module(table).asarray(ids)]


def _embedding_backward_on_device(ids, dout, dtable) -> None:
    """On a device: the CPU kernel's additions in order (zero_ref/models/layers_cuda.py),
    not the twin's add.at, whose atomics add in any order."""
    from zero_ref.models.layers_cuda import embedding_backward as on_device  # numba.cuda

    xp = array_module(dtable)
    rows = xp.ascontiguousarray(dout).reshape(-1, dout.shape[-1])
    on_device(xp.asarray(ids).reshape(-1), rows, dtable)


@numba_on_host(_embedding_backward_on_device, arg=2)
def embedding_backward(ids: np.ndarray, dout: np.ndarray, dtable: np.ndarray) -> None:
    """Scatter-add dout rows into dtable (overwritten first): repeated ids accumulate.

    A Numba loop over the rows in order: the same additions in the same order as
    `np.add.at` (the reference), so bitwise the same, without its per-row overhead.
    The kernel does no bounds checks: the forward lookup has already indexed
    the table with these ids.
    """
    rows = np.ascontiguousarray(dout).reshape(-1, dout.shape[-1])  # (N, C)
    _embedding_backward_kernel(ids.reshape(-1), rows, dtable)
    return None


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _embedding_backward_kernel(ids, rows, dtable):  # pragma: no cover
    dtable[:] = 0
    for i in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            dtable[ids[i], c] += rows[i, c]


def embedding_backward_reference(ids: np.ndarray, dout: np.ndarray, dtable: np.ndarray) -> None:
    """The twin of embedding_backward: one unbuffered scatter-add (slow: a Python-level loop)."""
    xp = array_module(dtable)
    dtable[...] = 0
    xp.add.at(dtable, xp.asarray(ids).reshape(-1), dout.reshape(-1, dout.shape[-1]))


# --- activations ------------------------------------------------------------


def tanh_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d tanh(x)/dx = 1 - tanh(x)^2, from the saved output y."""
    return dy * (1 - y * y)


def gelu_forward_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The twin of gelu_forward: GPT-2's formula, with the gate s = 0.5 (1 + tanh(u))."""
    t = array_module(x).tanh(_GELU_C * (x + _GELU_K * x**3))
    return 0.5 * x * (1 + t), 0.5 * (1 + t)


def gelu_backward_reference(x: np.ndarray, s: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The twin of gelu_backward: differentiate the tanh form, with tanh(u) = 2s - 1."""
    t = 2 * s - 1
    d_inner = tanh_backward(t, 0.5 * x * dy)  # through the tanh, into its argument
    return dy * 0.5 * (1 + t) + d_inner * _GELU_C * (1 + 3 * _GELU_K * x * x)


@numba_on_host(gelu_forward_reference)
def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).

    Computed as y = x * s with the gate s = 0.5 (1 + tanh(u)) = sigmoid(2u) =
    1 / (1 + exp(-2u)), equal exactly and without tanh's cancellation near s = 0.
    Returns (y, s); backward needs s. Two Numba passes around one NumPy exp:
    NumPy's exp is vectorized, twice as fast as a Numba loop's call to libm.
    """
    x1 = np.ascontiguousarray(x).reshape(-1)
    s, y = np.empty_like(x1), np.empty_like(x1)
    _gelu_exponent_kernel(x1, s)  # s = -2u
    with np.errstate(over="ignore"):  # exp(-2u) = inf for x below about -10: s becomes 0
        np.exp(s, out=s)
    _gelu_gate_kernel(x1, s, y)  # s = 1 / (1 + s), y = x * s
    return y.reshape(x.shape), s.reshape(x.shape)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gelu_exponent_kernel(x, out):  # pragma: no cover
    minus_2c, k = x.dtype.type(-2 * _GELU_C), x.dtype.type(_GELU_K)
    for i in range(x.size):
        out[i] = minus_2c * (x[i] + k * x[i] * x[i] * x[i])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gelu_gate_kernel(x, s, y):  # pragma: no cover
    one = x.dtype.type(1.0)
    for i in range(x.size):
        s[i] = one / (one + s[i])
        y[i] = x[i] * s[i]


@numba_on_host(gelu_backward_reference)
def gelu_backward(x: np.ndarray, s: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx from the GELU input x and its gate s (from gelu_forward).

    d(x s)/dx = s + x ds/dx, with ds/dx = 2 s (1 - s) du/dx (the sigmoid's
    derivative) and du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
    """
    dx = np.empty(x.size, dy.dtype)
    _gelu_backward_kernel(
        np.ascontiguousarray(x).reshape(-1),
        np.ascontiguousarray(s).reshape(-1),
        np.ascontiguousarray(dy).reshape(-1),
        dx,
    )
    return dx.reshape(x.shape)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _gelu_backward_kernel(x, s, dy, dx):  # pragma: no cover
    one, two_c = x.dtype.type(1.0), x.dtype.type(2 * _GELU_C)
    k3 = x.dtype.type(3 * _GELU_K)
    for i in range(x.size):
        ds_dx = two_c * (one + k3 * x[i] * x[i]) * s[i] * (one - s[i])
        dx[i] = dy[i] * (s[i] + x[i] * ds_dx)


# --- layer norm -------------------------------------------------------------


class LayerNormCache(NamedTuple):
    xhat: np.ndarray  # (N, C) normalized input, before gain and bias
    rstd: np.ndarray  # (N,) 1 / sqrt(var + eps)


def layernorm_forward_reference(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float = LN_EPS
) -> tuple[np.ndarray, LayerNormCache]:
    """The twin of layernorm_forward, in NumPy array operations."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    centered = x2 - x2.mean(axis=-1, keepdims=True)
    var = (centered * centered).mean(axis=-1)  # (N,) biased, as GPT-2
    rstd = 1 / array_module(x).sqrt(var + eps)
    xhat = centered * rstd[:, None]
    return (xhat * gain + bias).reshape(x.shape), LayerNormCache(xhat, rstd)


def layernorm_backward_reference(
    cache: LayerNormCache,
    gain: np.ndarray,
    dy: np.ndarray,
    dgain: np.ndarray,
    dbias: np.ndarray,
) -> np.ndarray:
    """The twin of layernorm_backward, in NumPy array operations."""
    xhat, rstd = cache
    dy2 = dy.reshape(xhat.shape)  # (N, C): every row shares gain and bias
    sum_rows_into(dy2 * xhat, dgain)
    sum_rows_into(dy2, dbias)
    dxhat = dy2 * gain
    # Normalizing removes the mean and fixes the variance, so the gradient loses
    # its component along the constant direction and along xhat.
    mean_dxhat = dxhat.mean(axis=-1, keepdims=True)
    mean_dxhat_xhat = (dxhat * xhat).mean(axis=-1, keepdims=True)
    return ((dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd[:, None]).reshape(dy.shape)


@numba_on_host(layernorm_forward_reference)
def layernorm_forward(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float = LN_EPS
) -> tuple[np.ndarray, LayerNormCache]:
    """y = (x - mean) / sqrt(var + eps) * gain + bias, over the last axis of x.

    A Numba kernel, one pass per row. The NumPy twin makes eight passes, and its
    reductions along a short last axis (C = 64) pay more per row in overhead
    than in arithmetic.
    """
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])  # (N, C)
    y, xhat = np.empty_like(x2), np.empty_like(x2)
    rstd = np.empty(x2.shape[0], x2.dtype)
    _layernorm_forward_kernel(x2, gain, bias, x2.dtype.type(eps), y, xhat, rstd)
    return y.reshape(x.shape), LayerNormCache(xhat, rstd)


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _layernorm_forward_kernel(x, gain, bias, eps, y, xhat, rstd):  # pragma: no cover
    N, C = x.shape
    inv_c = x.dtype.type(1.0) / C
    for i in range(N):
        mean = x[i].sum() * inv_c
        var = x.dtype.type(0.0)  # biased, as GPT-2
        for c in range(C):
            xhat[i, c] = x[i, c] - mean
            var += xhat[i, c] * xhat[i, c]
        rstd[i] = x.dtype.type(1.0) / np.sqrt(var * inv_c + eps)
        for c in range(C):
            xhat[i, c] *= rstd[i]
            y[i, c] = xhat[i, c] * gain[c] + bias[c]


@numba_on_host(layernorm_backward_reference, arg=2)
def layernorm_backward(
    cache: LayerNormCache,
    gain: np.ndarray,
    dy: np.ndarray,
    dgain: np.ndarray,
    dbias: np.ndarray,
) -> np.ndarray:
    """Write dL/dgain and dL/dbias into the given views; return dL/dx."""
    dy2 = np.ascontiguousarray(dy).reshape(cache.xhat.shape)  # (N, C)
    dx = np.empty_like(dy2)
    _layernorm_backward_kernel(cache.xhat, cache.rstd, gain, dy2, dx, dgain, dbias)
    return dx.reshape(dy.shape)


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _layernorm_backward_kernel(xhat, rstd, gain, dy, dx, dgain, dbias):  # pragma: no cover
    N, C = dy.shape
    inv_c = dy.dtype.type(1.0) / C
    dgain[:] = 0
    dbias[:] = 0
    for i in range(N):  # rows in order: gain and bias sum the same way at any thread count
        mean_dxhat = dy.dtype.type(0.0)
        mean_dxhat_xhat = dy.dtype.type(0.0)
        for c in range(C):
            dxhat = dy[i, c] * gain[c]
            mean_dxhat += dxhat
            mean_dxhat_xhat += dxhat * xhat[i, c]
            dgain[c] += dy[i, c] * xhat[i, c]
            dbias[c] += dy[i, c]
        mean_dxhat *= inv_c
        mean_dxhat_xhat *= inv_c
        for c in range(C):
            dx[i, c] = (dy[i, c] * gain[c] - mean_dxhat - xhat[i, c] * mean_dxhat_xhat) * rstd[i]


# --- loss -------------------------------------------------------------------


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over all positions, and d(loss)/d(logits).

    logits (..., V) float, targets (...) int in [0, V).
    """
    xp = array_module(logits)
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    tgt = xp.asarray(targets).reshape(-1)  # (N,) on the logits' device
    n = flat.shape[0]
    rows = xp.arange(n)
    exp = flat - flat.max(axis=1, keepdims=True)  # shifted: the largest logit is 0
    target_shifted = exp[rows, tgt]  # (N,) read before exp overwrites the shifted logits
    xp.exp(exp, out=exp)
    sum_exp = exp.sum(axis=1, keepdims=True)  # (N, 1)
    loss = -float((target_shifted - xp.log(sum_exp[:, 0])).mean())
    dlogits = exp
    dlogits /= sum_exp  # softmax probabilities
    dlogits[rows, tgt] -= 1
    dlogits /= n
    return loss, dlogits.reshape(logits.shape)
