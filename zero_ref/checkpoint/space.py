"""Room for a save, checked before it starts: before the first step and again before
each save, so a save folder that is too small costs no training and never a
checkpoint (a failed save would leave the previous one as it was anyway, but the
steps since it would be lost).

A save writes every rank's file and rank 0's manifest into one folder
(zero_ref/checkpoint/writer.py), so the folder's filesystem needs room for all
of them at once, in whole blocks; the previous tags are deleted (--keep-last)
only after the new one is published. Their sizes follow from the layout: a rank
file holds three float32 shards (param, exp_avg, exp_avg_sq) under a header
whose size is known in advance, and the manifest's size is that of the manifest
built with placeholder CRCs of the widest form. What killed saves left
(.step_*.partial, .pruned) is counted as free: the save removes it first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zero_ref.checkpoint.manifest import STATE_KINDS, CheckpointError, rank_file_name
from zero_ref.checkpoint.writer import build_manifest
from zero_ref.errors import CollectiveError
from zero_ref.io.tensor_io import safetensors_file_bytes

FreeBytes = Callable[[Path], int]  # a folder -> the bytes its filesystem has free for us
LARGEST_CRC32 = 2**32 - 1  # the manifest's placeholder: no real CRC prints wider


class SaveSpaceError(CheckpointError, CollectiveError):
    """The save folder cannot hold a checkpoint: every rank raises it together (before
    the first step it is bad input, exit 2; later the run stops before the save)."""


def disk_free_bytes(folder: Path) -> int:
    """The bytes an unprivileged writer may still use on folder's filesystem."""
    return shutil.disk_usage(folder).free


def rank_file_bytes(shard_numel: int) -> int:
    """One rank file: the three state kinds, shard_numel float32 each, and the header."""
    return safetensors_file_bytes([(kind, (shard_numel,)) for kind in STATE_KINDS])


def in_blocks(nbytes: int, block: int) -> int:
    """nbytes as the filesystem allocates them: whole blocks."""
    return -(-nbytes // block) * block


def save_bytes(engine, step: int, training: dict[str, Any], block: int) -> int:
    """The bytes a save of `engine` after `step` takes on disk: every rank's file, the
    manifest, and a block each for the tag folder and the new `latest`."""
    file_bytes = rank_file_bytes(engine.layout.shard_numel)
    files = [
        {"rank": r, "file": rank_file_name(r), "bytes": file_bytes, "crc32": LARGEST_CRC32}
        for r in range(engine.layout.world_size)
    ]
    manifest = json.dumps(build_manifest(engine, step, files, training), indent=1).encode()
    files_bytes = engine.layout.world_size * in_blocks(file_bytes, block)
    return files_bytes + in_blocks(len(manifest), block) + 2 * block


def reclaimable_bytes(directory: Path) -> int:
    """What killed saves left in `directory`, which the next save removes first."""
    total = 0
    for leftover in directory.glob(".step_*"):
        if leftover.is_dir() and leftover.name.endswith((".partial", ".pruned")):
            for root, _, names in os.walk(leftover):
                total += sum(_allocated(Path(root) / name) for name in names)
    return total


def _allocated(path: Path) -> int:
    try:
        return path.lstat().st_blocks * 512
    except OSError:
        return 0


def check_save_space(
    engine,
    directory: str | Path,
    step: int,
    training: dict[str, Any],
    free_bytes: FreeBytes = disk_free_bytes,
) -> int:
    """Rank 0 measures the folder, every rank gets its verdict (a collective): returns
    the bytes the save needs, or raises SaveSpaceError on every rank alike."""
    directory = Path(directory)
    verdict: tuple[int, str | None] = (0, None)
    if engine.rank == 0:
        verdict = _measure(engine, directory, step, training, free_bytes)
    need, problem = engine.comm.mpi.bcast(verdict, root=0)
    if problem is not None:
        raise SaveSpaceError(problem)
    return need


def _measure(engine, directory: Path, step, training, free_bytes) -> tuple[int, str | None]:
    block = os.statvfs(directory).f_frsize or 4096
    need = save_bytes(engine, step, training, block)
    free = free_bytes(directory) + reclaimable_bytes(directory)
    if free >= need:
        return need, None
    return need, (
        f"--save-dir {directory}: {free:,} bytes free, a checkpoint after step {step} needs "
        f"{need:,} ({engine.layout.world_size} rank files of "
        f"{rank_file_bytes(engine.layout.shard_numel):,} bytes and the manifest); the "
        "checkpoints already there are kept: free space or give another --save-dir"
    )
