"""Know before you run: one rank's peak memory, estimated from the flags alone.

Model states (Sec. 5 of the ZeRO paper) are counted from the real padded
layout and the same buffer sizes the stages allocate, so this part equals the
engine's memory ledger exactly. Activations are counted from the shapes the
GPT and MLP units keep for backward, plus the transients of the backward pass
at its worst moment. No MPI here: `check_fits` turns the estimate into a
refusal before the first step, and `python -m zero_ref.estimate` prints it for
every stage, as DeepSpeed's estimate_zero3_model_states_mem_needs_all_cold does.
Not counted: the single-rank oracle that --check-oracle keeps on rank 0 (a
debugging mode for small models). Measured against real runs: docs/memory.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zero_ref.app.cli import Parsed, UsageError, parse_args
from zero_ref.dtypes import ElementBytes, element_bytes
from zero_ref.engine.memory import (
    FP32,
    buffer_formula_bytes,
    formula_bytes,
    grad_strip_bytes,
    grads_on_disk,
    offload_pool_numel,
    offload_pool_row_numel,
    offload_pool_rows,
)
from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.flat import FlatLayout, model_layout
from zero_ref.models.gpt import GPT
from zero_ref.models.mlp import CharMLP
from zero_ref.models.unit import Model
from zero_ref.offload.swap_file import ALIGN

F32 = 4  # bytes: every array the engine and the models allocate is float32
# What a rank holds above its baseline that nothing here counts: malloc's heap in
# use, library pages touched after the baseline, MPI's shared memory. Measured,
# not derived: 8 to 10 MiB per rank in docs/memory.md's runs (scripts/bench_memory.py).
OVERHEAD_BYTES = 8 * 2**20


@dataclass(frozen=True)
class RankEstimate:
    """One rank's memory at its training peak, in bytes, by what holds it."""

    stage: int
    world: int
    numel: int  # Psi, real parameters
    padded_numel: int  # Psi after padding every unit to a multiple of world
    params: int
    grads: int
    optimizer: int
    buffers: int  # bucket staging, unit scratch, the gathered unit
    activations: int  # what the model keeps for backward, at the worst moment of it
    overhead: int  # measured constant: MPI, malloc, Python (OVERHEAD_BYTES)

    @property
    def model_states(self) -> int:
        """What the engine's ledger holds: params + grads + optimizer + buffers."""
        return self.params + self.grads + self.optimizer + self.buffers

    @property
    def total(self) -> int:
        """The training peak: model states, activations and overhead."""
        return self.model_states + self.activations + self.overhead

    def per_param(self, nbytes: int) -> float:
        """nbytes per real parameter: the unit the paper's formulas use."""
        return nbytes / max(self.numel, 1)


def state_bytes(
    layout: FlatLayout,
    stage: int,
    bucket_numel: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
) -> dict[str, int]:
    """Bytes by ledger category that a rank of `stage` allocates: the ledger's own
    formulas (zero_ref/engine/memory.py), from the layout and the precision alone."""
    world = layout.world_size
    unit_numels = [u.padded_numel for u in layout.units]
    buffers = buffer_formula_bytes(stage, unit_numels, world, bucket_numel, grad_accum, sizes)
    return {**formula_bytes(stage, layout.full_numel, world, grad_accum, sizes), "buffers": buffers}


