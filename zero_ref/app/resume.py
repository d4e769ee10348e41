"""The trainer's side of checkpoints: what a save records besides the model state,
and resuming from one (docs/checkpoints.md).

A checkpoint records the run's position exactly: the run's step (the data
position: batches depend only on (seed, step), zero_ref/app/data.py, so there
is no generator state to carry), the optimizer's own step count (AdamW's bias
correction; it lags the run's step by the steps a NaN/Inf skipped), the
learning-rate schedule, and the whole config. Resuming with the same flags
continues the run as if it had never stopped; flags that differ are listed.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict
from typing import Any

import numpy as np

from zero_ref.app.cli import Parsed
from zero_ref.checkpoint.manifest import MANIFEST, CheckpointError
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.checkpoint.space import check_run_space, check_save_space, save_steps
from zero_ref.checkpoint.writer import save_checkpoint
from zero_ref.io.disk_space import FreeBytes, disk_free_bytes
from zero_ref.models.unit import Model
from zero_ref.optim.loss_scale import LossScaleState

MODEL_FLAGS = ("model", "context", "d_embed", "d_hidden", "n_layer", "n_head", "d_model")


def training_record(parsed: Parsed, step: int, engine, tokens: np.ndarray) -> dict[str, Any]:
    """The manifest's "training" entry for a save after run step `step`."""
    run, zero = parsed.run, parsed.zero
    return {
        "lr_schedule": asdict(run.lr_schedule),
        "next_lr": run.lr_schedule(step + 1) if step < run.steps else None,
        "data": {
            "next_step": step,
            "seed": run.seed,
            "batch_size": run.batch_size,
            "micro_batch_size": run.micro_batch_size,
            "grad_accum": zero.grad_accum,
            "world_size": engine.world,
            "corpus_chars": int(tokens.size),
            "corpus_crc32": corpus_crc32(tokens),
        },
        "rng": {
            "batches": "numpy default_rng([seed, step]) per step: no state to carry",
            "init": f"numpy default_rng({run.seed}), used once at step 0",
        },
        "config": {
            "run": {k: v for k, v in asdict(run).items() if k != "lr_schedule"},
            "zero": zero.flat(),  # the settings by name, as before ZeroConfig had groups
        },
    }


TRAINING_KEYS = (("config", "run"), ("config", "zero"), ("data", "corpus_crc32"), ("lr_schedule",))


def corpus_crc32(tokens: np.ndarray) -> int:
    """The corpus's fingerprint in a manifest: a resume on other text is reported."""
    return zlib.crc32(np.ascontiguousarray(tokens).data)


def open_checkpoint(parsed: Parsed, model: Model, trace=None) -> Checkpoint:
    """The checkpoint --resume names, checked against the model these flags build and
    against the run's length (on every rank alike, before any state exists: a problem
    is one message from rank 0, exit 2); its later checks and reads are timed on
    `trace` (--trace)."""
    checkpoint = Checkpoint(parsed.run.resume, trace)
    training = checkpoint.manifest["training"]
    for path in TRAINING_KEYS:
        entry = training
        for key in path:
            if not isinstance(entry, dict) or key not in entry:
                where = checkpoint.folder / MANIFEST
                raise CheckpointError(f"{where}: the manifest has no training.{'.'.join(path)}")
            entry = entry[key]
    checkpoint.check_model(model, _model_flag_hint(checkpoint, parsed))
    run = parsed.run
    end, flag = (run.stop_at_step, "--stop-at-step") if run.stop_at_step else (run.steps, "--steps")
    if checkpoint.step > end:
        raise CheckpointError(
            f"--resume {checkpoint.folder}: it was saved after step {checkpoint.step}, past "
            f"{flag} {end}; give a later {flag} to train on"
        )
    return checkpoint


def resume_engine(checkpoint: Checkpoint, comm, build) -> tuple[Any, int, dict[str, Any]]:
    """Verify every file (all ranks together), build the engine from the checkpoint's
    parameters (`build()`: the sharded init, reading only this rank's share) and
    restore AdamW's state. Returns the engine, the step to continue after, and a
    record of what loading took (the slowest rank's time)."""
    t0 = time.perf_counter()
    verify_everywhere(checkpoint, comm)  # a damaged file stops every rank here
    verify_s = time.perf_counter() - t0
    engine = build()
    first = restore(engine, checkpoint)
    load_s = comm.allreduce_max_float64(time.perf_counter() - t0, kind="checkpoint")
    record = {"resumed_from": str(checkpoint.folder), "after_step": first}
    return (
        engine,
        first,
        record | {"bytes": checkpoint.total_bytes(), "verify_s": verify_s, "load_s": load_s},
    )


def announce_resume(checkpoint, parsed, world, tokens, loaded, console, log) -> None:
    """Rank 0's lines about the resume (every setting that changed, in every mode),
    and its --log-jsonl record."""
    for line in describe_resume(checkpoint, parsed, world):
        console.always(line)
    if checkpoint.manifest["training"]["data"]["corpus_crc32"] != corpus_crc32(tokens):
        console.always("resume: the corpus differs from the one the checkpoint saw")
    last = parsed.run.stop_at_step or parsed.run.steps
    if checkpoint.step == last:
        console.always(f"resume: the checkpoint is at step {last} already: nothing to train")
    size, seconds = loaded["bytes"], loaded["load_s"]
    console.say(
        f"loaded {size / 1e6:,.1f} MB in {seconds:.2f} s ({size / seconds / 1e9:.2f} GB/s, "
        f"CRC-32 checks {loaded['verify_s']:.2f} s of it)"
    )
    if log:
        log.write(loaded)


