"""`--check-oracle`: rank 0 replays every training step in the single-rank oracle.

Before each step the oracle holds the engine's state (parameters, AdamW's m and
v, the step count), consolidated from every rank; it then takes the step from
the same micro-batches, and its result is compared with the engine's:

* deterministic mode: bitwise, every element of the parameters, m and v, and the
  gradient norm exactly;
* fast mode: within the one-step bound of zero_ref/oracle/bound.py, derived from
  how far reordering the sums over ranks can move a step. Because the oracle is
  re-synced every step, the bound holds for any run length.

Either way the reported loss must match the oracle's mean loss (to float64
rounding). A broken check ends the run on every rank (exit 1) with one message
naming the step, the tensor and the element. The consolidation traffic is kept
off the communication ledger's step totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zero_ref.app.failure import CollectiveError
from zero_ref.checkpoint.manifest import STATE_KINDS
from zero_ref.config import ZeroConfig
from zero_ref.layout.flat import tensor_views
from zero_ref.oracle.bound import (
    StepBound,
    Violation,
    fast_step_bound,
    largest_ratio,
    worst_violation,
)
from zero_ref.oracle.single_rank import Oracle

LOSS_RELATIVE = 1e-12  # the loss is a float64 mean of the same per-rank losses, reordered


class OracleMismatchError(CollectiveError):
    """The engine's step is not the oracle's (raised on every rank together)."""


@dataclass
class RunSummary:
    """The largest one-step differences seen over the run."""

    steps: int = 0
    max_param_diff: float = 0.0
    at_step: int | None = None
    max_bound_ratio: float = 0.0  # fast mode: largest |diff| / bound, 1 = on the bound


class OracleCheck:
    """Created on every rank (consolidation is a collective); the oracle lives on rank 0."""

    def __init__(self, engine, cfg: ZeroConfig, model) -> None:
        """Starts from the engine's own state: its initial parameters, or everything a
        resumed run restored (parameters, m, v, step count). A collective."""
        self.engine, self.cfg, self.model = engine, cfg, model
        self.xp = engine.place.module()  # where the engine's model math runs
        self.oracle = None  # the one full copy of the model, on rank 0 alone
        with engine.comm.ledger.off_the_books():
            state = self._state_on_root()
        if engine.rank == 0:
            shard = engine.shard_world  # hybrid sharding's groups ("host": as MPI split them)
            local = getattr(engine, "qgz_local_size", None)  # qgZ's hops, as MPI split them
            hosts = getattr(engine.comm, "world_of", None)  # two-level sums: their order
            self.oracle = Oracle.for_config(state["param"], cfg, model, shard, local, hosts)
            self.oracle.load_state(
                state["param"], state["exp_avg"], state["exp_avg_sq"], engine.step_count
            )
            self.oracle.scaler = engine.scaler  # fp16: where a resumed run's scaler stands
        self.summary = RunSummary()
        self._last_diff = math.nan

    def after_step(self, result, inputs: np.ndarray, targets: np.ndarray, lr: float) -> float:
        """Compare the step the engine just took; returns the largest parameter
        difference (rank 0; NaN elsewhere). Raises OracleMismatchError on every rank."""
        engine = self.engine
        with engine.comm.ledger.off_the_books():
            state = self._state_on_root()
            problem = None
            if self.oracle is not None:
                problem = self._compare(result, inputs, targets, lr, state)
            agreed = engine.comm.allreduce_min_int64(0 if problem else 1, kind="check")
        if not agreed:
            raise OracleMismatchError(problem or "--check-oracle failed on rank 0 (its message)")
        if self.oracle is None:
            return math.nan
        self.oracle.load_state(state["param"], state["exp_avg"], state["exp_avg_sq"], result.step)
        self.oracle.scaler = engine.scaler  # fp16: the next step starts from the engine's
        return self._last_diff

    def _state_on_root(self) -> dict[str, dict[str, np.ndarray]]:
        """The engine's parameters, m and v by name, streamed to rank 0 unit by unit
        (a collective; the other ranks get empty dicts and hold nothing extra)."""
        state: dict[str, dict[str, np.ndarray]] = {k: {} for k in STATE_KINDS}

        def keep(kind: str, unit, flat: np.ndarray) -> None:
            for name, tensor in tensor_views(flat, unit).items():
                state[kind][f"{unit.name}.{name}"] = tensor.copy()

        self.engine.stream_state(STATE_KINDS, keep)
        return state

    def describe(self) -> str:
        """One line for the end of the run, in every mode (--quiet too)."""
        s = self.summary
        if self.cfg.deterministic:
            return (
                f"oracle check: {s.steps} steps, parameters, m and v bitwise equal to the "
                "single-rank oracle after every step (deterministic mode)"
            )
        return (
            f"oracle check: {s.steps} steps, largest one-step parameter difference "
            f"{s.max_param_diff:.3g} (step {s.at_step}), at most {s.max_bound_ratio:.3g} of "
            "the bound reordered sums allow (fast mode, docs/determinism.md)"
        )

    # ---- rank 0
    def _compare(self, result, inputs, targets, lr, state) -> str | None:
        oracle, step = self.oracle, result.step
        self.summary.steps += 1
        self._last_diff = 0.0
        loss = oracle.model_step(self.model, inputs, targets, lr, self.xp)
        if oracle.last_skipped != result.skipped:
            took = {True: "skipped the step (a NaN/Inf gradient)", False: "took the step"}
            return (
                f"--check-oracle: step {step}: the engine {took[result.skipped]}, the "
                f"oracle {took[oracle.last_skipped]}"
            )
        if result.skipped:  # skipped on every rank and by the oracle: nothing moved
            return None
        engine_flat = {
            "parameter": oracle.flatten(state["param"]),
            "exp_avg": oracle.flatten(state["exp_avg"]),
            "exp_avg_sq": oracle.flatten(state["exp_avg_sq"]),
        }
        oracle_flat = {
            "parameter": oracle.params,
            "exp_avg": oracle.exp_avg,
            "exp_avg_sq": oracle.exp_avg_sq,
        }
        bound = None if self.cfg.deterministic else self._bound()
        self._record(step, engine_flat["parameter"], oracle.params, bound)
        for name, mine in engine_flat.items():  # elements first: the most precise message
            allowed = None if bound is None else _bound_of(bound, name)
            violation = worst_violation(name, mine, oracle_flat[name], allowed)
            if violation:
                return self._describe(step, violation)
        return self._norm_problem(result, bound) or _loss_problem(step, result.loss, loss)

    def _bound(self) -> StepBound:
        o = self.oracle
        return fast_step_bound(
            o.last_detail, o.last_grad_norm, self.cfg.clip, o.params, o.exp_avg, o.exp_avg_sq
        )

    def _norm_problem(self, result, bound: StepBound | None) -> str | None:
        expected = self.oracle.last_grad_norm
        allowed = 0.0 if bound is None else bound.grad_norm
        if abs(result.grad_norm - expected) <= allowed:
            return None
        return (
            f"--check-oracle: step {result.step} is not the oracle's: the gradient norm is "
            f"{result.grad_norm!r} on the engine, {expected!r} in the oracle "
            f"(allowed difference {allowed:.3g})"
        )

    def _describe(self, step: int, v: Violation) -> str:
        where = self.oracle.locate(v.index)
        if v.allowed == 0.0:
            why = "deterministic mode must be bitwise equal"
        else:
            why = (
                f"|difference| {abs(v.engine - v.oracle):.3g} > {v.allowed:.3g} allowed: more "
                "than reordering the sums over ranks can explain (docs/determinism.md)"
            )
        return (
            f"--check-oracle: step {step} is not the oracle's: {v.buffer} {where} is "
            f"{v.engine!r} on the engine, {v.oracle!r} in the oracle; {why}"
        )

    def _record(self, step: int, mine: np.ndarray, expected: np.ndarray, bound) -> None:
        diff = float(np.max(np.abs(mine - expected), initial=0.0))
        self._last_diff = diff
        s = self.summary
        if diff > s.max_param_diff or s.at_step is None:
            s.max_param_diff, s.at_step = diff, step
        if bound is not None:
            s.max_bound_ratio = max(s.max_bound_ratio, largest_ratio(mine, expected, bound.param))


def _bound_of(bound: StepBound, name: str) -> np.ndarray:
    return {"parameter": bound.param, "exp_avg": bound.exp_avg, "exp_avg_sq": bound.exp_avg_sq}[
        name
    ]


def _loss_problem(step: int, reported: float, expected: float) -> str | None:
    if abs(reported - expected) <= LOSS_RELATIVE * max(1.0, abs(expected)):
        return None
    return (
        f"--check-oracle: step {step}: the reported loss {reported!r} is not the oracle's "
        f"mean loss over ranks and micro-steps, {expected!r}"
    )
