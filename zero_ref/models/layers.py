"""Layer math as pure functions: forward and hand-written backward in NumPy.

Every function works in the dtype it is given (float32 in training, float64
in the finite-difference checks). Shape comments: B batch, T time, C channels.
"""

from __future__ import annotations

import numpy as np


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """y = x @ w + b, with x (..., C_in), w (C_in, C_out), b (C_out,)."""
    y = x @ w
    if b is not None:
        y += b
    return y


def linear_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, dw: np.ndarray, db: np.ndarray | None
) -> np.ndarray:
    """Write dL/dw and dL/db into the given views; return dL/dx."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C_in)
    dy2 = dy.reshape(-1, dy.shape[-1])  # (N, C_out)
    np.matmul(x2.T, dy2, out=dw)
    if db is not None:
        np.sum(dy2, axis=0, out=db)
    return dy @ w.T


def embedding_forward(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Look up rows: ids (...) int -> (..., C)."""
    return table[ids]


def embedding_backward(ids: np.ndarray, dout: np.ndarray, dtable: np.ndarray) -> None:
    """Scatter-add dout rows into dtable (overwritten first): repeated ids accumulate."""
    dtable[...] = 0
    np.add.at(dtable, ids.reshape(-1), dout.reshape(-1, dout.shape[-1]))


def tanh_backward(y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """d tanh(x)/dx = 1 - tanh(x)^2, from the saved output y."""
    return dy * (1 - y * y)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over all positions, and d(loss)/d(logits).

    logits (..., V) float, targets (...) int in [0, V).
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    tgt = targets.reshape(-1)  # (N,)
    shifted = flat - flat.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    log_probs = shifted - np.log(sum_exp)
    n = flat.shape[0]
    loss = -float(log_probs[np.arange(n), tgt].mean())
    dlogits = exp / sum_exp
    dlogits[np.arange(n), tgt] -= 1
    dlogits /= n
    return loss, dlogits.reshape(logits.shape)
