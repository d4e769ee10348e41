"""The main job: `mpirun -n 4 python -m zero_ref.train` trains a character-level
language model with ZeRO, printing the loss as it goes and, at the end, each
rank's memory and communication ledgers beside the paper's formulas."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence

import numpy as np

from zero_ref import __version__
from zero_ref.app.agreement import check_same_job, job_parts
from zero_ref.app.cli import Parsed, parse_args
from zero_ref.app.data import encode_corpus, load_text, unigram_entropy
from zero_ref.app.failure import step_started
from zero_ref.app.output_paths import check_output_paths, output_paths, remove_stale_temporaries
from zero_ref.app.process_memory import PhasePeaks
from zero_ref.app.progress import Progress
from zero_ref.app.report import comm_table, memory_table, rank_report, rss_table
from zero_ref.app.resume import Saver, announce_resume, open_checkpoint, resume_engine
from zero_ref.app.tasks import Task, build_task, describe_params
from zero_ref.comm.ledger import expected_sent_bytes, paper_sent_bytes
from zero_ref.engine.init_source import FileInit, InitSource, RandomInit
from zero_ref.engine.memory import formula_bytes
from zero_ref.io.metrics_log import JsonlLog
from zero_ref.io.tensor_io import SafetensorsWriter
from zero_ref.io.trace import Trace, write_trace
from zero_ref.layout.flat import tensor_views
from zero_ref.threads import settle_thread_budget


def device_line(engine, comm) -> str:
    """With --device gpu: which device, and how its buffers reach MPI (docs/gpu.md)."""
    if getattr(engine.place, "description", None) is None:
        return ""
    return f"; device: {engine.place.description}; {comm.path}"


def resume_args(checkpoint, world: int, stage: int) -> dict:
    """The trace's "resume" event: the checkpoint as saved, and who reads it now."""
    return {
        "checkpoint": str(checkpoint.folder),
        "step": checkpoint.step,
        "saved": checkpoint.saved_layout(),
        "resumed": {"world_size": world, "stage": stage},
    }


def attach_trace(trace: Trace, engine, comm) -> None:
    """Everything that records events: the engine's units and update (and its saves,
    zero_ref/checkpoint/writer.py), the ledger's collectives and copies, the
    offloaded update's swap reads, AdamW sub-groups and writes."""
    engine.trace = comm.ledger.trace = trace
    if engine.offloaded is not None:
        engine.offloaded.trace = trace


def prepare(parsed: Parsed, world: int) -> tuple[Task, InitSource, object, np.ndarray, object]:
    """Corpus, task and where the initial parameters come from: all checks before the
    first collective. No parameter is drawn or read yet: each rank will take only its
    own share (zero_ref/engine/init_source.py). With --resume the checkpoint's
    manifest is read and checked against the model here."""
    run, zero = parsed.run, parsed.zero
    check_output_paths(run)  # before any work: a bad --export must not cost a run
    vocab, tokens = encode_corpus(load_text(run.data))
    task = build_task(run, vocab, tokens, world, zero.grad_accum)
    task.batches(0)  # a corpus too short for one batch fails here, on every rank alike
    checkpoint = None
    if run.resume:
        checkpoint = open_checkpoint(parsed, task.model)  # checked before any state exists
        init = checkpoint.source("param")
    elif run.init:
        init = FileInit(run.init, task.model)
    else:
        init = RandomInit(task.model, run.seed)
    return task, init, vocab, tokens, checkpoint


