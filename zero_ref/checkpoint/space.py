"""Room for a save, checked before it starts: for the whole run before the first step
and again before each save, so a save folder that is too small costs no training
and never a checkpoint (a failed save would leave the previous one as it was
anyway, but the steps since it would be lost).

A save writes every rank's file and rank 0's manifest into one folder
(zero_ref/checkpoint/writer.py), so the folder's filesystem needs room for all
of them at once, in whole blocks; the previous tags are deleted (--keep-last)
only after the new one is published, so a run that saves more than once needs
room for the tags it keeps plus the one being written (`run_peak`). Their sizes
follow from the layout: a rank file holds three float32 shards (param, exp_avg,
exp_avg_sq) under a header whose size is known in advance, and the manifest's size
is that of the manifest built with placeholder CRCs of the widest form. What killed saves left
(.step_*.partial, .pruned) is counted as free: the save removes it first.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from zero_ref.checkpoint.manifest import STATE_KINDS, CheckpointError, rank_file_name, tags_in
from zero_ref.checkpoint.writer import build_manifest
from zero_ref.io.disk_space import FreeBytes, disk_free_bytes
from zero_ref.io.tensor_io import safetensors_file_bytes
from zero_ref.runtime.errors import CollectiveError

LARGEST_CRC32 = 2**32 - 1  # the manifest's placeholder: no real CRC prints wider


class SaveSpaceError(CheckpointError, CollectiveError):
    """The save folder cannot hold a checkpoint: every rank raises it together (before
    the first step it is bad input, exit 2; later the run stops before the save)."""


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
            total += folder_bytes(leftover)
    return total


def folder_bytes(folder: Path) -> int:
    """The blocks every file under `folder` takes."""
    total = 0
    for root, _, names in os.walk(folder):
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
    return need, _one_save_short(engine, directory, free, need, step)


def _one_save_short(engine, directory: Path, free: int, need: int, step: int) -> str:
    return (
        f"--save-dir {directory}: {free:,} bytes free, a checkpoint after step {step} needs "
        f"{need:,} ({engine.layout.world_size} rank files of "
        f"{rank_file_bytes(engine.layout.shard_numel):,} bytes and the manifest), "
        f"{need - free:,} bytes more than there is; the checkpoints already there are "
        "kept: free space or give another --save-dir"
    )


def save_steps(first: int, last: int, every: int | None) -> list[int]:
    """The steps a run from step `first` to `last` saves after (zero_ref/train.py):
    every `every`-th, and always the last."""
    steps = list(range(every * (first // every + 1), last + 1, every)) if every else []
    if last > first and (not steps or steps[-1] != last):
        steps.append(last)
    return steps


class RunPeak(NamedTuple):
    """The most room a run's saves take at once, beyond what the folder holds now."""

    bytes: int
    step: int  # the save being written at that moment
    older: int  # the checkpoints on disk beside it then, pruned only after it is published


def run_peak(
    steps: Sequence[int], one_save: int, on_disk: dict[int, int], keep_last: int | None
) -> RunPeak:
    """Replays the saves as zero_ref/checkpoint/writer.py makes them: each new tag is
    written beside the ones there; once it is published, a tag of the same step it
    replaced and the oldest beyond keep_last (counting only tags up to the new one)
    are deleted. `on_disk`: step -> bytes of the tags the folder holds already."""
    existing = sorted(on_disk.items())  # oldest first; those after a save join later
    kept: deque[tuple[int, int]] = deque()  # (step, bytes) of the tags up to the last save
    extra, peak, joined = 0, RunPeak(0, steps[0] if steps else 0, 0), 0
    for step in steps:
        while joined < len(existing) and existing[joined][0] < step:
            kept.append(existing[joined])  # already on disk: costs nothing more
            joined += 1
        if extra + one_save > peak.bytes:
            peak = RunPeak(extra + one_save, step, len(kept))
        extra += one_save
        if joined < len(existing) and existing[joined][0] == step:  # replaced once published
            extra -= existing[joined][1]
            joined += 1
        kept.append((step, one_save))
        while keep_last is not None and len(kept) > keep_last:
            extra -= kept.popleft()[1]
    return peak


def check_run_space(
    engine,
    directory: str | Path,
    steps: Sequence[int],
    keep_last: int | None,
    training: dict[str, Any],
    free_bytes: FreeBytes = disk_free_bytes,
) -> RunPeak:
    """Before the first step: room for all the run's saves (`steps`), the ones it keeps
    on disk together with the one being written (a collective like check_save_space;
    `training` is the last save's record, the widest manifest). Returns the peak, or
    raises SaveSpaceError on every rank alike, naming how many bytes are missing."""
    directory = Path(directory)
    verdict: tuple[RunPeak | None, str | None] = (None, None)
    if engine.rank == 0 and steps:
        verdict = _measure_run(engine, directory, steps, keep_last, training, free_bytes)
    peak, problem = engine.comm.mpi.bcast(verdict, root=0)
    if problem is not None:
        raise SaveSpaceError(problem)
    return peak


def _measure_run(engine, directory: Path, steps, keep_last, training, free_bytes):
    block = os.statvfs(directory).f_frsize or 4096
    one = save_bytes(engine, steps[-1], training, block)
    on_disk = {step: folder_bytes(tag) for step, tag in tags_in(directory)}
    peak = run_peak(steps, one, on_disk, keep_last)
    free = free_bytes(directory) + reclaimable_bytes(directory)
    if free >= peak.bytes:
        return peak, None
    if peak.older == 0:  # the save alone does not fit
        return peak, _one_save_short(engine, directory, free, peak.bytes, peak.step)
    kept = "all of them" if keep_last is None else f"--keep-last {keep_last}"
    return peak, (
        f"--save-dir {directory}: {free:,} bytes free, but this run's {len(steps)} "
        f"checkpoint(s) ({kept}) need {peak.bytes:,} at once, {peak.bytes - free:,} bytes "
        f"more than there is: the one after step {peak.step} is written while "
        f"{peak.older} older one(s) are still on disk (they are deleted only after it is "
        f"published); each takes {one:,} bytes ({engine.layout.world_size} rank files of "
        f"{rank_file_bytes(engine.layout.shard_numel):,} bytes and the manifest). Free "
        "space, keep fewer (--keep-last), save less often (--save-every) or give another "
        "--save-dir"
    )
