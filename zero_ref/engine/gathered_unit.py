"""Stage 3's gathered unit: the one reused buffer a unit's parameters are gathered
into, with explicit states (ZeRO, Sec. 5.3: P_os+g+p; FSDP2's ShardedState /
TrainingState are the model).

  EMPTY   it holds no unit's current parameters (at creation, after the update,
          after the parameters were filled or loaded, after lending it out)
  IN_USE  unit i was gathered and compute is reading it (forward or backward)
  HELD    compute released unit i; the buffer still holds its values, so asking
          for unit i again (the last unit's forward is followed by its backward,
          unit 0's backward by the next micro-step's forward) gathers nothing

acquire(i): EMPTY or HELD -> IN_USE (a gather unless HELD holds unit i);
release(i): IN_USE(i) -> HELD(i); invalidate(): EMPTY or HELD -> EMPTY, the one
place that forgets the buffer's contents. Anything else is a bug and asserts.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import numpy as np


class UnitState(Enum):
    EMPTY = "empty"
    IN_USE = "in use"
    HELD = "held"


class GatheredUnit:
    """The buffer (the parameters' dtype, the widest unit) and which unit it holds."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer
        self.state, self.unit = UnitState.EMPTY, None

    def acquire(self, i: int, numel: int, gather: Callable[[np.ndarray], None]) -> np.ndarray:
        """Unit i's first `numel` elements, gathered by gather(out) unless held already."""
        assert self.state is not UnitState.IN_USE, f"unit {i} acquired while {self.unit} in use"
        if not (self.state is UnitState.HELD and self.unit == i):
            gather(self.buffer[:numel])
        self.state, self.unit = UnitState.IN_USE, i
        return self.buffer[:numel]

    def release(self, i: int) -> None:
        """Compute is done with unit i; its values stay until the next gather."""
        assert self.state is UnitState.IN_USE and self.unit == i, (
            f"unit {i} released while the buffer is {self.state.value} ({self.unit})"
        )
        self.state = UnitState.HELD

    def invalidate(self) -> None:
        """The shard changed (update, fill, load) or the buffer is lent: forget it."""
        assert self.state is not UnitState.IN_USE, f"unit {self.unit} invalidated in use"
        self.state, self.unit = UnitState.EMPTY, None

    def lend(self, scratch: np.ndarray | None) -> np.ndarray:
        """A float32 buffer of the widest unit, idle between steps, for rank 0 to land
        streamed state in (zero_ref/engine/state_io.py): the float32 widening scratch
        with 16-bit parameters (this buffer keeps its unit), else this buffer itself,
        invalidated. Called on every rank, so all gather alike afterwards."""
        if scratch is not None:
            return scratch
        self.invalidate()
        return self.buffer
