"""The three float formats zero_ref computes and stores in, and rounding between them.

Every rounding is to nearest, ties to even, the IEEE default that GPUs use too,
done on the bits by zero_ref/numerics/rounding.py's Numba kernels (NumPy twins beside
them), so the engine and the single-rank oracle round alike; NaNs become torch's
canonical quiet NaNs. The communication layer, the engine and the oracle all
use it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from zero_ref.numerics import rounding


class _Formats(Mapping):
    """ "fp32", "fp16", "bf16" -> their NumPy dtypes. bfloat16 is ml_dtypes', imported on
    the first use of "bf16": its import costs about 0.7 s of CPU, in every rank of every
    run, and only bf16 runs need it (measured: `python -X importtime -c 'import
    zero_ref.train'`, ml_dtypes 0.70 s of 1.41 s)."""

    def __init__(self) -> None:
        self._made = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16)}

    def __getitem__(self, name: str) -> np.dtype:
        if name == "bf16" and name not in self._made:
            _register_bf16()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(("fp32", "fp16", "bf16"))

    def __len__(self) -> int:
        return 3


DTYPES = _Formats()


def dtype_of(name: str) -> np.dtype:
    """The NumPy dtype of a precision name ("fp32", "fp16", "bf16")."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"precision {name!r} is not one of {', '.join(DTYPES)}") from None


_ROUND = {  # dst dtype -> (Numba kernel, NumPy twin), float32 bits to 16-bit bits
    DTYPES["fp16"]: (rounding.round_fp16_kernel, rounding.round_fp16_reference),
}  # bf16's pair is added by _register_bf16, with its dtype
_WIDEN = {  # src dtype -> (Numba kernel, NumPy twin), 16-bit bits to float32 bits
    DTYPES["fp16"]: (rounding.widen_fp16_kernel, rounding.widen_fp16_reference),
}
_BITS = {4: np.uint32, 2: np.uint16}


def _register_bf16() -> None:
    """Import ml_dtypes and enter bfloat16 in DTYPES and the rounding tables (once)."""
    import ml_dtypes  # here, not at the top: see _Formats

    bf16 = np.dtype(ml_dtypes.bfloat16)
    DTYPES._made["bf16"] = bf16
    _ROUND[bf16] = (rounding.round_bf16_kernel, rounding.round_bf16_reference)
    _WIDEN[bf16] = (rounding.widen_bf16_kernel, rounding.widen_bf16_reference)
    _NAMES[bf16] = bf16.name


def _bf16_made_elsewhere() -> bool:
    """True once, when bfloat16 arrays exist (ml_dtypes imported by the caller) but the
    tables do not hold bf16 yet: the caller registers it and looks again."""
    if "bf16" in DTYPES._made or "ml_dtypes" not in sys.modules:
        return False
    _register_bf16()
    return True


# dtypes, not scalar types: `a.dtype == np.float32` converts the type on every call
# (~100 ns; the 16-bit path asks several times for each of ~800 buckets a step)
_F32, _FP16 = DTYPES["fp32"], DTYPES["fp16"]


