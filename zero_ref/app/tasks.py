"""The two language-modelling tasks the trainer offers: the model, its batches
for one step, and how to sample text from it. No MPI here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zero_ref.app.cli import RunConfig
from zero_ref.app.data import CharVocab, micro_batches, sequence_batches
from zero_ref.layout.flat import model_layout, ownership
from zero_ref.models.gpt import GPT, GPTConfig, generate_with
from zero_ref.models.mlp import CharMLP, MLPConfig
from zero_ref.models.unit import Model

Batches = Callable[[int], tuple[np.ndarray, np.ndarray]]  # step -> inputs, targets (k, W, b, ...)
Forward = Callable[[np.ndarray], np.ndarray]  # the model's output for a batch of ids


@dataclass(frozen=True)
class Task:
    model: Model
    batches: Batches
    tokens_per_step: int  # predicted characters per optimizer step, all ranks
    sample: Callable[[Forward, int, int], str]  # (forward, n chars, seed) -> text


def build_task(
    run: RunConfig, vocab: CharVocab, tokens: np.ndarray, world: int, grad_accum: int
) -> Task:
    b, k = run.micro_batch_size, grad_accum
    if run.model == "gpt":
        model = GPT(GPTConfig(vocab.size, run.context, run.n_layer, run.n_head, run.d_model))

        def batches(step: int):
            return sequence_batches(tokens, run.context, b, world, k, step, run.seed)

        per_step = run.batch_size * run.context
        return Task(model, batches, per_step, lambda p, n, s: _sample_gpt(model, p, vocab, n, s))
    model = CharMLP(MLPConfig(vocab.size, run.context, run.d_embed, run.d_hidden))

    def batches(step: int):
        return micro_batches(tokens, run.context, b, world, k, step, run.seed)

    return Task(model, batches, run.batch_size, lambda p, n, s: _sample_mlp(model, p, vocab, n, s))


def _start_id(vocab: CharVocab) -> int:
    return int(vocab.encode("\n")[0]) if "\n" in vocab.chars else 0


def _sample_gpt(model: GPT, forward: Forward, vocab: CharVocab, n: int, seed: int) -> str:
    prompt = np.array([[_start_id(vocab)]])
    ids = generate_with(forward, model.config.context, prompt, n, np.random.default_rng(seed))
    return vocab.decode(ids[0, 1:])


def _sample_mlp(model: CharMLP, forward: Forward, vocab: CharVocab, n: int, seed: int) -> str:
    """n characters from the MLP, starting from a window of newlines."""
    rng, context = np.random.default_rng(seed), model.config.context
    ids = [_start_id(vocab)] * context
    for _ in range(n):
        logits = forward(np.array([ids[-context:]]))[0].astype(np.float64)
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(np.array(ids[context:]))


def describe_params(model: Model, world: int = 1) -> str:
    """--print-params: names, shapes, numel and the total; on several ranks, who owns
    which elements of each tensor (the flat layout every stage shards by)."""
    rows, total = [], 0
    for unit in model.units:
        for spec in unit.param_specs():
            rows.append(
                f"{unit.name + '.' + spec.name:<28} {str(spec.shape):<16} {spec.numel:>10,}"
            )
            total += spec.numel
    rows.append(f"{'total':<45} {total:>10,}")
    if world > 1:
        rows.append(f"\nwho owns which elements on {world} ranks (a tensor's flat indices):")
        for name, rank, lo, hi in ownership(model_layout(model, world)):
            rows.append(f"  rank {rank}: {name}[{lo}:{hi}]")
    return "\n".join(rows)
