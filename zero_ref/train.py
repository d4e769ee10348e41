"""The main job: `mpirun -n 4 python -m zero_ref.train` trains a character-level
language model with ZeRO, printing the loss as it goes and, at the end, each
rank's memory and communication ledgers beside the paper's formulas."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from zero_ref import __version__
from zero_ref.atomic import AtomicTextLog
from zero_ref.cli import RunConfig, parse_args
from zero_ref.config import ZeroConfig
from zero_ref.data import CharVocab, encode_corpus, load_text, micro_batches
from zero_ref.models.mlp import CharMLP, MLPConfig
from zero_ref.models.unit import forward_all, init_params
from zero_ref.report import comm_table, memory_table, rank_report
from zero_ref.tensor_io import load_named, save_safetensors


def build(run: RunConfig, zero: ZeroConfig, world: int):
    """Model, vocabulary, initial parameters and a batch function, before any MPI call."""
    vocab, tokens = encode_corpus(load_text(run.data))
    micro = run.micro_batch_size(world, zero.grad_accum)
    model = CharMLP(MLPConfig(vocab.size, run.context, run.d_embed, run.d_hidden))

    def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
        return micro_batches(tokens, run.context, micro, world, zero.grad_accum, step, run.seed)

    batches(0)  # a corpus too short for one batch fails here, on every rank alike
    init = load_named(run.init) if run.init else init_params(model, run.seed)
    return model, vocab, init, batches


def sample_text(model: CharMLP, params: dict, vocab: CharVocab, n: int, seed: int) -> str:
    """n characters from the trained MLP, starting from a window of newlines."""
    rng = np.random.default_rng(seed)
    start = vocab.encode("\n")[0] if "\n" in vocab.chars else 0
    ids = [int(start)] * model.config.context
    for _ in range(n):
        window = np.array([ids[-model.config.context :]])
        logits = forward_all(model, params, window)[0].astype(np.float64)
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(np.array(ids[model.config.context :]))


def train(run: RunConfig, zero: ZeroConfig, mpi_comm) -> None:
    from zero_ref.comm import Comm
    from zero_ref.stages import make_engine

    comm = Comm(mpi_comm, deterministic=zero.deterministic)
    model, vocab, init, batches = build(run, zero, comm.size)
    engine = make_engine(model, init, zero, comm)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(
        f"zero_ref {__version__}: stage {zero.stage}, {comm.size} ranks, "
        f"{engine.layout.numel:,} parameters, vocab {vocab.size}, "
        f"{'deterministic' if zero.deterministic else 'fast'} mode",
        flush=True,
    )
    log = AtomicTextLog(run.log_jsonl) if run.log_jsonl and comm.rank == 0 else None
    for step in range(run.steps):
        inputs, targets = batches(step)
        t0 = time.perf_counter()
        result = engine.train_step(inputs[:, comm.rank], targets[:, comm.rank])
        step_s = time.perf_counter() - t0
        if step % run.log_every == 0 or step == run.steps - 1:
            say(
                f"step {result.step:5d}  loss {result.loss:.4f}  grad norm "
                f"{result.grad_norm:.3f}  {step_s * 1e3:.1f} ms/step",
                flush=True,
            )
        if log:
            sent = sum(v["sent_bytes"] for v in comm.ledger.last_step().values())
            log.write_line(
                json.dumps(
                    {
                        "step": result.step,
                        "loss": result.loss,
                        "grad_norm": result.grad_norm,
                        "lr": zero.optimizer.lr,
                        "step_time_s": step_s,
                        "sent_bytes": sent,
                    }
                )
            )
    finish(run, zero, engine, model, vocab, log, say)


def finish(run, zero, engine, model, vocab, log, say) -> None:
    """Export, ledgers, sample: the collectives first, then rank 0 alone."""
    full = engine.full_parameters()  # a collective at stage 3
    reports = engine.comm.mpi.gather(rank_report(engine), root=0)
    if engine.rank != 0:
        return
    if run.export:
        save_safetensors(run.export, full)
        say(f"exported consolidated parameters to {run.export}")
    numel, world, k = engine.layout.full_numel, engine.world, zero.grad_accum
    say(memory_table(reports, zero.stage, numel, world, k))
    say(comm_table(reports, zero.stage, numel, world, k))
    if log:
        log.write_line(json.dumps({"final": True, "ranks": reports}))
        log.close()
    if run.sample_chars:
        say("sample:\n" + sample_text(model, full, vocab, run.sample_chars, run.seed))


def main(argv: Sequence[str] | None = None) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        run, zero = parse_args(argv)
        train(run, zero, world)
    except (ValueError, FileNotFoundError) as e:
        if world.rank == 0:
            print(f"zero_ref.train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
