"""Fault injection, for the failure tests and docs/reliability.md.

One environment variable, read only here, at the top of each training step
(zero_ref.app.failure.step_started). An armed fault acts through the hooks the
engine and the checkpoint writer expose on purpose (zero_ref/engine/hooks.py),
except skip_gather, which replaces the next call of the engine's Comm's public
allgather or iallgather (--overlap-comm), whichever comes first:

    ZERO_REF_INJECT_FAULT="<kind>:rank=<R>:step=<S>"

  raise        rank R raises InjectedFault in the middle of step S
  kill         rank R sends itself SIGKILL in the middle of step S (SIGKILL cannot
               be caught: to MPI this is the OOM killer or a lost node)
  raise_in_flight, kill_in_flight  the same, at the first unit boundary of step S's
               backward at which rank R has a non-blocking collective in flight
               (--overlap-comm: a bucket's reduce-scatter, a prefetched gather); the
               line it prints says how many
  skip_gather  rank R skips its first all-gather of step S (at stage 3: the
               forward gather of the first unit), as a buggy rank would
  nan, inf     rank R writes NaN (Inf) into element 0 of the gradient of the last
               unit's first tensor, in step S
  drop_grad    rank R zeroes the last unit's gradients in step S before they are
               reduced, as if its contribution were lost (a silent bug for
               --check-oracle to catch)
  bias_correction  rank R's AdamW uses step S+1's bias correction in step S (another
               silent bug: the updates of R's shard come out slightly wrong)
  save_kill    rank R sends itself SIGKILL half-way through writing its checkpoint
               file in the next save (after step S's, with --save-every), after its
               parameters and before AdamW's state
  publish_kill rank R (only rank 0 publishes) sends itself SIGKILL in the next save
               after the new tag folder is in place, before `latest` names it

"In the middle of step S" is right after the first unit's backward, when the
other ranks are already in the step's collectives. Each fault prints one line
"zero_ref fault: ... at t=<unix time>" to stderr as it fires, so a test can
time how long the job takes to end after it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from zero_ref.engine.hooks import EngineHooks

FAULT_ENV = "ZERO_REF_INJECT_FAULT"
FAULT_LOG_ENV = "ZERO_REF_FAULT_LOG"  # optional: a file each fired fault is appended to
KINDS = (
    "raise",
    "kill",
    "raise_in_flight",
    "kill_in_flight",
    "skip_gather",
    "nan",
    "inf",
    "drop_grad",
    "bias_correction",
    "save_kill",
    "publish_kill",
)


class InjectedFault(RuntimeError):
    """The error a `raise` fault raises: it stands for any bug on one rank."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> Fault:
        """'raise:rank=2:step=3' -> Fault('raise', 2, 3); errors name the variable."""
        kind, *fields = text.split(":")
        values = dict(f.partition("=")[::2] for f in fields)
        if kind not in KINDS or set(values) != {"rank", "step"}:
            raise ValueError(
                f"{FAULT_ENV}={text!r} is not allowed: it must be <kind>:rank=<R>:step=<S> "
                f"with kind one of {', '.join(KINDS)}"
            )
        try:
            return cls(kind, int(values["rank"]), int(values["step"]))
        except ValueError:
            raise ValueError(f"{FAULT_ENV}={text!r}: rank and step must be integers") from None

    def __str__(self) -> str:
        return f"{self.kind}:rank={self.rank}:step={self.step}"


def inject_from_env(step: int, engine, environ: Mapping[str, str] = os.environ) -> None:
    """Arm the fault ZERO_REF_INJECT_FAULT names, if it is for this rank and step."""
    text = environ.get(FAULT_ENV)
    if not text:
        return
    fault = Fault.parse(text)
    if fault.rank == engine.rank and fault.step == step:
        arm(fault, engine)


def arm(fault: Fault, engine) -> None:
    """Make `fault` happen during the engine's next step (or its next save)."""
    if fault.kind == "skip_gather":
        _on_next_call(engine.comm, ("allgather", "iallgather"), lambda *a, **k: _skipped(fault))
        return
    engine.hooks = FaultHooks(fault, engine.hooks)


