"""Check a user's run step by step against the single-rank math, and name the bug.

Checker keeps the oracle's state (oracle_step.py) from the run's initial parameters,
takes the run's steps in order, and returns a Verdict per step: the first quantity
outside its bound (compare.py), and when there is one, the names of the catalogue's
hypotheses (diagnoses.py) that reproduce the step (retry.py). This is the paper's claim that
ZeRO changes where the state lives, never the math (Sec. 5), checked on a run that is
not zero_ref's: whatever the framework, the step must equal the single-rank one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zero_ref.check.compare import Mismatch, compare
from zero_ref.check.diagnoses import CATALOGUE
from zero_ref.check.oracle_step import OracleState, initial_state, oracle_step
from zero_ref.check.plan import default_plan
from zero_ref.check.record import RecordError, RunSpec, StepRecord, validate_record
from zero_ref.check.retry import StepContext, diagnose, follow

__all__ = ["Checker", "Mismatch", "Verdict"]

WHAT = {
    "skipped": "whether the GradScaler skipped the step (1 = skipped)",
    "scale": "the GradScaler's loss scale",
    "lr": "the learning rate",
    "grad_norm": "the gradient norm the clip returned",
    "applied_grad": "the gradient at optimizer.step",
    "update": "the update (parameter before minus after)",
    "param": "the parameter after the step",
}


@dataclass(frozen=True)
class Verdict:
    """One step's result: ok, or the first mismatch and the diagnoses that explain it."""

    step: int
    ok: bool
    first: Mismatch | None
    diagnoses: tuple[str, ...]
    since: int | None = None  # the first of the flagged steps running up to this one

    def __str__(self) -> str:
        if self.ok:
            return f"step {self.step}: ok (within the bound)"
        head = f"step {self.step}: {_mismatch_words(self.first)}"
        if self.since is not None:
            head += (
                f" (the run left the oracle at step {self.since}; read that step first: "
                "later ones follow from it)"
            )
        if not self.diagnoses:
            return head + (
                " No bug of the catalogue reproduces this step "
                "(docs/check_reference.md, 'When nothing matches')."
            )
        says = [f"{name}: {CATALOGUE[name].says}" for name in self.diagnoses]
        lead = "Matches the oracle if" if len(says) == 1 else "Matches the oracle under each of"
        return f"{head} {lead} {'; or '.join(says)}."


def _mismatch_words(m: Mismatch) -> str:
    """The first sentence of a flagged step's paragraph."""
    if m.quantity == "skipped":
        did, should = ("skipped", "have stepped") if m.run else ("stepped", "have skipped")
        why = "" if m.run else " (its gradient has an Inf or NaN)"
        return f"the run {did} this step, which the GradScaler should {should}{why}."
    if m.quantity == "applied_grad" and m.run != m.run and m.bound == 0.0:
        return (
            f"{m.name} had no gradient at optimizer.step, where the oracle has one "
            f"({m.oracle:.9g} at [{', '.join(map(str, m.index))}])."
        )
    where = f"{m.name}[{', '.join(map(str, m.index))}]" if m.index else m.name
    return (
        f"{WHAT[m.quantity]} is outside the bound{f' at {where}' if where else ''}: "
        f"run {m.run:.9g}, oracle {m.oracle:.9g}, |difference| {abs(m.run - m.oracle):.3g}, "
        f"bound {m.bound:.3g}."
    )


class Checker:
    """The oracle for one run: construct it with the run's spec and initial parameters,
    then call check() with each optimizer step's record, in order."""

    def __init__(self, spec: RunSpec, initial_params: dict[str, np.ndarray]) -> None:
        names = set(initial_params)
        if names != set(spec.names):
            raise RecordError(
                f"initial parameters: missing {sorted(set(spec.names) - names)}, "
                f"unknown {sorted(names - set(spec.names))}"
            )
        for k, p in initial_params.items():
            if tuple(p.shape) != tuple(spec.shapes[k]):
                raise RecordError(
                    f"initial parameters: {k} has shape {p.shape}, "
                    f"the run's is {tuple(spec.shapes[k])}"
                )
        self.spec = spec
        self._state = initial_state(initial_params)
        self._run_params = {k: np.asarray(p, np.float64) for k, p in initial_params.items()}
        self._last_step: int | None = None
        self._last_passed: StepContext | None = None  # persistent hypotheses must fit it too
        self._first_flagged: int | None = None
        # after the first flagged step: each diagnosis and the oracle's state under it
        self._shadows: dict[str, OracleState] | None = None

    def check(self, record: StepRecord) -> Verdict:
        """Check one optimizer step (the next one of the run) and advance the oracle."""
        if self._last_step is not None and record.step != self._last_step + 1:
            raise RecordError(
                f"step {record.step} after step {self._last_step}: steps must come "
                "in order, none missing"
            )
        validate_record(self.spec, record)
        plan = default_plan(self.spec, record)
        expected = oracle_step(self.spec, record, self._state, plan)
        first = compare(self.spec, record, self._run_params, expected)
        names: tuple[str, ...] = ()
        now = StepContext(record, self._state, self._run_params, plan)
        if first is None:
            # a passing step: the run is back on the oracle's track
            self._last_passed, self._shadows, self._first_flagged = now, None, None
        elif self._shadows is None:
            self._shadows = diagnose(self.spec, now, self._last_passed)
        else:
            self._shadows = follow(self.spec, self._shadows, now)
        if first is not None:
            names = tuple(self._shadows)
        self._state = expected.state  # the oracle keeps its own trajectory, right or wrong
        self._run_params = {k: v.astype(np.float64) for k, v in record.params_after.items()}
        self._last_step = record.step
        since = self._first_flagged
        if first is not None and self._first_flagged is None:
            self._first_flagged = record.step
        return Verdict(record.step, first is None, first, names, since)