def _on_bits(kernels: tuple, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Run a (kernel, twin) pair on the bits of src and dst: the Numba kernel on their
    (rows, cols) views, the NumPy twin where a layout has none."""
    if src.shape != dst.shape:
        src = np.broadcast_to(src, dst.shape)
    src_bits, dst_bits = src.view(_BITS[src.itemsize]), dst.view(_BITS[dst.itemsize])
    kernel, twin = kernels
    s, d = rounding.as_rows(src_bits), rounding.as_rows(dst_bits)
    if s is None or d is None:
        twin(src_bits, dst_bits)
    else:
        kernel(s, d)
    return dst


def round_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """dst[...] = src rounded to dst's dtype: to nearest, ties to even, a float16
    overflow to Inf (the loss scaler's signal), a NaN to the canonical quiet NaN
    (zero_ref/numerics/rounding.py's rule, torch's). 16-bit to the other 16-bit goes through
    float32 (exact); the same dtype is a copy."""
    kernels = _ROUND.get(dst.dtype)
    if kernels is not None and src.dtype == _F32:  # the common case first
        _on_bits(kernels, dst, src)
    elif dst.dtype == src.dtype:
        dst[...] = src
    elif dst.dtype == _F32:
        widen_into(dst, src)
    elif kernels is not None and src.dtype in _WIDEN:
        _on_bits(kernels, dst, widen_into(np.empty(src.shape, np.float32), src))
    elif _bf16_made_elsewhere():
        return round_into(dst, src)
    else:  # other dtypes (float64, say): NumPy's cast
        with np.errstate(over="ignore", invalid="ignore"):
            dst[...] = src
    return dst


def widen_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """float32 dst[...] = src (16-bit values widen exactly)."""
    kernels = _WIDEN.get(src.dtype)
    if kernels is not None and dst.dtype == _F32:
        return _on_bits(kernels, dst, src)
    if kernels is None and src.dtype.itemsize == 2 and _bf16_made_elsewhere():
        return widen_into(dst, src)
    dst[...] = src
    return dst


def rounded(src: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """src's values after one rounding to `dtype`, widened back to float32 (a new array)."""
    if dtype == _F32:
        return np.array(src, np.float32)
    once = round_into(np.empty(src.shape, dtype), src)
    return widen_into(np.empty(src.shape, np.float32), once)


def accumulate_rounded(dst: np.ndarray, src: np.ndarray) -> None:
    """dst = dst + src, added in float32 and rounded once to dst's dtype (16-bit
    gradient accumulation); for float32 arrays simply dst += src."""
    if dst.dtype == _F32 and src.dtype == _F32:
        dst += src
        return
    total = widen_into(np.empty(dst.shape, np.float32), dst)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf + -Inf: the scaler's NaN
        total += widen_into(np.empty(src.shape, np.float32), src)
    round_into(dst, total)


def sum_widened_rows(words: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float32 out (n,) <- the sum in row order of the (W, n) 16-bit rows, each widened
    exactly, added in float32 (zero_ref/comm/reduction.py's 16-bit sums over ranks)."""
    kernel = rounding.sum_widened_rows_kernel
    if not (words.flags.c_contiguous and out.flags.c_contiguous):
        kernel = rounding.sum_widened_rows_reference
    kernel(words.view(np.uint16), out, words.dtype == _FP16)
    return out


def sum_widened_rows_rounded(words: np.ndarray, out: np.ndarray) -> np.ndarray:
    """16-bit out (n,) of the words' dtype <- sum_widened_rows of the (W, n) rows,
    rounded once: one kernel, no float32 temporary (a 16-bit block of a sum over ranks)."""
    kernel = rounding.sum_widened_rows_rounded_kernel
    if not (words.flags.c_contiguous and out.flags.c_contiguous):
        kernel = rounding.sum_widened_rows_rounded_reference
    kernel(words.view(np.uint16), out.view(np.uint16), words.dtype == _FP16)
    return out


_NAMES = {  # bf16's entry is added by _register_bf16
    d: d.name for d in (DTYPES["fp32"], DTYPES["fp16"], np.dtype(np.uint16), np.dtype(np.uint32))
}


class HostArrays:
    """Temporaries and the roundings on arrays in RAM: what the engine's placement and
    a Comm's 16-bit sums use (zero_ref/gpu/arrays.py's DeviceArrays has the same
    methods for device arrays)."""

    def temporary(self, numel: int, dtype: np.dtype) -> np.ndarray:
        """An array for the length of one call (not in a ledger: what a rank keeps is)."""
        return np.empty(numel, dtype)

    def dtype_name(self, array: np.ndarray) -> str:
        """What the elements are ("float32", "float16", "bfloat16"); looked up, since
        NumPy computes dtype.name in Python (~5 us, and every collective asks)."""
        return _NAMES.get(array.dtype) or array.dtype.name

    def round_into(self, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        """dst[...] = src rounded once to dst's dtype (a copy when they agree)."""
        return round_into(dst, src)

    def widen_into(self, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        """float32 dst[...] = src (16-bit values widen exactly)."""
        return widen_into(dst, src)

    def accumulate_rounded(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst = dst + src, added in float32, rounded once to dst's dtype."""
        accumulate_rounded(dst, src)

    def sum_widened_rows(self, words: np.ndarray, out: np.ndarray) -> np.ndarray:
        """float32 out = the (W, n) 16-bit rows widened and summed in row order."""
        return sum_widened_rows(words, out)

    def sum_widened_rows_rounded(self, words: np.ndarray, out: np.ndarray) -> np.ndarray:
        """16-bit out = the (W, n) rows of its dtype widened, summed in row order, rounded once."""
        return sum_widened_rows_rounded(words, out)

    def sync(self) -> None:
        """Before MPI reads or writes the arrays: nothing to wait for in RAM."""

    def to_host(self, array: np.ndarray) -> np.ndarray:
        """The array as host code reads it (checkpoints, export, the oracle): itself."""
        return array

    def module(self):
        """The array module the arrays are computed on."""
        return np

    def copy_in(self, dst: np.ndarray, host: np.ndarray) -> None:
        """dst[...] = host values."""
        dst[...] = host

    def fill_from_host(self, dst: np.ndarray, fill) -> None:
        """fill(out) writes dst's values into a host array: here dst itself."""
        fill(dst)


HOST = HostArrays()


@dataclass(frozen=True)
class ElementBytes:
    """Bytes per element of each kind of model-sized array (the memory and
    communication formulas take them; fp32 is the default)."""

    param: int = 4  # what the model reads (16-bit with mixed precision)
    grad: int = 4  # gradient buffers and their accumulation
    comm: int = 4  # gradients on the wire
    master: int = 0  # a float32 master copy beside 16-bit parameters (4), or none (0)


FP32 = ElementBytes()  # every array float32, no separate master copy


def name_of(dtype: np.dtype) -> str:
    """The precision name ("fp32", "fp16", "bf16") of a NumPy dtype."""
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"dtype {dtype} is not one of {', '.join(DTYPES)}")


def element_bytes(param: str, grad: str, comm: str) -> ElementBytes:
    """ElementBytes of precision names ("fp32", "fp16", "bf16")."""
    p, g, c = (dtype_of(n).itemsize for n in (param, grad, comm))
    return ElementBytes(p, g, c, 0 if param == "fp32" else 4)