def train(parsed: Parsed, mpi_comm) -> None:
    from zero_ref.app.oracle_check import OracleCheck
    from zero_ref.comm.choose import comm_for
    from zero_ref.comm.collectives import ranks_sharing_this_host
    from zero_ref.engine import make_engine

    run, zero = parsed.run, parsed.zero
    comm = comm_for(mpi_comm, zero)
    budget = settle_thread_budget(ranks_sharing_this_host(mpi_comm))
    # what libraries set up once is part of the baseline, not of ZeRO's memory (on the host
    # Comm: a GPU run's staging buffers would otherwise keep the warm-up's size)
    warm_up(getattr(comm, "host_comm", comm))
    phases = PhasePeaks()
    task, init, vocab, tokens, checkpoint = prepare(parsed, comm.size)
    parts = job_parts(run, zero, task.model, vocab.chars, tokens, __version__, checkpoint)
    check_same_job(mpi_comm, parts)  # before any collective of training (issue 14)
    refuse_if_it_cannot_fit(parsed, task, comm, budget.ranks_on_host)
    trace = Trace(comm.rank) if run.trace else None  # --trace (docs/stages.md)
    if trace is not None and checkpoint:  # a resume's checks and reads are events too
        checkpoint.trace = trace
        trace.instant("resume", "checkpoint", **resume_args(checkpoint, comm.size, zero.stage))
    build = lambda: make_engine(task.model, init, zero, comm)  # noqa: E731
    engine, first, loaded = (
        resume_engine(checkpoint, comm, build) if checkpoint else (build(), 0, None)
    )
    phases.end("init")
    progress = Progress(run, comm.rank == 0, first)
    progress.say(
        f"zero_ref {__version__}: {run.model}, stage {zero.stage}, {comm.size} ranks, "
        f"{engine.layout.numel:,} parameters, vocab {vocab.size}, "
        f"{'deterministic' if zero.deterministic else 'fast'} mode; corpus {tokens.size:,} "
        f"characters, unigram entropy {unigram_entropy(tokens):.3f} nats/char"
        + f"; {budget.describe()}"
        + device_line(engine, comm)
    )
    for note in parsed.notes:
        progress.always(note)
    report_stale_swap(engine, progress)
    check = OracleCheck(engine, zero, task.model) if run.check_oracle else None
    log = open_log(run, comm.rank == 0, progress, first if checkpoint else None)
    if checkpoint:
        announce_resume(checkpoint, parsed, comm.size, tokens, loaded, progress, log)
    saver = Saver(parsed, engine, tokens, progress, log, first)  # checks the room for a save
    if trace is not None:  # from the first step on: units, collectives, the update, saves
        attach_trace(trace, engine, comm)
    last = min(run.steps, run.stop_at_step or run.steps)
    skipped = 0  # steps skipped for a NaN/Inf gradient (fp16: an overflow)
    for step in range(first, last):
        step_started(step + 1, engine)  # for error messages; fires ZERO_REF_INJECT_FAULT
        if trace is not None:
            trace.step = step + 1  # names the optimizer step, skipped or not
        inputs, targets = task.batches(step)
        lr = run.lr_schedule(step + 1)
        t0 = time.perf_counter()
        result = engine.train_step(inputs[:, comm.rank], targets[:, comm.rank], lr=lr)
        step_s = time.perf_counter() - t0
        record = {
            "step": step + 1,
            "loss": result.loss,
            "lr": lr,
            "grad_norm": result.grad_norm,
            "tokens_per_s": task.tokens_per_step / step_s,
            "step_time_s": step_s,
            "sent_bytes": comm.ledger.last_step_sent_bytes(),
            "skipped": result.skipped,
            "loss_scale": result.loss_scale,
        }
        skipped += result.skipped
        if trace is not None:
            trace.counter("ledger bytes", engine.memory.bytes_by_category())
            buffers = engine.memory.held["buffers"].items()
            trace.counter("ledger buffers", {name: int(a.nbytes) for name, a in buffers})
        if check:
            record["oracle_max_abs_diff"] = check.after_step(result, inputs, targets, lr)
        progress.update(record)
        if log:
            log.write(record)
        if run.save_every and (step + 1) % run.save_every == 0:
            saver.save(step + 1)
    progress.close()
    phases.end("train")
    if check:
        progress.always(check.describe())
    if skipped or zero.precision == "fp16":
        scale = f", loss scale now {engine.loss_scale():g}" if engine.scaler else ""
        progress.always(f"{skipped} of {last - first} steps skipped (NaN/Inf gradients){scale}")
    if checkpoint:
        checkpoint.close()
    if run.save_dir and last > first and saver.last_saved != last:
        saver.save(last)  # always at the end (not when nothing was trained)
    finish(parsed, engine, task, log, phases, skipped, unigram_entropy(tokens))
    engine.close()  # swap files are scratch: removed at a clean end


