"""The single-rank oracle: what one process holding everything would compute.

This is the reference every ZeRO stage is tested against, and a tool for
checking your own sharded optimizer (see docs/oracle.md). It needs no MPI. Per
optimizer step it takes, for every micro-step j and every rank r, the
gradients rank r computed, and does exactly this, in float32:

  s_j  = g[j][0] + g[j][1] + ... + g[j][W-1]        (rank order, elementwise)
  acc  = s_0 + s_1 + ... + s_{k-1}                  (micro-step order)
  g    = acc / (W * k * S)                          (the mean gradient, unscaled)
  norm = sqrt(sum(g^2))                             (correctly rounded, math.fsum)
  a NaN/Inf: skip the step (fp16 overflow, or the "skip" policy) or raise
  g   *= min(1, clip / (norm + 1e-6))               (if clipping)
  AdamW on the whole flat buffer (torch.optim.AdamW semantics)

With mixed precision (docs/precision.md) it makes the engine's roundings, each
to nearest even: gradients are computed from the master weights rounded to
16 bits (and the loss scaled by S, fp16), each g[j][r] is rounded to the
gradients' dtype and then to the wire's, each s_j and each partial acc to the
gradients' dtype; AdamW updates the float32 master weights. Without it every
rounding is the identity and S = 1.

With qwZ (ZeRO++'s quantized weights, `quantize_block`) each rank's forward reads
every unit's parameters quantized and dequantized (zero_ref/numerics/quantize.py: blocks of
the unit's own elements, [b*block, (b+1)*block), the last zero-padded), rounded once
to the parameters' dtype, while backward reads the full-precision ones; with
activation checkpointing the forward recomputed before a unit's backward reads the
full ones too, as the engine's, which runs it after backward's gather. So the
per-unit forward and backward are written here (model_gradients), in the engine's
order, not taken from loss_and_grads. With hpZ too (`backward_reads_forward`) backward
and its recompute read the dequantized ones as well: the secondary copy backward gathers
from is filled from forward's gather (zero_ref/engine/secondary_copy.py).

With qgZ (ZeRO++'s quantized gradients, `gradient_blocks`) each g[j][r], after those
roundings, is laid out as the engine's buckets see it (the layout at W ranks, each
unit a (W, shard_numel) matrix whose row d goes to rank d, the bucket plan of
zero_ref/layout/buckets.py) and every destination row of every bucket is quantized
and dequantized in the blocks of zero_ref/layout/grad_blocks.py, in int8 or int4 (its
`bits`), before the rank-order sum: s_j = q(g[j][0]) + q(g[j][1]) + ... in float32,
rounded once. In two hops (GradientBlocks.local_size L, DeepSpeed's across nodes) the
ranks form groups of L, each group's q(g) are added in rank order in float32 (not
rounded) and that partial p_h is quantized again in the same blocks:
s_j = q(p_0) + q(p_1) + ... in group order, rounded once.

With hybrid sharding (`shard_size` G: FSDP's HYBRID_SHARD, DeepSpeed's MiCS) the sum is
the engine's two levels: each group of G consecutive ranks sums its own, micro-step by
micro-step as above (acc_g, rounded to the gradients' dtype), and the groups' sums are
then added in group order in float32 and rounded once (the cross-group all-reduce of
zero_ref/engine/hybrid.py, at the accumulation boundary): acc = acc_0 + acc_1 + ...

With the two-level collectives (collectives "hierarchical", `hosts`: the placement table
(H, L) of zero_ref/comm/hier_order.py) a float32 sum is each host's rows added in world-rank
order, then the hosts' partials in host order (two_level_sum); a 16-bit sum rounds each
host's partial to its 16 bits before the hosts' are added (what crosses). With
hybrid sharding too, each shard group's sum and the replicas' float32 all-reduce take
their groups' common two-level order where the groups span hosts (split_placement, the
mirror of two_level.group_comm), and rank order where they do not.

The deterministic engine reproduces this bit for bit at every stage and world
size; the fast engine agrees within the tolerance in docs/determinism.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from zero_ref.comm.hier_order import split_placement, two_level_sum
from zero_ref.config import AdamWConfig, ZeroConfig
from zero_ref.formulas.memory import group_size_of
from zero_ref.layout.buckets import bucket_plan
from zero_ref.layout.flat import build_layout, layout_align, rank_rows
from zero_ref.layout.grad_blocks import bucket_block_starts
from zero_ref.models.unit import Model, loss_and_grads, unit_params_view
from zero_ref.numerics.dtypes import dtype_of, rounded
from zero_ref.numerics.quantize import quantized_copy, quantized_rows
from zero_ref.numerics.rank_order import sum_in_rank_order
from zero_ref.optim.adamw import AdamWScalars, adamw_reference, adamw_scalars, with_lr
from zero_ref.optim.gradnorm import clip_coefficient, sumsq_exact_reference
from zero_ref.optim.loss_scale import LossScaleConfig, initial_state, next_state
from zero_ref.optim.nonfinite import NonFiniteGradientError

NamedArrays = Mapping[str, np.ndarray]
UnitSpecs = Sequence[tuple[str, Sequence[tuple[str, tuple[int, ...]]]]]


@dataclass(frozen=True)
class GradientBlocks:
    """What qgZ's blocks depend on: the model's units (names and shapes, in forward order,
    as zero_ref/layout/flat.py's model_layout lists them), the layout's alignment, the
    bucket size, the block size, and the bits of the values (8 or 4)."""

    units: UnitSpecs
    align: int
    bucket_numel: int
    block: int
    bits: int = 8
    local_size: int | None = None  # two hops: groups of this many ranks (None: one hop)

    @classmethod
    def for_model(
        cls, model: Model, cfg: ZeroConfig, host_size: int | None = None
    ) -> GradientBlocks:
        """cfg's blocks; host_size: what quantized_gradient_local_size "host" came to (the
        engine's qgz_local_size; None: one hop, every rank on one host)."""
        units = [(u.name, [(s.name, tuple(s.shape)) for s in u.param_specs()]) for u in model.units]
        pp = cfg.zeropp
        align, bits = layout_align(cfg), pp.quantized_gradient_bits
        local = pp.quantized_gradient_local_size
        local = None if local == "world" else group_size_of(local, host_size)
        return cls(units, align, cfg.bucket_numel, pp.quantize_block, bits, local)


@dataclass(frozen=True)
class StepDetail:
    """What the last step used, for bounding how far a reordered sum may move it
    (zero_ref/oracle/bound.py). Flat float32 arrays in the oracle's order."""

    grad_abs_mean: np.ndarray  # sum over ranks and micro-steps of |g[j][r]|, / (W k)
    grad: np.ndarray  # the mean gradient after clipping: what AdamW was given
    coef: float  # the clipping coefficient (1 without clipping)
    scalars: AdamWScalars  # this step's AdamW scalars
    world: int
    grad_accum: int


class Oracle:
    """Full parameters and AdamW state for a whole model, in one flat buffer (no padding).

    `params` are the float32 master weights; with mixed precision the model reads
    them rounded to `precision` ("fp16", "bf16"). grad_dtype and comm_dtype are
    ZeroConfig's grad_dtype and comm_dtype; loss_scale is fp16's scaler."""

    def __init__(
        self,
        init_params: NamedArrays,
        optimizer: AdamWConfig,
        clip: float | None = None,
        precision: str = "fp32",
        grad_dtype: str | None = None,
        comm_dtype: str | None = None,
        loss_scale: LossScaleConfig | None = None,
        nonfinite: str = "raise",
        quantize_block: int | None = None,
        checkpoint_activations: bool = False,
        gradient_blocks: GradientBlocks | None = None,
        backward_reads_forward: bool = False,
        shard_size: int | None = None,
        hosts: np.ndarray | None = None,
    ) -> None:
        self.names = list(init_params)
        self.shapes = [np.shape(init_params[k]) for k in self.names]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.params = self._flatten(init_params)
        self.exp_avg = np.zeros_like(self.params)
        self.exp_avg_sq = np.zeros_like(self.params)
        self.optimizer, self.clip = optimizer, clip
        self.param_dtype = dtype_of(precision)
        self.grad_dtype = dtype_of(grad_dtype or precision)
        self.comm_dtype = dtype_of(comm_dtype or grad_dtype or precision)
        self.loss_scale_cfg = loss_scale if precision == "fp16" else None
        self.scaler = None if self.loss_scale_cfg is None else initial_state(self.loss_scale_cfg)
        self.nonfinite = nonfinite
        self.quantize_block = quantize_block  # qwZ's block (None: forward reads full weights)
        self.recompute = checkpoint_activations  # with qwZ: the recompute reads full weights
        self.gradient_blocks = gradient_blocks  # qgZ's (None: gradients summed as they are)
        # hpZ with qwZ: backward reads forward's dequantized weights (the secondary copy)
        self.backward_reads_forward = backward_reads_forward
        self.shard_size = shard_size  # hybrid sharding's group size G (None: one group)
        self.hosts = hosts  # the two-level collectives' placement (H, L); None: flat
        self.step_count = 0
        self.last_grad_norm = float("nan")
        self.last_skipped = False
        self.last_detail: StepDetail | None = None

    @classmethod
    def for_config(
        cls,
        init_params: NamedArrays,
        cfg: ZeroConfig,
        model: Model | None = None,
        shard_size: int | None = None,
        qgz_local_size: int | None = None,
        hosts: np.ndarray | None = None,
    ):
        """The oracle of an engine configured by `cfg` (its optimizer, clipping, precision);
        with quantized_gradients the model too (qgZ's blocks follow its units); with
        hybrid_shard_size "host", `shard_size`: the ranks a host holds (the engine's
        shard_world); with quantized_gradient_local_size "host", `qgz_local_size`: the
        engine's (None: one hop); with the two-level collectives, `hosts`: the placement
        table their Comm found (HierarchicalComm.world_of; None: flat sums)."""
        mp, pp = cfg.mixed_precision, cfg.zeropp
        if pp.quantized_gradients and model is None:
            raise ValueError("quantized_gradients: the oracle needs the model (its units)")
        hybrid = cfg.hybrid.shard_size
        if hybrid == "host" and shard_size is None:
            raise ValueError("hybrid_shard_size 'host': the oracle needs shard_size (G)")
        blocks = None
        if pp.quantized_gradients:
            blocks = GradientBlocks.for_model(model, cfg, qgz_local_size)
        return cls(
            init_params,
            cfg.optimizer,
            cfg.clip,
            mp.dtype,
            mp.grad_dtype,
            mp.comm_dtype,
            mp.loss_scale,
            cfg.nonfinite,
            pp.quantize_block if pp.quantized_weights else None,
            cfg.checkpoint_activations,
            blocks,
            pp.quantized_weights and pp.hpz_partition_size != 1,
            None if hybrid is None else group_size_of(hybrid, shard_size),
            hosts,
        )

    def loss_scale(self) -> float | None:
        """The scale the next step's backward multiplies the loss by (None: no scaling)."""
        return None if self.scaler is None else self.scaler.scale

    def model_parameters(self) -> dict[str, np.ndarray]:
        """The parameters the model reads: the master weights rounded to 16 bits
        (widened back to float32), or the master weights themselves in fp32."""
        return self.unflatten(rounded(self.params, self.param_dtype))

    def forward_parameters(self, model: Model) -> dict[str, np.ndarray]:
        """What forward reads: model_parameters(), or with qwZ each unit's quantized and
        dequantized in blocks of its own elements, rounded once to the parameters' dtype."""
        full = self.model_parameters()
        if self.quantize_block is None:
            return full
        out = {}
        for unit in model.units:
            names = [f"{unit.name}.{s.name}" for s in unit.param_specs()]
            flat = np.concatenate([full[k].reshape(-1) for k in names] or [np.zeros(0, np.float32)])
            flat = rounded(
                quantized_copy(flat, self.quantize_block, f"unit {unit.name}"), self.param_dtype
            )
            offset = 0
            for k in names:
                out[k] = flat[offset : offset + full[k].size].reshape(full[k].shape)
                offset += full[k].size
        return out

    def _flatten(self, named: NamedArrays) -> np.ndarray:
        parts = [np.asarray(named[k], np.float32).reshape(-1) for k in self.names]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the current parameters, by name."""
        return self.unflatten(self.params)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the named tensors in a flat buffer of the oracle's order."""
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[offset : offset + size].reshape(shape).copy()
            offset += size
        return out

    def flatten(self, named: NamedArrays) -> np.ndarray:
        """A flat float32 buffer of the oracle's order from named tensors."""
        return self._flatten(named)

    def locate(self, index: int) -> str:
        """'name[i, j]' for element `index` of a flat buffer of the oracle's order."""
        offset = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            if index < offset + size:
                where = np.unravel_index(index - offset, shape) if shape else ()
                return f"{name}[{', '.join(str(int(i)) for i in where)}]"
            offset += size
        raise IndexError(f"element {index} is past the {offset} elements of the model")

    def load_state(
        self, params: NamedArrays, exp_avg: NamedArrays, exp_avg_sq: NamedArrays, step_count: int
    ) -> None:
        """Continue from another optimizer's state (a sharded engine's, consolidated)."""
        self.params = self._flatten(params)
        self.exp_avg = self._flatten(exp_avg)
        self.exp_avg_sq = self._flatten(exp_avg_sq)
        self.step_count = step_count

    def step(
        self, grads: Sequence[Sequence[NamedArrays]], lr: float | None = None
    ) -> dict[str, np.ndarray]:
        """One optimizer step from grads[j][r] (micro-step j, rank r); returns parameters.

        `lr` overrides the configured learning rate for this step. A skipped step
        (last_skipped) leaves everything but fp16's loss scaler as it was."""
        k, world = len(grads), len(grads[0])
        acc = np.empty_like(self.params)
        abs_sum = np.zeros_like(self.params)  # only for StepDetail: not part of the step
        if self.shard_size is not None:
            acc = self._summed_in_groups(grads, abs_sum)
        for j, per_rank in enumerate(grads if self.shard_size is None else ()):
            rows = np.stack([self._flatten(g) for g in per_rank])  # (W, numel)
            rows = rounded(rounded(rows, self.grad_dtype), self.comm_dtype)  # stored, sent
            s_j = rounded(self._summed(rows), self.grad_dtype)
            abs_sum += np.abs(rows).sum(axis=0)
            if j == 0:
                acc[...] = s_j
            else:
                acc = rounded(acc + s_j, self.grad_dtype)
        scale = 1.0 if self.scaler is None else self.scaler.scale
        g = np.divide(acc, np.float32(world * k * scale), dtype=np.float32)
        self.last_grad_norm = math.sqrt(sumsq_exact_reference(g))
        self.last_skipped = not math.isfinite(self.last_grad_norm) and self._skip(acc)
        if self.scaler is not None:
            self.scaler = next_state(self.loss_scale_cfg, self.scaler, self.last_skipped)
        if self.last_skipped:
            return self.parameters()
        coef = clip_coefficient(self.last_grad_norm, self.clip)
        if coef != 1:
            g *= coef
        self.step_count += 1
        s = adamw_scalars(with_lr(self.optimizer, lr), self.step_count)
        adamw_reference(self.params, g, self.exp_avg, self.exp_avg_sq, s)
        self.last_detail = StepDetail(abs_sum / (world * k), g, float(coef), s, world, k)
        return self.parameters()

    def _summed_in_groups(self, grads, abs_sum: np.ndarray) -> np.ndarray:
        """Hybrid sharding's sum: per group of G consecutive ranks the micro-steps' sums
        (each its ranks in rank order), then the groups added in group order in float32
        and rounded once to the gradients' dtype."""
        world, size = len(grads[0]), self.shard_size
        if size < 1 or world % size:
            raise ValueError(f"shard_size {size} does not divide the {world} ranks")
        group_accs = np.empty((world // size, self.params.size), np.float32)
        shards, replicas = self._group_tables(world, size)
        for j, per_rank in enumerate(grads):
            rows = np.stack([self._flatten(g) for g in per_rank])  # (W, numel)
            rows = rounded(rounded(rows, self.grad_dtype), self.comm_dtype)  # stored, sent
            abs_sum += np.abs(rows).sum(axis=0)
            for g in range(world // size):
                mine = rows[g * size : (g + 1) * size]  # qgZ inside the group, at G ranks
                s_jg = rounded(self._summed(mine, shards), self.grad_dtype)
                group_accs[g] = s_jg if j == 0 else rounded(group_accs[g] + s_jg, self.grad_dtype)
        out = np.empty_like(self.params)
        if replicas is not None:  # the two-level all-reduce (16-bit: partials rounded)
            partial = None if self.grad_dtype == np.float32 else self.grad_dtype
            return rounded(two_level_sum(group_accs, replicas, out, partial), self.grad_dtype)
        return rounded(sum_in_rank_order(group_accs, out), self.grad_dtype)

    def _group_tables(self, world: int, size: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Hybrid sharding's two-level orders (None: rank order): the shard groups' (G
        consecutive ranks) and the replica groups' (the ranks at one place in every
        shard group), each their groups' common placement with the two-level collectives."""
        if self.hosts is None:
            return None, None
        shards = [range(g * size, (g + 1) * size) for g in range(world // size)]
        replicas = [range(i, world, size) for i in range(size)]
        return split_placement(self.hosts, shards), split_placement(self.hosts, replicas)

    def _summed(self, rows: np.ndarray, table: np.ndarray | None | str = "world") -> np.ndarray:
        """The float32 sum (not rounded) of the ranks' rows (W, numel) as the reduce-scatter
        makes it: in rank order, or two levels in `table`'s order (default the world's
        `hosts`); with qgZ of what each destination dequantizes, in one hop or two (groups
        of gradient_blocks.local_size ranks, partials requantized)."""
        out = np.empty_like(self.params)
        gb, world = self.gradient_blocks, rows.shape[0]
        hosts = self.hosts if isinstance(table, str) else table
        if gb is None and hosts is not None:  # 16-bit: each host's partial crosses rounded
            partial = None if self.comm_dtype == np.float32 else self.comm_dtype
            return two_level_sum(rows, hosts, out, partial)
        if gb is None:
            return sum_in_rank_order(rows, out)
        local = gb.local_size
        if local is None or local in (1, world):
            return sum_in_rank_order(self._through_wire(rows), out)
        if world % local:
            raise ValueError(f"qgZ's local size {local} does not divide the {world} ranks")
        wire = self._through_wire(rows)
        partials = np.stack(
            [
                sum_in_rank_order(wire[h : h + local], np.empty_like(out))
                for h in range(0, world, local)
            ]
        )  # (H, numel): each group's sum in float32, not rounded
        return sum_in_rank_order(self._through_wire(partials, world), out)

    def _through_wire(self, rows: np.ndarray, world: int | None = None) -> np.ndarray:
        """Each row of rows (R, numel: a rank's, or a group's partial) as qgZ's destinations
        dequantize it: laid into the engine's buckets at `world` ranks (default R),
        quantized per destination row in its blocks."""
        gb = self.gradient_blocks
        world = rows.shape[0] if world is None else world
        layout = build_layout(gb.units, world, gb.align)
        where = self._full_index(layout)  # oracle element -> its padded full index
        out = np.empty_like(rows)
        for r in range(rows.shape[0]):
            full = np.zeros(layout.full_numel, np.float32)
            full[where] = rows[r]
            matrix = np.concatenate(
                [rank_rows(full[u.full_slice()], u) for u in layout.units], axis=1
            )  # (W, shard_numel): row d goes to rank d
            for bucket in bucket_plan(layout, gb.bucket_numel):
                cols = slice(bucket.shard_offset, bucket.shard_offset + bucket.shard_numel)
                starts = bucket_block_starts(layout, bucket, gb.block)
                matrix[:, cols] = quantized_rows(matrix[:, cols], starts, gb.bits)
            offset = 0
            for u in layout.units:
                full[u.full_offset : u.full_offset + u.padded_numel] = matrix[
                    :, offset : offset + u.shard_numel
                ].reshape(-1)
                offset += u.shard_numel
            out[r] = full[where]
        return out

    def _full_index(self, layout) -> np.ndarray:
        """For each element of the oracle's flat order, its index in the layout's full buffer."""
        at = {}
        for u in layout.units:
            for slot in u.slots:
                at[f"{u.name}.{slot.name}"] = u.full_offset + slot.offset
        parts = [
            at[k] + np.arange(n, dtype=np.int64)
            for k, n in zip(self.names, self.sizes, strict=True)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _skip(self, acc: np.ndarray) -> bool:
        """A NaN/Inf in the summed gradient: skip (fp16, or the "skip" policy) or raise."""
        bad = ~np.isfinite(acc)
        if not bad.any():
            return False  # a finite gradient whose float32 norm overflowed
        if self.scaler is not None or self.nonfinite == "skip":
            return True
        where = self.locate(int(np.argmax(bad)))
        raise NonFiniteGradientError(
            f"non-finite gradient (NaN or Inf) in {where} at step {self.step_count + 1}"
        )

    def model_step(
        self,
        model: Model,
        inputs: np.ndarray,
        targets: np.ndarray,
        lr: float | None = None,
        xp: ModuleType = np,
    ) -> float:
        """One step of `model` on inputs[j, r] / targets[j, r] (micro-step j, rank r).

        Each rank's gradient is computed from the current full parameters, as
        rank r would; returns the mean loss over all ranks and micro-steps. xp: the
        array module the engine's model math runs in (CuPy for --device gpu): the
        oracle's runs there too, so the gradients are the same bits; only the step
        (the optimizer, what ZeRO shards) is the oracle's own."""
        params = {k: xp.asarray(v) for k, v in self.model_parameters().items()}
        forward = params
        if self.quantize_block is not None:
            forward = {k: xp.asarray(v) for k, v in self.forward_parameters(model).items()}
            if self.backward_reads_forward:
                params = forward
        losses, grads = [], []
        for j in range(inputs.shape[0]):
            per_rank = []
            for r in range(inputs.shape[1]):
                x, t = inputs[j, r], targets[j, r]
                loss, g = self.model_gradients(model, params, forward, x, t)
                losses.append(loss)
                per_rank.append(g if xp is np else {k: xp.asnumpy(v) for k, v in g.items()})
            grads.append(per_rank)
        self.step(grads, lr)
        return float(np.mean(losses))

    def model_gradients(
        self, model: Model, params: NamedArrays, forward: NamedArrays, x, targets
    ) -> tuple[float, dict[str, np.ndarray]]:
        """One rank's loss and gradients: loss_and_grads, unless qwZ makes forward read
        `forward` (the dequantized parameters) and backward `params`, unit by unit in
        the engine's order (zero_ref/engine/step.py's forward_backward)."""
        if forward is params:
            return loss_and_grads(model, params, x, targets, self.loss_scale())
        kept = []  # per unit: its forward's cache, or (checkpointing) its input
        for unit in model.units:
            x_in = x
            x, cache = unit.forward(unit_params_view(unit, forward), x)
            kept.append(x_in if self.recompute else cache)
        loss, dout = model.loss(x, targets)
        if self.loss_scale() is not None:
            dout = dout * np.float32(self.loss_scale())
        grads: dict[str, np.ndarray] = {}
        for i in range(len(model.units) - 1, -1, -1):
            unit, full = model.units[i], unit_params_view(model.units[i], params)
            cache = unit.forward(full, kept[i])[1] if self.recompute else kept[i]
            unit_grads = {s.name: np.empty_like(full[s.name]) for s in unit.param_specs()}
            dout = unit.backward(full, cache, dout, unit_grads)
            grads.update({f"{unit.name}.{k}": v for k, v in unit_grads.items()})
        return loss, grads
