"""Named tensors on disk, streamed: no rank ever needs the whole model in memory.

--init reads .npz or .safetensors; each rank asks only for the element ranges it
owns (`TensorFile.read(name, start, stop)`). A safetensors file is read with
positioned reads of exactly those bytes; an .npz member is decompressed one
tensor at a time (the zip format offers no ranges), so its peak is the largest
tensor. --export writes consolidated parameters as safetensors *while they
arrive*: the header (names, shapes, offsets) is known before the first tensor,
so `SafetensorsWriter` writes it first and then each tensor in turn, under a
temporary name renamed into place at the end (zero_ref/io/atomic.py's discipline).

The safetensors format: 8 bytes little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}}, then the data, every
byte of it belonging to exactly one tensor, offsets counted from its start.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

import numpy as np

from zero_ref.io.atomic import fsync_dir

FORMATS = (".npz", ".safetensors")
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}  # BF16: see _read_bytes
_ALIGN = 8  # the header is padded with spaces so the data starts 8-byte aligned


class TensorFile:
    """The tensors of an .npz or .safetensors file: names, shapes, and ranges on demand."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.suffix not in FORMATS:
            raise ValueError(
                f"{self.path}: unknown tensor file type {self.path.suffix!r}; "
                f"allowed: {', '.join(FORMATS)}"
            )
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such file")
        try:
            self._open()
        except (ValueError, KeyError, OSError, zipfile.BadZipFile, struct.error) as e:
            raise ValueError(f"{self.path}: cannot read tensors ({type(e).__name__}: {e})") from e

    def _open(self) -> None:
        if self.path.suffix == ".npz":
            self._npz = np.load(self.path, allow_pickle=False)
            headers = _npz_headers(self.path)  # shapes from the .npy headers: no data read
            self.shapes = {k: shape for k, (shape, _) in headers.items()}
            self.dtypes = {k: dtype for k, (_, dtype) in headers.items()}
            self._cache: tuple[str, np.ndarray] | None = None
            return
        self._npz = None
        self._entries, self._data_start = read_header(self.path)
        self.shapes = {k: tuple(e["shape"]) for k, e in self._entries.items()}
        self.dtypes = {k: np.dtype(np.float32) for k in self._entries}  # all read as float32

    def read(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Elements [start, stop) of tensor `name` in flat (C) order, as float32."""
        numel = int(np.prod(self.shapes[name], dtype=np.int64))
        stop = numel if stop is None else stop
        if not 0 <= start <= stop <= numel:
            raise ValueError(f"{self.path}: {name} has {numel} elements, asked [{start}, {stop})")
        if self._npz is not None:
            return self._npz_member(name).reshape(-1)[start:stop].astype(np.float32)
        return self._read_range(name, start, stop)

    def read_all(self, name: str) -> np.ndarray:
        """The whole tensor, in its shape (0-d tensors stay 0-d)."""
        return self.read(name).reshape(self.shapes[name])

    def _npz_member(self, name: str) -> np.ndarray:
        """One member, kept until another is asked for (ranks read a tensor in pieces)."""
        if self._cache is None or self._cache[0] != name:
            self._cache = (name, self._npz[name])
        return self._cache[1]

    def _read_range(self, name: str, start: int, stop: int) -> np.ndarray:
        entry = self._entries[name]
        dtype = entry["dtype"]
        itemsize = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        begin = self._data_start + entry["data_offsets"][0] + start * itemsize
        with open(self.path, "rb") as f:
            raw = os.pread(f.fileno(), (stop - start) * itemsize, begin)
        if len(raw) != (stop - start) * itemsize:
            raise ValueError(f"{self.path}: truncated: {name} ends past the end of the file")
        return _decode(raw, dtype)

    def close(self) -> None:
        if self._npz is not None:
            self._npz.close()


def _npz_headers(path: Path) -> dict[str, tuple[tuple, np.dtype]]:
    """{member: (shape, dtype)} of an .npz, from each member's .npy header alone (a
    member is decompressed only as far as its header)."""
    found = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as f:
                version = np.lib.format.read_magic(f)
                read = {(1, 0): np.lib.format.read_array_header_1_0}
                read = read.get(version, np.lib.format.read_array_header_2_0)
                shape, _, dtype = read(f)
            found[info.filename[: -len(".npy")]] = (tuple(shape), dtype)
    return found


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """The JSON header of a safetensors file (its entries) and where its data starts."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise ValueError(f"header length {n} is past the end of the {size}-byte file")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    for name, entry in header.items():
        if entry.get("dtype") not in (*_DTYPES, "BF16"):
            raise ValueError(f"tensor {name}: dtype {entry.get('dtype')!r} is not floating point")
    return header, 8 + n


