"""The main job: `mpirun -n 4 python -m zero_ref.train` trains a character-level
language model with ZeRO, printing the loss as it goes and, at the end, each
rank's memory and communication ledgers beside the paper's formulas.

This module is the run's order: set up (zero_ref/app/run_setup.py: the corpus, the
checks, the warm-up; then the engine, new or resumed), the steps, and the end
(zero_ref/app/run_finish.py: export, sample, trace, report).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zero_ref import __version__
from zero_ref.app.agreement import check_same_job, job_parts
from zero_ref.app.cli import Parsed, parse_args
from zero_ref.app.console import Console
from zero_ref.app.data import unigram_entropy
from zero_ref.app.failure import step_started
from zero_ref.app.process_memory import PhasePeaks
from zero_ref.app.resume import Saver, announce_resume, resume_engine
from zero_ref.app.run_finish import finish
from zero_ref.app.run_setup import (
    Prepared,
    device_line,
    open_log,
    prepare,
    refuse_if_it_cannot_fit,
    report_stale_swap,
    resume_args,
    warm_up,
)
from zero_ref.app.tasks import describe_params
from zero_ref.io.metrics_log import JsonlLog
from zero_ref.io.trace import Trace
from zero_ref.runtime.threads import settle_thread_budget

if TYPE_CHECKING:  # imported where they run: each brings MPI, or a run's one-time cost
    from zero_ref.app.oracle_check import OracleCheck
    from zero_ref.comm.collectives import Comm


@dataclass
class Training:
    """One run's parts, made before step one, used by the steps and the end."""

    parsed: Parsed
    engine: Any  # a zero_ref.engine stage
    job: Prepared
    first: int  # the step this run starts after (a resumed run: the checkpoint's)
    phases: PhasePeaks
    console: Console
    log: JsonlLog | None
    saver: Saver
    check: OracleCheck | None
    trace: Trace | None

    @property
    def last(self) -> int:
        """The step this run stops after (--steps, or --stop-at-step before it)."""
        run = self.parsed.run
        return min(run.steps, run.stop_at_step or run.steps)


def train(parsed: Parsed, mpi_comm) -> None:
    """One run: set up (every check first, then the engine, new or resumed), the steps,
    the end (the last save, the ledgers' report, the swap files removed)."""
    t = set_up(parsed, mpi_comm)
    skipped = train_steps(t)
    end_training(t, skipped)


def set_up(parsed: Parsed, mpi_comm) -> Training:
    """Everything before step one, in order: the Comm and the thread budget, the
    libraries' warm-up (the memory baseline), the checks (the corpus, the same job on
    every rank, the memory it needs), the engine, the first line, the outputs."""
    from zero_ref.comm.choose import comm_for
    from zero_ref.comm.collectives import ranks_sharing_this_host

    run, zero = parsed.run, parsed.zero
    comm = comm_for(mpi_comm, zero)
    budget = settle_thread_budget(ranks_sharing_this_host(mpi_comm))
    # what libraries set up once is part of the baseline, not of ZeRO's memory (on the host
    # Comm: a GPU run's staging buffers would otherwise keep the warm-up's size)
    warm_up(comm.host_comm)
    phases = PhasePeaks()
    trace = Trace(comm.rank) if run.trace else None  # --trace (docs/stages.md)
    job = prepare(parsed, comm.size, trace)
    model, chars, tokens = job.task.model, job.vocab.chars, job.tokens
    parts = job_parts(run, zero, model, chars, tokens, __version__, job.checkpoint)
    check_same_job(mpi_comm, parts)  # before any collective of training (issue 14)
    refuse_if_it_cannot_fit(parsed, job.task, comm, budget.ranks_on_host)
    engine, first, loaded = build_engine(parsed, job, comm, trace)
    phases.end("init")
    console = Console(run, comm.rank == 0, first)
    console.say(first_line(parsed, job, engine) + f"; {budget.describe()}" + device_line(engine))
    check, log, saver = start(parsed, job, engine, first, loaded, console)
    if trace is not None:  # from the first step on: units, collectives, the update, saves
        engine.attach_trace(trace)
    return Training(parsed, engine, job, first, phases, console, log, saver, check, trace)


def build_engine(parsed: Parsed, job: Prepared, comm: Comm, trace: Trace | None):
    """The engine, new or (--resume) from the checkpoint, whose checks and reads are
    events on the trace; returns it, the step it starts after, and what loading took."""
    from zero_ref.engine.ladder import make_engine

    build = lambda: make_engine(job.task.model, job.init, parsed.zero, comm)  # noqa: E731
    if job.checkpoint is None:
        return build(), 0, None
    if trace is not None:
        resumed = resume_args(job.checkpoint, comm.size, parsed.zero.stage)
        trace.instant("resume", "checkpoint", **resumed)
    return resume_engine(job.checkpoint, comm, build)


