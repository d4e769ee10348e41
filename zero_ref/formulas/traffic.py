"""The bytes a step should move, in closed form (ZeRO, Sec. 7: 2 Psi per step for data
parallelism and stages 1-2, 3 Psi at stage 3; ZeRO++'s qwZ, hpZ and qgZ on top): what
comm/ledger.py's books must add up to, what the end-of-run report and the estimate
print, and what the step-time model (formulas/step_model.py) prices per link. Pure
functions of integers, beside formulas/memory.py's bytes held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_ref.formulas.unit_order import step_reads
from zero_ref.layout.grad_blocks import GradientWire
from zero_ref.numerics.dtypes import FP32, ElementBytes
from zero_ref.numerics.quantize import quantized_gather_bytes


def paper_sent_bytes(
    stage: int, numel: int, world_size: int, grad_accum: int, element_bytes: int = 4
) -> int:
    """Bytes one rank sends per step for parameters and gradients.

    At grad_accum = 1 this is the paper's Sec. 7 volume (2 Psi at stages 0-2,
    3 Psi at stage 3, times (W-1)/W elements of `element_bytes`: 2 in the paper's
    fp16). Each reduce-scatter or all-gather of Psi elements moves (W-1)/W * Psi
    per rank. Stage 0 all-reduces (= reduce-scatter + all-gather) every micro-step;
    stages 1-2 reduce-scatter every micro-step and all-gather once; stage 3 gathers
    twice (forward, backward) per micro-step and reduce-scatters every micro-step.
    The paper counts one micro-step; for k > 1 this is zero_ref's schedule
    (DeepSpeed's stages 0-1 reduce once)."""
    per_collective = element_bytes * numel * (world_size - 1) // world_size
    k = grad_accum
    return per_collective * {0: 2 * k, 1: k + 1, 2: k + 1, 3: 3 * k}[stage]


@dataclass(frozen=True)
class QuantizedGathers:
    """Stage 3 with qwZ: each unit's full-precision gathers per step (backward's) and its
    quantized ones (forward's: int8 values and one float32 scale per `block`)."""

    full: tuple[int, ...]
    quantized: tuple[int, ...]
    block: int


@dataclass(frozen=True)
class HierarchicalGathers:
    """Stage 3 with hpZ: each unit's gathers per step across the world (full precision,
    and with qwZ forward's quantized ones, `block`), and inside its partition group of
    `group_size` ranks from the secondary copy (the ledger's "allgather_hpz"; with qwZ
    too they send the dequantized values in the parameters' dtype)."""

    full: tuple[int, ...]
    quantized: tuple[int, ...]
    group: tuple[int, ...]
    block: int | None
    group_size: int


def expected_sent_bytes(
    stage: int,
    unit_numels: Sequence[int],
    world_size: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
    skipped: bool = False,
    after_skipped: bool = False,
    gathers: Sequence[int] | QuantizedGathers | HierarchicalGathers | None = None,
    grad_blocks: int | GradientWire | None = None,
) -> int:
    """Bytes one rank sends per step for parameters and gradients in zero_ref's schedule.

    Gradients are reduce-scattered in the wire's dtype (sizes.comm), parameters
    all-gathered in theirs (sizes.param); stage 0's all-reduce gathers the reduced
    blocks in the gradients' dtype (sizes.grad). At stage 3 the gathered-unit buffer
    is reused: the last unit's forward gather serves its backward too, and unit 0's
    backward gather serves the next micro-step's forward. unit_numels are the
    padded sizes, in forward order. A skipped step (a NaN/Inf gradient) updates
    nothing, so stages 1-2 gather nothing after it, and at stage 3 the step after
    it (`after_skipped`) finds unit 0 still in the buffer, unchanged. `gathers`: each
    unit's gathers per step where stage 3 holds more than one unit (prefetch buffers,
    persistent units: zero_ref/engine/gathered_unit.py's gathers_per_step), or with
    qwZ a QuantizedGathers: forward's gathers then send (W-1)/W * (numel + 4 numel /
    block) bytes each, backward's their parameters' dtype; with hpZ a HierarchicalGathers:
    its group gathers send (G-1)/G of their units in the parameters' dtype (hpz_sent_bytes
    gives the two parts apart). `grad_blocks` (qgZ): its GradientWire (zero_ref/layout/
    grad_blocks.py plan_wire: the packed values and the blocks of a destination row,
    summed over the buckets), or for int8 the number of blocks alone; each micro-step's
    reduce-scatter then sends (W-1) x row_bytes in place of (W-1)/W x psi x sizes.comm:
    in int8 (W-1) x (psi / W + 4 blocks), in int4 (W-1) x (sum over buckets of
    ceil(C_b / 2) + 4 blocks), C_b a bucket's columns."""
    psi, k = sum(unit_numels), grad_accum
    fraction = (world_size - 1) / world_size
    if stage == 0:
        return int(fraction * psi * k * (sizes.comm + sizes.grad))
    if grad_blocks is not None:  # qgZ: int8 or int4 gradients; the rest as without it
        no_grads = ElementBytes(sizes.param, sizes.grad, 0)  # the parameters' bytes alone
        params = expected_sent_bytes(
            stage, unit_numels, world_size, grad_accum, no_grads, skipped, after_skipped, gathers
        )
        return params + qgz_sent_bytes(psi, world_size, grad_accum, grad_blocks)
    if stage < 3:
        return int(fraction * psi * (k * sizes.comm + (0 if skipped else sizes.param)))
    if isinstance(gathers, HierarchicalGathers):
        return sum(hpz_sent_bytes(unit_numels, world_size, grad_accum, sizes, gathers))
    if isinstance(gathers, QuantizedGathers):
        full = sum(n * c for n, c in zip(unit_numels, gathers.full, strict=True))
        quantized = sum(
            quantized_gather_bytes(n, gathers.block) * c
            for n, c in zip(unit_numels, gathers.quantized, strict=True)
        )
        return int(fraction * (sizes.param * full + quantized + sizes.comm * k * psi))
    counts = gathers or stage3_gathers(
        len(unit_numels), grad_accum, held=0 if after_skipped else None
    )
    gathered = sum(n * c for n, c in zip(unit_numels, counts, strict=True))
    return int(fraction * (sizes.param * gathered + sizes.comm * k * psi))


def qgz_sent_bytes(
    psi: int, world_size: int, grad_accum: int, grad_blocks: int | GradientWire
) -> int:
    """qgZ's gradient bytes one rank sends per step: (W-1) destination rows a micro-step,
    each its packed values and a float32 scale a block (a GradientWire's row_bytes; an
    int alone: int8's psi / W values and that many blocks)."""
    if isinstance(grad_blocks, GradientWire):
        row = grad_blocks.row_bytes
    else:
        row = psi // world_size + 4 * grad_blocks  # int8: a byte a value
    return grad_accum * (world_size - 1) * row


def hpz_sent_bytes(
    unit_numels: Sequence[int],
    world_size: int,
    grad_accum: int,
    sizes: ElementBytes,
    gathers: HierarchicalGathers,
    grad_blocks: int | GradientWire | None = None,
) -> tuple[int, int]:
    """Stage 3 with hpZ, bytes one rank sends per step: (across the world: the
    gradients' reduce-scatter and the gathers from the primary shards, inside the
    partition group: the gathers from the secondary copy). Across hosts, when the
    groups are the hosts, only the first part travels. With qgZ (`grad_blocks`, as
    expected_sent_bytes takes it) the gradients are its quantized rows, not a
    reduce-scatter in sizes.comm."""
    psi, world = sum(unit_numels), (world_size - 1) / world_size
    full = sum(n * c for n, c in zip(unit_numels, gathers.full, strict=True))
    quantized = sum(
        quantized_gather_bytes(n, gathers.block) * c
        for n, c in zip(unit_numels, gathers.quantized, strict=True)
        if c
    )
    group = sum(n * c for n, c in zip(unit_numels, gathers.group, strict=True))
    inside = int((gathers.group_size - 1) / gathers.group_size * sizes.param * group)
    if grad_blocks is not None:
        across = int(world * (sizes.param * full + quantized))
        return across + qgz_sent_bytes(psi, world_size, grad_accum, grad_blocks), inside
    across = int(world * (sizes.param * full + quantized + sizes.comm * grad_accum * psi))
    return across, inside


def stage3_gathers(n_units: int, grad_accum: int, held: int | None = None) -> list[int]:
    """How often each unit is all-gathered in one step at stage 3: over the step's reads
    (forward in order, backward in reverse: formulas/unit_order.py, the order the
    engine's loop follows), a unit already in the buffer (`held` at the start: none
    after an update, which makes every copy stale) not gathered again."""
    counts = [0] * n_units
    for (i, _), _ in step_reads(n_units, grad_accum):
        if held != i:
            counts[i] += 1
            held = i
    return counts
