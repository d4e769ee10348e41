"""The oracle raced against itself with the ranks summed in other orders.

Each shuffled rank order is an association MPI may legally choose, so the gap
it opens in one step is exactly what fast mode's one-step bound
(zero_ref/oracle/bound.py) must allow. `race` runs a small GPT for a number of
steps, re-syncs the second oracle to the first before each step (as
--check-oracle does with the engine) and returns the largest
|other - oracle| / bound over parameters, m and v. With `mutate` the second
oracle carries a bug instead, which the bound must catch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from zero_ref.config import AdamWConfig
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.models.unit import init_params, loss_and_grads
from zero_ref.oracle.bound import fast_step_bound, largest_ratio
from zero_ref.oracle.single_rank import Oracle

CONTEXT, WORLD, VOCAB = 8, 4, 29
Grads = list[list[dict[str, np.ndarray]]]  # grads[j][r]: micro-step j, rank r


def rank_grads(model: GPT, params: dict, tokens: np.ndarray, rng, k: int) -> Grads:
    """Each rank's gradient at each micro-step, on its own 2 sequences."""
    out = []
    for _ in range(k):
        per_rank = []
        for _ in range(WORLD):
            start = rng.integers(0, tokens.size - CONTEXT - 1, 2)
            x = np.stack([tokens[s : s + CONTEXT] for s in start])  # (2, T)
            y = np.stack([tokens[s + 1 : s + CONTEXT + 1] for s in start])
            per_rank.append(loss_and_grads(model, params, x, y)[1])
        out.append(per_rank)
    return out


def state_of(oracle: Oracle) -> tuple:
    unflat = oracle.unflatten
    return oracle.parameters(), unflat(oracle.exp_avg), unflat(oracle.exp_avg_sq), oracle.step_count


def race(
    k: int,
    clip: float | None,
    steps: int,
    mutate: Callable[[Oracle, Grads], None] | None = None,
    seed: int = 0,
) -> float:
    """The largest |other - oracle| / bound over `steps` steps (1 = on the bound)."""
    model = GPT(GPTConfig(vocab_size=VOCAB, context=CONTEXT, n_layer=1, n_head=2, d_model=16))
    tokens = np.random.default_rng(7).integers(0, VOCAB, 4000)
    init = init_params(model, seed)
    cfg = AdamWConfig(lr=3e-3, weight_decay=0.01)
    oracle, other = Oracle(init, cfg, clip), Oracle(init, cfg, clip)
    rng, worst = np.random.default_rng(seed * 1000 + k), 0.0
    for _ in range(steps):
        grads = rank_grads(model, oracle.parameters(), tokens, rng, k)
        other.load_state(*state_of(oracle))
        oracle.step(grads)
        perm = rng.permutation(WORLD)
        other_grads = [[per_rank[p] for p in perm] for per_rank in grads]
        if mutate:
            mutate(other, other_grads)
        other.step(other_grads)
        worst = max(worst, _step_ratio(oracle, other, clip))
    return worst


def _step_ratio(oracle: Oracle, other: Oracle, clip: float | None) -> float:
    o = oracle
    bound = fast_step_bound(
        o.last_detail, o.last_grad_norm, clip, o.params, o.exp_avg, o.exp_avg_sq
    )
    return max(
        largest_ratio(other.params, o.params, bound.param),
        largest_ratio(other.exp_avg, o.exp_avg, bound.exp_avg),
        largest_ratio(other.exp_avg_sq, o.exp_avg_sq, bound.exp_avg_sq),
    )


def drop_rank_1(other: Oracle, grads: Grads) -> None:
    """A bug: rank 1's gradient never arrives."""
    for per_rank in grads:
        per_rank[1] = {name: np.zeros_like(g) for name, g in per_rank[1].items()}


def bias_correction_of_next_step(other: Oracle, grads: Grads) -> None:
    """A bug: AdamW's bias correction uses the step count one ahead."""
    other.step_count += 1


BUGS = {
    "dropped rank gradient": drop_rank_1,
    "bias correction one step off": bias_correction_of_next_step,
}