def start(parsed: Parsed, job: Prepared, engine, first: int, loaded: dict | None, console):
    """The notes, the stale swap folders, the oracle check, the log, the resume's lines
    and the saver (which checks the room for a save): (check, log, saver)."""
    from zero_ref.app.oracle_check import OracleCheck

    run, checkpoint = parsed.run, job.checkpoint
    for note in parsed.notes:
        console.always(note)
    report_stale_swap(engine, console)
    check = OracleCheck(engine, parsed.zero, job.task.model) if run.check_oracle else None
    log = open_log(run, engine.rank == 0, console, first if checkpoint else None)
    if checkpoint:
        announce_resume(checkpoint, parsed, engine.world, job.tokens, loaded, console, log)
    saver = Saver(parsed, engine, job.tokens, console, log, first)
    return check, log, saver


def train_steps(t: Training) -> int:
    """Steps first+1 .. last, each logged, checked and saved as asked; returns how many
    were skipped for a NaN/Inf gradient (fp16: an overflow)."""
    save_every, skipped = t.parsed.run.save_every, 0
    for step in range(t.first + 1, t.last + 1):
        record = train_step(t, step)
        skipped += record["skipped"]
        t.console.update(record)
        if t.log:
            t.log.write(record)
        if save_every and step % save_every == 0:
            t.saver.save(step)
    t.console.close()
    t.phases.end("train")
    return skipped


def train_step(t: Training, step: int) -> dict:
    """Optimizer step `step` (from 1) on this rank's share of the batch: its record."""
    engine, task, rank = t.engine, t.job.task, t.engine.rank
    step_started(step, engine)  # for error messages; fires ZERO_REF_INJECT_FAULT
    if t.trace is not None:
        t.trace.step = step  # names the optimizer step, skipped or not
    inputs, targets = task.batches(step - 1)
    lr = t.parsed.run.lr_schedule(step)
    t0 = time.perf_counter()
    result = engine.train_step(inputs[:, rank], targets[:, rank], lr=lr)
    step_s = time.perf_counter() - t0
    record = {
        "step": step,
        "loss": result.loss,
        "lr": lr,
        "grad_norm": result.grad_norm,
        "tokens_per_s": task.tokens_per_step / step_s,
        "step_time_s": step_s,
        "sent_bytes": engine.comm.ledger.last_step_sent_bytes(),
        "skipped": result.skipped,
        "loss_scale": result.loss_scale,
    }
    if t.trace is not None:
        t.trace.counter("ledger bytes", engine.memory_report()["memory_bytes"])
        t.trace.counter("ledger buffers", engine.buffer_bytes())
    if t.check:
        record["oracle_max_abs_diff"] = t.check.after_step(result, inputs, targets, lr)
    return record


def end_training(t: Training, skipped: int) -> None:
    """The oracle's summary, the skipped steps, the last save, the report, the cleanup."""
    engine, run, checkpoint = t.engine, t.parsed.run, t.job.checkpoint
    if t.check:
        t.console.always(t.check.describe())
    if skipped or t.parsed.zero.mixed_precision.dtype == "fp16":
        scale = f", loss scale now {engine.loss_scale():g}" if engine.scaler else ""
        steps = f"{skipped} of {t.last - t.first} steps"
        t.console.always(f"{steps} skipped (NaN/Inf gradients){scale}")
    if checkpoint:
        checkpoint.close()
    if run.save_dir and t.last > t.first and t.saver.last_saved != t.last:
        t.saver.save(t.last)  # always at the end (not when nothing was trained)
    finish(t.parsed, engine, t.job, t.log, t.phases, t.trace, skipped)
    engine.close()  # swap files are scratch: removed at a clean end


def first_line(parsed: Parsed, job: Prepared, engine) -> str:
    """The run's first line: version, model, stage, ranks, sizes, mode and corpus."""
    run, zero, tokens = parsed.run, parsed.zero, job.tokens
    return (
        f"zero_ref {__version__}: {run.model}, stage {zero.stage}, {engine.world} ranks"
        f"{_hybrid_phrase(engine)}, "
        f"{engine.layout.numel:,} parameters, vocab {job.vocab.size}, "
        f"{'deterministic' if zero.deterministic else 'fast'} mode; corpus {tokens.size:,} "
        f"characters, unigram entropy {unigram_entropy(tokens):.3f} nats/char"
    )


def _hybrid_phrase(engine) -> str:
    """With hybrid sharding: how the ranks are grouped (engine/hybrid.py)."""
    if engine.cfg.hybrid.shard_size is None:
        return ""
    groups = engine.hybrid.replicas
    return f" (hybrid sharding: {groups} groups of {engine.shard_world}, replicated)"


def main(argv: Sequence[str] | None = None) -> int:
    from mpi4py import MPI

    from zero_ref.app.failure import FailureGuard

    world = MPI.COMM_WORLD
    # Bad input on every rank: one message from rank 0, exit 2. Any other failure,
    # on any rank: that rank's message, then MPI_Abort ends the whole job.
    with FailureGuard(world, "zero_ref.train") as guard:  # UsageError is a ValueError
        try:
            parsed = parse_args(argv, world.size, world.rank)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        if parsed.run.print_params:
            job = prepare(parsed, world.size)
            if world.rank == 0:
                print(describe_params(job.task.model, world.size))
            return 0
        train(parsed, world)
    return guard.exit_code


if __name__ == "__main__":
    sys.exit(main())
