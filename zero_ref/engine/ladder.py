"""The ZeRO stage ladder, and the engine a configuration asks for (Sec. 5 of the paper).

Each stage is a subclass of the one below it and adds exactly one thing:

  Stage0DataParallel      baseline: full replicas, gradients all-reduced
  Stage1OptimizerSharded  + optimizer state partitioned (P_os)
  Stage2GradientsSharded  + gradients partitioned, reduce-scattered in buckets (P_os+g)
  Stage3ParamsSharded     + parameters partitioned, gathered per unit (P_os+g+p)

Its own module, not the package's __init__: every `zero_ref.engine.X` import runs that
__init__, and one that imported the stages would tie each stage to itself in a circle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.hooks import EngineHooks
from zero_ref.engine.stage0 import Stage0DataParallel
from zero_ref.engine.stage1 import Stage1OptimizerSharded
from zero_ref.engine.stage2 import Stage2GradientsSharded
from zero_ref.engine.stage3 import Stage3ParamsSharded
from zero_ref.models.unit import Model

LADDER = (Stage0DataParallel, Stage1OptimizerSharded, Stage2GradientsSharded, Stage3ParamsSharded)


def make_engine(
    model: Model,
    init_params: Mapping[str, np.ndarray],
    cfg: ZeroConfig,
    comm: Comm,
    hooks: EngineHooks | None = None,
) -> Stage0DataParallel:
    """The engine for cfg.stage, holding this rank's share of the model; `hooks`: named
    points a tool acts at (zero_ref/engine/hooks.py), none by default."""
    return LADDER[cfg.stage](model, init_params, cfg, comm, hooks)
