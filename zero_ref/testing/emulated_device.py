"""Device arrays emulated in host memory, as strict as CuPy's: for testing the GPU path's
array-module code on a machine without a GPU (tests only; docs/gpu.md).

numba-cuda's simulator makes device arrays that are plain NumPy arrays, so code
that runs there can still call NumPy and Numba on them; on a GPU the engine
and the model see CuPy arrays, which refuse that. `DeviceArray` is a NumPy
array that refuses the same things CuPy does, so a test catches them here:

  - mixing a host array (numpy.ndarray) into an operation on device arrays
    (CuPy: "Unsupported type <class 'numpy.ndarray'>"), or assigning one into
    a device array (CuPy: "non-scalar numpy.ndarray cannot be used for fill");
    host data must be copied in with `xp.asarray` / `.set()` and out with
    `.get()` / `xp.asnumpy`, of the same dtype and shape, into contiguous
    arrays (CuPy's get and set check all three);
  - `numpy.copyto` and friends between host and device (CuPy: `.get(out=)`,
    `.set()`);
  - a bfloat16 device array (CuPy has no bfloat16: the engine stores its bits
    as uint16 and converts with CUDA kernels).

`EMULATED` is the array module (`xp`) of these arrays, what CuPy is on a GPU:
NumPy's functions, with results on the "device". The arithmetic is NumPy's, so
results equal a NumPy run of the same formulas; what the emulation proves is
that the code would hand CuPy only what CuPy takes.

What it cannot catch: a DeviceArray is a NumPy array, so `numpy.asarray` or
`memoryview` of it, or a Numba CPU kernel given it, reads it silently where
CuPy would raise or a GPU would crash. (Numba types ndarray subclasses through a cache keyed by
shape and dtype, so a typeof hook refusing them is not reliable.) A kernel run
on device arrays would still be caught one step later: its output is a host
array, and the next operation mixing it with device arrays raises.
"""

from __future__ import annotations

import numpy as np


class DeviceArray(np.ndarray):
    """A NumPy array standing for a CuPy array: see the module docstring."""

    def __array_finalize__(self, obj) -> None:
        _refuse_bfloat16(self)

    def view(self, *args, **kwargs):
        """NumPy's view, refused as bfloat16 (a dtype view is made, then retyped)."""
        return _refuse_bfloat16(super().view(*args, **kwargs))

    def __array_namespace__(self, api_version=None):
        return EMULATED

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _refuse_host_arrays(ufunc.__name__, inputs + (out or ()))
        if out is not None:
            kwargs["out"] = tuple(_host_view(o) for o in out)
        with np.errstate(all="ignore"):  # a GPU does not warn on Inf or NaN: nor do we
            result = getattr(ufunc, method)(*(_host_view(x) for x in inputs), **kwargs)
        return _to_device(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host_arrays(func.__name__, _flatten((args, kwargs)))
        result = func(*_host_view(args), **_host_view(kwargs))
        return _to_device(result)

    def __setitem__(self, index, value) -> None:
        if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray) and value.ndim:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill (CuPy)")
        with np.errstate(all="ignore"):  # a GPU's casts do not warn either
            super().__setitem__(index, value)

    def get(self, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy (CuPy's .get), into `out` when given: same dtype and shape."""
        host = self.view(np.ndarray)
        if out is None:
            return host.copy()
        _same_layout("get", out, self)
        np.copyto(out, host)
        return out

    def set(self, host: np.ndarray) -> None:
        """self <- host (CuPy's .set): same dtype and shape, self contiguous."""
        if type(host) is not np.ndarray:
            raise TypeError(f"DeviceArray.set takes a host array, not {type(host).__name__}")
        _same_layout("set", host, self)
        np.copyto(self.view(np.ndarray), host)


def _same_layout(what: str, host: np.ndarray, device: DeviceArray) -> None:
    """CuPy's get(out=) and set() copy bytes: the dtypes and shapes must agree and both
    sides be contiguous (CuPy: TypeError, ValueError, RuntimeError)."""
    if host.dtype != device.dtype or host.shape != device.shape:
        raise TypeError(f"{what}: {host.dtype}{host.shape} vs device {device.dtype}{device.shape}")
    if not (host.flags.c_contiguous and device.flags.c_contiguous):
        raise RuntimeError(f"{what}: CuPy copies between contiguous arrays only")


def _refuse_bfloat16(array):
    if isinstance(array, DeviceArray) and array.dtype.name == "bfloat16":
        raise TypeError("a device array cannot be bfloat16 (CuPy has no bfloat16)")
    return array


def _flatten(value) -> list:
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    if isinstance(value, dict):
        return _flatten(list(value.values()))
    return [value]


def _refuse_host_arrays(what: str, values) -> None:
    for value in values:
        if isinstance(value, np.ndarray) and not isinstance(value, DeviceArray):
            raise TypeError(
                f"{what}: a host array (numpy.ndarray, shape {value.shape}) mixed with "
                "device arrays; copy it to the device with xp.asarray first"
            )


def _host_view(value):
    """value with every DeviceArray in it seen as the NumPy array it is."""
    if isinstance(value, DeviceArray):
        return value.view(np.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_host_view(v) for v in value)
    if isinstance(value, dict):
        return {k: _host_view(v) for k, v in value.items()}
    return value


def _to_device(value):
    if isinstance(value, np.ndarray):
        return value.view(DeviceArray)
    if isinstance(value, tuple):
        return tuple(_to_device(v) for v in value)
    return value


class _EmulatedModule:
    """The array module of DeviceArray: NumPy's names, results on the device."""

    __name__ = "zero_ref.testing.emulated_device.EMULATED"

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        if isinstance(attr, (type, np.ufunc)) or not callable(attr):
            return attr  # dtypes and constants; ufuncs dispatch through __array_ufunc__
        return lambda *args, **kwargs: _to_device(attr(*_host_view(args), **_host_view(kwargs)))

    def asarray(self, value, dtype=None) -> DeviceArray:
        """A device copy of host data (or the device array itself)."""
        if isinstance(value, DeviceArray) and (dtype is None or value.dtype == dtype):
            return value
        return np.array(_host_view(value), dtype=dtype).view(DeviceArray)

    def asnumpy(self, value) -> np.ndarray:
        """A host copy (cupy.asnumpy)."""
        return value.get() if isinstance(value, DeviceArray) else np.asarray(value)


EMULATED = _EmulatedModule()


def to_device(array: np.ndarray) -> DeviceArray:
    """A device view of a host array's memory (tests: the engine's arrays as CuPy sees
    them, which share memory with the numba device arrays)."""
    return array.view(DeviceArray)
