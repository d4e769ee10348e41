"""What each stage hands the update: Owned views, each field the array its name says.

The update (engine/step.py, engine/stores.py, offload/pipeline.py) reads an Owned by
name: `o.grad` for the norm, `o.master`, `o.exp_avg`, `o.exp_avg_sq` for AdamW. So a
stage that built one with two fields swapped would update the wrong array; here each
field is checked against the engine's own buffer, on one rank (COMM_SELF), at every
stage, before any step (the moments are zeros then, the gradient is not).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.layout.flat import Owned
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

UNITS = [("a", [("w", (5, 3))]), ("empty", [("w", (0,))]), ("b", [("w", (7,)), ("bias", (2,))])]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_owned_field_is_the_buffer_it_names(stage):
    model = ReplayModel(UNITS)
    cfg = ZeroConfig(stage=stage, bucket_numel=8)
    engine = make_engine(model, init_params(model, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
    engine.forward_backward(model.contexts(0, 0, 1, 1)[0, 0], np.zeros(1), 0)
    params = engine.shard_params if stage == 3 else engine.full_params
    owned = engine.owned_slices()
    assert owned, f"stage {stage}: nothing to update"
    for o in owned:
        assert type(o) is Owned
        assert np.shares_memory(o.param, params)
        assert o.master is o.param or np.shares_memory(o.master, engine.master)  # fp32
        assert np.shares_memory(o.exp_avg, engine.exp_avg)
        assert np.shares_memory(o.exp_avg_sq, engine.exp_avg_sq)
        assert not np.shares_memory(o.exp_avg, o.exp_avg_sq)
        assert not np.shares_memory(o.grad, params)
        assert not (
            np.shares_memory(o.grad, engine.exp_avg) or np.shares_memory(o.grad, engine.exp_avg_sq)
        )
    grads = np.concatenate([o.grad for o in owned])
    assert np.any(grads != 0), f"stage {stage}: o.grad is not the gradient backward wrote"
    engine.close()
