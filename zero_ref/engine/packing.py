"""Named tensors out of a padded full buffer (filling it is zero_ref/engine/init_source.py's)."""

from __future__ import annotations

import numpy as np

from zero_ref.layout.flat import FlatLayout, tensor_views


def unpack_full(full: np.ndarray, layout: FlatLayout) -> dict[str, np.ndarray]:
    """Copies of every named tensor in a padded full buffer."""
    out = {}
    for unit in layout.units:
        for name, view in tensor_views(full[unit.full_slice()], unit).items():
            out[f"{unit.name}.{name}"] = view.copy()
    return out
