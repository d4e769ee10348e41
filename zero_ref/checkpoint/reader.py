"""Reading a checkpoint: open and check its manifest, verify its files, and read
element ranges of any unit straight from the rank files that hold them.

A `Checkpoint` never reads a whole rank file into memory: each range is one
positioned read (os.preadv) per piece, into the caller's buffer. Its
`source(kind)` is an InitSource (zero_ref/engine/init_source.py), so a
resuming engine fills its parameters and optimizer state exactly as it fills
initial parameters: unit by unit, each rank only what it keeps. With --trace,
each file's check and each piece read are events on the "checkpoint" lane, with
their bytes and (a read) where its elements lie in the unit and the old file.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from zero_ref.checkpoint.manifest import (
    MANIFEST,
    STATE_KINDS,
    CheckpointError,
    layout_from_record,
    rank_file_name,
    read_manifest,
    resolve_tag,
)
from zero_ref.checkpoint.reshard import Piece, pieces
from zero_ref.io.tensor_io import read_header
from zero_ref.layout.flat import UnitLayout

VERIFY_CHUNK_BYTES = 16 << 20  # read at a time while checking a file's CRC-32
F32_BYTES = 4


class Checkpoint:
    """One tag folder: its manifest, the layout it was saved with, its rank files."""

    def __init__(self, path: str | os.PathLike[str], trace=None) -> None:
        """trace: a zero_ref.io.trace.Trace (--trace) to time each check and read on."""
        self.folder = resolve_tag(path)
        self.manifest = read_manifest(self.folder)
        self.layout = layout_from_record(self.manifest["layout"], str(self.folder / MANIFEST))
        self.step = int(self.manifest["step"])
        self.world_size = self.layout.world_size
        self.units = {u.name: u for u in self.layout.units}
        self.files = self._file_entries()
        self._open: dict[int, tuple[int, dict[str, int]]] = {}  # rank -> (fd, data starts)
        self.trace = trace

    def _file_entries(self) -> list[dict]:
        """The manifest's files: one per saving rank, each {rank, file, bytes, crc32}."""
        where, files = self.folder / MANIFEST, self.manifest["files"]
        if not isinstance(files, list) or len(files) != self.world_size:
            raise CheckpointError(
                f"{where}: 'files' must list one file per rank 0..{self.world_size - 1}"
            )
        for i, entry in enumerate(files):
            ok = isinstance(entry, dict) and entry.get("rank") == i
            ok = ok and entry.get("file") == rank_file_name(i)
            ok = ok and all(_is_int(entry.get(k)) for k in ("bytes", "crc32"))
            if not ok:
                raise CheckpointError(
                    f"{where}: files[{i}] = {entry!r}: expected rank {i}, file "
                    f"{rank_file_name(i)}, and integer bytes and crc32"
                )
        return files

    def saved_layout(self) -> dict:
        """Who saved it, and each unit's size and slice as it was cut: what a trace's
        "resume" event says, so that each read can be placed (scripts/docs/plot_checkpoint.py)."""
        m = self.manifest
        units = [
            {"name": u.name, "numel": u.numel, "shard_numel": u.shard_numel}
            for u in self.layout.units
        ]
        files = [{"file": f["file"], "bytes": f["bytes"]} for f in self.files]
        return {"world_size": m["world_size"], "stage": m["stage"], "units": units, "files": files}

    def total_bytes(self) -> int:
        """All rank files together, as the manifest records them."""
        return sum(int(f["bytes"]) for f in self.files)

    def path_of(self, rank: int) -> Path:
        return self.folder / rank_file_name(rank)

    # ---- checks
    def check_model(self, model, flags_hint: str = "") -> None:
        """Refuse a checkpoint of another model: every unit, tensor name and shape must
        match `model` (world sizes and stages may differ)."""
        where = f"{self.folder}: saved for another model"
        here = [(u.name, [(s.name, tuple(s.shape)) for s in u.param_specs()]) for u in model.units]
        there = [(u.name, [(s.name, s.shape) for s in u.slots]) for u in self.layout.units]
        if [n for n, _ in there] != [n for n, _ in here]:
            raise CheckpointError(
                f"{where}: units [{_names(there)}] there, [{_names(here)}] here{flags_hint}"
            )
        for (unit, saved), (_, wanted) in zip(there, here, strict=True):
            if saved != wanted:
                diff = next(
                    (
                        f"{unit}.{a[0]} {a[1]} there, {unit}.{b[0]} {b[1]} here"
                        for a, b in zip(saved, wanted, strict=False)
                        if a != b
                    ),
                    f"unit {unit} has {len(saved)} tensors there, {len(wanted)} here",
                )
                raise CheckpointError(f"{where}: {diff}{flags_hint}")

    def verify(self, ranks: Iterable[int], chunk_bytes: int = VERIFY_CHUNK_BYTES) -> list[str]:
        """Problems with the given ranks' files (missing, unreadable, wrong size, CRC-32
        mismatch, unexpected tensors), each naming the file; [] if they are sound.
        Streams each file through one buffer of chunk_bytes."""
        problems = []
        for rank in ranks:
            try:
                problem = self._verify_one(rank, chunk_bytes)
            except OSError as e:
                problem = f"{self.path_of(rank)}: cannot read ({e.strerror or e})"
            if problem:
                problems.append(problem)
        return problems

    def _verify_one(self, rank: int, chunk_bytes: int) -> str | None:
        entry, path = self.files[rank], self.path_of(rank)
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            what = "truncated" if size < entry["bytes"] else "longer than saved"
            return f"{path}: {what}: {size} bytes, the manifest says {entry['bytes']}"
        t0 = time.perf_counter()
        crc = _crc32_of(path, min(chunk_bytes, size))  # a small file: a small buffer
        if self.trace is not None:
            seconds = time.perf_counter() - t0
            self.trace.complete(f"verify {path.name}", "checkpoint", t0, seconds, bytes=size)
        if crc != entry["crc32"]:
            return (
                f"{path}: CRC-32 {crc:#010x}, the manifest says {entry['crc32']:#010x}: "
                "the file is damaged"
            )
        try:
            self._data_starts(rank)
        except CheckpointError as e:
            return str(e)
        return None

    # ---- reading
    def read_range(self, kind: str, unit: UnitLayout, lo: int, hi: int, out: np.ndarray) -> None:
        """out[:] = elements [lo, hi) of `unit`'s padded range of state `kind`, read
        from the saved ranks' files (zeros where the range lies in padding)."""
        saved = self.units[unit.name]
        out[:] = 0
        for piece in pieces(saved, lo, hi):
            fd, starts = self._file(piece.rank)
            target = out[piece.out_start : piece.out_start + piece.numel]
            offset = starts[kind] + F32_BYTES * piece.file_start
            t0 = time.perf_counter()
            got = os.preadv(fd, [memoryview(target).cast("B")], offset)
            if got != F32_BYTES * piece.numel:
                raise CheckpointError(
                    f"{self.path_of(piece.rank)}: truncated: {kind} of {unit.name} ends past "
                    "the end of the file"
                )
            if self.trace is not None:
                self._trace_read(kind, unit, lo, piece, t0)

    def _trace_read(self, kind: str, unit: UnitLayout, lo: int, piece: Piece, t0: float) -> None:
        """A read on the trace: which elements of the unit, from which old rank's file."""
        seconds = time.perf_counter() - t0
        self.trace.complete(
            f"read {kind} {unit.name}", "checkpoint", t0, seconds,
            bytes=F32_BYTES * piece.numel, kind=kind, unit=unit.name,
            start=lo + piece.out_start,  # element of the unit
            numel=piece.numel, from_rank=piece.rank,
            file_start=piece.file_start,  # element of that rank's tensors
        )  # fmt: skip

    def source(self, kind: str) -> StateSource:
        return StateSource(self, kind)

    def close(self) -> None:
        for fd, _ in self._open.values():
            os.close(fd)
        self._open.clear()

    def _file(self, rank: int) -> tuple[int, dict[str, int]]:
        if rank not in self._open:
            starts = self._data_starts(rank)
            self._open[rank] = (os.open(self.path_of(rank), os.O_RDONLY), starts)
        return self._open[rank]

    def _data_starts(self, rank: int) -> dict[str, int]:
        """Where each state tensor's bytes begin in rank's file, after checking that the
        file holds exactly the three float32 tensors of its slice."""
        path = self.path_of(rank)
        try:
            entries, data_start = read_header(path)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: cannot read its header ({e})") from None
        shape = [self.layout.shard_numel]
        for kind in STATE_KINDS:
            entry = entries.get(kind)
            if entry is None or entry.get("dtype") != "F32" or entry.get("shape") != shape:
                raise CheckpointError(
                    f"{path}: expected tensor {kind!r} float32 {shape}, found {entry}"
                )
        if set(entries) != set(STATE_KINDS):
            raise CheckpointError(
                f"{path}: unexpected tensors {sorted(set(entries) - set(STATE_KINDS))}"
            )
        return {kind: data_start + entries[kind]["data_offsets"][0] for kind in STATE_KINDS}


class StateSource:
    """One state kind of a checkpoint, as an InitSource (zero_ref/engine/init_source.py)."""

    def __init__(self, checkpoint: Checkpoint, kind: str) -> None:
        self.checkpoint, self.kind = checkpoint, kind

    def fill_unit(self, unit: UnitLayout, out: np.ndarray, lo: int, hi: int) -> None:
        self.checkpoint.read_range(self.kind, unit, lo, hi, out)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _names(units: list) -> str:
    return ", ".join(n for n, _ in units[:6]) + (" ..." if len(units) > 6 else "")


def _crc32_of(path: Path, chunk_bytes: int) -> int:
    """CRC-32 of a whole file, read into one reused buffer (one chunk held, not two)."""
    crc, chunk = 0, bytearray(max(1, chunk_bytes))
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            crc = zlib.crc32(view[:n], crc)
    return crc
