"""The per-block quantization error that qwZ's and qgZ's error scripts both report.

ZeRO++ (Sec. 3.1-3.3) quantizes in blocks, each scaled by its own absolute maximum,
so the error of a block is best read relative to that maximum: half a quantization
step, 0.5 / 127 in int8 (0.5 / 7 in int4), bounds max |x - x'| / amax.
scripts/bench/quantize_error.py (qwZ: a unit's parameters in blocks of the unit) and
scripts/bench/qgz_error.py (qgZ: a bucket's destination rows in gradient blocks) each
cut their own blocks and quantize them their own way; this is what they then share.
"""

from __future__ import annotations

import numpy as np


def relative_errors(x: np.ndarray, back: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x (B, n), one block each, and its dequantized copy back (B, n): max
    |x - x'| / amax and the root-mean-square |x - x'| / amax, for the rows holding a
    nonzero value (an all-zero block has no error to scale)."""
    x = x.astype(np.float64)
    diff = np.abs(x - back)
    amax = np.abs(x).max(axis=1)
    keep = amax > 0
    rms = np.sqrt((diff**2).mean(axis=1))
    return diff.max(axis=1)[keep] / amax[keep], rms[keep] / amax[keep]
