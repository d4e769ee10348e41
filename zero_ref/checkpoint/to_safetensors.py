"""One plain safetensors file from a checkpoint, without MPI and without the model
in memory (the job DeepSpeed's zero_to_fp32.py does).

Tensors are written in layout order under the model's names, each streamed in
windows of at most `window` elements: a window is read from the rank files
that hold it (zero_ref/checkpoint/reshard.py: a tensor cut by the saving
ranks' slice boundaries comes from several files) and written at once. Peak
memory is one window, whatever the model's size. Every rank file's CRC-32 is
checked first, through a buffer of the same size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zero_ref.checkpoint.manifest import CheckpointError
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.io.tensor_io import SafetensorsWriter

WINDOW_NUMEL = 4 << 20  # elements per read-and-write: 16 MiB of float32
OPTIMIZER_PREFIXES = {"exp_avg": "exp_avg.", "exp_avg_sq": "exp_avg_sq."}


@dataclass(frozen=True)
class Consolidated:
    path: Path
    tensors: int
    bytes: int
    seconds: float


def consolidate(
    checkpoint: Checkpoint,
    out: str | Path,
    optimizer_states: bool = False,
    window: int = WINDOW_NUMEL,
) -> Consolidated:
    """Write `out` (.safetensors): every parameter as float32, and with
    optimizer_states AdamW's m and v as "exp_avg.<name>" and "exp_avg_sq.<name>"."""
    if window < 1:
        raise ValueError(f"window={window} is not allowed: it must be >= 1 element")
    problems = checkpoint.verify(range(checkpoint.world_size), chunk_bytes=4 * window)
    if problems:
        raise CheckpointError("; ".join(problems))
    t0 = time.perf_counter()
    kinds = [("param", "")]
    if optimizer_states:
        kinds += list(OPTIMIZER_PREFIXES.items())
    named = [
        (kind, prefix + f"{u.name}.{s.name}", u, s)
        for kind, prefix in kinds
        for u in checkpoint.layout.units
        for s in u.slots
    ]
    buffer = np.empty(min(window, max((s.numel for *_, s in named), default=0)), np.float32)
    with SafetensorsWriter(out, [(name, s.shape) for _, name, _, s in named]) as writer:
        for kind, name, unit, slot in named:
            _stream_tensor(checkpoint, writer, kind, name, unit, slot, buffer)
    return Consolidated(Path(out), len(named), writer.nbytes, time.perf_counter() - t0)


def _stream_tensor(checkpoint, writer, kind, name, unit, slot, buffer) -> None:
    for a in range(0, slot.numel, max(1, buffer.size)):  # size 0: every tensor is empty
        b = min(slot.numel, a + buffer.size)
        piece = buffer[: b - a]
        checkpoint.read_range(kind, unit, slot.offset + a, slot.offset + b, piece)
        writer.write_part(name, piece)
