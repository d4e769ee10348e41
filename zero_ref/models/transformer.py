"""Transformer layer math for the GPT units: forward and hand-written backward.

The two-layer MLP with GPT-2's GELU and causal multi-head self-attention, as
pure functions of arrays in the style of `layers.py` (which holds the linear,
GELU and layer-norm pieces): a backward writes parameter gradients into the
views it is given (overwriting them) and returns the gradient of its input.
Every function keeps the dtype it is given. Shape letters: B batch, T time,
C channels, nh heads, hs head size (C = nh * hs).

Speed notes (one rank's forward + backward should be GEMM-bound): every matmul
is one 2-D GEMM or one batched matmul over (B, nh); heads are read and written
as strided views of the fused (B, T, 3C) and (B, T, C) arrays, never copied;
the causal softmax and its backward are Numba kernels (NumPy twins beside them)
that touch only the T (T + 1) / 2 scores a query may see.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from zero_ref.models.layers import (
    gelu_backward,
    gelu_forward,
    linear_backward,
    linear_forward,
    matmul_into,
)
from zero_ref.numerics.array_module import array_module, on_host

# --- MLP --------------------------------------------------------------------


class MLPCache(NamedTuple):
    x: np.ndarray  # (B, T, C) input, for the fc weight gradient
    pre: np.ndarray  # (B, T, 4C) fc output before GELU
    gate: np.ndarray  # (B, T, 4C) GELU's gate: act = pre * gate, and its derivative uses it


def mlp_forward(
    x: np.ndarray, fc_w: np.ndarray, fc_b: np.ndarray, proj_w: np.ndarray, proj_b: np.ndarray
) -> tuple[np.ndarray, MLPCache]:
    """proj(gelu(fc(x))): (B, T, C) -> (B, T, 4C) -> (B, T, C)."""
    pre = linear_forward(x, fc_w, fc_b)  # (B, T, 4C)
    act, gate = gelu_forward(pre)
    return linear_forward(act, proj_w, proj_b), MLPCache(x, pre, gate)


def mlp_backward(
    cache: MLPCache,
    fc_w: np.ndarray,
    proj_w: np.ndarray,
    dy: np.ndarray,
    dfc_w: np.ndarray,
    dfc_b: np.ndarray,
    dproj_w: np.ndarray,
    dproj_b: np.ndarray,
) -> np.ndarray:
    """Write the four MLP gradients into the given views; return dL/dx."""
    act = cache.pre * cache.gate  # one multiply: cheaper than a third cached 4C-wide array
    dact = linear_backward(act, proj_w, dy, dproj_w, dproj_b)  # (B, T, 4C)
    dpre = gelu_backward(cache.pre, cache.gate, dact)
    return linear_backward(cache.x, fc_w, dpre, dfc_w, dfc_b)


# --- causal self-attention --------------------------------------------------


class AttentionCache(NamedTuple):
    x: np.ndarray  # (B, T, C) input, for the qkv weight gradient
    q: np.ndarray  # (B, nh, T, hs) views into the fused qkv activations
    k: np.ndarray  # (B, nh, T, hs)
    v: np.ndarray  # (B, nh, T, hs)
    att: np.ndarray  # (B, nh, T, T) softmax probabilities, zero above the diagonal
    y: np.ndarray  # (B, T, C) heads merged, input to the output projection


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    """(B, T, C) -> (B, nh, T, hs), a view: head h is columns h*hs .. (h+1)*hs."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def split_qkv(qkv: np.ndarray, n_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, T, 3C) -> q, k, v, each (B, nh, T, hs): views, so writing into them fills qkv.

    Columns [0, C) are the queries, [C, 2C) the keys, [2C, 3C) the values, each
    split into heads as split_heads does.
    """
    B, T, C3 = qkv.shape
    parts = qkv.reshape(B, T, 3, n_head, C3 // (3 * n_head)).transpose(2, 0, 3, 1, 4)
    return parts[0], parts[1], parts[2]


def attention_forward(
    x: np.ndarray,
    qkv_w: np.ndarray,
    qkv_b: np.ndarray,
    proj_w: np.ndarray,
    proj_b: np.ndarray,
    n_head: int,
) -> tuple[np.ndarray, AttentionCache]:
    """Causal multi-head self-attention: (B, T, C) -> (B, T, C).

    qkv_w (C, 3C) and qkv_b (3C,) make queries, keys and values in one matmul;
    proj_w (C, C) and proj_b (C,) mix the heads back together.
    """
    qkv = linear_forward(x, qkv_w, qkv_b)  # (B, T, 3C)
    q, k, v = split_qkv(qkv, n_head)
    scores = q @ k.swapaxes(-1, -2)  # (B, nh, T, T)
    att = causal_softmax(scores, 1 / math.sqrt(q.shape[-1]))  # in place
    y = array_module(x).empty_like(x)  # (B, T, C): each head's output in its own columns
    matmul_into(att, v, split_heads(y, n_head))
    out = linear_forward(y, proj_w, proj_b)
    return out, AttentionCache(x, q, k, v, att, y)


def attention_backward(
    cache: AttentionCache,
    qkv_w: np.ndarray,
    proj_w: np.ndarray,
    dout: np.ndarray,
    dqkv_w: np.ndarray,
    dqkv_b: np.ndarray,
    dproj_w: np.ndarray,
    dproj_b: np.ndarray,
) -> np.ndarray:
    """Write the four attention gradients into the given views; return dL/dx."""
    x, q, k, v, att, y = cache
    n_head = q.shape[1]
    dy = linear_backward(y, proj_w, dout, dproj_w, dproj_b)  # (B, T, C)
    dyh = split_heads(dy, n_head)  # (B, nh, T, hs)
    xp = array_module(dy)
    dqkv = xp.empty((*x.shape[:2], 3 * x.shape[2]), dy.dtype)  # (B, T, 3C), filled by head
    dq, dk, dv = split_qkv(dqkv, n_head)
    matmul_into(att.swapaxes(-1, -2), dyh, dv)
    datt = dyh @ v.swapaxes(-1, -2)  # (B, nh, T, T)
    dscores = causal_softmax_backward(att, datt, 1 / math.sqrt(q.shape[-1]))  # in place
    matmul_into(dscores, k, dq)
    matmul_into(dscores.swapaxes(-1, -2), q, dk)
    return linear_backward(x, qkv_w, dqkv, dqkv_w, dqkv_b)


# --- the causal softmax: Numba kernels and their NumPy twins ----------------


def causal_softmax(scores: np.ndarray, scale: float) -> np.ndarray:
    """softmax(scale * scores) over the last axis, keys after the query masked out.

    scores (..., T, T), C-contiguous, is overwritten with the probabilities
    (exactly 0 above the diagonal) and returned.
    """
    assert scores.flags.c_contiguous, "causal_softmax works in place: scores must be contiguous"
    if not on_host(array_module(scores)):  # device arrays: the twin, in their module
        return causal_softmax_reference(scores, scale)
    T = scores.shape[-1]
    _causal_softmax_kernel(scores.reshape(-1, T, T), scores.dtype.type(scale))
    return scores


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _causal_softmax_kernel(scores, scale):  # pragma: no cover
    zero, one = scores.dtype.type(0.0), scores.dtype.type(1.0)
    R, T, _ = scores.shape  # R = B * nh score matrices
    for r in range(R):
        for i in range(T):  # query i sees keys 0 .. i
            top = scores[r, i, 0]
            for j in range(1, i + 1):
                top = max(top, scores[r, i, j])
            total = zero
            for j in range(i + 1):  # the exponents are <= 0: exp cannot overflow
                scores[r, i, j] = math.exp((scores[r, i, j] - top) * scale)
                total += scores[r, i, j]
            inv_total = one / total
            for j in range(i + 1):
                scores[r, i, j] *= inv_total
            for j in range(i + 1, T):
                scores[r, i, j] = zero


def causal_softmax_backward(att: np.ndarray, datt: np.ndarray, scale: float) -> np.ndarray:
    """dL/dscores from the probabilities att and dL/datt (..., T, T); datt is overwritten.

    The softmax Jacobian gives att * (datt - sum_j datt * att) per row, times
    the scale the scores were multiplied by. Masked entries have att == 0.
    """
    assert datt.flags.c_contiguous, (
        "causal_softmax_backward works in place: datt must be contiguous"
    )
    if not on_host(array_module(att)):
        return causal_softmax_backward_reference(att, datt, scale)
    T = att.shape[-1]
    _causal_softmax_backward_kernel(
        att.reshape(-1, T, T), datt.reshape(-1, T, T), att.dtype.type(scale)
    )
    return datt


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _causal_softmax_backward_kernel(att, datt, scale):  # pragma: no cover
    R, T, _ = att.shape
    for r in range(R):
        for i in range(T):
            dot = att.dtype.type(0.0)
            for j in range(i + 1):
                dot += datt[r, i, j] * att[r, i, j]
            for j in range(i + 1):
                datt[r, i, j] = att[r, i, j] * (datt[r, i, j] - dot) * scale
            for j in range(i + 1, T):
                datt[r, i, j] = 0


def causal_softmax_reference(scores: np.ndarray, scale: float) -> np.ndarray:
    """The twin of causal_softmax: mask with -inf, then a softmax in NumPy operations."""
    xp, T = array_module(scores), scores.shape[-1]
    scores *= scale
    scores += xp.triu(xp.full((T, T), -np.inf, scores.dtype), k=1)  # exp(-inf) = 0: masked
    scores -= scores.max(axis=-1, keepdims=True)  # the diagonal is never masked: finite
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def causal_softmax_backward_reference(
    att: np.ndarray, datt: np.ndarray, scale: float
) -> np.ndarray:
    """The twin of causal_softmax_backward, in NumPy operations."""
    datt -= (datt * att).sum(axis=-1, keepdims=True)
    datt *= att
    datt *= scale
    return datt