class FaultHooks(EngineHooks):
    """The engine's hooks with one fault armed at its point; it fires once, after which
    every point is the wrapped hooks' again."""

    def __init__(self, fault: Fault, inner: EngineHooks) -> None:
        self.fault, self.inner, self.armed = fault, inner, True

    def _fires(self, *kinds: str) -> bool:
        """True (once) if the armed fault is one of `kinds`."""
        if self.armed and self.fault.kind in kinds:
            self.armed = False
            return True
        return False

    def after_unit_backward(self, engine, i: int, micro: int) -> None:
        """In the middle of the step: poison or drop unit i's gradients, raise, or die."""
        flying = len(engine.comm.in_flight)
        if flying and self._fires("raise_in_flight", "kill_in_flight"):
            _fired(self.fault, f"with {flying} collectives in flight")
            if self.fault.kind == "raise_in_flight":
                raise InjectedFault(f"injected fault {self.fault}")
            os.kill(os.getpid(), signal.SIGKILL)
        if self._fires("nan", "inf", "drop_grad", "raise", "kill"):
            kind = self.fault.kind
            if kind in ("nan", "inf"):
                _poison_gradient(engine, i, np.nan if kind == "nan" else np.inf)
            if kind == "drop_grad":
                for grad in engine.unit_grads(i).values():
                    grad[...] = 0
            _fired(self.fault)
            if kind == "raise":
                raise InjectedFault(f"injected fault {self.fault}")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        self.inner.after_unit_backward(engine, i, micro)

    def bias_correction_step(self, step: int) -> int:
        """AdamW's bias correction of one step later, once."""
        if self._fires("bias_correction"):
            _fired(self.fault)
            return self.inner.bias_correction_step(step + 1)
        return self.inner.bias_correction_step(step)

    def before_state_written(self, kind: str) -> None:
        """save_kill: SIGKILL after the parameters went in whole, before AdamW's state."""
        if kind != "param" and self._fires("save_kill"):
            _die(self.fault)
        self.inner.before_state_written(kind)

    def before_publish(self) -> None:
        """publish_kill: SIGKILL with the new tag folder in place, before `latest`."""
        if self._fires("publish_kill"):
            _die(self.fault)
        self.inner.before_publish()


def _die(fault: Fault) -> None:
    _fired(fault)
    os.kill(os.getpid(), signal.SIGKILL)


def _poison_gradient(engine, i: int, value: float) -> None:
    """Element 0 of the first tensor of unit i (the last unit: backward runs in reverse)."""
    grads = engine.unit_grads(i)
    first = next(iter(grads.values()))
    first.reshape(-1)[:1] = value


def _fired(fault: Fault, detail: str = "") -> None:
    """Say that the fault fired, on stderr and, if ZERO_REF_FAULT_LOG names a file, there
    too: mpirun may drop a rank's last output when the job aborts, a file keeps it."""
    detail = f" {detail}" if detail else ""
    line = f"zero_ref fault: {fault} fired{detail} (pid {os.getpid()}) at t={time.time():.3f}"
    print(line, file=sys.stderr, flush=True)
    log = os.environ.get(FAULT_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _skipped(fault: Fault):
    """A gather this rank skips: nothing sent; an issued one returns a request that is
    already complete (MPI_REQUEST_NULL), as if the bytes had come."""
    _fired(fault)
    return _NothingInFlight()


class _NothingInFlight:
    def wait(self) -> None:
        """Nothing was issued, so nothing to wait for."""


def _on_next_call(obj, names: tuple[str, ...], action: Callable) -> None:
    """Route the next call of any of obj.<names>(...) to action(...), once: every name
    is put back at the first call."""
    originals = {name: (getattr(obj, name), name in vars(obj)) for name in names}

    def restore() -> None:
        for name, (original, own) in originals.items():
            if own:
                setattr(obj, name, original)  # a module's function
            else:
                delattr(obj, name)  # the class's method shows through again

    def once(*args, **kwargs):
        restore()
        return action(*args, **kwargs)

    for name in names:
        setattr(obj, name, once)
