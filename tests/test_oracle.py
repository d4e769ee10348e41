"""The single-rank oracle used as a library, without MPI: it must do exactly
what zero_ref/oracle/single_rank.py's docstring says, in that order, in float32."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from zero_ref.config import AdamWConfig
from zero_ref.models.unit import init_params
from zero_ref.optim.adamw import adamw_reference, adamw_scalars
from zero_ref.optim.gradnorm import clip_coefficient, sumsq_exact_reference
from zero_ref.oracle.single_rank import Oracle
from zero_ref.testing.replay import ReplayModel

SHAPES = {"a.w": (3, 4), "a.b": (4,), "b.s": (), "b.e": (0, 2), "c.v": (7,)}
OPT = AdamWConfig(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def named(rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {k: (rng.standard_normal(s) * scale).astype(np.float32) for k, s in SHAPES.items()}


def flat(d: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(d[k], np.float32).reshape(-1) for k in SHAPES])


def assert_params_bitwise(got: dict[str, np.ndarray], flat_expected: np.ndarray) -> None:
    assert list(got) == list(SHAPES)
    np.testing.assert_array_equal(bits(flat(got)), bits(flat_expected))


class HandOptimizer:
    """The oracle's documented step, written again with plain loops over arrays."""

    def __init__(self, init: dict[str, np.ndarray], opt: AdamWConfig, clip: float | None):
        self.p = flat(init)
        self.m, self.v = np.zeros_like(self.p), np.zeros_like(self.p)
        self.opt, self.clip, self.t = opt, clip, 0

    def step(self, grads, lr=None) -> float:
        k, world = len(grads), len(grads[0])
        acc = None
        for j in range(k):  # micro-steps in order
            s_j = flat(grads[j][0]).copy()
            for r in range(1, world):  # ranks in order, within each micro-step
                s_j = s_j + flat(grads[j][r])
            acc = s_j if acc is None else acc + s_j
        g = (acc / np.float32(world * k)).astype(np.float32)
        norm = math.sqrt(sumsq_exact_reference(g))
        coef = clip_coefficient(norm, self.clip)
        if coef != 1:
            g = g * coef
        self.t += 1
        opt = self.opt if lr is None else dataclasses.replace(self.opt, lr=lr)
        adamw_reference(self.p, g, self.m, self.v, adamw_scalars(opt, self.t))
        return norm


def test_one_rank_one_micro_step_is_adamw_reference():
    rng = np.random.default_rng(0)
    init = named(rng)
    oracle = Oracle(init, OPT)
    p = flat(init)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t in range(1, 4):
        g = named(rng, 0.1)
        returned = oracle.step([[g]])
        adamw_reference(p, flat(g), m, v, adamw_scalars(OPT, t))
        assert_params_bitwise(returned, p)
        assert_params_bitwise(oracle.parameters(), p)
        np.testing.assert_array_equal(bits(oracle.exp_avg), bits(m))
        np.testing.assert_array_equal(bits(oracle.exp_avg_sq), bits(v))
        assert oracle.step_count == t
        assert oracle.last_grad_norm == math.sqrt(sumsq_exact_reference(flat(g)))


@pytest.mark.parametrize("world, k", [(1, 3), (2, 1), (3, 2), (4, 3)])
@pytest.mark.parametrize("clip", [None, 1e-3, 1e3])
def test_steps_follow_the_documented_order(world, k, clip):
    rng = np.random.default_rng([world, k])
    init = named(rng)
    oracle, hand = Oracle(init, OPT, clip), HandOptimizer(init, OPT, clip)
    for _ in range(3):
        grads = [[named(rng, 10.0 ** rng.uniform(-2, 2)) for _ in range(world)] for _ in range(k)]
        oracle.step(grads)
        norm = hand.step(grads)
        assert oracle.last_grad_norm == norm
        assert_params_bitwise(oracle.parameters(), hand.p)


def cancelling(values: list[float]) -> list[dict[str, np.ndarray]]:
    """One gradient dict per entry of `values`: every element set to that value."""
    return [{k: np.full(s, v, np.float32) for k, s in SHAPES.items()} for v in values]


NUMEL = sum(int(np.prod(s)) for s in SHAPES.values())


def norm_of_constant(value: np.float32) -> float:
    return math.sqrt(sumsq_exact_reference(np.full(NUMEL, value, np.float32)))


def norm_after_one_step(grads) -> float:
    """The oracle's norm of the mean gradient, one step from grads[j][r]."""
    oracle = Oracle({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}, OPT)
    oracle.step(grads)
    return float(oracle.last_grad_norm)


def test_ranks_are_summed_in_rank_order():
    # float32: (1e8 + 1) - 1e8 = 0, but (1e8 - 1e8) + 1 = 1
    third = np.float32(1) / np.float32(3)
    assert norm_after_one_step([cancelling([1e8, 1.0, -1e8])]) == 0.0
    assert norm_after_one_step([cancelling([1e8, -1e8, 1.0])]) == norm_of_constant(third)


