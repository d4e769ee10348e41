"""Moving named tensors in and out of the padded full buffer, with the checks a
user's --init file needs (names, shapes, dtypes)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zero_ref.flat import FlatLayout, tensor_views


def check_named_tensors(named: Mapping[str, np.ndarray], layout: FlatLayout) -> None:
    """Raise ValueError listing every missing, extra or wrongly shaped tensor."""
    expected = {f"{u.name}.{s.name}": s.shape for u in layout.units for s in u.slots}
    missing = sorted(set(expected) - set(named))
    extra = sorted(set(named) - set(expected))
    wrong = [
        f"{k}: shape {tuple(np.shape(named[k]))}, expected {expected[k]}"
        for k in expected
        if k in named and tuple(np.shape(named[k])) != expected[k]
    ]
    not_float = [k for k in expected if k in named and not _is_real_float(named[k])]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected tensors: {', '.join(extra)}")
    if wrong:
        problems.append("wrong shapes: " + "; ".join(wrong))
    if not_float:
        problems.append(f"not floating point: {', '.join(not_float)}")
    if problems:
        raise ValueError("initial parameters do not match the model: " + " | ".join(problems))


def _is_real_float(a: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def pack_full(named: Mapping[str, np.ndarray], layout: FlatLayout) -> np.ndarray:
    """A new padded full float32 buffer holding `named` (padding is zero)."""
    check_named_tensors(named, layout)
    full = np.zeros(layout.full_numel, np.float32)
    for unit in layout.units:
        views = tensor_views(full[unit.full_slice()], unit)
        for name, view in views.items():
            view[...] = named[f"{unit.name}.{name}"]
    return full


def unpack_full(full: np.ndarray, layout: FlatLayout) -> dict[str, np.ndarray]:
    """Copies of every named tensor in a padded full buffer."""
    out = {}
    for unit in layout.units:
        for name, view in tensor_views(full[unit.full_slice()], unit).items():
            out[f"{unit.name}.{name}"] = view.copy()
    return out
