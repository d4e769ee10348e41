"""Stage 3's gathered units: the reused buffers units' parameters are gathered into,
with explicit states (ZeRO, Sec. 5.3: P_os+g+p; FSDP2's ShardedState /
TrainingState are the model), and the prefetch that fills them ahead of use.

Each buffer (the parameters' dtype, the widest unit) is in one state:

  EMPTY      it holds no unit's current parameters (at creation, after the update,
             after the parameters were filled or loaded, after lending it out)
  IN_FLIGHT  unit i's all-gather was issued ahead of use (--overlap-comm): MPI
             writes the buffer; nothing reads it until the gather is waited for
  IN_USE     unit i was gathered and compute is reading it (forward or backward)
  HELD       compute released unit i; the buffer still holds its values, so asking
             for unit i again (the last unit's forward is followed by its backward,
             unit 0's backward by the next micro-step's forward) gathers nothing

acquire(i): unit i IN_USE (waited for if IN_FLIGHT, gathered now if in no
buffer), then the prefetch; release(i): IN_USE(i) -> HELD(i); invalidate():
every buffer EMPTY, a gather still in flight waited for and dropped (DeepSpeed
PR #6557 left unused prefetches in flight). Anything else is a bug and asserts:
a buffer is never gathered into while in use or in flight (DeepSpeed #7965 was
a buffer reused while queued work still read it).

The prefetch (FSDP's forward_prefetch / BACKWARD_PRE, DeepSpeed's stage-3
prefetch coordinator): after unit i is acquired, the units the step reads next
(`upcoming`, in order: forward then backward) are gathered into free buffers, as
many as the PrefetchPlan allows (zero_ref/formulas/memory.py's prefetch_plan).
The blocking schedule's plan has one buffer and no prefetch: the paper's one
gathered unit at a time.

Units smaller than the persistence threshold (stage3_param_persistence_threshold)
have a buffer of their own, gathered at first use after each update and kept.

What a buffer holds is keyed by (unit, quantized): with qwZ (ZeRO++'s quantized
weights) forward reads a unit dequantized from an int8 gather and backward reads it
gathered in full precision, so the two are different contents and a HELD forward copy
never serves backward (the last unit's forward-to-backward reuse goes, and so does
unit 0's backward-to-next-forward reuse). Without qwZ every key is (unit, False) and
both reuses stay. A plain int i is the key (i, False).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

import numpy as np

from zero_ref.formulas.memory import PrefetchPlan, prefetch_plan
from zero_ref.formulas.unit_order import step_reads

Key = tuple[int, bool]  # (unit, quantized): what a buffer holds


def key_of(k: int | Key) -> Key:
    """A unit's key: (i, quantized) as given, or a plain unit index as (i, False)."""
    return k if isinstance(k, tuple) else (int(k), False)


class UnitState(Enum):
    EMPTY = "empty"
    IN_FLIGHT = "in flight"
    IN_USE = "in use"
    HELD = "held"