def test_micro_steps_are_summed_after_ranks():
    """s_j sums ranks first; acc sums the s_j. Summing each rank's micro-steps
    first would give (1e8 + 1) - 1e8 = 0 here instead of 1."""
    grads = [cancelling([1e8, -1e8]), cancelling([1.0, 0.0])]  # grads[j][r]
    assert norm_after_one_step(grads) == norm_of_constant(np.float32(0.25))
    # micro-steps in order: (1e8 + 1) + (-1e8) = 0 with one rank
    grads = [cancelling([1e8]), cancelling([1.0]), cancelling([-1e8])]
    assert norm_after_one_step(grads) == 0.0


def test_lr_override_applies_to_one_step_only():
    rng = np.random.default_rng(1)
    init = named(rng)
    oracle, hand = Oracle(init, OPT), HandOptimizer(init, OPT, None)
    for lr in (None, 0.3, 0.0, None, 1e-4):
        grads = [[named(rng)]]
        oracle.step(grads, lr=lr)
        hand.step(grads, lr=lr)
        assert_params_bitwise(oracle.parameters(), hand.p)
    assert oracle.optimizer == OPT


def test_lr_zero_leaves_params_but_moves_state():
    rng = np.random.default_rng(2)
    init = named(rng)
    oracle = Oracle(init, OPT)
    oracle.step([[named(rng)]], lr=0.0)
    assert_params_bitwise(oracle.parameters(), flat(init))
    assert np.any(oracle.exp_avg != 0) and oracle.step_count == 1


def test_parameters_are_copies_with_names_and_shapes():
    init = named(np.random.default_rng(3))
    oracle = Oracle(init, OPT)
    params = oracle.parameters()
    assert list(params) == list(SHAPES) == oracle.names
    for name, shape in SHAPES.items():
        assert params[name].shape == shape and params[name].dtype == np.float32
        np.testing.assert_array_equal(params[name], init[name])
        params[name][...] = 123.0  # writing the copy...
    assert_params_bitwise(oracle.parameters(), flat(init))  # ...changes nothing
    init["a.w"][...] = -5.0  # nor does writing the caller's arrays
    assert not np.any(oracle.parameters()["a.w"] == -5.0)


def test_model_step_with_replay_model_equals_step_with_its_gradients():
    units = [("u0", [("w", (3, 5)), ("s", ())]), ("u1", [("e", (0,)), ("b", (7,))])]
    model = ReplayModel(units)
    init = init_params(model, seed=4)
    by_model, by_grads = Oracle(init, OPT, clip=0.5), Oracle(init, OPT, clip=0.5)
    world, k = 3, 2
    for step in range(3):
        ctx = model.contexts(seed=4, step=step, grad_accum=k, world_size=world)
        loss = by_model.model_step(model, ctx, np.zeros((k, world)))
        assert loss == 0.0
        grads = [[model.gradients(ctx[j, r]) for r in range(world)] for j in range(k)]
        by_grads.step(grads)
        assert by_model.last_grad_norm == by_grads.last_grad_norm
        a, b = by_model.parameters(), by_grads.parameters()
        assert list(a) == list(b) == list(init)
        for name in a:
            np.testing.assert_array_equal(bits(a[name]), bits(b[name]))


def run_torch_example(script: str, *args: str) -> dict:
    """Run one of the scripts/examples/oracle_*_example.py and return its last line's JSON."""
    import json
    import subprocess
    import sys

    from tests.mpi_pool import REPO

    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "examples" / script), *args],
        cwd=REPO / "scripts" / "examples",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pytorch_ddp_example_passes_zero_ref_check_and_names_a_missing_division():
    """scripts/examples/oracle_ddp_example.py: DDP (2 gloo processes, accumulation, clipping,
    torch's AdamW) watched by zero_ref.check: every step within the bound."""
    pytest.importorskip("torch")
    assert run_torch_example("oracle_ddp_example.py") == {
        "steps": 5,
        "flagged_step": None,
        "diagnoses": [],
    }


def test_pytorch_fsdp2_example_passes_zero_ref_check():
    """scripts/examples/oracle_fsdp_example.py: FSDP2 fully_shard (2 gloo processes, two units,
    accumulation without sync, clipping of DTensor grads, torch's AdamW) watched by
    zero_ref.check, which hooks the unsharded parameters before the reduce-scatter."""
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("this torch build has no torch.distributed")
    pytest.importorskip("torch.distributed.fsdp", reason="needs FSDP")
    if not hasattr(torch.distributed.fsdp, "fully_shard"):
        pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6")
    result = run_torch_example("oracle_fsdp_example.py")
    assert (result["steps"], result["flagged_step"]) == (5, None)
