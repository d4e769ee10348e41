"""Before step one of `python -m zero_ref.train`: the corpus, the task and the initial
parameters' source, every check that needs no collective of training, the
libraries' warm-up (the memory baseline), the run's first line and its log.

zero_ref/train.py calls these in order; nothing here trains.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from zero_ref.app.cli import Parsed, UsageError
from zero_ref.app.console import Console
from zero_ref.app.data import CharVocab, encode_corpus, load_text
from zero_ref.app.output_paths import check_output_paths, output_paths, remove_stale_temporaries
from zero_ref.app.resume import open_checkpoint
from zero_ref.app.tasks import Task, build_task
from zero_ref.checkpoint.reader import Checkpoint
from zero_ref.engine.init_source import FileInit, InitSource, RandomInit
from zero_ref.formulas.memory import shard_world_of
from zero_ref.io.metrics_log import JsonlLog
from zero_ref.io.trace import Trace
from zero_ref.layout.flat import check_block_fits


class Prepared(NamedTuple):
    """What the flags and the corpus give before any collective: the task, where the
    initial parameters come from, the vocabulary and tokens, and --resume's checkpoint."""

    task: Task
    init: InitSource
    vocab: CharVocab
    tokens: np.ndarray
    checkpoint: Checkpoint | None


def prepare(parsed: Parsed, world: int, trace: Trace | None = None) -> Prepared:
    """Corpus, task and where the initial parameters come from: all checks before the
    first collective. No parameter is drawn or read yet: each rank will take only its
    own share (zero_ref/engine/init_source.py). With --resume the checkpoint's
    manifest is read and checked against the model here (its later reads: on `trace`)."""
    run, zero = parsed.run, parsed.zero
    check_output_paths(run)  # before any work: a bad --export must not cost a run
    vocab, tokens = encode_corpus(load_text(run.data))
    task = build_task(run, vocab, tokens, world, zero.grad_accum)
    task.batches(0)  # a corpus too short for one batch fails here, on every rank alike
    _check_quantize_block(zero, task.model, world)
    checkpoint = None
    if run.resume:
        checkpoint = open_checkpoint(parsed, task.model, trace)  # before any state exists
        init = checkpoint.source("param")
    elif run.init:
        init = FileInit(run.init, task.model)
    else:
        init = RandomInit(task.model, run.seed)
    return Prepared(task, init, vocab, tokens, checkpoint)


def _check_quantize_block(zero, model, world: int) -> None:
    """qwZ's --quantize-block must fit the model's largest unit (layout.flat
    check_block_fits); qgZ alone pads nothing (its blocks are cut at unit edges)."""
    if not zero.zeropp.quantized_weights:
        return
    units = [sum(s.numel for s in unit.param_specs()) for unit in model.units]
    try:
        check_block_fits(units, shard_world_of(zero, world), zero.zeropp.quantize_block)
    except ValueError as e:
        raise UsageError(f"--quantize-block: {e}") from None


def warm_up(comm) -> None:
    """Let every library do its one-time setup now, at sizes that do not depend on the
    model, so the baseline the memory report subtracts holds it: Numba loads (or
    compiles) its kernels, BLAS allocates its work buffers, Python imports the modules
    a run uses, NumPy's layer code runs once on a tiny GPT, and MPI maps the shared
    memory its collectives use (1 MiB per rank, off the ledger). What is left above
    the baseline then grows with the model: ZeRO's arrays and the activations."""
    import zero_ref.app.estimate_messages  # noqa: F401 (imported for its one-time cost)
    import zero_ref.app.oracle_check  # noqa: F401
    import zero_ref.app.resume  # noqa: F401
    import zero_ref.engine  # noqa: F401
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


def refuse_if_it_cannot_fit(parsed: Parsed, task: Task, comm, ranks_on_host: int) -> None:
    """Before any allocation: each rank's estimated peak against the memory its host has
    for it. Rank 0's reading of MemAvailable is used by all, so all decide alike."""
    from zero_ref.app.estimate_messages import check_fits
    from zero_ref.app.process_memory import mem_available_bytes

    available = comm.mpi.bcast(mem_available_bytes() if comm.rank == 0 else None, root=0)
    check_fits(parsed, task.model, comm.size, ranks_on_host, available)


def resume_args(checkpoint: Checkpoint, world: int, stage: int) -> dict:
    """The trace's "resume" event: the checkpoint as saved, and who reads it now."""
    return {
        "checkpoint": str(checkpoint.folder),
        "step": checkpoint.step,
        "saved": checkpoint.saved_layout(),
        "resumed": {"world_size": world, "stage": stage},
    }


def device_line(engine) -> str:
    """With --device gpu: which device, and how its buffers reach MPI (docs/gpu.md)."""
    if engine.device_description is None:
        return ""
    return f"; device: {engine.device_description}; {engine.comm.path}"


def report_stale_swap(engine, console: Console) -> None:
    """Swap folders a killed run left under --nvme-path, removed at this start (all
    ranks' counts, said once)."""
    everyone = engine.comm.mpi.gather(engine.stale_swap_folders(), root=0)
    if engine.rank == 0 and any(everyone):
        found = [p for rank in everyone for p in rank]
        console.always(f"removed {len(found)} swap folder(s) a killed run left: {found[0]} ...")


def open_log(
    run, is_root: bool, console: Console, after_step: int | None = None
) -> JsonlLog | None:
    """Rank 0's --log-jsonl, after removing what a killed earlier writer left; a resumed
    run continues the log after its checkpoint's step."""
    if not is_root:
        return None
    for path in output_paths(run).values():
        for stale in remove_stale_temporaries(path):
            console.always(f"removed {stale}, left by a writer that was killed")
    return JsonlLog(run.log_jsonl, after_step) if run.log_jsonl else None
