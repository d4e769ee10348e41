"""The minimal engine (zero_ref/engine/minimal.py) is bitwise the full engine and the
single-rank oracle, at every stage and at 1-4 ranks; it refuses what it does not
implement; it stays short; and docs/stages.md's walk through it points at real lines.

The property test is cheap (CI runs it): a few draws and pinned examples per stage.
The heavier one across odd shapes (zero-size, scalar and prime-sized tensors, units of
nothing, the character MLP) runs with ZERO_REF_HEAVY_MINIMAL=1."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.test_parity import MLP, TINY_UNITS, units
from zero_ref.comm.collectives import Comm
from zero_ref.comm.reduction import MPIReduction, OrderedReduction
from zero_ref.config import (
    HybridConfig,
    MixedPrecisionConfig,
    OffloadConfig,
    OverlapConfig,
    ZeroConfig,
    ZeroPPConfig,
)
from zero_ref.engine import minimal
from zero_ref.engine.minimal import MINIMAL_FIELDS, MinimalEngine, check_minimal
from zero_ref.models.unit import init_params
from zero_ref.testing.replay import ReplayModel

REPO = Path(__file__).resolve().parents[1]
MINIMAL = REPO / "zero_ref/engine/minimal.py"
HEAVY = os.environ.get("ZERO_REF_HEAVY_MINIMAL") == "1"
# zero-size, scalar and prime-sized tensors, units of nothing (tests/test_parity.py's), the MLP
ODD_MODELS = st.one_of(units.map(lambda u: {"model": "replay", "units": u}), st.just(MLP))

SMALL_UNITS = {  # a scalar, a prime, a tensor cut by every shard boundary at 2-4 ranks
    "model": "replay",
    "units": [["u0", [["t0", []], ["t1", [5]]]], ["u1", [["t0", [3, 7]]]]],
}


def case(model: dict, **changes) -> dict:
    """A case as the pool worker reads it (tests/minimal_case.py)."""
    return {
        "engine": "minimal",
        "world": 2,
        "model": model,
        "stage": 3,
        "bucket_numel": 4,
        "grad_accum": 1,
        "clip": None,
        "weight_decay": 0.1,
        "lr": 1e-2,
        "lrs": [None, 3e-2],
        "steps": 2,
        "seed": 3,
        **changes,
    }


def drawn_cases(model: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(
        lambda m, **kw: case(m, **kw),
        model,
        world=st.sampled_from([1, 2, 3, 4]),
        stage=st.sampled_from([0, 1, 2, 3]),
        bucket_numel=st.sampled_from([1, 4, 64, 1 << 20]),
        grad_accum=st.sampled_from([1, 2, 3]),
        clip=st.sampled_from([None, 0.5]),
        lrs=st.lists(st.sampled_from([None, 1e-3, 3e-2]), min_size=2, max_size=2),
        steps=st.integers(1, 2),
        seed=st.integers(0, 2**16),
    )


def check_same(mpi_pools, drawn: dict) -> None:
    """Every step: minimal == full == oracle, bit for bit, and the same norm and count;
    the loss the two engines report is one computation (equal), the oracle's within
    float64 reordering (tests/test_parity.py's check_loss says why)."""
    skip = ("world", "model")
    result = mpi_pools(drawn["world"]).run(
        {k: v for k, v in drawn.items() if k not in skip} | drawn["model"]
    )
    assert len(result["steps"]) == drawn["steps"]
    for i, step in enumerate(result["steps"]):
        where = f"step {i} of {drawn}"
        assert step["full_is_oracle"], f"{where}: the full engine is not the oracle"
        assert step["minimal_is_full"], f"{where}: the minimal engine is not the full engine"
        assert step["minimal_is_oracle"], f"{where}: the minimal engine is not the oracle"
        assert len(set(step["norms"])) == 1, f"{where}: norms {step['norms']}"
        assert len(set(step["step_counts"])) == 1, f"{where}: steps {step['step_counts']}"
        got, want, oracle = step["losses"]
        assert got == want and math.isclose(got, oracle, rel_tol=1e-12), where


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=drawn_cases(st.just(SMALL_UNITS)))
@example(drawn=case(SMALL_UNITS, world=1, stage=0, grad_accum=2))
@example(drawn=case(SMALL_UNITS, world=2, stage=1, clip=0.5))
@example(drawn=case(SMALL_UNITS, world=3, stage=2, grad_accum=3, bucket_numel=1))
@example(drawn=case(SMALL_UNITS, world=4, stage=3, grad_accum=2, clip=0.5))
@example(drawn=case(SMALL_UNITS, world=3, stage=3))
def test_minimal_is_full_engine_and_oracle(mpi_pools, drawn):
    check_same(mpi_pools, drawn)