def _decode(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "BF16":  # the upper 16 bits of a float32
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, _DTYPES[dtype]).astype(np.float32)


def load_named(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of a file, whole (for tests and small models; ranks use TensorFile)."""
    tensors = TensorFile(path)
    try:
        return {name: tensors.read_all(name) for name in tensors.shapes}
    finally:
        tensors.close()


class SafetensorsWriter:
    """Writes float32 tensors one by one into a safetensors file, atomically.

    `specs` fixes the names, shapes and order up front; `write` must then be
    called once per tensor, in that order (or `write_part` with consecutive
    pieces of it, for a tensor gathered from several places). The file appears
    under its real name only when `close()` has written every tensor; an
    exception inside a `with` block removes the temporary instead. `crc32` and
    `nbytes` describe every byte written so far (checkpoint manifests keep them).
    """

    def __init__(self, path: str | os.PathLike[str], specs: Iterable[tuple[str, tuple]]) -> None:
        self.path = Path(path)
        if self.path.suffix != ".safetensors":
            raise ValueError(f"{self.path}: exports are .safetensors files; use that extension")
        self.specs = [(name, tuple(int(d) for d in shape)) for name, shape in specs]
        self._shapes = dict(self.specs)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 (closed in close() or abort())
        self.crc32, self.nbytes = 0, 0
        self._emit(_header_bytes(self.specs))
        self.next, self.filled = 0, 0  # the tensor being written, and its elements so far

    def write(self, name: str, tensor: np.ndarray) -> None:
        self._skip_empty()
        expected, shape = self.specs[self.next] if self.next < len(self.specs) else (None, ())
        if np.size(tensor) == 0 and tuple(np.shape(tensor)) == self._shapes.get(name):
            return  # an empty tensor has no bytes: it is complete from the start
        if name != expected or tuple(np.shape(tensor)) != shape or self.filled:
            raise ValueError(
                f"{self.path}: expected {expected} {shape} next, got {name} {np.shape(tensor)}"
            )
        self.write_part(name, np.reshape(tensor, -1))

    def write_part(self, name: str, flat: np.ndarray) -> None:
        """The next len(flat) elements of tensor `name`, in flat (C) order."""
        if flat.size == 0 and name in self._shapes:
            return  # nothing to write (a piece of nothing, or an empty tensor)
        self._skip_empty()
        expected, shape = self.specs[self.next] if self.next < len(self.specs) else (None, ())
        numel = int(np.prod(shape, dtype=np.int64))
        if name != expected or self.filled + flat.size > numel:
            raise ValueError(
                f"{self.path}: expected {numel - self.filled} more elements of {expected} "
                f"next, got {flat.size} of {name}"
            )
        self._emit(np.ascontiguousarray(flat, np.float32).data)  # no copy if contiguous
        self.filled += flat.size
        if self.filled == numel:
            self.next, self.filled = self.next + 1, 0

    def _skip_empty(self) -> None:
        """Step past tensors of no elements: they have no bytes to wait for."""
        while (
            self.filled == 0
            and self.next < len(self.specs)
            and not int(np.prod(self.specs[self.next][1], dtype=np.int64))
        ):
            self.next += 1

    def _emit(self, data) -> None:
        self.f.write(data)
        self.crc32 = zlib.crc32(data, self.crc32)
        self.nbytes += memoryview(data).nbytes

    def close(self) -> Path:
        self._skip_empty()
        if self.next != len(self.specs):
            raise ValueError(f"{self.path}: {len(self.specs) - self.next} tensors never written")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(
        self, kind: type | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if error is None:
            self.close()
        else:
            self.abort()


def safetensors_file_bytes(specs: Iterable[tuple[str, tuple]]) -> int:
    """The size SafetensorsWriter's file of these float32 tensors will have (header and
    data), known before anything is written."""
    specs = [(name, tuple(int(d) for d in shape)) for name, shape in specs]
    data = sum(4 * int(np.prod(shape, dtype=np.int64)) for _, shape in specs)
    return len(_header_bytes(specs)) + data


def _header_bytes(specs: list[tuple[str, tuple]]) -> bytes:
    header, offset = {}, 0
    for name, shape in specs:
        nbytes = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)
    return struct.pack("<Q", len(text)) + text


def save_safetensors(path: str | os.PathLike[str], named: Mapping[str, np.ndarray]) -> Path:
    """Write `named` as float32 safetensors, atomically (all tensors in memory: tests)."""
    with SafetensorsWriter(path, [(k, np.shape(v)) for k, v in named.items()]) as writer:
        for name, tensor in named.items():
            writer.write(name, tensor)
    return writer.path
