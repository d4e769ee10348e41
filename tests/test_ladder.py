"""The stage ladder as data (zero_ref/engine/ladder.py, issue 32 item 2): each stage is two
parts, the table agrees with the formulas' ladder (formulas.memory.sharded), the classes are
shallow (no method defined at three levels of one class's ancestry), every attribute a part
sets is read by it, and the engine is built without calling into a half-built object."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from mpi4py import MPI

from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine import engine as engine_module
from zero_ref.engine import stage0, stage1, stage2, stage3
from zero_ref.engine.ladder import STAGES, make_engine
from zero_ref.formulas.memory import sharded
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

PARTS = [
    stage0.ReplicatedParams,
    stage0.FullGradients,
    stage0.AllReducedGrads,
    stage1.ShardUpdatedParams,
    stage1.ReduceScatteredGrads,
    stage2.ShardedGrads,
    stage3.GatheredParams,
]
MODEL = ReplayModel([("u0", [("w", (3, 5))]), ("u1", [("b", (7,))])])


@pytest.mark.parametrize("row", STAGES, ids=lambda r: f"stage{r.stage}")
def test_each_row_partitions_what_the_formulas_say(row):
    states = sharded(row.stage)
    assert row.optimizer_sharded == ("optimizer" in states)
    assert (row.params is stage3.GatheredParams) == ("params" in states)
    assert (row.grads is stage2.ShardedGrads) == ("grads" in states)
    assert row.stage == STAGES.index(row)


def test_each_stage_changes_only_what_its_row_adds():
    """Stage 1 (P_os) changes both parts (updates in shards: the gradient it needs is its
    slice, the parameters are gathered after); stage 2 only the gradients; stage 3 only
    the parameters."""
    changed = [
        {name for name in ("params", "grads") if getattr(a, name) is not getattr(b, name)}
        for a, b in zip(STAGES, STAGES[1:], strict=False)
    ]
    assert changed == [{"params", "grads"}, {"grads"}, {"params"}]


def _defined_in(cls: type) -> dict[str, list[type]]:
    """method name -> the classes of cls's ancestry (object left out) that define it."""
    out: dict[str, list[type]] = {}
    for klass in cls.__mro__[:-1]:
        for name, value in vars(klass).items():
            if inspect.isfunction(value) or isinstance(value, property):
                out.setdefault(name, []).append(klass)
    return out


@pytest.mark.parametrize("cls", [*PARTS, engine_module.Engine], ids=lambda c: c.__name__)
def test_no_method_is_defined_at_three_levels(cls):
    deep = {n: [k.__name__ for k in ks] for n, ks in _defined_in(cls).items() if len(ks) >= 3}
    assert not deep, deep
    assert len(cls.__mro__) <= 4, [k.__name__ for k in cls.__mro__]  # cls, <= 2 more, object


def _self_attributes(cls: type) -> tuple[set[str], set[str]]:
    """(attributes assigned as self.x = ..., attributes read as self.x) in cls's ancestry."""
    stored, read = set(), set()
    for klass in cls.__mro__[:-1]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                (stored if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return stored, read


# read by the other part of the stage (ReplicatedParams.owned reads grads.grad_acc,
# GatheredParams.owned reads grads.shard_grads) or by tools through the engine's names
READ_ELSEWHERE = {"grad_acc", "shard_grads", "grad_shard", "shard_params", "full_params"}


@pytest.mark.parametrize("cls", PARTS, ids=lambda c: c.__name__)
def test_a_part_keeps_no_state_it_never_reads(cls):
    stored, read = _self_attributes(cls)
    unused = stored - read - READ_ELSEWHERE
    assert not unused, f"{cls.__name__} stores {sorted(unused)} and never reads it"


@pytest.mark.parametrize("stage", range(4))
def test_the_engine_holds_its_rows_parts(stage):
    cfg = ZeroConfig(stage=stage)
    engine = make_engine(MODEL, init_params(MODEL, 0), cfg, comm_for(MPI.COMM_SELF, cfg))
    try:
        assert type(engine.params) is STAGES[stage].params
        assert type(engine.grads).__name__ in {"AllReducedGrads", "ReduceScatteredGrads"} | {
            "ShardedGrads"
        }
        assert engine.stage == stage and engine.params.ctx is engine.grads.ctx is engine.ctx
    finally:
        engine.close()


def test_a_part_is_built_from_a_finished_context():
    """The parts' constructors take the context and plain callables, never the engine:
    nothing they call can reach an attribute the engine has not set yet."""
    for cls in PARTS:
        params = list(inspect.signature(cls.__init__).parameters)
        assert "engine" not in params and params[1] == "ctx", (cls.__name__, params)


def test_a_reader_follows_at_most_16_frames_from_backward_to_the_kernel():
    """Issue 32 item 2's bound on the full engine (scripts/bench/trace_frames.py's
    grad_path_frames: 19 before the ladder became data, 16 after)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts/bench/trace_frames.py"
    spec = importlib.util.spec_from_file_location("trace_frames", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    got = script.measure_both()
    assert got["full"]["grad_path_frames"] <= 16, got["full"]
    assert got["minimal"]["grad_path_frames"] <= got["full"]["grad_path_frames"]
