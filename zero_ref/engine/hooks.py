"""Named points the engine and the checkpoint writer call on purpose, for tools that
must act inside a step or a save (fault injection: zero_ref/app/faults.py) without
replacing private names. Every point is a no-op here; a tool passes a subclass.

  after_unit_backward(engine, i, micro)  unit i's gradients were written, before the
                                         stage sends them on (Sec. 5: mid-backward)
  bias_correction_step(step)             the step AdamW's bias correction uses
  before_state_written(kind)             the checkpoint writer, before each state kind
  before_publish()                       the writer (rank 0), before `latest` names the
                                         new checkpoint
"""

from __future__ import annotations


class EngineHooks:
    """No-op hooks: what a run without tools uses."""

    def after_unit_backward(self, engine, i: int, micro: int) -> None:
        """Unit i's gradients of micro-step `micro` are written (engine.unit_grads(i))."""

    def bias_correction_step(self, step: int) -> int:
        """The step number AdamW's bias correction uses for optimizer step `step`."""
        return step

    def before_state_written(self, kind: str) -> None:
        """The checkpoint writer is about to write this rank's `kind` of state."""

    def before_publish(self) -> None:
        """Rank 0 is about to point `latest` at the checkpoint just published."""