def gpt_activation_bytes(model: GPT, batch: int, seq: int, checkpoint: bool = False) -> int:
    """Peak bytes of one micro-step's activations, as zero_ref/models/gpt.py keeps them.

    Per block, backward needs (B, T, .) arrays of widths: the attention
    branch's ln xhat C, attention input C, qkv 3C, merged heads C (6 C) and the
    (B, nh, T, T) attention probabilities; the MLP branch's ln xhat C, MLP input
    C, pre-activation 4C, GELU gate 4C (10 C); and a (B, T) rstd row each. The
    logits (B, T, V) and the head's cache (2 C wide: the engine's loop variable
    `cache` still holds it) live through all of backward. The worst moment is
    the backward of the last block (its MLP makes three 4C-wide transients; its
    attention a second (B, nh, T, T)) or the head's (dlogits, a second (B, T, V))."""
    cfg = model.config
    n, c, v = batch * seq, cfg.d_model, cfg.vocab_size
    att = batch * cfg.n_head * seq * seq
    attn_cache, mlp_cache = 6 * n * c + n + att, 10 * n * c + n
    block = attn_cache + mlp_cache
    kept = cfg.n_layer * block + (2 * n * c + n) + n * v  # + the head's cache and the logits
    head_backward = n * v + 2 * n * c  # dlogits, dh and dx
    mlp_backward = 13 * n * c  # act, d act, d pre (4C each) and d ln-out
    attn_backward = 7 * n * c + att  # the MLP's dx, dx, dy, dqkv (3C), dh, and d att
    block_backward = n * c + max(mlp_backward, attn_backward)  # + the incoming gradient
    if checkpoint:  # each unit keeps its input; one unit's cache is rebuilt at a time
        inputs = (2 * cfg.n_layer + 1) * n * c + n * v  # branch and head inputs, the logits
        head = (2 * n * c + n) + max(n * v, head_backward)  # its cache, new logits or backward
        rebuilt = n * c + max(attn_cache + attn_backward, mlp_cache + mlp_backward)
        return F32 * (inputs + max(head, rebuilt))
    return F32 * (kept + max(head_backward, block_backward))


def mlp_activation_bytes(model: CharMLP, batch: int) -> int:
    """Peak bytes of one micro-step of the character MLP (zero_ref/models/mlp.py):
    the hidden layer keeps its input (B, K*E) and output (B, H), the logits (B, V)
    live through backward; the worst moment adds dlogits, or tanh's two temporaries."""
    cfg = model.config
    x, h, v = batch * cfg.context * cfg.d_embed, batch * cfg.d_hidden, batch * cfg.vocab_size
    output_backward = v + h  # dlogits and dh
    hidden_backward = h + max(2 * h, h + x)  # dh, then tanh's temporaries or dpre and dx
    return F32 * (x + h + v + max(output_backward, hidden_backward))


def activation_bytes(model: Model, micro_batch: int, checkpoint: bool = False) -> int:
    """Activations of one micro-batch (the context is the model's own). With
    checkpointing the GPT keeps only unit inputs; the MLP's three small units keep
    about what they would anyway, so its count does not change."""
    if isinstance(model, GPT):
        return gpt_activation_bytes(model, micro_batch, model.config.context, checkpoint)
    if isinstance(model, CharMLP):
        return mlp_activation_bytes(model, micro_batch)
    raise TypeError(f"no activation estimate for {type(model).__name__}")


def estimate_rank(
    model: Model,
    stage: int,
    world: int,
    micro_batch: int,
    bucket_numel: int,
    grad_accum: int = 1,
    checkpoint: bool = False,
    sizes: ElementBytes = FP32,
    offload_pool: tuple[int, int] | None = None,
    offload_param: bool = False,
) -> RankEstimate:
    """One rank's peak for a run of `model` at `stage` on `world` ranks (`sizes`: the
    bytes per element of each kind of array, fp32 by default). With offload_pool =
    (sub_group_size, buffer_count) the optimizer state is on disk (and at stages 2-3
    the gradient shard: grads_on_disk), and RAM holds the pool of buffer_count x
    offload_pool_rows sub-groups instead, and the gradient's landing strip; with
    offload_param (stage 3) the parameter shard is on disk too."""
    layout = model_layout(model, world)
    states = state_bytes(layout, stage, bucket_numel, grad_accum, sizes)
    if offload_pool is not None and stage >= 1:
        states["optimizer"] = 0
        states["buffers"] += offload_buffer_bytes(layout, stage, bucket_numel, sizes, offload_pool)
        if grads_on_disk(stage, "nvme"):
            states["grads"] = 0
    if offload_param and stage == 3:
        states["params"] = 0
    return RankEstimate(
        stage=stage,
        world=world,
        numel=layout.numel,
        padded_numel=layout.full_numel,
        **states,
        activations=activation_bytes(model, micro_batch, checkpoint),
        overhead=OVERHEAD_BYTES,
    )


