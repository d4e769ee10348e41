"""zero_ref.check's torch-semantics reference against torch.optim itself (torch optional).

scripts/bench/check_torch_margin.py's loops: torch's AdamW, Adam (L2 decay) and SGD (momentum,
dampening, nesterov) in float32 on random gradients, two param groups of their own lr /
weight decay / betas / eps, an lr changed every step, clipping by torch's
clip_grad_norm_, a parameter without gradient on some steps (torch skips it: its count
and moments stay). The Checker, fed the same steps, must find every one inside its bound
for 50 steps, whichever torch implementation ran (single-tensor, foreach, fused), and
must flag the element of a step whose update was moved by a little more than rounding.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.check.checker import Checker

pytest.importorskip("torch")
_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "check_torch_margin.py"
_spec = importlib.util.spec_from_file_location("check_torch_margin", _SCRIPT)
margin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(margin)


@pytest.mark.parametrize(("kind", "impl"), margin.CASES)
def test_torch_optimizers_stay_inside_the_bound(kind, impl):
    clip = None if kind == "sgd" else 1.0
    init, records = margin.torch_run(kind, impl, 50, clip)
    checker = Checker(margin.spec_for(kind, clip), init)
    verdicts = [checker.check(r) for r in records]
    assert all(v.ok for v in verdicts), str(next(v for v in verdicts if not v.ok))


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
def test_an_update_moved_past_rounding_is_flagged(kind):
    """One element of step 10's update moved by 1e-3 of the update (a few dozen float32
    ulps of the parameter): rounding cannot, so the checker names that element."""
    init, records = margin.torch_run(kind, "foreach", 12, None)
    before, rec = records[8].params_after["w"], records[9]
    step = before - rec.params_after["w"]
    rec.params_after["w"][3, 4] -= np.float32(1e-3) * step[3, 4]
    checker = Checker(margin.spec_for(kind, None), init)
    flagged = [v for v in (checker.check(r) for r in records) if not v.ok]
    assert flagged and flagged[0].step == 10
    first = flagged[0].first
    assert (first.quantity, first.name, first.index) == ("update", "w", (3, 4))


def test_a_parameter_without_gradient_is_skipped_as_torch_skips_it():
    """Parameter e has no gradient at steps 2 and 3: torch leaves it, and its count stays."""
    init, records = margin.torch_run("adamw", "foreach", 4, None)
    assert "e" not in records[1].applied_grads and "e" not in records[2].applied_grads
    np.testing.assert_array_equal(records[2].params_after["e"], records[0].params_after["e"])
    checker = Checker(margin.spec_for("adamw", None), init)
    assert all(checker.check(r).ok for r in records)
    assert checker._state.params["e"].step == 2 and checker._state.params["w"].step == 4


@settings(max_examples=15, deadline=None)
@given(
    kind=st.sampled_from(["adamw", "adam", "sgd"]),
    lr=st.sampled_from([1e-4, 1e-2, 0.3]),
    weight_decay=st.sampled_from([0.0, 0.01, 0.5]),
    beta1=st.sampled_from([0.0, 0.3, 0.9]),
    beta2=st.sampled_from([0.9, 0.999]),
    eps=st.sampled_from([1e-8, 1e-3]),
    momentum=st.sampled_from([0.0, 0.5, 0.99]),
    dampening=st.sampled_from([0.0, 0.5]),
    nesterov=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_torch_setting_stays_inside_the_bound(
    kind, lr, weight_decay, beta1, beta2, eps, momentum, dampening, nesterov, seed
):
    """torch's own optimizer, one group, over the settings' ranges (nesterov needs momentum
    and no dampening: torch refuses it otherwise): 15 steps, never flagged."""
    import torch

    from zero_ref.check.record import GroupSettings, StepRecord

    nesterov = nesterov and momentum > 0 and dampening == 0
    rng = np.random.default_rng(seed)
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in margin.SHAPES.items()}
    params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in init.values()]
    if kind == "sgd":
        extra = dict(momentum=momentum, dampening=dampening, nesterov=nesterov)
        opt = torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, **extra)
    else:
        extra = dict(betas=(beta1, beta2), eps=eps)
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        opt = cls(params, lr=lr, weight_decay=weight_decay, **extra)
    group = GroupSettings(tuple(init), lr, weight_decay, **extra)
    checker = Checker(margin.spec_for(kind, None), init)
    for step in range(1, 16):
        grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in margin.SHAPES.items()}
        for p, g in zip(params, grads.values(), strict=True):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
        after = {k: p.detach().numpy().copy() for k, p in zip(init, params, strict=True)}
        verdict = checker.check(StepRecord(step, [[grads]], [[1.0]], (group,), grads, after))
        assert verdict.ok, str(verdict)
