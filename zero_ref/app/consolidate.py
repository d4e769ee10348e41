"""`python -m zero_ref.app.consolidate DIR OUT.safetensors`: a checkpoint's weights as one
plain safetensors file, with no MPI and without holding the model in memory
(zero_ref/checkpoint/to_safetensors.py). The file loads with safetensors.numpy,
safetensors.torch, and `python -m zero_ref.train --init OUT.safetensors`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from zero_ref.app.output_paths import (
    check_output_file,
    check_outside_checkpoints,
    checkpoint_folders,
)
from zero_ref.app.process_memory import resident_bytes
from zero_ref.checkpoint.manifest import CheckpointError
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.to_safetensors import WINDOW_NUMEL, consolidate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m zero_ref.app.consolidate",
        description="Write one safetensors file of a checkpoint's float32 weights.",
    )
    p.add_argument("checkpoint", help="a checkpoint folder (its 'latest' tag) or a tag folder")
    p.add_argument("out", help="the file to write (.safetensors), atomically")
    p.add_argument(
        "--optimizer-states",
        action="store_true",
        help="also write AdamW's m and v as exp_avg.<name> and exp_avg_sq.<name>",
    )
    p.add_argument(
        "--window",
        type=int,
        default=WINDOW_NUMEL,
        help=f"elements read and written at a time (default {WINDOW_NUMEL:,}): the peak memory",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    baseline = resident_bytes().get("rss", 0)  # the interpreter and its imports
    if not args.out.endswith(".safetensors"):
        print(f"consolidate: {args.out}: the output must be a .safetensors file", file=sys.stderr)
        return 2
    try:
        out = Path(args.out)
        check_output_file("OUT", out, (".safetensors",))  # before any reading
        check_outside_checkpoints("OUT", out, checkpoint_folders(args.checkpoint, args.checkpoint))
        checkpoint = Checkpoint(args.checkpoint)
        try:
            done = consolidate(checkpoint, args.out, args.optimizer_states, args.window)
        finally:
            checkpoint.close()
    except (CheckpointError, ValueError, OSError) as e:  # UsageError is a ValueError
        print(f"consolidate: {e}", file=sys.stderr)
        return 2
    record = {
        "checkpoint": str(checkpoint.folder),
        "step": checkpoint.step,
        "saved_world_size": checkpoint.world_size,
        "out": str(done.path),
        "tensors": done.tensors,
        "bytes": done.bytes,
        "seconds": done.seconds,
        "gb_per_s": done.bytes / done.seconds / 1e9 if done.seconds > 0 else None,
        "peak_rss_bytes": resident_bytes().get("peak", 0),
        "baseline_rss_bytes": baseline,
    }
    peak_above = record["peak_rss_bytes"] - baseline
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"wrote {done.path}: {done.tensors} tensors, {done.bytes / 1e6:,.1f} MB from "
            f"{checkpoint.folder} (step {checkpoint.step}, {checkpoint.world_size} ranks) in "
            f"{done.seconds:.2f} s; peak memory {peak_above / 2**20:,.1f} MiB above the "
            f"{baseline / 2**20:,.0f} MiB of the interpreter"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