@pytest.mark.skipif(not HEAVY, reason="heavier: set ZERO_REF_HEAVY_MINIMAL=1")
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    drawn=drawn_cases(st.one_of(units.map(lambda u: {"model": "replay", "units": u}), st.just(MLP)))
)
@example(drawn=case(TINY_UNITS, world=4, stage=3, grad_accum=2))
@example(drawn=case(TINY_UNITS, world=3, stage=1))
@example(drawn=case(MLP, world=3, stage=2, clip=0.5))
def test_minimal_across_odd_shapes(mpi_pools, drawn):
    check_same(mpi_pools, drawn)


# ---- what it refuses, without MPI
REFUSED = {  # a setting of each policy the full engine adds, and a knob of its buckets
    "precision": {"mixed_precision": MixedPrecisionConfig(dtype="bf16")},
    "offload_optimizer": {"offload": OffloadConfig(optimizer="nvme", nvme_path="/tmp")},
    "overlap_comm": {"overlap": OverlapConfig(comm=True)},
    "device": {"device": "gpu"},
    "quantized_weights": {"stage": 3, "zeropp": ZeroPPConfig(quantized_weights=True)},
    "hybrid_shard_size": {"hybrid": HybridConfig(shard_size=2)},
    "checkpoint_activations": {"checkpoint_activations": True},
    "nonfinite": {"nonfinite": "skip"},
    "bucket_numel": {"bucket_numel": 7},
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_setting_of_the_full_engine_is_refused_by_name(name):
    cfg = ZeroConfig(**REFUSED[name])
    with pytest.raises(ValueError, match=rf"does not implement .*{name}=") as got:
        check_minimal(cfg)
    assert "make_engine" in str(got.value)


@pytest.mark.parametrize("stage", [0, 3])
def test_the_settings_it_reads_are_accepted_at_both_ends(stage):
    for cfg in (ZeroConfig(stage=stage), ZeroConfig(stage=stage, grad_accum=64, clip=1e-3)):
        check_minimal(cfg)
    assert set(MINIMAL_FIELDS) <= set(ZeroConfig.__dataclass_fields__)


def one_unit_model():
    return ReplayModel([("u0", [("t0", (3,))])])


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_comm_whose_sums_disagree_with_the_config_is_refused(mpi_comm, deterministic):
    model = one_unit_model()
    reduction = MPIReduction() if deterministic else OrderedReduction()
    cfg = ZeroConfig(stage=1, deterministic=deterministic)
    with pytest.raises(ValueError, match="comm_for"):
        MinimalEngine(model, init_params(model, 0), cfg, Comm(mpi_comm, reduction))


def test_a_wrong_number_of_micro_batches_is_refused(mpi_comm):
    model = one_unit_model()
    cfg = ZeroConfig(stage=2, grad_accum=2, deterministic=True)
    engine = MinimalEngine(model, init_params(model, 0), cfg, Comm(mpi_comm, OrderedReduction()))
    x = np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="got 1 micro-batches; grad_accum is 2"):
        engine.train_step(x, x)


def test_a_nan_gradient_raises_on_the_step_it_appears(mpi_comm):
    from zero_ref.models.mlp import CharMLP, MLPConfig
    from zero_ref.optim.nonfinite import NonFiniteGradientError

    model = CharMLP(MLPConfig(5, context=2, d_embed=2, d_hidden=3))
    init = init_params(model, 0)
    init["hidden.weight"][0, 0] = np.nan  # every gradient below it is NaN
    cfg = ZeroConfig(stage=3, deterministic=True)
    engine = MinimalEngine(model, init, cfg, Comm(mpi_comm, OrderedReduction()))
    with pytest.raises(NonFiniteGradientError, match="at step 1"):
        engine.train_step(np.zeros((1, 4, 2), np.int32), np.zeros((1, 4), np.int32))


