"""Memory formulas: the bytes one rank holds, from integers alone (Sec. 5 of the paper).

The one place the ladder is written: stage s shards the first s of `LADDER`
(optimizer state, then gradients, then parameters), and every count below asks
`sharded(stage)` what it divides by Nd. The engine's ledger checks
(zero_ref/engine/memory.py, the swap files and the offload pool), the estimate
(zero_ref/app/estimate.py) and the end-of-run report (zero_ref/app/report.py) all
count with these functions, so they cannot drift apart. No MPI, no arrays:
element counts and `ElementBytes` (bytes per element of each kind of array) in,
bytes or element counts out.

Per rank, Psi parameters, Nd ranks (the paper's mixed precision, K = 12):
  stage 0: (2 + 2 + K) Psi      stage 1: (2 + 2 + K/Nd) Psi
  stage 2: (2 + (2 + K)/Nd) Psi stage 3: (2 + 2 + K) Psi / Nd
  (--precision fp16/bf16: the ledger holds exactly this; fp32: params 4 Psi, grads
  4 Psi, optimizer (m, v) 8 Psi, each divided by Nd once its stage shards it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_ref.layout.buckets import bucket_columns
from zero_ref.layout.grad_blocks import plan_blocks
from zero_ref.numerics.dtypes import FP32, ElementBytes
from zero_ref.numerics.quantize import quantized_gather_bytes, segment_payload_bytes

CATEGORIES = ("params", "grads", "optimizer", "buffers")  # the memory ledger's
LADDER = ("optimizer", "grads", "params")  # what stages 1, 2 and 3 each add to the sharding
F32 = 4  # bytes: the scratch the models read and write, and every activation, is float32
STRIP_BYTES = 1 << 20  # a gradient strip's size: the writes to the disk are this large


def sharded(stage: int) -> frozenset[str]:
    """The model states `stage` partitions over the ranks: the first `stage` of LADDER."""
    if stage not in range(len(LADDER) + 1):
        raise ValueError(f"stage {stage} is not one of 0, 1, 2, 3")
    return frozenset(LADDER[:stage])


def _per_rank(kind: str, stage: int, numel: int, world_size: int) -> int:
    """Elements of `kind` one rank keeps: all numel, or its 1/Nd once the stage shards it."""
    return numel // world_size if kind in sharded(stage) else numel


# ---- model states (params, grads, optimizer)


def formula_bytes(
    stage: int, numel: int, world_size: int, grad_accum: int, sizes: ElementBytes = FP32
) -> dict[str, int]:
    """Bytes of params, grads and optimizer state one rank holds in zero_ref's engine.

    numel is the padded Psi (a multiple of world_size); `sizes` the bytes per element
    of each kind of array (fp32 by default). With mixed precision and grad_accum = 1
    this is exactly the paper's (2 + 2 + K) Psi ladder with K = 12 (master weights,
    m, v in float32). Beyond the paper's model: with grad_accum > 1, a stage that
    keeps full gradients (0-1) keeps a second buffer for the sum, the size of what
    its optimizer updates (stage 0: a full accumulator; stage 1: a reduced shard
    beside the full buffer that backward writes into)."""
    k_bytes = 8 + sizes.master  # m and v, and the master weights when they are separate
    grads = sizes.grad * _per_rank("grads", stage, numel, world_size)
    if grad_accum > 1 and "grads" not in sharded(stage):
        grads += sizes.grad * _per_rank("optimizer", stage, numel, world_size)
    return {
        "params": sizes.param * _per_rank("params", stage, numel, world_size),
        "grads": grads,
        "optimizer": k_bytes * _per_rank("optimizer", stage, numel, world_size),
    }


def paper_formula_bytes(stage: int, numel: int, world_size: int, k: int = 12) -> float:
    """The paper's per-rank model-state bytes with mixed-precision Adam (K = 12), its
    four lines as Sec. 5 / Figure 1 print them."""
    psi, nd = float(numel), float(world_size)
    return {
        0: (2 + 2 + k) * psi,
        1: (2 + 2 + k / nd) * psi,
        2: (2 + (2 + k) / nd) * psi,
        3: (2 + 2 + k) * psi / nd,
    }[stage]


# ---- buffers: what a stage keeps besides the model states


@dataclass(frozen=True)
class PrefetchPlan:
    """Stage 3's gathered-unit buffers and how far ahead they are filled
    (zero_ref/engine/gathered_unit.py): `prefetch_plan` makes one."""

    buffers: int = 1  # gathered-unit buffers of the widest unit (1: no prefetch)
    ahead_numel: int = 0  # elements of upcoming units gathered ahead, at most
    ahead_units: int = 0  # upcoming units gathered ahead, at most
    persistent: frozenset[int] = frozenset()  # units that keep a buffer of their own


def prefetch_plan(
    unit_numels: Sequence[int],
    prefetches: bool,
    prefetch_numel: int | None,
    max_live_numel: int | None,
    persistence_numel: int,
) -> PrefetchPlan:
    """Stage 3's plan (ZeroConfig's prefetch_numel, max_live_numel, persistence_numel;
    DeepSpeed's stage3_prefetch_bucket_size, stage3_max_live_parameters and
    stage3_param_persistence_threshold). Units under the persistence threshold keep a
    buffer each. A schedule that prefetches (--overlap-comm) gathers ahead as many
    upcoming units as fit in prefetch_numel elements (None: one unit, FSDP's default),
    into 1 + that many buffers of the widest unit; max_live_numel bounds all gathered
    elements, the persistent units' included, so it bounds the buffers too."""
    persistent = frozenset(i for i, n in enumerate(unit_numels) if n < persistence_numel)
    kept = sum(unit_numels[i] for i in persistent)
    others = sorted(n for i, n in enumerate(unit_numels) if i not in persistent)
    widest = max(unit_numels, default=0)  # every gathered-unit buffer's width
    if not prefetches or prefetch_numel == 0 or len(others) < 2:
        ahead_units, ahead_numel = 0, 0
    elif prefetch_numel is None:
        ahead_units, ahead_numel = 1, widest
    else:
        ahead_units, ahead_numel = len(others) - 1, prefetch_numel
    fit, total = 0, 0  # the most units any window of ahead_numel elements can hold
    for n in others[: len(others) - 1]:
        if fit == ahead_units or total + n > ahead_numel:
            break
        fit, total = fit + 1, total + n
    buffers = 1 + fit
    if max_live_numel is not None:
        need = widest + kept
        if max_live_numel < need:
            raise ValueError(
                f"max_live_numel={max_live_numel} (stage3_max_live_parameters) is below what "
                f"stage 3 must hold gathered: the widest unit ({widest} elements) plus the "
                f"persistent units ({kept}); allowed: >= {need}"
            )
        buffers = min(buffers, (max_live_numel - kept) // widest) if widest else buffers
    return PrefetchPlan(buffers, ahead_numel, min(ahead_units, buffers - 1), persistent)


@dataclass(frozen=True)
class OverlapBuffers:
    """What --overlap-comm and stage 3's plan add to a stage's buffers: the bucket
    staging lanes (2 with overlap: double-buffered) and each lane's receive row, and
    stage 3's gathered-unit buffers and persistent units; with qwZ (quantize_block)
    each gathered-unit buffer's int8 send and receive bytes, and one float32 scratch;
    with hpZ (hpz_group: the partition group's ranks) the secondary copy, 1/G of every
    unit in the parameters' dtype."""

    lanes: int = 1
    plan: PrefetchPlan = PrefetchPlan()
    quantize_block: int | None = None
    hpz_group: int | None = None
    gradient_block: int | None = None  # qgZ: each lane's quantized send and receive bytes
    gradient_bits: int = 8  # qgZ's values: int8 or int4 (two a byte)


def group_size_of(size: int | str, ranks_per_host: int | None) -> int | None:
    """A group-size setting (hpz_partition_size, hybrid_shard_size,
    quantized_gradient_local_size) as a count of ranks: "host" is ranks_per_host, the
    ranks sharing a host (None where the caller does not know it), an integer itself. The
    groups themselves are comm/groups.py's; this is the one place their size is read."""
    return ranks_per_host if size == "host" else int(size)


def hpz_group_of(cfg, world_size: int, ranks_per_host: int | None = None) -> int | None:
    """hpZ's partition group size for a ZeroConfig (None: hpZ off). "host" is the ranks
    per host where the caller knows it (a launched run: MPI's shared-memory split), else
    the world size: an estimate made before launch assumes one host."""
    size = cfg.zeropp.hpz_partition_size
    if size == 1:
        return None
    return group_size_of(size, ranks_per_host or world_size)


def shard_world_of(cfg, world_size: int, ranks_per_host: int | None = None) -> int:
    """The ranks one copy of the model states is sharded over: the world, or with hybrid
    sharding (cfg.hybrid.shard_size) its group of G; every formula here then counts as
    at world size G. "host" as hpz_group_of reads it (an estimate before launch: one host)."""
    size = cfg.hybrid.shard_size
    if size is None:
        return world_size
    return group_size_of(size, ranks_per_host or world_size)


def overlap_buffers(
    unit_numels: Sequence[int], cfg, hpz_group: int | None = None
) -> OverlapBuffers:
    """The OverlapBuffers a ZeroConfig asks for (its overlap group, and ZeRO++'s
    quantize_block), for these padded unit sizes; hpz_group: hpZ's partition group size
    (hpz_group_of), None without hpZ."""
    ov, pp = cfg.overlap, cfg.zeropp
    live = ov.max_live_numel if cfg.stage == 3 else None  # moot below 3
    plan = prefetch_plan(unit_numels, ov.comm, ov.prefetch_numel, live, ov.persistence_numel)
    block = pp.quantize_block if pp.quantized_weights else None
    grad_block = pp.quantize_block if pp.quantized_gradients else None
    bits = pp.quantized_gradient_bits
    return OverlapBuffers(2 if ov.comm else 1, plan, block, hpz_group, grad_block, bits)


def buffer_bytes(
    stage: int,
    unit_numels: Sequence[int],
    world_size: int,
    bucket_numel: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
    overlap: OverlapBuffers = OverlapBuffers(),
) -> dict[str, int]:
    """Bytes of each buffer a rank of `stage` keeps, by the engine's ledger name (the
    `buffers` category; unit_numels are the padded unit sizes).

    Reducing: a stage that shards the optimizer (1-3) reduce-scatters buckets, staging
    the widest for all ranks (at most bucket_numel elements, zero_ref/layout/
    buckets.py, in the wire's dtype), with a landing row for a reduced bucket not
    written straight into the gradient shard (micro-steps after the first; stage 1's
    landing in the full gradient buffer); stage 0 all-reduces in place, through a
    staging chunk when the wire's dtype is not the gradients'. Backward writes float32
    into one unit's gradient scratch once gradients are sharded or 16-bit; the model
    reads 16-bit parameters through one unit's float32 scratch; sharded parameters
    are gathered one unit at a time. Each is as wide as the widest unit (or bucket)."""
    shards = sharded(stage)
    total_numel = sum(unit_numels)
    columns = min(bucket_columns(bucket_numel, world_size), total_numel // world_size)
    widest = max(unit_numels, default=0)
    held: dict[str, int] = {}
    if "optimizer" in shards:
        held["bucket_staging"] = sizes.comm * world_size * columns
        if grad_accum > 1 or "grads" not in shards:
            held["reduce_out"] = sizes.grad * columns
        for lane in range(1, overlap.lanes):
            held[f"bucket_staging (lane {lane})"] = sizes.comm * world_size * columns
        for lane in range(overlap.lanes if overlap.lanes > 1 else 0):
            held[f"bucket_recv (lane {lane})"] = sizes.grad * columns
        if overlap.gradient_block is not None:
            held |= quantized_reduce_bytes(
                unit_numels,
                world_size,
                bucket_numel,
                overlap.gradient_block,
                overlap.lanes,
                overlap.gradient_bits,
            )
    elif sizes.comm != sizes.grad:
        chunk = world_size * bucket_columns(bucket_numel, world_size)
        held["wire_chunk"] = sizes.comm * min(chunk, total_numel)
    if "grads" in shards or sizes.grad != F32:
        held["unit_grad_scratch"] = F32 * widest
    if sizes.master:
        held["unit_param_scratch"] = F32 * widest
    if "params" in shards:
        plan = overlap.plan
        wide = widest  # every buffer as wide as the widest unit, persistent or not
        held["gathered_unit"] = sizes.param * wide
        for k in range(1, plan.buffers):
            held[f"gathered_unit (prefetch {k})"] = sizes.param * wide
        for i in sorted(plan.persistent):
            held[f"persistent unit {i}"] = sizes.param * unit_numels[i]
        if overlap.quantize_block is not None:
            held |= quantized_gather_buffers(
                wide // world_size, world_size, plan.buffers, overlap.quantize_block
            )
        if overlap.hpz_group is not None:  # hpZ's secondary copy: 1/G of every unit
            held["hpZ secondary"] = sizes.param * (total_numel // overlap.hpz_group)
    return held


def quantized_reduce_bytes(
    unit_numels: Sequence[int],
    world_size: int,
    bucket_numel: int,
    block: int,
    lanes: int,
    bits: int = 8,
) -> dict[str, int]:
    """qgZ's buffers (zero_ref/engine/grad_buckets.py): per staging lane a send and a
    receive of W rows of the widest bucket's payload (its values, a byte each in int8 and
    two a byte in int4, then 4 bytes a block)."""
    plan = plan_blocks(unit_numels, world_size, bucket_numel, block)
    row = max((segment_payload_bytes(n, b, bits) for n, b in plan), default=0)
    held = {}
    for lane in range(lanes):
        suffix = f" (lane {lane})" if lane else ""
        held[f"qgz_send{suffix}"] = world_size * row
        held[f"qgz_recv{suffix}"] = world_size * row
    return held


def quantized_gather_buffers(shard: int, world_size: int, lanes: int, block: int) -> dict[str, int]:
    """qwZ's buffers (zero_ref/engine/quantized_gather.py): per gathered-unit buffer a
    send row of the widest slice quantized (shard int8 values, 4 bytes a block) and a
    receive row of every rank's, and one float32 slice the 16-bit paths widen and
    dequantize through."""
    row = quantized_gather_bytes(shard, block)
    held = {}
    for k in range(lanes):
        held[f"qwZ send {k}"] = row
        held[f"qwZ recv {k}"] = world_size * row
    held["qwZ float32 scratch"] = F32 * shard
    return held


def buffer_formula_bytes(
    stage: int,
    unit_numels: Sequence[int],
    world_size: int,
    bucket_numel: int,
    grad_accum: int,
    sizes: ElementBytes = FP32,
    overlap: OverlapBuffers = OverlapBuffers(),
) -> int:
    """Bytes of the `buffers` category: the sum of buffer_bytes."""
    held = buffer_bytes(stage, unit_numels, world_size, bucket_numel, grad_accum, sizes, overlap)
    return sum(held.values())


# ---- NVMe offload (ZeRO-Infinity: zero_ref/offload/)


def grads_on_disk(stage: int, offload_optimizer: str) -> bool:
    """Does the reduced gradient shard live in a swap file? With the optimizer state on
    NVMe once gradients are sharded (stages 2-3; ZeRO-Infinity, Sec. 5: what the
    optimizer streams, its gradient included, is on disk; docs/offload.md). Stage 1
    keeps a full gradient buffer that backward writes: its gradients stay in RAM."""
    return offload_optimizer == "nvme" and "grads" in sharded(stage)


def swap_file_bytes(
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    shard_numel: int,
    sizes: ElementBytes = FP32,
) -> int:
    """Bytes of one rank's swap files (offload is for stages 1-3, whose optimizer state is
    the shard's): master weights (mixed precision), m and v; stage 3's parameter shard;
    the gradient shard when grads_on_disk."""
    total = 0
    if offload_optimizer == "nvme":
        total += (8 + sizes.master) * shard_numel
    if offload_param == "nvme":
        total += sizes.param * shard_numel
    if grads_on_disk(stage, offload_optimizer):
        total += sizes.grad * shard_numel
    return total


def grad_strip_numel(widest_bucket: int, shard_numel: int, itemsize: int, align: int) -> int:
    """Elements of the strip a gradient shard on disk lands its buckets in
    (zero_ref/engine/grad_shard.py): room for the widest bucket plus one disk block
    (so its bottom can sit on a block), at least STRIP_BYTES, never more than the
    shard rounded up to blocks plus one block; a whole number of blocks."""
    block = align // itemsize
    wanted = max(widest_bucket, STRIP_BYTES // itemsize)
    return -(-min(wanted, shard_numel) // block) * block + block


def grad_strip_bytes(widest_bucket: int, shard_numel: int, itemsize: int, align: int) -> int:
    """The buffer a gradient shard on disk adds: its strip, aligned for O_DIRECT (one
    block of slack). (With grad_accum > 1 a micro-step's sum lands in reduce_out
    first, as in RAM: buffer_bytes counts it.)"""
    return grad_strip_numel(widest_bucket, shard_numel, itemsize, align) * itemsize + align


def offload_pool_rows(stage: int, offload_optimizer: str) -> int:
    """Rows per buffer set of the offload pool: master, m and v, and the gradient when it
    is on disk (read with them, sub-group by sub-group)."""
    return 3 + grads_on_disk(stage, offload_optimizer)


def offload_pool_numel(stage: int, unit_shard_numels: Sequence[int], sub_group_size: int) -> int:
    """Elements per sub-group of the offload buffer pool: sub_group_size, or less when
    no owned slice is that long (stage 3 owns one slice, its shard; stages 1-2 one
    per unit, its rank's slice). The pool is buffer_count x offload_pool_rows such
    sub-groups."""
    one_slice = "params" in sharded(stage)
    widest = sum(unit_shard_numels) if one_slice else max(unit_shard_numels, default=0)
    return max(1, min(sub_group_size, widest))


def offload_pool_row_numel(sub_group: int, align_numel: int) -> int:
    """Elements of one pool buffer: a sub-group rounded up to whole alignment blocks, plus
    one block of slack, so that a sub-group's buffer can start at the same offset within
    a block as its range does in the file (the condition for O_DIRECT), and every
    buffer of the pool starts on a block."""
    return -(-sub_group // align_numel) * align_numel + align_numel


def offload_buffer_bytes(
    stage: int,
    unit_shard_numels: Sequence[int],
    world_size: int,
    bucket_numel: int,
    sizes: ElementBytes,
    sub_group_size: int,
    buffer_count: int,
    align: int,
) -> int:
    """RAM that optimizer offload to NVMe adds to the buffers: the pool of buffer_count x
    offload_pool_rows float32 sub-groups (aligned for O_DIRECT: `align` bytes of room),
    and with the gradient shard on disk its landing strip."""
    sub_group = offload_pool_numel(stage, unit_shard_numels, sub_group_size)
    row = offload_pool_row_numel(sub_group, align // F32)
    total = F32 * buffer_count * offload_pool_rows(stage, "nvme") * row + align
    if grads_on_disk(stage, "nvme"):
        shard_numel = sum(unit_shard_numels)
        widest = min(bucket_columns(bucket_numel, world_size), shard_numel)
        total += grad_strip_bytes(widest, shard_numel, sizes.grad, align)
    return total


# ---- activations (the models', not ZeRO's: zero_ref/models/)


def gpt_activation_bytes(cfg, batch: int, seq: int, checkpoint: bool = False) -> int:
    """Peak bytes of one micro-step's activations, as zero_ref/models/gpt.py keeps them
    (cfg: a GPTConfig, read for n_layer, n_head, d_model and vocab_size).

    Per block, backward needs (B, T, .) arrays of widths: the attention
    branch's ln xhat C, attention input C, qkv 3C, merged heads C (6 C) and the
    (B, nh, T, T) attention probabilities; the MLP branch's ln xhat C, MLP input
    C, pre-activation 4C, GELU gate 4C (10 C); and a (B, T) rstd row each. The
    logits (B, T, V) and the head's cache (2 C wide: the engine's loop variable
    `cache` still holds it) live through all of backward. The worst moment is
    the backward of the last block (its MLP makes three 4C-wide transients; its
    attention a second (B, nh, T, T)) or the head's (dlogits, a second (B, T, V))."""
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


def mlp_activation_bytes(cfg, batch: int) -> int:
    """Peak bytes of one micro-step of the character MLP (zero_ref/models/mlp.py; cfg: an
    MLPConfig): the hidden layer keeps its input (B, K*E) and output (B, H), the logits
    (B, V) live through backward; the worst moment adds dlogits, or tanh's two
    temporaries."""
    x, h, v = batch * cfg.context * cfg.d_embed, batch * cfg.d_hidden, batch * cfg.vocab_size
    output_backward = v + h  # dlogits and dh
    hidden_backward = h + max(2 * h, h + x)  # dh, then tanh's temporaries or dpre and dx
    return F32 * (x + h + v + max(output_backward, hidden_backward))