def report_stale_swap(engine, progress: Progress) -> None:
    """Swap folders a killed run left under --nvme-path, removed at this start (all
    ranks' counts, said once)."""
    stale = [str(p) for p in engine.nvme.stale] if engine.nvme is not None else []
    everyone = engine.comm.mpi.gather(stale, root=0)
    if engine.rank == 0 and any(everyone):
        found = [p for rank in everyone for p in rank]
        progress.always(f"removed {len(found)} swap folder(s) a killed run left: {found[0]} ...")


def refuse_if_it_cannot_fit(parsed: Parsed, task: Task, comm, ranks_on_host: int) -> None:
    """Before any allocation: each rank's estimated peak against the memory its host has
    for it. Rank 0's reading of MemAvailable is used by all, so all decide alike."""
    from zero_ref.estimate import check_fits, mem_available_bytes

    available = comm.mpi.bcast(mem_available_bytes() if comm.rank == 0 else None, root=0)
    check_fits(parsed, task.model, comm.size, ranks_on_host, available)


def warm_up(comm) -> None:
    """Let every library do its one-time setup now, at sizes that do not depend on the
    model, so the baseline the memory report subtracts holds it: Numba loads (or
    compiles) its kernels, BLAS allocates its work buffers, Python imports the modules
    a run uses, NumPy's layer code runs once on a tiny GPT, and MPI maps the shared
    memory its collectives use (1 MiB per rank, off the ledger). What is left above
    the baseline then grows with the model: ZeRO's arrays and the activations."""
    import zero_ref.app.oracle_check  # noqa: F401 (imported for its one-time cost)
    import zero_ref.app.resume  # noqa: F401
    import zero_ref.engine  # noqa: F401
    import zero_ref.estimate  # noqa: F401
    from zero_ref.config import AdamWConfig
    from zero_ref.models.gpt import GPT, GPTConfig
    from zero_ref.models.unit import init_params, loss_and_grads
    from zero_ref.optim.adamw import adamw_kernel, adamw_scalars
    from zero_ref.optim.gradnorm import sumsq_bins, sumsq_fast

    x = np.zeros(1, np.float32)
    adamw_kernel(x, x.copy(), x.copy(), x.copy(), adamw_scalars(AdamWConfig(), 1))
    sumsq_bins(x)
    sumsq_fast(x)
    a = np.ones((256, 256), np.float32)
    a @ a
    tiny = GPT(GPTConfig(vocab_size=5, context=4, n_layer=1, n_head=1, d_model=4))
    ids = np.zeros((1, 4), np.int32)
    loss_and_grads(tiny, init_params(tiny, 0), ids, ids)
    per_rank = 1 << 18  # float32 elements: 1 MiB
    whole = np.zeros(per_rank * comm.size, np.float32)
    with comm.ledger.off_the_books():
        comm.allgather(whole[:per_rank].copy(), whole, kind="warm-up")
        comm.reduce_scatter_sum(whole, np.empty(per_rank, np.float32))


def open_log(
    run, is_root: bool, progress: Progress, after_step: int | None = None
) -> JsonlLog | None:
    """Rank 0's --log-jsonl, after removing what a killed earlier writer left; a resumed
    run continues the log after its checkpoint's step."""
    if not is_root:
        return None
    for path in output_paths(run).values():
        for stale in remove_stale_temporaries(path):
            progress.always(f"removed {stale}, left by a writer that was killed")
    return JsonlLog(run.log_jsonl, after_step) if run.log_jsonl else None


