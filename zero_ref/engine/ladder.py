"""The ZeRO stage ladder as data, and the engine a configuration asks for (Sec. 5).

A stage is two parts: how each rank holds the parameters and how it holds and reduces
the gradients. Each stage swaps one part for the one its row of the paper adds (the
optimizer state's partition, P_os, changes both parts of stage 0: each rank updates
only its rows, so the gradient it needs is its slice and the parameters are gathered
after the update):

  stage  params              grads                 partitions (Sec. 5)
  0      ReplicatedParams    AllReducedGrads       nothing: data parallelism
  1      ShardUpdatedParams  ReduceScatteredGrads  + optimizer state (P_os)
  2      ShardUpdatedParams  ShardedGrads          + gradients (P_os+g)
  3      GatheredParams      ShardedGrads          + parameters (P_os+g+p)

`sharded(stage)` (the formulas' ladder, zero_ref/formulas/memory.py) says which model
states a stage partitions; the table below must agree with it (tests/test_ladder.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.engine import Engine
from zero_ref.engine.hooks import EngineHooks
from zero_ref.engine.stage0 import AllReducedGrads, ReplicatedParams
from zero_ref.engine.stage1 import ReduceScatteredGrads, ShardUpdatedParams
from zero_ref.engine.stage2 import ShardedGrads
from zero_ref.engine.stage3 import GatheredParams
from zero_ref.formulas.memory import sharded
from zero_ref.models.unit import Model


@dataclass(frozen=True)
class Stage:
    """One row of the ladder: the stage's number and its two parts."""

    stage: int
    params: type  # built as params(ctx, new_master), then params.fill(source)
    grads: type  # built as grads(ctx, divisor)

    @property
    def optimizer_sharded(self) -> bool:
        """P_os: m, v and the master weights kept as shards (every stage above 0)."""
        return "optimizer" in sharded(self.stage)


def _all_reduced(ctx, divisor) -> AllReducedGrads:
    return AllReducedGrads(ctx)


def _reduce_scattered(ctx, divisor) -> ReduceScatteredGrads:
    return ReduceScatteredGrads(ctx)


STAGES = (
    Stage(0, ReplicatedParams, _all_reduced),
    Stage(1, ShardUpdatedParams, _reduce_scattered),
    Stage(2, ShardUpdatedParams, ShardedGrads),
    Stage(3, GatheredParams, ShardedGrads),
)


def make_engine(
    model: Model,
    init_params: Mapping[str, np.ndarray],
    cfg: ZeroConfig,
    comm: Comm,
    hooks: EngineHooks | None = None,
) -> Engine:
    """The engine for cfg.stage, holding this rank's share of the model; `hooks`: named
    points a tool acts at (zero_ref/engine/hooks.py), none by default."""
    return Engine(STAGES[cfg.stage], model, init_params, cfg, comm, hooks)
