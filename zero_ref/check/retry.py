"""Retrying a flagged step under each hypothesis of the catalogue (diagnoses.py).

A step that leaves the bound is retried from the oracle's state before it, under each
hypothesis's Plans; the names under which the whole step fits are the diagnosis. A
persistent hypothesis (a convention a loop keeps every step) must also fit the last step
that passed. After the first flagged step, each diagnosis is followed on its own
trajectory, so the steps after it are named as well.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from zero_ref.check.compare import compare
from zero_ref.check.diagnoses import CATALOGUE, Hypothesis
from zero_ref.check.oracle_step import OracleState, oracle_step
from zero_ref.check.plan import Plan
from zero_ref.check.record import RunSpec, StepRecord


@dataclass(frozen=True)
class StepContext:
    """One step as the oracle met it: the record, its state before, the run's parameters
    before, and the plan that step was checked under."""

    record: StepRecord
    state: OracleState
    run_before: dict[str, np.ndarray]
    plan: Plan


def diagnose(
    spec: RunSpec, now: StepContext, before: StepContext | None = None
) -> dict[str, OracleState]:
    """The hypotheses under which the run's step `now` is inside the bound, each with the
    oracle's state after the step under it; a persistent one only if it also reproduces
    `before`, the last step that passed."""
    found = {}
    for name, hypothesis in CATALOGUE.items():
        after = reproducing(spec, hypothesis, now)
        if after is None:
            continue
        if (
            hypothesis.persistent
            and before is not None
            and reproducing(spec, hypothesis, before) is None
        ):
            continue
        found[name] = after
    return found


def follow(
    spec: RunSpec, shadows: dict[str, OracleState], now: StepContext
) -> dict[str, OracleState]:
    """The steps after the first flagged one: each diagnosis kept so far is kept if the run's
    step is inside the bound from that diagnosis's own trajectory, under the bug again (a
    convention kept) or under the correct plan (a bug that struck once, like a reset)."""
    kept = {}
    for name, state in shadows.items():
        ctx = replace(now, state=state)
        after = reproducing(spec, CATALOGUE[name], ctx, also_correct=True)
        if after is not None:
            kept[name] = after
    return kept


def reproducing(
    spec: RunSpec, hypothesis: Hypothesis, ctx: StepContext, also_correct: bool = False
) -> OracleState | None:
    """The oracle's state after the step under the first variant of the hypothesis that puts
    the run's step inside the bound, or None (a hypothesis with no variant at this step
    changes nothing: it reproduces a step only where the correct plan already does)."""
    variants = hypothesis.variants(spec, ctx.record, ctx.state, ctx.plan)
    if also_correct or not variants:
        variants = [*variants, ctx.plan]
    for variant in variants:
        expected = oracle_step(spec, ctx.record, ctx.state, variant)
        if compare(spec, ctx.record, ctx.run_before, expected, variant.ignores) is None:
            return expected.state
    return None
