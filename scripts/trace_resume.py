"""Resume from a checkpoint, recording every range each rank reads from which file.

    mpirun -n 3 python scripts/trace_resume.py runs/ckpt --out runs/resume_stage3.json \\
        -- --stage 3

A resume (zero_ref/app/resume.py's resume_engine, as `python -m zero_ref.train
--resume` runs it) checks every rank file, builds the engine from the checkpoint's
parameters and loads AdamW's m and v, each rank reading only what its stage keeps.
The trace has no events for it, so this script resumes through a Checkpoint that
notes each range it is asked for and the pieces of old rank files it reads them
from (zero_ref/checkpoint/reshard.py), and rank 0 writes them all as JSON beside
the saved layout. The flags after `--` are zero_ref.train's (the model, the new
stage); the world size is mpirun's. scripts/plot_checkpoint.py draws the result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.app.resume import resume_engine
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.reshard import pieces
from zero_ref.comm.collectives import comm_for
from zero_ref.engine import make_engine
from zero_ref.train import prepare


class RecordingCheckpoint(Checkpoint):
    """A Checkpoint that notes, for every range it reads, the pieces it reads it from."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.reads: list[dict] = []

    def read_range(self, kind, unit, lo, hi, out) -> None:
        for piece in pieces(self.units[unit.name], lo, hi):  # what read_range reads
            self.reads.append(
                {
                    "kind": kind,
                    "unit": unit.name,
                    "start": lo + piece.out_start,  # element of the unit
                    "numel": piece.numel,
                    "from_rank": piece.rank,
                    "file_start": piece.file_start,  # element of that rank's tensor
                }
            )
        super().read_range(kind, unit, lo, hi, out)


def saved_layout(checkpoint: Checkpoint) -> dict:
    """Who saved the checkpoint, and each unit's size and slice as it was cut."""
    m = checkpoint.manifest
    units = [
        {"name": u.name, "numel": u.numel, "shard_numel": u.shard_numel}
        for u in checkpoint.layout.units
    ]
    files = [{"file": f["file"], "bytes": f["bytes"]} for f in checkpoint.files]
    return {"world_size": m["world_size"], "stage": m["stage"], "units": units, "files": files}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """This script's flags, and zero_ref.train's: those after `--`."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1 :]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a --save-dir folder (its latest tag) or a tag folder")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    own, flags = split_argv(sys.argv[1:])
    a = p.parse_args(own)
    world = MPI.COMM_WORLD
    parsed = parse_args(flags, world.size, world.rank)
    comm = comm_for(world, parsed.zero)
    task, *_ = prepare(parsed, comm.size)
    checkpoint = RecordingCheckpoint(a.checkpoint)
    checkpoint.check_model(task.model)
    build = lambda: make_engine(task.model, checkpoint.source("param"), parsed.zero, comm)  # noqa: E731
    engine, step, _ = resume_engine(checkpoint, comm, build)
    everyone = world.gather(checkpoint.reads, root=0)
    engine.close()
    if comm.rank == 0:
        record = {
            "checkpoint": str(checkpoint.folder),
            "step": step,
            "saved": saved_layout(checkpoint),
            "resumed": {"world_size": comm.size, "stage": parsed.zero.stage},
            "reads": everyone,  # per new rank
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(record))
        print(json.dumps({"written": str(a.out), "reads_per_rank": [len(r) for r in everyone]}))


if __name__ == "__main__":
    main()
