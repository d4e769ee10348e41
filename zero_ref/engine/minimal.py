"""ZeRO stages 0-3 in one file, the way to read the paper's Sec. 5 before the full engine.

fp32, blocking collectives, on the CPU; no policies, hooks or schedules. It uses what
the full engine (engine/ladder.py's make_engine) uses -- the flat layout (layout/flat.py),
the model units (models/), the rank-order sums of comm/'s Comm, the exact gradient norm
and the AdamW kernel (optim/) -- so in deterministic mode it is bitwise that engine and
the single-rank oracle at every stage and world size (tests/test_minimal.py). What each
stage adds (Sec. 5.1-5.3), each visible where it happens:

  stage 0  every rank holds everything; each unit's gradient is all-reduced
  stage 1  + optimizer state sharded: a rank updates its slice, then the updated
             parameters are all-gathered
  stage 2  + gradients sharded: each unit's gradient is reduce-scattered as soon as
             backward writes it, and a rank keeps only its shard
  stage 3  + parameters sharded: each unit is all-gathered for forward and again for
             backward, and released after; no all-gather after the update

Run it: `mpirun -n 4 python -m zero_ref.engine.minimal --stage 3` (docs/stages.md).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from operator import attrgetter

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import FLAT_NAMES, ZeroConfig
from zero_ref.engine.step import StepResult
from zero_ref.layout.flat import UnitLayout, model_layout, tensor_views
from zero_ref.models.unit import Model
from zero_ref.optim.adamw import adamw_kernel, adamw_scalars, with_lr
from zero_ref.optim.gradnorm import clip_coefficient, global_grad_norm, unscale_and_clip, unscaled
from zero_ref.optim.nonfinite import NonFiniteGradientError

# What this engine reads from a ZeroConfig; any other setting belongs to the full engine.
MINIMAL_FIELDS = ("stage", "grad_accum", "clip", "deterministic", "optimizer")


def check_minimal(cfg: ZeroConfig) -> None:
    """Refuse a setting this engine does not implement (precision, offload, overlap,
    ZeRO++, ...), naming each, rather than run something else than was asked."""
    default, at = ZeroConfig(), {name: attrgetter(path) for name, path in FLAT_NAMES.items()}
    extra = [
        f"{name}={get(cfg)!r}"
        for name, get in at.items()
        if name not in MINIMAL_FIELDS and get(cfg) != get(default)
    ]
    if extra:
        raise ValueError(
            f"the minimal engine runs fp32, blocking, on the CPU, and reads only "
            f"{', '.join(MINIMAL_FIELDS)}; it does not implement {', '.join(extra)}: "
            "leave them at their defaults, or use zero_ref.engine.ladder.make_engine"
        )


class MinimalEngine:
    """One rank's share of the model at cfg.stage, and the step of Sec. 5."""

    def __init__(
        self, model: Model, init: Mapping[str, np.ndarray], cfg: ZeroConfig, comm: Comm
    ) -> None:
        check_minimal(cfg)
        if comm.reduction.deterministic != cfg.deterministic:
            raise ValueError("build the Comm with zero_ref.comm.choose.comm_for(mpi_comm, cfg)")
        self.model, self.cfg, self.comm, self.stage = model, cfg, comm, cfg.stage
        self.world, self.rank = comm.size, comm.rank
        self.layout = model_layout(model, self.world)  # each unit padded to a multiple of W
        self.step_count = 0
        full = np.zeros(self.layout.full_numel, np.float32)  # (full_numel,)
        for unit in self.layout.units:
            for name, view in tensor_views(full[unit.full_slice()], unit).items():
                view[...] = init[f"{unit.name}.{name}"]
        # stage 3 keeps only its slice of each unit: the shard buffer (shard_numel,)
        self.params = self._shard_of(full) if self.stage >= 3 else full
        self.gathered = np.zeros(self.layout.widest_unit_numel, np.float32)  # one unit
        # stage 2 keeps only its slice of the (accumulated) gradient
        grads_numel = self.layout.shard_numel if self.stage >= 2 else self.layout.full_numel
        self.grads = np.zeros(grads_numel, np.float32)
        self.unit_grad = np.zeros(self.layout.widest_unit_numel, np.float32)  # backward's
        # stage 1 keeps only its slice of AdamW's m and v
        state_numel = self.layout.shard_numel if self.stage >= 1 else self.layout.full_numel
        self.exp_avg = np.zeros(state_numel, np.float32)
        self.exp_avg_sq = np.zeros(state_numel, np.float32)

    def _shard_of(self, full: np.ndarray) -> np.ndarray:
        """This rank's slice of every unit, unit after unit: the shard buffer's layout."""
        return np.concatenate(
            [full[u.full_slice()][self._mine(u)] for u in self.layout.units]
            or [np.zeros(0, np.float32)]
        )

    def _mine(self, unit: UnitLayout) -> slice:
        """This rank's slice of a unit's padded range (layout/flat.py: equal slices)."""
        return slice(self.rank * unit.shard_numel, (self.rank + 1) * unit.shard_numel)

    # ---- the parameters a unit reads
    def unit_params(self, unit: UnitLayout) -> dict[str, np.ndarray]:
        """Stages 0-2: views of the full parameters. Stage 3: the unit all-gathered from
        every rank's slice into the one-unit buffer (Sec. 5.3)."""
        if self.stage < 3:
            return tensor_views(self.params[unit.full_slice()], unit)
        buffer = self.gathered[: unit.padded_numel]  # (W * shard_numel,)
        self.comm.allgather(self.params[unit.shard_slice()], buffer)
        return tensor_views(buffer, unit)

    # ---- the step
    def train_step(
        self, inputs: np.ndarray, targets: np.ndarray, lr: float | None = None
    ) -> StepResult:
        """One optimizer step from this rank's micro-batches inputs[j], targets[j]."""
        k = self.cfg.grad_accum
        if len(inputs) != k or len(targets) != k:
            raise ValueError(f"train_step got {len(inputs)} micro-batches; grad_accum is {k}")
        self.comm.set_context(step=self.step_count + 1)
        loss_sum = sum(self.forward_backward(inputs[j], targets[j], j == 0) for j in range(k))
        grad_norm = self.update(lr)
        loss = self.comm.allreduce_float64(loss_sum, kind="loss") / (k * self.world)
        return StepResult(self.step_count, loss, grad_norm)

    def forward_backward(self, x: np.ndarray, targets: np.ndarray, first: bool) -> float:
        """Forward unit by unit, the loss, backward in reverse; each unit's gradient
        reduced as soon as backward has written it. Returns this micro-batch's loss."""
        caches = []
        for model_unit, unit in zip(self.model.units, self.layout.units, strict=True):
            x, cache = model_unit.forward(self.unit_params(unit), x)
            caches.append(cache)  # stage 3: the gathered unit is released (overwritten)
        loss, dout = self.model.loss(x, targets)
        for i in range(len(self.layout.units) - 1, -1, -1):
            unit = self.layout.units[i]
            params = self.unit_params(unit)  # stage 3 gathers the unit again
            grad = self.unit_grad[: unit.padded_numel]  # (W * shard_numel,)
            grad[unit.numel :] = 0  # the padding; backward overwrites the rest
            dout = self.model.units[i].backward(params, caches[i], dout, tensor_views(grad, unit))
            caches[i] = None
            self.reduce_unit_grad(unit, grad, first)
        return loss

    def reduce_unit_grad(self, unit: UnitLayout, grad: np.ndarray, first: bool) -> None:
        """Sum one unit's gradient over the ranks (in rank order in deterministic mode)
        and add it to this micro-step's total. Stages 0-1 all-reduce it and keep it
        whole; stages 2-3 reduce-scatter it: each rank receives only its slice."""
        if self.stage < 2:
            self.comm.allreduce_sum(grad)
            summed, total = grad, self.grads[unit.full_slice()]
        else:
            summed = np.empty(unit.shard_numel, np.float32)  # (shard_numel,)
            self.comm.reduce_scatter_sum(grad, summed)
            total = self.grads[unit.shard_slice()]
        if first:
            total[...] = summed
        else:
            total += summed  # micro-step order, as the oracle adds them

    def owned(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """(param, grad, exp_avg, exp_avg_sq) of each unit, for the part this rank
        updates: all of it at stage 0, its slice from stage 1 on."""
        pieces = []
        for unit in self.layout.units:
            whole = unit.full_slice()  # the unit, in a full buffer
            start = unit.full_offset + self.rank * unit.shard_numel
            mine = slice(start, start + unit.shard_numel)  # this rank's slice, in a full buffer
            shard = unit.shard_slice()  # this rank's slice, in a shard buffer
            p, g, state = {  # where each state is read, stage by stage: the ladder
                0: (whole, whole, whole),
                1: (mine, mine, shard),  # + optimizer state sharded
                2: (mine, shard, shard),  # + gradients sharded
                3: (shard, shard, shard),  # + parameters sharded
            }[self.stage]
            m, v = self.exp_avg[state], self.exp_avg_sq[state]
            pieces.append((self.params[p], self.grads[g], m, v))
        return pieces

    def update(self, lr: float | None) -> float:
        """Sec. 5's update phase: the mean gradient's global norm (over every rank's
        slice from stage 1 on), clipping, AdamW on what this rank owns; stages 1-2 then
        all-gather the updated parameters. Returns the norm."""
        divisor = np.float32(self.world * self.cfg.grad_accum)  # the mean over W k
        pieces = self.owned()
        norm_comm = self.comm if self.stage >= 1 else None  # who holds the other slices
        unscaled_grads = (unscaled(grad, divisor) for _, grad, _, _ in pieces)
        norm = global_grad_norm(unscaled_grads, norm_comm, exact=self.cfg.deterministic)
        if not math.isfinite(norm):  # the same norm on every rank: all raise
            raise NonFiniteGradientError(f"non-finite gradient norm at step {self.step_count + 1}")
        self.step_count += 1
        coef = clip_coefficient(norm, self.cfg.clip)
        s = adamw_scalars(with_lr(self.cfg.optimizer, lr), self.step_count)
        for param, grad, exp_avg, exp_avg_sq in pieces:
            adamw_kernel(param, unscale_and_clip(grad, divisor, coef), exp_avg, exp_avg_sq, s)
        if self.stage in (1, 2):  # every rank needs every updated parameter again
            for unit in self.layout.units:
                self.comm.allgather_in_place(self.params[unit.full_slice()])
        return norm

    def full_parameters(self) -> dict[str, np.ndarray]:
        """Every parameter by global name, whole (a collective at stage 3)."""
        named = {}
        for unit in self.layout.units:
            named |= {f"{unit.name}.{n}": v.copy() for n, v in self.unit_params(unit).items()}
        return named


# ---- the command: a character MLP on random windows of one sentence, checked each step
TEXT = "zero redundancy: each rank keeps one slice of every unit, and gathers the rest. "


def build_parser() -> argparse.ArgumentParser:
    """The flags of `python -m zero_ref.engine.minimal`."""
    parser = argparse.ArgumentParser(
        prog="python -m zero_ref.engine.minimal",
        description="Train a tiny character MLP with the minimal ZeRO engine; rank 0 "
        "checks each step's parameters against the single-rank oracle, bit for bit.",
    )
    parser.add_argument("--stage", type=_int_in(0, 3), default=3, help="0..3 (default 3)")
    parser.add_argument("--steps", type=_int_in(1, 1000), default=5, help="1..1000")
    parser.add_argument("--grad-accum", type=_int_in(1, 64), default=1, help="1..64")
    parser.add_argument("--clip", type=float, default=None, help="max gradient norm (> 0)")
    parser.add_argument("--seed", type=_int_in(0, 2**32 - 1), default=0, help="0..2^32-1")
    return parser


def _int_in(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi], else an error naming the range."""

    def parse(text: str) -> int:
        if not text.lstrip("-").isdigit() or not lo <= int(text) <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in [{lo}, {hi}]")
        return int(text)

    return parse


def main(argv: list[str] | None = None) -> None:
    """Train, printing each step's loss, norm and whether it is bitwise the oracle."""
    from zero_ref.comm.choose import world_comm
    from zero_ref.config import AdamWConfig
    from zero_ref.models.mlp import CharMLP, MLPConfig
    from zero_ref.models.unit import init_params
    from zero_ref.oracle.single_rank import Oracle

    args = build_parser().parse_args(argv)
    cfg = ZeroConfig(
        stage=args.stage, grad_accum=args.grad_accum, clip=args.clip, deterministic=True,
        optimizer=AdamWConfig(lr=1e-2),
    )  # fmt: skip
    comm = world_comm(cfg)
    vocab = sorted(set(TEXT))
    tokens = np.array([vocab.index(c) for c in TEXT], np.int32)
    model = CharMLP(MLPConfig(len(vocab), context=4, d_embed=8, d_hidden=32))
    init = init_params(model, args.seed)
    engine = MinimalEngine(model, init, cfg, comm)
    oracle = Oracle.for_config(init, cfg, model) if comm.rank == 0 else None
    shape = (cfg.grad_accum, comm.size, 8)  # (k, W, b) windows of 4 characters
    for step in range(args.steps):
        starts = np.random.default_rng([args.seed, step]).integers(0, len(TEXT) - 4, shape)
        inputs, targets = tokens[starts[..., None] + np.arange(4)], tokens[starts + 4]
        result = engine.train_step(inputs[:, comm.rank], targets[:, comm.rank])
        params = engine.full_parameters()
        if oracle is not None:
            oracle.model_step(model, inputs, targets)
            same = all(_bits(params[n]) == _bits(v) for n, v in oracle.parameters().items())
            print(
                f"step {result.step}: loss {result.loss:.4f}, grad norm {result.grad_norm:.4f}, "
                f"stage {cfg.stage} on {comm.size} ranks, bitwise the oracle: {same}",
                flush=True,
            )


def _bits(a: np.ndarray) -> bytes:
    """An array's bytes: equal bytes are equal bits (np.array_equal takes -0.0 for 0.0)."""
    return np.ascontiguousarray(a).tobytes()


if __name__ == "__main__":
    main()
