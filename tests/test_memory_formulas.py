"""zero_ref/formulas/memory.py: the stage ladder written once, and each buffer the
engine keeps, by its ledger name, what the formula says (not only their sum)."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from zero_ref.comm.collectives import Comm
from zero_ref.config import HybridConfig, MixedPrecisionConfig, ZeroConfig, ZeroPPConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.formulas.memory import (
    LADDER,
    buffer_bytes,
    group_size_of,
    hpz_group_of,
    shard_world_of,
    sharded,
)
from zero_ref.models.unit import init_params
from zero_ref.numerics.dtypes import element_bytes
from zero_ref.testing.replay import ReplayModel


def test_each_stage_shards_what_the_one_below_does_and_one_thing_more():
    assert [sorted(sharded(s)) for s in range(4)] == [
        [],
        ["optimizer"],
        ["grads", "optimizer"],
        ["grads", "optimizer", "params"],
    ]
    for stage in range(1, 4):
        assert sharded(stage) - sharded(stage - 1) == {LADDER[stage - 1]}
    with pytest.raises(ValueError, match="stage 4 is not one of 0, 1, 2, 3"):
        sharded(4)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize(
    "precision, grad, wire",
    [("fp32", None, None), ("fp16", None, None), ("bf16", None, "fp32"), ("bf16", "fp32", None)],
)
def test_each_buffer_the_engine_holds_is_the_formulas(stage, k, precision, grad, wire):
    model = ReplayModel([("u0", [("w", (3, 5)), ("s", ())]), ("u1", [("b", (7,))])])
    cfg = ZeroConfig(
        stage=stage,
        grad_accum=k,
        bucket_numel=8,
        mixed_precision=MixedPrecisionConfig(
            dtype=precision, grad_accum_dtype=grad, communication_data_type=wire
        ),
    )
    engine = make_engine(model, init_params(model, 0), cfg, Comm(MPI.COMM_SELF))
    mp = cfg.mixed_precision
    sizes = element_bytes(mp.dtype, mp.grad_dtype, mp.comm_dtype)
    numels = [u.padded_numel for u in engine.layout.units]
    assert engine.buffer_bytes() == buffer_bytes(stage, numels, 1, 8, k, sizes)


@pytest.mark.parametrize(
    "size, ranks_per_host, ranks",
    [("host", 3, 3), ("host", 1, 1), ("host", None, None), (1, 3, 1), (2, 3, 2), (3, None, 3)],
)
def test_group_size_of_reads_each_value_a_group_setting_takes(size, ranks_per_host, ranks):
    """ "host" is the ranks sharing a host (None: not known here), an integer is itself."""
    assert group_size_of(size, ranks_per_host) == ranks


@pytest.mark.parametrize("field", ["hpz_partition_size", "hybrid_shard_size"])
def test_a_host_group_is_the_ranks_per_host_or_the_whole_world(field):
    """hpZ's group and the hybrid shard world read "host" the same way: the ranks per host
    where the caller knows it, else the world (an estimate before launch: one host)."""
    of = hpz_group_of if field == "hpz_partition_size" else shard_world_of

    def config(size):
        if field == "hpz_partition_size":
            return ZeroConfig(stage=3, zeropp=ZeroPPConfig(hpz_partition_size=size))
        return ZeroConfig(stage=3, hybrid=HybridConfig(shard_size=size))

    cfg = config("host")
    assert of(cfg, 6, ranks_per_host=3) == 3
    assert of(cfg, 6) == 6
    assert of(config(2), 6, ranks_per_host=3) == 2
