"""The main job: `mpirun -n 4 python -m zero_ref.train` trains a character-level
language model with ZeRO, printing the loss as it goes and, at the end, each
rank's memory and communication ledgers beside the paper's formulas."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np

from zero_ref import __version__
from zero_ref.cli import Parsed, UsageError, parse_args
from zero_ref.comm_ledger import paper_sent_bytes
from zero_ref.data import encode_corpus, load_text, unigram_entropy
from zero_ref.failure import step_started
from zero_ref.memory import fp32_formula_bytes
from zero_ref.metrics_log import JsonlLog
from zero_ref.models.unit import init_params
from zero_ref.output_paths import check_output_paths, output_paths, remove_stale_temporaries
from zero_ref.progress import Progress
from zero_ref.report import comm_table, memory_table, rank_report
from zero_ref.tasks import Task, build_task, describe_params
from zero_ref.tensor_io import load_named, save_safetensors


def prepare(parsed: Parsed, world: int) -> tuple[Task, dict, object, np.ndarray]:
    """Corpus, task and initial parameters: all checks before the first collective."""
    run, zero = parsed.run, parsed.zero
    check_output_paths(run)  # before any work: a bad --export must not cost a run
    vocab, tokens = encode_corpus(load_text(run.data))
    task = build_task(run, vocab, tokens, world, zero.grad_accum)
    task.batches(0)  # a corpus too short for one batch fails here, on every rank alike
    init = load_named(run.init) if run.init else init_params(task.model, run.seed)
    return task, init, vocab, tokens


def train(parsed: Parsed, mpi_comm) -> None:
    from zero_ref.comm import comm_for
    from zero_ref.oracle_check import OracleCheck
    from zero_ref.stages import make_engine

    run, zero = parsed.run, parsed.zero
    comm = comm_for(mpi_comm, zero)
    task, init, vocab, tokens = prepare(parsed, comm.size)
    engine = make_engine(task.model, init, zero, comm)
    progress = Progress(run, comm.rank == 0)
    progress.say(
        f"zero_ref {__version__}: {run.model}, stage {zero.stage}, {comm.size} ranks, "
        f"{engine.layout.numel:,} parameters, vocab {vocab.size}, "
        f"{'deterministic' if zero.deterministic else 'fast'} mode; corpus {tokens.size:,} "
        f"characters, unigram entropy {unigram_entropy(tokens):.3f} nats/char"
    )
    for note in parsed.notes:
        progress.always(note)
    check = OracleCheck(engine, init, zero, task.model) if run.check_oracle else None
    log = open_log(run, comm.rank == 0, progress)
    for step in range(run.steps):
        step_started(step + 1, engine)  # for error messages; fires ZERO_REF_INJECT_FAULT
        inputs, targets = task.batches(step)
        lr = run.lr_schedule(step + 1)
        t0 = time.perf_counter()
        result = engine.train_step(inputs[:, comm.rank], targets[:, comm.rank], lr=lr)
        step_s = time.perf_counter() - t0
        record = {
            "step": result.step,
            "loss": result.loss,
            "lr": lr,
            "grad_norm": result.grad_norm,
            "tokens_per_s": task.tokens_per_step / step_s,
            "step_time_s": step_s,
            "sent_bytes": comm.ledger.last_step_sent_bytes(),
            "skipped": result.skipped,
        }
        if check:
            record["oracle_max_abs_diff"] = check.after_step(result, inputs, targets, lr)
        progress.update(record)
        if log:
            log.write(record)
    progress.close()
    if check:
        progress.always(check.describe())
    finish(parsed, engine, task, log)


def open_log(run, is_root: bool, progress: Progress) -> JsonlLog | None:
    """Rank 0's --log-jsonl, after removing what a killed earlier writer left."""
    if not is_root:
        return None
    for path in output_paths(run).values():
        for stale in remove_stale_temporaries(path):
            progress.always(f"removed {stale}, left by a writer that was killed")
    return JsonlLog(run.log_jsonl) if run.log_jsonl else None


def finish(parsed: Parsed, engine, task: Task, log: JsonlLog | None) -> None:
    """Export, ledgers, sample: the collectives first, then rank 0 alone."""
    run, zero = parsed.run, parsed.zero
    with engine.comm.ledger.off_the_books():
        full = engine.full_parameters()  # a collective at stage 3
    reports = engine.comm.mpi.gather(rank_report(engine), root=0)
    if engine.rank != 0:
        return
    if run.export:
        save_safetensors(run.export, full)
        print(f"exported consolidated parameters to {run.export}")
    numel, world, k = engine.layout.full_numel, engine.world, zero.grad_accum
    print(memory_table(reports, zero.stage, numel, world, k))
    print(comm_table(reports, zero.stage, numel, world, k))
    if log:
        log.write(
            {
                "final": True,
                "model": run.model,
                "stage": zero.stage,
                "world_size": world,
                "numel_padded": numel,
                "formula_bytes": fp32_formula_bytes(zero.stage, numel, world, k),
                "paper_sent_bytes": paper_sent_bytes(zero.stage, numel, world, k),
                "ranks": reports,
            }
        )
        log.close()
    if run.sample_chars:
        print("sample:\n" + task.sample(full, run.sample_chars, run.seed), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    from mpi4py import MPI

    from zero_ref.failure import FailureGuard

    world = MPI.COMM_WORLD
    # Bad input on every rank: one message from rank 0, exit 2. Any other failure,
    # on any rank: that rank's message, then MPI_Abort ends the whole job.
    bad_input = (UsageError, ValueError, FileNotFoundError)
    with FailureGuard(world, "zero_ref.train", input_errors=bad_input) as guard:
        try:
            parsed = parse_args(argv, world.size, world.rank)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        if parsed.run.print_params:
            task, _, _, _ = prepare(parsed, world.size)
            if world.rank == 0:
                print(describe_params(task.model))
            return 0
        train(parsed, world)
    return guard.exit_code


if __name__ == "__main__":
    sys.exit(main())
