"""zero_ref.check's catalogue: every bug it names is flagged at its first affected step and
diagnosed by that name alone, and each clean twin passes 50 steps with no alarm.

The loops are tests/check_sim.py's (float32 NumPy, torch's conventions, the reduction
DDP does): 2 ranks and 3 micro-steps, so that a factor of A and a factor of N differ
(with N = A they cannot be told apart: test_equal_factors_name_both).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.check_sim import SimRun, initial_params, simulate
from zero_ref.check import diagnoses as dg
from zero_ref.check.checker import Checker
from zero_ref.check.oracle_step import initial_state
from zero_ref.check.plan import default_plan

SCHEDULE = tuple(1.0 / (1 + 0.3 * t) for t in range(60))
# bug -> (the loop's settings, the first step the bug changes)
CASES = {
    "accumulation_divided_twice": ({}, 1),
    "accumulation_not_divided": ({}, 1),
    "micro_batch_dropped": ({}, 1),
    "micro_steps_overwritten": ({}, 1),
    "micro_batch_counted_twice": ({}, 1),
    "token_mean_per_micro_batch": ({"normalization": "weighted"}, 1),
    "grads_not_zeroed": ({}, 2),
    "world_divided_twice": ({}, 1),
    "world_not_divided": ({}, 1),
    "clip_local_norm": ({}, 1),
    "clip_before_reduction": ({}, 1),
    "decay_on_excluded": ({}, 1),
    "decay_missing": ({}, 1),
    "l2_instead_of_decoupled": ({}, 1),
    "decoupled_instead_of_l2": ({"optimizer": "adam"}, 1),
    "bias_correction_step_off_by_one": ({}, 1),
    "step_counted_without_grad": ({"no_grad_steps": {2: "b2", 3: "b2"}}, 4),
    "unscale_with_updated_scale": ({"scaler": True, "growth_interval": 3}, 3),
    "clip_before_unscale": ({"scaler": True}, 1),
    "lr_one_step_early": ({"schedule": SCHEDULE}, 1),
    "lr_one_step_late": ({"schedule": SCHEDULE}, 2),
    "state_reset_on_resume": ({"resume_at": 6}, 6),
}


def _verdicts(run: SimRun, steps: int):
    checker = Checker(run.spec(), initial_params(run))
    return [checker.check(r) for r in simulate(run, steps)]


def test_the_cases_cover_the_catalogue():
    assert set(CASES) == set(dg.CATALOGUE)


def test_the_reference_page_explains_every_diagnosis():
    page = (Path(__file__).resolve().parents[1] / "docs" / "check_reference.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", page.split("## The diagnoses")[1], flags=re.M)
    assert rows == list(dg.CATALOGUE)


@pytest.mark.parametrize("bug", sorted(CASES))
def test_each_bug_is_flagged_at_its_first_step_and_named(bug):
    settings, first = CASES[bug]
    verdicts = _verdicts(SimRun(bugs=frozenset({bug}), **settings), first + 2)
    flagged = [v for v in verdicts if not v.ok]
    assert flagged, f"{bug}: no step flagged"
    assert flagged[0].step == first, str(flagged[0])
    assert flagged[0].diagnoses == (bug,), str(flagged[0])
    assert bug in str(flagged[0])  # the paragraph a user reads names it


@pytest.mark.parametrize("bug", sorted(CASES))
def test_each_clean_twin_passes_fifty_steps(bug):
    settings, _ = CASES[bug]
    verdicts = _verdicts(SimRun(**settings), 50)
    assert all(v.ok for v in verdicts), str(next(v for v in verdicts if not v.ok))


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
@pytest.mark.parametrize(("world", "accum"), [(1, 1), (3, 2), (2, 3), (3, 3)])
def test_clean_loops_at_the_ends_pass(world, accum, optimizer):
    run = SimRun(world=world, accum=accum, optimizer=optimizer, clip=None if world == 3 else 0.5)
    assert all(v.ok for v in _verdicts(run, 12))


def test_equal_factors_name_both():
    """N = A = 3: dividing by A twice is dividing by N twice; the verdict says both."""
    run = SimRun(world=3, accum=3, bugs=frozenset({"accumulation_divided_twice"}))
    flagged = next(v for v in _verdicts(run, 2) if not v.ok)
    assert set(flagged.diagnoses) == {"accumulation_divided_twice", "world_divided_twice"}
    assert "under each of" in str(flagged)


def test_a_persistent_bug_that_earlier_steps_rule_out_is_not_named():
    """The scale grows at step 3: unscaling with the grown scale halves the gradient, which
    dividing by N = 2 twice would also do, but that would have shown at steps 1 and 2."""
    run = SimRun(scaler=True, growth_interval=3, bugs=frozenset({"unscale_with_updated_scale"}))
    flagged = next(v for v in _verdicts(run, 4) if not v.ok)
    assert flagged.diagnoses == ("unscale_with_updated_scale",)


def test_later_steps_point_back_to_the_first_and_keep_its_diagnosis():
    """After the first flagged step each diagnosis follows its own trajectory: a kept
    convention (a factor every step) and a bug that struck once (a reset at step 6, the
    steps after it correct from the reset state) are both named again later."""
    verdicts = _verdicts(SimRun(bugs=frozenset({"world_not_divided"})), 4)
    assert [v.since for v in verdicts] == [None, 1, 1, 1] and "step 1" in str(verdicts[2])
    assert all(v.diagnoses == ("world_not_divided",) for v in verdicts)
    verdicts = _verdicts(SimRun(resume_at=6, bugs=frozenset({"state_reset_on_resume"})), 9)
    assert [v.ok for v in verdicts] == [True] * 5 + [False] * 4
    assert all(v.diagnoses == ("state_reset_on_resume",) for v in verdicts[5:])


def test_a_step_back_on_track_starts_afresh():
    """Clipping hides a halved gradient from the update: steps 4 and 5 pass, step 6 (the
    scale grows again) is flagged on its own, not as following step 3."""
    run = SimRun(scaler=True, growth_interval=3, bugs=frozenset({"unscale_with_updated_scale"}))
    verdicts = _verdicts(run, 6)
    assert [v.ok for v in verdicts] == [True, True, False, True, True, False]
    assert verdicts[5].since is None and verdicts[5].diagnoses == ("unscale_with_updated_scale",)


def _context(run: SimRun, steps_before: int = 0):
    """The oracle's state and plan at step steps_before + 1 of a clean run."""
    spec, records = run.spec(), list(simulate(run, steps_before + 1))
    checker = Checker(spec, initial_params(run))
    for r in records[:-1]:
        checker.check(r)
    state = checker._state if steps_before else initial_state(initial_params(run))
    return spec, records[-1], state, default_plan(spec, records[-1])