def offload_buffer_bytes(
    layout: FlatLayout,
    stage: int,
    bucket_numel: int,
    sizes: ElementBytes,
    offload_pool: tuple[int, int],
) -> int:
    """RAM that optimizer offload adds to the buffers: the pool (aligned for O_DIRECT),
    and with the gradient shard on disk its landing strip."""
    sub_group, count = offload_pool
    shards = [u.shard_numel for u in layout.units]
    row = offload_pool_row_numel(offload_pool_numel(stage, shards, sub_group), ALIGN // 4)
    total = 4 * count * offload_pool_rows(stage, "nvme") * row + ALIGN  # room to align it
    if grads_on_disk(stage, "nvme"):
        widest = min(bucket_columns(bucket_numel, layout.world_size), layout.shard_numel)
        total += grad_strip_bytes(widest, layout.shard_numel, sizes.grad, ALIGN)
    return total


def estimate_for(
    parsed: Parsed, model: Model, world: int, stage: int | None = None
) -> RankEstimate:
    """estimate_rank with the run's own settings (another stage if given)."""
    run, zero = parsed.run, parsed.zero
    return estimate_rank(
        model,
        zero.stage if stage is None else stage,
        world,
        run.micro_batch_size,
        zero.bucket_numel,
        zero.grad_accum,
        checkpoint=zero.checkpoint_activations,
        sizes=element_bytes(zero.precision, zero.grad_dtype, zero.comm_dtype),
        offload_pool=(zero.sub_group_size, zero.buffer_count)
        if zero.offload_optimizer == "nvme"
        else None,
        offload_param=zero.offload_param == "nvme",
    )


def mem_available_bytes(
    meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup"
) -> int | None:
    """MemAvailable of this host, or less where a cgroup (v2) limit leaves less room;
    None where neither says."""
    try:
        lines = Path(meminfo).read_text().splitlines()
    except OSError:
        lines = []
    kib = [int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")]
    known = [kib[0] * 1024] if kib else []
    try:
        limit = (Path(cgroup) / "memory.max").read_text().strip()
        used = int((Path(cgroup) / "memory.current").read_text())
        if limit != "max":
            known.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(known, default=None)


def human(nbytes: float) -> str:
    """Bytes in the largest unit that keeps the number >= 1: 1.16 TiB, 5.47 GiB, 812 MiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def check_fits(
    parsed: Parsed, model: Model, world: int, ranks_on_host: int, mem_available: int | None = None
) -> RankEstimate:
    """Refuse, with one UsageError naming the numbers and the flags that lower them, a
    run whose estimated peak per rank exceeds the host's available memory shared by
    its ranks. mem_available: the host's bytes (None: read now; a host that does not
    say is not checked). Returns the estimate of a run that fits."""
    est = estimate_for(parsed, model, world)
    available = mem_available_bytes() if mem_available is None else mem_available
    ranks = max(1, ranks_on_host)
    if available is None or est.total <= available // ranks:
        return est
    run = parsed.run
    message = (
        f"this run needs about {human(est.total)} per rank at stage {est.stage} (model states "
        f"{human(est.model_states)}, activations {human(est.activations)} for "
        f"{_micro_batch_words(run, model)}, overhead {human(est.overhead)}), but each of the "
        f"{ranks} ranks on this host has {human(available / ranks)} (MemAvailable "
        f"{human(available)} / {ranks}). To need less: {'; '.join(_remedies(parsed, model, est))}."
    )
    raise UsageError(message)


def _micro_batch_words(run, model: Model) -> str:
    if isinstance(model, GPT):
        return f"a micro-batch of {run.micro_batch_size} x {run.context} characters"
    return f"a micro-batch of {run.micro_batch_size} windows of {run.context} characters"


def _remedies(parsed: Parsed, model: Model, est: RankEstimate) -> list[str]:
    """The flags that lower the estimate, those of its larger part first."""
    run = parsed.run
    width = "--d-model, --n-layer" if isinstance(model, GPT) else "--d-hidden, --d-embed"
    activations = [
        f"a smaller --micro-batch-size (now {run.micro_batch_size}), or --batch-size "
        f"(now {run.batch_size}) with more --grad-accum",
        f"a shorter --context (now {run.context})",
    ]
    states = [f"a smaller model ({width})", "more ranks, on more hosts"]
    if est.stage < 3:
        stage3 = estimate_for(parsed, model, est.world, stage=3)
        states.insert(0, f"--stage 3 (about {human(stage3.total)} per rank)")
    return activations + states if est.activations >= est.model_states else states + activations


def model_for(parsed: Parsed, world: int) -> Model:
    """The model these flags train (the corpus fixes its vocabulary); no parameters."""
    from zero_ref.app.data import encode_corpus, load_text
    from zero_ref.app.tasks import build_task

    vocab, tokens = encode_corpus(load_text(parsed.run.data))
    return build_task(parsed.run, vocab, tokens, world, parsed.zero.grad_accum).model


def estimate_table(parsed: Parsed, model: Model, world: int, available: int | None) -> str:
    """Every stage's estimate for these flags, and what fits in `available` bytes a rank."""
    run, zero = parsed.run, parsed.zero
    ests = [estimate_for(parsed, model, world, stage=s) for s in range(4)]
    lines = [
        f"memory per rank for {run.model}: {ests[0].numel:,} parameters ({ests[0].padded_numel:,}"
        f" padded for {world} ranks), micro-batch {run.micro_batch_size}, context {run.context}"
        f", grad-accum {zero.grad_accum}, bucket {zero.bucket_numel:,} elements",
        f"memory available per rank: {'unknown' if available is None else human(available)}",
        f"{'stage':>6}{'params':>10}{'grads':>10}{'optimizer':>10}{'buffers':>10}"
        f"{'activations':>12}{'overhead':>10}{'total':>10}{'B/param':>10}  fits  largest model",
    ]
    for est in ests:
        cells = [est.params, est.grads, est.optimizer, est.buffers, est.activations]
        lines.append(
            f"{est.stage:>5}{'*' if est.stage == zero.stage else ' '}"
            + "".join(f"{human(b):>10}" for b in cells[:4])
            + f"{human(cells[4]):>12}{human(est.overhead):>10}{human(est.total):>10}"
            + f"{est.per_param(est.total):>10.4g}  {_fits(est, available)}"
        )
    lines.append(
        "*: the stage of these flags. largest model: the parameters whose model states "
        "would fit beside these activations (extrapolated at this stage's bytes/param)."
    )
    return "\n".join(lines)


def _fits(est: RankEstimate, available: int | None) -> str:
    if available is None:
        return "   ?"
    largest = (available - est.activations - est.overhead) / est.per_param(est.model_states)
    count = f"{largest / 1e9:.3g}B" if largest >= 1e9 else f"{largest / 1e6:.3g}M"
    return f"{'yes' if est.total <= available else 'no':>4}  {count if largest >= 1e6 else '-'}"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m zero_ref.estimate [train flags] --ranks N`: the table, nothing run."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--ranks", type=int, default=1)
    own.add_argument("--ranks-per-host", type=int)
    mine, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        print(USAGE)
        return 0
    try:
        if mine.ranks < 1:
            raise UsageError(f"--ranks {mine.ranks} is not allowed: it must be >= 1")
        parsed = parse_args(rest, mine.ranks)
        model = model_for(parsed, mine.ranks)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"zero_ref.estimate: error: {e}", file=sys.stderr)
        return 2
    host, per_host = mem_available_bytes(), mine.ranks_per_host or mine.ranks
    print(estimate_table(parsed, model, mine.ranks, None if host is None else host // per_host))
    if host is not None:
        print(f"(MemAvailable {human(host)} on this host, shared by {per_host} ranks)")
    return 0


USAGE = """usage: python -m zero_ref.estimate [flags of python -m zero_ref.train] --ranks N
                                  [--ranks-per-host M]

One rank's estimated peak memory at every ZeRO stage for the run these flags
describe, without running it: model states from the padded layout (what the
engine's ledger will hold), activations of one micro-batch, a measured
overhead; and whether it fits in MemAvailable / M (M: --ranks unless given).
The training flags: python -m zero_ref.train --help."""


if __name__ == "__main__":
    sys.exit(main())
