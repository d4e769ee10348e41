"""Know before you run: one rank's peak memory, estimated from the flags alone.

Model states (Sec. 5 of the ZeRO paper) are counted from the real padded
layout with the formulas the engine's ledger is checked against
(zero_ref/formulas/memory.py), so this part equals the ledger exactly.
Activations are counted from the shapes the GPT and MLP units keep for
backward, plus the transients of the backward pass at its worst moment. No MPI
here: zero_ref/app/estimate_messages.py turns the estimate into a refusal
before the first step, or into the table `python -m zero_ref.app.estimate` prints.
Not counted: the single-rank oracle that --check-oracle keeps on rank 0 (a
debugging mode for small models). Measured against real runs: docs/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_ref.app.cli import Parsed
from zero_ref.formulas.memory import (
    FP32,
    OverlapBuffers,
    buffer_formula_bytes,
    formula_bytes,
    gpt_activation_bytes,
    grads_on_disk,
    hpz_group_of,
    mlp_activation_bytes,
    offload_buffer_bytes,
    overlap_buffers,
    shard_world_of,
)
from zero_ref.layout.flat import FlatLayout, layout_align, model_layout
from zero_ref.models.gpt import GPT
from zero_ref.models.mlp import CharMLP
from zero_ref.models.unit import Model
from zero_ref.numerics.dtypes import ElementBytes, element_bytes
from zero_ref.offload.swap_file import ALIGN

# What a rank holds above its baseline that nothing here counts: malloc's heap in
# use, library pages touched after the baseline, MPI's shared memory. Measured,
# not derived: 8 to 10 MiB per rank in docs/memory.md's runs (scripts/bench/bench_memory.py).
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
    overlap_cfg=None,
) -> dict[str, int]:
    """Bytes by ledger category that a rank of `stage` allocates: the ledger's own
    formulas, from the layout and the precision alone (and with `overlap_cfg`, a
    ZeroConfig, the buffers its overlap and stage-3 plan add)."""
    world = layout.world_size
    unit_numels = [u.padded_numel for u in layout.units]
    overlap = OverlapBuffers()
    if overlap_cfg is not None:
        overlap = overlap_buffers(unit_numels, overlap_cfg, hpz_group_of(overlap_cfg, world))
    buffers = buffer_formula_bytes(
        stage, unit_numels, world, bucket_numel, grad_accum, sizes, overlap
    )
    return {**formula_bytes(stage, layout.full_numel, world, grad_accum, sizes), "buffers": buffers}


def activation_bytes(model: Model, micro_batch: int, checkpoint: bool = False) -> int:
    """Activations of one micro-batch (the context is the model's own). With
    checkpointing the GPT keeps only unit inputs; the MLP's three small units keep
    about what they would anyway, so its count does not change."""
    if isinstance(model, GPT):
        return gpt_activation_bytes(model.config, micro_batch, model.config.context, checkpoint)
    if isinstance(model, CharMLP):
        return mlp_activation_bytes(model.config, micro_batch)
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
    overlap_cfg=None,
) -> RankEstimate:
    """One rank's peak for a run of `model` at `stage` on `world` ranks (`sizes`: the
    bytes per element of each kind of array, fp32 by default). With offload_pool =
    (sub_group_size, buffer_count) the optimizer state is on disk (and at stages 2-3
    the gradient shard: grads_on_disk), and RAM holds the pool of buffer_count x
    offload_pool_rows sub-groups instead, and the gradient's landing strip; with
    offload_param (stage 3) the parameter shard is on disk too; overlap_cfg (a
    ZeroConfig): the buffers --overlap-comm and stage 3's prefetch plan add; with its
    hybrid_shard_size, the states are a shard group's, as at world size G."""
    shard = world if overlap_cfg is None else shard_world_of(overlap_cfg, world)
    layout = model_layout(model, shard, 1 if overlap_cfg is None else layout_align(overlap_cfg))
    states = state_bytes(layout, stage, bucket_numel, grad_accum, sizes, overlap_cfg)
    if offload_pool is not None and stage >= 1:
        sub_group, count = offload_pool
        shards = [u.shard_numel for u in layout.units]
        states["optimizer"] = 0
        states["buffers"] += offload_buffer_bytes(
            stage, shards, world, bucket_numel, sizes, sub_group, count, ALIGN
        )
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


def estimate_for(
    parsed: Parsed, model: Model, world: int, stage: int | None = None
) -> RankEstimate:
    """estimate_rank with the run's own settings (another stage if given)."""
    run, zero = parsed.run, parsed.zero
    mp, off = zero.mixed_precision, zero.offload
    return estimate_rank(
        model,
        zero.stage if stage is None else stage,
        world,
        run.micro_batch_size,
        zero.bucket_numel,
        zero.grad_accum,
        checkpoint=zero.checkpoint_activations,
        sizes=element_bytes(mp.dtype, mp.grad_dtype, mp.comm_dtype),
        offload_pool=(off.sub_group_size, off.buffer_count) if off.optimizer == "nvme" else None,
        offload_param=off.param == "nvme",
        overlap_cfg=zero,
    )


def model_for(parsed: Parsed, world: int) -> Model:
    """The model these flags train (the corpus fixes its vocabulary); no parameters."""
    from zero_ref.app.data import encode_corpus, load_text
    from zero_ref.app.tasks import build_task

    vocab, tokens = encode_corpus(load_text(parsed.run.data))
    return build_task(parsed.run, vocab, tokens, world, parsed.zero.grad_accum).model