@pytest.mark.parametrize(
    ("name", "settings", "steps_before"),
    [
        ("accumulation_divided_twice", {"accum": 1}, 0),
        ("accumulation_not_divided", {"accum": 1}, 0),
        ("micro_batch_dropped", {"accum": 1}, 0),
        ("micro_steps_overwritten", {"accum": 1}, 0),
        ("micro_batch_counted_twice", {"accum": 1}, 0),
        ("token_mean_per_micro_batch", {}, 0),
        ("grads_not_zeroed", {}, 0),
        ("world_divided_twice", {"world": 1}, 0),
        ("world_not_divided", {"world": 1}, 0),
        ("clip_local_norm", {"clip": None}, 0),
        ("clip_before_reduction", {"world": 1}, 0),
        ("decay_on_excluded", {"weight_decay": 0.0}, 0),
        ("decay_missing", {"weight_decay": 0.0}, 0),
        ("l2_instead_of_decoupled", {"optimizer": "adam"}, 0),
        ("decoupled_instead_of_l2", {}, 0),
        ("bias_correction_step_off_by_one", {"optimizer": "sgd"}, 0),
        ("step_counted_without_grad", {}, 2),
        ("unscale_with_updated_scale", {}, 0),
        ("clip_before_unscale", {"scaler": True, "clip": None}, 0),
        ("lr_one_step_early", {}, 0),
        ("lr_one_step_late", {"schedule": SCHEDULE}, 0),
        ("state_reset_on_resume", {}, 0),
    ],
)
def test_a_hypothesis_offers_nothing_where_its_bug_cannot_show(name, settings, steps_before):
    spec, record, state, plan = _context(SimRun(**settings), steps_before)
    assert dg.CATALOGUE[name].variants(spec, record, state, plan) == []


def test_the_variants_change_what_they_say():
    spec, record, state, plan = _context(SimRun(), 1)
    (twice,) = dg.accumulation_divided_twice(spec, record, state, plan)
    np.testing.assert_array_equal(twice.weights, plan.weights / 3)
    dropped = dg.micro_batch_dropped(spec, record, state, plan)
    assert [int(np.flatnonzero(v.weights[:, 0] == 0)[0]) for v in dropped] == [0, 1, 2]
    (excluded,) = dg.decay_on_excluded(spec, record, state, plan)
    assert [g.weight_decay for g in excluded.groups] == [0.1, 0.1]
    missing = dg.decay_missing(spec, record, state, plan)
    assert [[g.weight_decay for g in v.groups] for v in missing] == [[0.0, 0.0]]
    offsets = [v.step_offset for v in dg.bias_correction_step_off_by_one(spec, record, state, plan)]
    assert offsets == [1, -1]
    (reset,) = dg.state_reset_on_resume(spec, record, state, plan)
    assert reset.reset_state
