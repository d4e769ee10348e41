"""Transformer layer math for the GPT units: forward and hand-written backward.

Layer norm, GPT-2's GELU, the two-layer MLP and causal multi-head
self-attention, as pure functions of arrays in the style of `layers.py`: a
backward writes parameter gradients into the views it is given (overwriting
them) and returns the gradient of its input. Every function keeps the dtype it
is given. Shape letters: B batch, T time, C channels, nh heads, hs head size
(C = nh * hs).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from zero_ref.models.layers import linear_backward, linear_forward, tanh_backward

LN_EPS = 1e-5
_GELU_C = math.sqrt(2.0 / math.pi)  # GPT-2's tanh approximation of x * Phi(x)
_GELU_K = 0.044715


# --- layer norm -------------------------------------------------------------


class LayerNormCache(NamedTuple):
    xhat: np.ndarray  # (..., C) normalized input, before gain and bias
    rstd: np.ndarray  # (..., 1) 1 / sqrt(var + eps)


def layernorm_forward(
    x: np.ndarray, gain: np.ndarray, bias: np.ndarray, eps: float = LN_EPS
) -> tuple[np.ndarray, LayerNormCache]:
    """y = (x - mean) / sqrt(var + eps) * gain + bias, over the last axis of x."""
    centered = x - x.mean(axis=-1, keepdims=True)  # (..., C)
    var = (centered * centered).mean(axis=-1, keepdims=True)  # (..., 1) biased, as GPT-2
    rstd = 1 / np.sqrt(var + eps)
    xhat = centered * rstd
    return xhat * gain + bias, LayerNormCache(xhat, rstd)


def layernorm_backward(
    cache: LayerNormCache,
    gain: np.ndarray,
    dy: np.ndarray,
    dgain: np.ndarray,
    dbias: np.ndarray,
) -> np.ndarray:
    """Write dL/dgain and dL/dbias into the given views; return dL/dx."""
    xhat, rstd = cache
    lead = tuple(range(dy.ndim - 1))  # every axis but C: gain and bias are shared
    np.sum(dy * xhat, axis=lead, out=dgain)
    np.sum(dy, axis=lead, out=dbias)
    dxhat = dy * gain  # (..., C)
    # Normalizing removes the mean and fixes the variance, so the gradient loses
    # its component along the constant direction and along xhat.
    mean_dxhat = dxhat.mean(axis=-1, keepdims=True)
    mean_dxhat_xhat = (dxhat * xhat).mean(axis=-1, keepdims=True)
    return (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd


# --- GELU and MLP -----------------------------------------------------------


def gelu_forward(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1 + np.tanh(_GELU_C * (x + _GELU_K * x**3)))


def gelu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx from the GELU input x (the tanh is recomputed, not cached)."""
    t = np.tanh(_GELU_C * (x + _GELU_K * x**3))
    d_inner = tanh_backward(t, 0.5 * x * dy)  # through the tanh, into its argument
    return dy * 0.5 * (1 + t) + d_inner * _GELU_C * (1 + 3 * _GELU_K * x * x)


class MLPCache(NamedTuple):
    x: np.ndarray  # (B, T, C) input, for the fc weight gradient
    pre: np.ndarray  # (B, T, 4C) fc output before GELU


def mlp_forward(
    x: np.ndarray, fc_w: np.ndarray, fc_b: np.ndarray, proj_w: np.ndarray, proj_b: np.ndarray
) -> tuple[np.ndarray, MLPCache]:
    """proj(gelu(fc(x))): (B, T, C) -> (B, T, 4C) -> (B, T, C)."""
    pre = linear_forward(x, fc_w, fc_b)  # (B, T, 4C)
    return linear_forward(gelu_forward(pre), proj_w, proj_b), MLPCache(x, pre)


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
    act = gelu_forward(cache.pre)  # recomputed: caching it would double the 4C-wide memory
    dact = linear_backward(act, proj_w, dy, dproj_w, dproj_b)  # (B, T, 4C)
    dpre = gelu_backward(cache.pre, dact)
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
    """(B, T, C) -> (B, nh, T, hs), a view where possible."""
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, nh, T, hs) -> (B, T, C), the inverse of split_heads."""
    B, nh, T, hs = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)


def causal_mask(T: int) -> np.ndarray:
    """(T, T) bool, True where key position j lies in the future of query i (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


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
    T = x.shape[1]
    qkv = linear_forward(x, qkv_w, qkv_b)  # (B, T, 3C)
    q, k, v = (split_heads(part, n_head) for part in np.split(qkv, 3, axis=-1))
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B, nh, T, T)
    scores[..., causal_mask(T)] = -np.inf  # a position may not look at later ones
    att = _softmax_inplace(scores)
    y = merge_heads(att @ v)  # (B, T, C)
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
    dy = linear_backward(y, proj_w, dout, dproj_w, dproj_b)  # (B, T, C)
    dyh = split_heads(dy, n_head=q.shape[1])  # (B, nh, T, hs)
    datt = dyh @ v.swapaxes(-1, -2)  # (B, nh, T, T)
    dv = att.swapaxes(-1, -2) @ dyh  # (B, nh, T, hs)
    # Softmax backward. Masked entries have att == 0, so they get no gradient.
    dscores = att * (datt - (datt * att).sum(axis=-1, keepdims=True))
    dscores *= 1 / math.sqrt(q.shape[-1])
    dq = dscores @ k  # (B, nh, T, hs)
    dk = dscores.swapaxes(-1, -2) @ q  # (B, nh, T, hs)
    dqkv = np.concatenate([merge_heads(d) for d in (dq, dk, dv)], axis=-1)  # (B, T, 3C)
    return linear_backward(x, qkv_w, dqkv, dqkv_w, dqkv_b)


def _softmax_inplace(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, reusing the scores' memory for the probabilities."""
    scores -= scores.max(axis=-1, keepdims=True)  # the diagonal is never masked: finite
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores
