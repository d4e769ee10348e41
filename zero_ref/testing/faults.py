"""Fault injection, for the failure tests and docs/reliability.md.

One environment variable, read only here, at the top of each training step
(zero_ref.app.failure.step_started):

    ZERO_REF_INJECT_FAULT="<kind>:rank=<R>:step=<S>"

  raise        rank R raises InjectedFault in the middle of step S
  kill         rank R sends itself SIGKILL in the middle of step S (SIGKILL cannot
               be caught: to MPI this is the OOM killer or a lost node)
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

FAULT_ENV = "ZERO_REF_INJECT_FAULT"
FAULT_LOG_ENV = "ZERO_REF_FAULT_LOG"  # optional: a file each fired fault is appended to
KINDS = (
    "raise",
    "kill",
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
    """Make `fault` happen during the engine's next step."""
    if fault.kind == "skip_gather":
        _on_next_call(engine.comm, "allgather", lambda original, *a, **k: _fired(fault))
        return
    if fault.kind == "bias_correction":
        _wrong_bias_correction(fault, engine)
        return
    if fault.kind in ("save_kill", "publish_kill"):
        _kill_in_save(fault)
        return

    def mid_step(original: Callable, i: int, micro: int) -> None:
        if fault.kind in ("nan", "inf"):
            _poison_gradient(engine, i, np.nan if fault.kind == "nan" else np.inf)
        if fault.kind == "drop_grad":
            for grad in engine.unit_grads(i).values():
                grad[...] = 0
        _fired(fault)
        if fault.kind == "raise":
            raise InjectedFault(f"injected fault {fault}")
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        original(i, micro)

    _on_next_call(engine, "on_unit_backward_done", mid_step)


def _wrong_bias_correction(fault: Fault, engine) -> None:
    """The engine's next optimizer step computes its AdamW scalars for one step later."""
    from zero_ref.engine import step as stage0

    right = stage0.adamw_scalars

    def wrong(cfg, step):
        stage0.adamw_scalars = right  # once
        _fired(fault)
        return right(cfg, step + 1)

    stage0.adamw_scalars = wrong


def _kill_in_save(fault: Fault) -> None:
    """SIGKILL inside the next checkpoint save, at the point the kind names."""
    from zero_ref.checkpoint import writer

    def die(*args, **kwargs):
        _fired(fault)
        os.kill(os.getpid(), signal.SIGKILL)

    if fault.kind == "publish_kill":
        _on_next_call(writer, "_replace_latest", lambda original, *a, **k: die())
        return

    def second_kind(original, engine, file_writer, kind):
        if kind == "param":  # the parameters go in whole; AdamW's state never does
            original(engine, file_writer, kind)
            _on_next_call(writer, "_write_state", lambda original, *a, **k: die())
            return
        die()

    _on_next_call(writer, "_write_state", second_kind)


def _poison_gradient(engine, i: int, value: float) -> None:
    """Element 0 of the first tensor of unit i (the last unit: backward runs in reverse)."""
    grads = engine.unit_grads(i)
    first = next(iter(grads.values()))
    first.reshape(-1)[:1] = value


def _fired(fault: Fault) -> None:
    """Say that the fault fired, on stderr and, if ZERO_REF_FAULT_LOG names a file, there
    too: mpirun may drop a rank's last output when the job aborts, a file keeps it."""
    line = f"zero_ref fault: {fault} fired (pid {os.getpid()}) at t={time.time():.3f}"
    print(line, file=sys.stderr, flush=True)
    log = os.environ.get(FAULT_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _on_next_call(obj, name: str, action: Callable) -> None:
    """Route the next call of obj.<name>(...) to action(original, ...), once."""
    original = getattr(obj, name)
    own = name in vars(obj)  # a module's function (put back) or a class's method

    def once(*args, **kwargs):
        if own:
            setattr(obj, name, original)
        else:
            delattr(obj, name)  # the class's method shows through again
        return action(original, *args, **kwargs)

    setattr(obj, name, once)
