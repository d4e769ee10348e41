"""zero_ref.check's torch-semantics reference against torch.optim itself (torch optional).

scripts/check_torch_margin.py's loops: torch's AdamW, Adam (L2 decay) and SGD (momentum,
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

from zero_ref.check.checker import Checker

pytest.importorskip("torch")
_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_torch_margin.py"
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
