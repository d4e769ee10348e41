"""Saving a checkpoint (a collective): every rank writes its own slices, rank 0
the manifest, and the tag folder appears whole or not at all.

  1. rank 0 removes what killed saves left (.step_*.partial folders) and makes
     DIR/.step_000123.partial/
  2. every rank writes rank_{r}.safetensors there (param, exp_avg, exp_avg_sq:
     its slices, streamed unit by unit from the engine's own buffers, no copy),
     fsyncs it and reports its size and CRC-32 to rank 0
  3. rank 0 writes manifest.json (atomically), fsyncs the folder, renames it
     to DIR/step_000123 (atomic), fsyncs DIR
  4. rank 0 replaces DIR/latest atomically, then deletes the oldest tags
     beyond --keep-last

A kill before step 3's rename leaves only a hidden .partial folder; a kill
between the rename and step 4 leaves `latest` naming the previous tag. Either
way the previous checkpoint stays loadable. With --trace, each rank's file, the
manifest and the publishing are events on the "checkpoint" lane, with their bytes.

With hybrid sharding the first shard group writes: its G files hold the whole model, a
checkpoint of world size G; the other groups hold the same state and write nothing, so
any run (any world size, hybrid or not) can resume from it or reshard it.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zero_ref import __version__
from zero_ref.checkpoint.manifest import (
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    STATE_KINDS,
    layout_record,
    rank_file_name,
    tag_for,
    tags_in,
)
from zero_ref.engine.hooks import EngineHooks
from zero_ref.io.atomic import atomic_write_bytes, fsync_dir
from zero_ref.io.tensor_io import SafetensorsWriter


@dataclass
class SaveResult:
    folder: Path
    bytes: int  # all rank files together
    seconds: float
    removed: list[str] = field(default_factory=list)  # left by killed saves
    pruned: list[str] = field(default_factory=list)  # older tags beyond keep_last

    def describe(self) -> str:
        rate = self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")
        return (
            f"saved checkpoint {self.folder}: {self.bytes / 1e6:,.1f} MB in "
            f"{self.seconds:.2f} s ({rate:.2f} GB/s)"
        )


def save_checkpoint(
    engine,
    directory: str | Path,
    step: int,
    training: dict[str, Any],
    keep_last: int | None = None,
) -> SaveResult:
    """Save the engine's parameters, m and v after run step `step` into
    directory/step_{step}/ (a collective; rank 0's result is complete). `training`
    is the caller's record of the run's position and config (plain JSON data)."""
    comm, rank = engine.comm, engine.rank
    writes = engine.hybrid.group_index == 0  # hybrid sharding: one group's files
    directory, tag = Path(directory), tag_for(step)
    partial = directory / f".{tag}.partial"
    t0 = time.perf_counter()
    removed = []
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        removed = remove_unfinished(directory)
        partial.mkdir()
    comm.mpi.Barrier()  # the folder exists before anyone writes into it
    trace = getattr(engine, "trace", None)  # --trace: each file written, with its bytes
    mine, name = None, rank_file_name(engine.shard_rank)
    if writes:
        with _traced(trace, f"write {name}", step=step) as args:
            mine = write_rank_file(engine, partial / name)
            args["bytes"] = mine["bytes"]
    entries = [e for e in comm.mpi.gather(mine, root=0) or () if e is not None]
    result = SaveResult(directory / tag, 0, 0.0, removed)
    if rank == 0:
        manifest = json.dumps(build_manifest(engine, step, entries, training), indent=1).encode()
        with _traced(trace, f"write {MANIFEST}", step=step, bytes=len(manifest)):
            atomic_write_bytes(partial / MANIFEST, manifest)
        with _traced(trace, f"publish {tag}", step=step):  # renames and fsyncs: no bytes
            _publish(directory, partial, tag)
            _hooks(engine).before_publish()
            _replace_latest(directory, tag)
            result.pruned = prune(directory, keep_last, keep=tag)
        result.bytes = sum(e["bytes"] for e in entries)
    comm.mpi.Barrier()  # no rank goes on (or exits) before the save is complete
    result.seconds = time.perf_counter() - t0
    return result


def _traced(trace, name: str, **args):
    """An event on the trace's checkpoint lane around the block, or nothing; yields the
    event's args, for what is known at its end."""
    return nullcontext(args) if trace is None else trace.span(name, "checkpoint", **args)


def write_rank_file(engine, path: Path) -> dict[str, Any]:
    """This rank's slices of every state kind, unit by unit, into one safetensors file."""
    shard = engine.layout.shard_numel
    with SafetensorsWriter(path, [(kind, (shard,)) for kind in STATE_KINDS]) as writer:
        for kind in STATE_KINDS:
            _write_state(engine, writer, kind)
    engine.release_offloaded()  # offloaded state was read through its mappings
    return {
        "rank": engine.shard_rank,
        "file": path.name,
        "bytes": writer.nbytes,
        "crc32": writer.crc32,
    }


def _hooks(engine) -> EngineHooks:
    """The engine's named points (zero_ref/engine/hooks.py: fault injection), or none."""
    return getattr(engine, "hooks", None) or EngineHooks()


def _write_state(engine, writer: SafetensorsWriter, kind: str) -> None:
    _hooks(engine).before_state_written(kind)
    for unit in engine.layout.units:
        mine = engine.owned_state(kind, unit)
        writer.write_part(kind, mine)
        engine.release_pages(mine)  # offloaded state: one unit in RAM at a time


def build_manifest(engine, step: int, files: list[dict], training: dict[str, Any]) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "zero_ref_version": __version__,
        "tag": tag_for(step),
        "step": step,
        "optimizer_steps": engine.step_count,
        "world_size": engine.layout.world_size,  # the files' (hybrid sharding: one group's)
        "stage": engine.stage,
        "dtype": "float32",  # with fp16/bf16: the float32 master weights, not their rounding
        "precision": engine.cfg.mixed_precision.dtype,
        "loss_scaler": None if engine.scaler is None else asdict(engine.scaler),
        "state_kinds": list(STATE_KINDS),
        "layout": layout_record(engine.layout),
        "files": files,
        "training": training,
    }