class Saver:
    """--save-dir: a checkpoint after the steps asked for (a collective). The folder's
    room for the whole run's saves (those --keep-last keeps beside the one being
    written) is checked when the saver is made, before the first step, and the room
    for each save again before it (zero_ref/checkpoint/space.py); `free_bytes`
    measures it."""

    def __init__(
        self,
        parsed: Parsed,
        engine,
        tokens,
        console,
        log,
        first: int = 0,
        free_bytes: FreeBytes = disk_free_bytes,
    ) -> None:
        self.parsed, self.engine, self.tokens, self.console = parsed, engine, tokens, console
        self.log = log  # rank 0's --log-jsonl, or None
        self.free_bytes = free_bytes
        self.last_saved: int | None = None
        run = parsed.run
        last = min(run.steps, run.stop_at_step or run.steps)
        if run.save_dir and last > first:
            self.check_run_space(save_steps(first, last, run.save_every))

    def check_run_space(self, steps: list[int]) -> None:
        """SaveSpaceError on every rank if the folder cannot hold the saves after `steps`
        that are on disk at once; the last save's manifest is the widest."""
        training = training_record(self.parsed, steps[-1], self.engine, self.tokens)
        run = self.parsed.run
        folder, keep = run.save_dir, run.keep_last
        check_run_space(self.engine, folder, steps, keep, training, self.free_bytes)

    def check_space(self, step: int) -> int:
        """The bytes a save after `step` needs; SaveSpaceError on every rank if the
        folder has less."""
        training = training_record(self.parsed, step, self.engine, self.tokens)
        run = self.parsed.run
        return check_save_space(self.engine, run.save_dir, step, training, self.free_bytes)

    def save(self, step: int) -> None:
        run = self.parsed.run
        self.check_space(step)  # the previous checkpoint stays as it is
        training = training_record(self.parsed, step, self.engine, self.tokens)
        with self.engine.comm.ledger.off_the_books():
            result = save_checkpoint(self.engine, run.save_dir, step, training, run.keep_last)
        for name in result.removed:
            self.console.always(f"removed {name}, left by a save that was killed")
        self.console.say(result.describe())
        for name in result.pruned:
            self.console.say(f"removed checkpoint {name} (--keep-last {run.keep_last})")
        if self.log:
            folder, size, seconds = str(result.folder), result.bytes, result.seconds
            record = {"checkpoint": folder, "after_step": step, "bytes": size, "save_s": seconds}
            self.log.write(record)
        self.last_saved = step


def verify_everywhere(checkpoint: Checkpoint, comm) -> None:
    """Every rank checks a share of the saved files (size, CRC-32, tensors); all ranks
    then raise the same error if any file is bad, before any state changes."""
    mine = checkpoint.verify(range(comm.rank, checkpoint.world_size, comm.size))
    problems = [p for share in comm.mpi.allgather(mine) for p in share]
    if problems:
        raise CheckpointError("cannot resume: " + "; ".join(problems))


def restore(engine, checkpoint: Checkpoint) -> int:
    """AdamW's m and v, its step count and fp16's loss scaler into an engine built from
    the checkpoint's parameters; returns the run step to continue after. A scaler
    saved by an fp16 run resumes exactly; an fp16 run from another precision's
    checkpoint starts its scaler afresh."""
    for kind in ("exp_avg", "exp_avg_sq"):
        engine.load_state(kind, checkpoint.source(kind))
    engine.step_count = int(checkpoint.manifest["optimizer_steps"])
    saved = checkpoint.manifest.get("loss_scaler")
    if engine.scaler is not None and saved is not None:
        engine.scaler = LossScaleState(**saved)
    return checkpoint.step


def describe_resume(checkpoint: Checkpoint, parsed: Parsed, world: int) -> list[str]:
    """What resuming does: from where, and every setting that differs from the saved run's."""
    m = checkpoint.manifest
    lines = [
        f"resuming from {checkpoint.folder} after step {m['step']} "
        f"(saved by {m['world_size']} ranks at stage {m['stage']}; now {world} ranks at "
        f"stage {parsed.zero.stage})"
    ]
    saved = m["training"]["config"]
    now = {"run": asdict(parsed.run), "zero": parsed.zero.flat()}
    ignore = {  # where the run writes and what it shows: not how it trains
        *("resume", "save_dir", "save_every", "keep_last", "stop_at_step", "init"),
        *("quiet", "log_every", "log_jsonl", "export", "sample_chars", "check_oracle"),
        *("print_params", "lr_schedule", "trace"),
    }
    for part in ("run", "zero"):
        for key, value in saved[part].items():
            new = now[part].get(key)
            if key not in ignore and _plain(new) != value:
                lines.append(f"resume: {key} was {value!r}, now {_plain(new)!r}")
    schedule = asdict(parsed.run.lr_schedule)
    if m["training"]["lr_schedule"] != schedule:
        lines.append(f"resume: lr schedule was {m['training']['lr_schedule']}, now {schedule}")
    return lines


def _plain(value: Any) -> Any:
    """A value as it reads back from JSON (tuples become lists)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _model_flag_hint(checkpoint: Checkpoint, parsed: Parsed) -> str:
    saved = checkpoint.manifest["training"].get("config", {}).get("run", {})
    now = asdict(parsed.run)
    diffs = [
        f"--{k.replace('_', '-')} {saved[k]} there, {now[k]} here"
        for k in MODEL_FLAGS
        if k in saved and saved[k] != now[k]
    ]
    if saved.get("data") != now["data"]:
        diffs.append(f"--data {saved.get('data')} there, {now['data']} here")
    return f" ({'; '.join(diffs)})" if diffs else ""
