"""Summing per-rank contributions in rank order: the one reduction order that
makes a sharded run reproduce the single-rank oracle bit for bit."""

from __future__ import annotations

import numpy as np


def sum_in_rank_order(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = ((rows[0] + rows[1]) + rows[2]) + ...  elementwise, left to right.

    rows is (W, n): row r holds rank r's contribution. NumPy adds two arrays
    elementwise, so each element sees exactly this association."""
    out[...] = rows[0]
    with np.errstate(invalid="ignore"):  # Inf + -Inf (fp16 overflow): NaN, the scaler's signal
        for r in range(1, rows.shape[0]):
            out += rows[r]
    return out