class Slot:
    """One buffer and what it holds."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer = buffer
        self.state, self.unit, self.pending = UnitState.EMPTY, None, None  # unit: a Key


# issue(key, out, lane) -> a Pending; complete(key, pending): wait for it and finish up
Issue = Callable[[Key, np.ndarray, int], object]
Complete = Callable[[Key, object], None]


class GatheredUnits:
    """The buffers, which unit each holds, and the prefetch into them."""

    def __init__(
        self,
        buffers: list[np.ndarray],
        persistent: dict[int, np.ndarray],
        plan: PrefetchPlan,
        numel_of: Callable[[int], int],
        issue: Issue,
        complete: Complete,
    ) -> None:
        self.slots = [Slot(b) for b in buffers]
        self.kept = {i: Slot(b) for i, b in persistent.items()}  # persistent units' own
        self.plan, self.numel_of, self.issue, self.complete = plan, numel_of, issue, complete

    @property
    def buffer(self) -> np.ndarray:
        """The first buffer (what a lone gathered unit is gathered into)."""
        return self.slots[0].buffer

    # ---- the states
    def acquire(self, i: int | Key, upcoming: Iterable[int | Key] = ()) -> np.ndarray:
        """Unit i's padded parameters, IN_USE; then the upcoming units gathered ahead."""
        i = key_of(i)
        upcoming = list(self._window(i, map(key_of, upcoming)))
        slot = self._kept(i) or self._holding(i)
        if slot is None:
            slot = self._gather_now(i, upcoming)
        elif slot.state is UnitState.EMPTY:  # a persistent unit's first use since the update
            self._start(slot, i)
        assert slot.state is not UnitState.IN_USE, f"unit {i} acquired while in use"
        if slot.state is UnitState.IN_FLIGHT:
            self._finish(slot)
        slot.state = UnitState.IN_USE
        self._prefetch(upcoming)
        return slot.buffer[: self.numel_of(i[0])]

    def release(self, i: int | Key) -> None:
        """Compute is done with unit i; its values stay until the buffer is needed."""
        i = key_of(i)
        slot = self._kept(i) or self._holding(i)
        assert slot is not None and slot.state is UnitState.IN_USE, (
            f"unit {i} released while not in use"
        )
        slot.state = UnitState.HELD

    def invalidate(self) -> None:
        """The shards changed (update, fill, load) or a buffer is lent: forget every
        unit, waiting for (and dropping) any gather still in flight."""
        for slot in self.slots + list(self.kept.values()):
            assert slot.state is not UnitState.IN_USE, f"unit {slot.unit} invalidated in use"
            if slot.state is UnitState.IN_FLIGHT:
                self._finish(slot)
            slot.state, slot.unit = UnitState.EMPTY, None

    def finish_in_flight(self) -> None:
        """Wait for every gather still in flight (its unit HELD after, still valid)."""
        for slot in self.slots:
            if slot.state is UnitState.IN_FLIGHT:
                self._finish(slot)

    def lend(self, scratch: np.ndarray | None) -> np.ndarray:
        """A float32 buffer of the widest unit, idle between steps, for rank 0 to land
        streamed state in (zero_ref/engine/state_io.py): the float32 widening scratch
        with 16-bit parameters (the buffers keep their units), else the first buffer,
        every unit invalidated. Called on every rank, so all gather alike afterwards."""
        if scratch is not None:
            return scratch
        self.invalidate()
        return self.buffer

    def states(self) -> list[tuple[str, int | None]]:
        """(state, unit) of each buffer: what tests and the trace look at."""
        return [(s.state.value, None if s.unit is None else s.unit[0]) for s in self.slots]

    # ---- where a unit goes
    def _kept(self, i: Key) -> Slot | None:
        """A persistent unit's own buffer (never a quantized gather: ZeroConfig refuses)."""
        return self.kept.get(i[0]) if not i[1] else None

    def _holding(self, i: Key) -> Slot | None:
        return next((s for s in self.slots if s.unit == i), None)

    def _gather_now(self, i: Key, upcoming: list[Key]) -> Slot:
        """Unit i is in no buffer: gather it into a free one (one is always freed: a
        prefetched unit not used is waited for and dropped)."""
        slot = self._free(protect=set(upcoming)) or self._free(protect=set())
        if slot is None:  # every buffer in flight with units read later: drop the oldest
            slot = next(s for s in self.slots if s.state is UnitState.IN_FLIGHT)
            self._finish(slot)
        self._start(slot, i)
        return slot

    def _window(self, i: Key, upcoming: Iterable[Key]) -> Iterable[Key]:
        """The upcoming units a prefetch may gather: distinct, not i, not persistent,
        within the plan's unit and element limits."""
        seen, numel = {i}, 0
        for j in upcoming:
            if len(seen) > self.plan.ahead_units:
                return
            if j in seen or j[0] in self.plan.persistent:
                continue
            numel += self.numel_of(j[0])
            if numel > self.plan.ahead_numel:
                return
            seen.add(j)
            yield j

    def _prefetch(self, upcoming: list[Key]) -> None:
        """Gather the window's units not yet in a buffer, while buffers are free."""
        for j in upcoming:
            if self._holding(j) is None:
                slot = self._free(protect=set(upcoming))
                if slot is None:
                    return
                self._start(slot, j)

    def _free(self, protect: set[Key]) -> Slot | None:
        """An EMPTY buffer, else a HELD one whose unit is not about to be read."""
        for state in (UnitState.EMPTY, UnitState.HELD):
            for slot in self.slots:
                if slot.state is state and slot.unit not in protect:
                    return slot
        return None

    def _start(self, slot: Slot, i: Key) -> None:
        assert slot.state in (UnitState.EMPTY, UnitState.HELD), (
            f"a gather into a buffer {slot.state.value} with unit {slot.unit}"
        )
        lane = self.slots.index(slot) if slot in self.slots else len(self.slots)
        slot.pending = self.issue(i, slot.buffer[: self.numel_of(i[0])], lane)
        slot.state, slot.unit = UnitState.IN_FLIGHT, i

    def _finish(self, slot: Slot) -> None:
        """Wait for slot's gather; the buffer holds its unit after (HELD until used)."""
        self.complete(slot.unit, slot.pending)
        slot.pending, slot.state = None, UnitState.HELD


def gathered_units_for(
    cfg, layout, place, prefetches: bool, dtype, issue: Issue, complete: Complete
) -> GatheredUnits:
    """The buffers cfg's plan asks for (one without prefetch; each as wide as the widest
    unit, lent whole to stream state: lend) and one of its own for each persistent
    unit, all in the memory ledger, EMPTY."""
    plan = stage3_plan(cfg, layout, prefetches)
    units, wide = layout.units, layout.widest_unit_numel
    names = ["gathered_unit"] + [f"gathered_unit (prefetch {k})" for k in range(1, plan.buffers)]
    buffers = [place.empty("buffers", name, wide, dtype) for name in names]
    kept = {
        i: place.empty("buffers", f"persistent unit {i}", units[i].padded_numel, dtype)
        for i in sorted(plan.persistent)
    }
    numel = lambda i: units[i].padded_numel  # noqa: E731
    return GatheredUnits(buffers, kept, plan, numel, issue, complete)


def stage3_plan(cfg, layout, prefetches: bool) -> PrefetchPlan:
    """The gathered-unit plan of a config and layout (formulas.memory.prefetch_plan)."""
    numels, ov = [u.padded_numel for u in layout.units], cfg.overlap
    return prefetch_plan(
        numels, prefetches, ov.prefetch_numel, ov.max_live_numel, ov.persistence_numel
    )


def gathers_per_step(
    plan: PrefetchPlan, unit_numels: list[int], grad_accum: int, quantized: bool = False
) -> list[int]:
    """How often each unit is all-gathered in one step (after an update: nothing held)
    under `plan`: this module's own policy run over the step's order of units (engine/
    unit_order.py's, which engine/step.py follows) with gathers counted, not made.
    The blocking plan gives formulas/traffic.py's stage3_gathers. quantized (qwZ): forward's
    keys are (i, True); the counts are then of both kinds (gathers_by_kind splits them)."""
    full, forward = gathers_by_kind(plan, unit_numels, grad_accum, quantized)
    return [a + b for a, b in zip(full, forward, strict=True)]


def gathers_by_kind(
    plan: PrefetchPlan,
    unit_numels: list[int],
    grad_accum: int,
    quantized: bool,
    hpz: bool = False,
) -> tuple[list[int], ...]:
    """Each unit's full-precision gathers and quantized (qwZ forward) gathers per step;
    with hpz (ZeRO++'s secondary copy, zero_ref/engine/secondary_copy.py) a third list,
    the gathers inside the partition group: every gather of a unit after its first
    (world) gather has been waited for, until the update, and with qwZ every key is
    quantized (forward and backward read the same dequantized values)."""
    counts = {True: [0] * len(unit_numels), False: [0] * len(unit_numels)}
    group, fresh = [0] * len(unit_numels), set()  # fresh: units the copy holds

    def issue(key: Key, out: np.ndarray, lane: int) -> int | None:
        if hpz and key[0] in fresh:
            group[key[0]] += 1
            return None
        counts[key[1]][key[0]] += 1
        return key[0]  # a world gather: waited for, it fills the copy

    def complete(key: Key, primary: int | None) -> None:
        if primary is not None:
            fresh.add(primary)

    empty = [np.empty(0, np.uint8)] * plan.buffers
    kept = {i: np.empty(0, np.uint8) for i in plan.persistent}
    units = GatheredUnits(empty, kept, plan, unit_numels.__getitem__, issue, complete)
    fwd, back = quantized, quantized and hpz  # the keys' flag in forward and in backward
    for (i, forward), ahead in step_reads(len(unit_numels), grad_accum):
        key = (i, fwd if forward else back)
        units.acquire(key, [(j, fwd if f else back) for j, f in ahead])
        units.release(key)
    if hpz:
        return counts[False], counts[True], group
    return counts[False], counts[True]