def test_the_command_trains_bitwise_the_oracle(capsys):
    """`python -m zero_ref.engine.minimal` in this process (one rank): each step says so."""
    minimal.main(["--stage", "3", "--steps", "2", "--grad-accum", "2", "--clip", "0.5"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.endswith("bitwise the oracle: True") for line in lines)


# ---- it stays a file a reader can hold, and the docs' walk through it stays true
def test_the_minimal_engine_is_one_short_file_without_policies():
    source = MINIMAL.read_text()
    assert len(source.splitlines()) <= 300
    imported = set(re.findall(r"^from (zero_ref\.\S+) import", source, re.M))
    assert not imported & {
        "zero_ref.engine.precision",
        "zero_ref.engine.stores",
        "zero_ref.engine.collective_schedule",
        "zero_ref.engine.hooks",
        "zero_ref.engine.base",
    }


def test_stages_md_line_references_name_what_is_there():
    """Every [`name`](../zero_ref/engine/minimal.py#Ln) link of docs/stages.md: line n of
    the file defines `name` (or, for a name not defined, mentions it)."""
    page = (REPO / "docs/stages.md").read_text()
    links = re.findall(r"\[`([\w.]+)(?:\(\))?`\]\(\.\./zero_ref/engine/minimal\.py#L(\d+)\)", page)
    assert len(links) >= 8, "docs/stages.md's walk through minimal.py has lost its links"
    lines = MINIMAL.read_text().splitlines()
    for name, n in links:
        line = lines[int(n) - 1]
        short = name.split(".")[-1]
        assert re.search(rf"\b(def|class) {short}\b", line) or short in line, (
            f"docs/stages.md links `{name}` to minimal.py line {n}, which is: {line.strip()}"
        )


def test_stages_md_quotes_what_trace_frames_measures():
    """docs/stages.md's table of frames and lines is scripts/bench/trace_frames.py's figures now
    (a change to either engine's call path changes them: rerun the script, update it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "trace_frames", REPO / "scripts/bench/trace_frames.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    got = script.measure_both()
    page = (REPO / "docs/stages.md").read_text()
    rows = {  # the table's first cell (its start) -> the figure of each engine
        "| frames from `train_step`": lambda e: e["stack_depth"],
        "| distinct zero_ref functions": lambda e: e["window_zero_ref_functions"],
        "| ... of them outside comm/": lambda e: e["window_engine_functions"],
        "| zero_ref lines executed": lambda e: e["step"]["engine_side"]["executed_lines"],
        "| ... in files": lambda e: e["step"]["engine_side"]["files"],
        "| lines those files hold": lambda e: e["step"]["engine_side"]["lines_in_those_files"],
    }
    for start, figure in rows.items():
        line = next(line for line in page.splitlines() if line.startswith(start))
        quoted = [int(c.strip().replace(",", "")) for c in line.strip("|").split("|")[1:]]
        assert quoted == [figure(got["minimal"]), figure(got["full"])], line
    model = got["minimal"]["step"]["model"]
    assert f"{model['executed_lines']} lines executed in {model['files']} files" in page


@pytest.mark.parametrize(
    "flag, good, bad",
    [("--stage", ["0", "3"], ["-1", "4", "2.5"]), ("--steps", ["1", "1000"], ["0", "1001"])]
    + [("--grad-accum", ["1", "64"], ["0", "65"]), ("--seed", ["0"], ["-1", "x"])],
)
def test_the_command_takes_each_range_at_both_ends_and_refuses_one_beyond(flag, good, bad, capsys):
    parser = minimal.build_parser()
    for value in good:
        assert getattr(parser.parse_args([flag, value]), flag[2:].replace("-", "_")) == int(value)
    for value in bad:
        with pytest.raises(SystemExit):
            parser.parse_args([flag, value])
        assert f"{value!r} is not an integer in [" in capsys.readouterr().err