def _publish(directory: Path, partial: Path, tag: str) -> None:
    """Rename the finished folder into place (replacing a tag of the same name)."""
    fsync_dir(partial)
    final = directory / tag
    if final.exists():  # the same step saved again, e.g. by a run resumed before it
        replaced = directory / f".{tag}.replaced"
        final.rename(replaced)
        partial.rename(final)
        shutil.rmtree(replaced)
    else:
        partial.rename(final)
    fsync_dir(directory)


def _replace_latest(directory: Path, tag: str) -> None:
    atomic_write_bytes(directory / LATEST, (tag + "\n").encode())


def remove_unfinished(directory: Path) -> list[str]:
    """Clean up after saves that were killed; returns what was done. A .partial
    folder (a save not yet published) or .pruned one (a deletion under way) is
    removed; a .replaced folder is put back if the tag it replaced is missing (a
    kill between _publish's two renames), else removed."""
    done = []
    for path in sorted(directory.glob(".step_*")):
        if not path.is_dir():
            continue
        tag = path.name[1:].rsplit(".", 1)[0]
        if path.name.endswith(".replaced") and not (directory / tag).exists():
            path.rename(directory / tag)
            done.append(f"{path.name} (restored)")
        elif path.name.endswith((".partial", ".replaced", ".pruned")):
            shutil.rmtree(path)
            done.append(path.name)
    return done


def prune(directory: Path, keep_last: int | None, keep: str) -> list[str]:
    """Delete the oldest tags so that at most keep_last remain up to `keep` (the tag
    just saved, never deleted). Tags of later steps, left by a run this one resumed
    before, are not counted and not touched. Each is renamed to a hidden .pruned
    folder first, so a kill mid-deletion leaves nothing that looks like a tag."""
    if keep_last is None:
        return []
    newest = int(keep.split("_")[1])
    tags = [p for step, p in tags_in(directory) if step <= newest]
    doomed = [p for p in tags[: max(0, len(tags) - keep_last)] if p.name != keep]
    for path in doomed:
        hidden = path.with_name(f".{path.name}.pruned")
        path.rename(hidden)
        shutil.rmtree(hidden)
    return [p.name for p in doomed]