def finish(
    parsed: Parsed,
    engine,
    task: Task,
    log: JsonlLog | None,
    phases: PhasePeaks,
    skipped: int = 0,
    entropy: float | None = None,
) -> None:
    """Export, sample, ledgers: the collectives first, then rank 0 alone. Nothing here
    needs the whole model on any rank: both stream it one unit at a time."""
    run, zero = parsed.run, parsed.zero
    with engine.comm.ledger.off_the_books():
        if run.export:
            export(engine, run.export)
        sample = sample_text(engine, task, run) if run.sample_chars else None
    phases.end("finish")
    if engine.trace is not None:
        everyone = engine.comm.mpi.gather(engine.trace.events, root=0)
        if engine.rank == 0:
            write_trace(run.trace, everyone)
            print(f"trace of {len(everyone)} ranks written to {run.trace} (ui.perfetto.dev)")
    reports = engine.comm.mpi.gather(rank_report(engine, phases), root=0)
    if engine.rank != 0:
        return
    if run.export:
        print(f"exported consolidated parameters to {run.export}")
    numel, world, k = engine.layout.full_numel, engine.world, zero.grad_accum
    unit_numels = [u.padded_numel for u in engine.layout.units]
    sizes = engine.precision.bytes
    print(memory_table(reports, zero.stage, numel, world, k, sizes, zero.precision))
    print(rss_table(reports))
    print(comm_table(reports, zero.stage, unit_numels, world, k, sizes))
    if log:
        log.write(
            {
                "final": True,
                "model": run.model,
                "unigram_entropy": entropy,  # nats/char: a model that ignores context
                "stage": zero.stage,
                "world_size": world,
                "numel_padded": numel,
                "precision": zero.precision,
                "element_bytes": dataclasses.asdict(sizes),
                "formula_bytes": formula_bytes(zero.stage, numel, world, k, sizes),
                "unit_padded_numels": unit_numels,
                "paper_sent_bytes": paper_sent_bytes(zero.stage, numel, world, 1, sizes.param),
                "expected_sent_bytes": expected_sent_bytes(
                    zero.stage, unit_numels, world, k, sizes
                ),
                "skipped_steps": skipped,
                "loss_scale": engine.loss_scale(),
                "ranks": reports,
            }
        )
        log.close()
    if sample is not None:
        print("sample:\n" + sample, flush=True)


def export(engine, path: str) -> None:
    """Stream the parameters to rank 0, which writes each tensor as it arrives, into a
    temporary file renamed into place at the end (a collective)."""
    writer = None
    if engine.rank == 0:
        writer = SafetensorsWriter(path, engine.layout.named_shapes())

    def write(kind: str, unit, flat) -> None:
        for name, tensor in tensor_views(flat, unit).items():
            writer.write(f"{unit.name}.{name}", tensor)

    try:
        engine.stream_state(["param"], write)
    except BaseException:
        if writer:
            writer.abort()
        raise
    if writer:
        writer.close()


def sample_text(engine, task: Task, run) -> str | None:
    """Text from the trained model, every rank running the forward (stage 3 gathers
    unit by unit); rank 0's logits are broadcast so all ranks draw the same ids."""

    def forward(ids: np.ndarray) -> np.ndarray:
        out = np.ascontiguousarray(engine.forward(ids))
        engine.comm.broadcast(out, kind="sample")
        return out

    text = task.sample(forward, run.sample_chars, run.seed)
    return text if engine.rank == 0 else None


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
            task, *_ = prepare(parsed, world.size)
            if world.rank == 0:
                print(describe_params(task.model, world.size))
            return 0
        train(parsed, world)
    return guard.exit_code


if __name__ == "__main__":
    sys.exit(main())
