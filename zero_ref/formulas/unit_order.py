"""The order one step reads its units in (ZeRO, Sec. 5): forward through the units, the
loss, backward in reverse, once per micro-step; and, at each read, the reads that follow
it (what stage 3 may gather ahead: zero_ref/engine/gathered_unit.py's prefetch).

Written once, here, for the step's loop (engine/step.py) and for the count of stage 3's
gathers that loop makes (gathered_unit.py's gathers_by_kind), so the two cannot drift.
A read is a pair (unit, forward?).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

Read = tuple[int, bool]  # (unit index, True in forward / False in backward)


def phase(units: Iterable[int], forward: bool) -> Iterator[Read]:
    """The reads of `units`, in that order, all in one pass."""
    return ((j, forward) for j in units)


def after_forward(i: int, n: int) -> Iterator[Read]:
    """What the step reads after unit i's forward (of n units): the later units'
    forwards, then every unit's backward, last unit first."""
    return chain(phase(range(i + 1, n), True), phase(range(n - 1, -1, -1), False))


def after_backward(i: int, n: int, more_micro_steps: bool) -> Iterator[Read]:
    """What the step reads after unit i's backward: the earlier units' backwards, then,
    when another micro-step follows, its forward through every unit."""
    again = range(n) if more_micro_steps else ()
    return chain(phase(range(i - 1, -1, -1), False), phase(again, True))


def step_reads(n: int, grad_accum: int) -> Iterator[tuple[Read, Iterator[Read]]]:
    """Every read of one optimizer step of n units and grad_accum micro-steps, in order,
    each with the reads that follow it (as the loop in engine/step.py makes them)."""
    for micro in range(grad_accum):
        for i in range(n):
            yield (i, True), after_forward(i, n)
        for i in range(n - 1, -1, -1):
            yield (i, False), after_backward(i, n, micro < grad_accum - 1)
