"""Named tensors on disk: --init reads .npz or .safetensors; --export writes
consolidated parameters as .safetensors (atomically)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from zero_ref.atomic import atomic_write_bytes

FORMATS = (".npz", ".safetensors")


def load_named(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Named arrays from an .npz or .safetensors file, with errors naming the path."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(
            f"{path}: unknown tensor file type {path.suffix!r}; allowed: {', '.join(FORMATS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        return dict(st_load(path.read_bytes()))
    except Exception as e:  # corrupt files raise many different types
        raise ValueError(f"{path}: cannot read tensors ({type(e).__name__}: {e})") from e


def save_safetensors(path: str | os.PathLike[str], named: dict[str, np.ndarray]) -> Path:
    """Write `named` as float32 safetensors, atomically."""
    if Path(path).suffix != ".safetensors":
        raise ValueError(f"{path}: --export writes .safetensors files; use that extension")
    data = st_save({k: np.array(v, np.float32, order="C") for k, v in named.items()})  # keeps 0-d
    return atomic_write_bytes(path, data)
