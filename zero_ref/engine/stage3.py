"""Stage 3 (P_os+g+p): parameters are partitioned too.

Adds to stage 2: each rank keeps only its slice of the parameters (4 Psi / Nd
bytes). Before a unit's forward, and again before its backward, the unit's
parameters are all-gathered into one buffer the size of the widest unit,
reused by every gather, so at any time a rank holds its shard plus one
gathered unit. The optimizer updates the shard in place and no all-gather
follows the step.
"""

from __future__ import annotations

import numpy as np

from zero_ref.engine.init_source import InitSource
from zero_ref.engine.packing import unpack_full
from zero_ref.engine.stage2 import Stage2GradientsSharded
from zero_ref.engine.stores import param_store_for
from zero_ref.layout.flat import Owned, tensor_views


class Stage3ParamsSharded(Stage2GradientsSharded):
    """Everything sharded; units gathered on demand."""

    stage = 3

    def _init_params(self, source: InitSource) -> None:
        """Only this rank's slice of each unit is ever filled (DeepSpeed's zero.Init)."""
        n, p = self.layout.shard_numel, self.precision
        self.param_store = param_store_for(self.cfg, self.place, self.swap)  # RAM, or NVMe
        self.shard_params = self.param_store.zeros("shard_params", n, p.param)
        self.master = p.master_for(self.shard_params, self._new_master)
        self._fill_params(source)
        widest = self.layout.widest_unit_numel
        self.gathered = self.place.empty("buffers", "gathered_unit", widest, p.param)
        self.gathered_unit: int | None = None  # which unit `gathered` holds now
        self._init_compute_scratch()

    def _fill_params(self, source: InitSource) -> None:
        """Unit by unit: this rank's slice of the master weights, rounded into the 16-bit
        parameters; an offloaded slice leaves RAM before the next unit is filled."""
        for unit in self.layout.units:
            lo, mine = self.rank * unit.shard_numel, unit.shard_slice()
            self._fill(source, unit, self.master[mine], lo, lo + unit.shard_numel)
            params = self.shard_params[mine]
            for written in self.precision.round_master(self.place, params, self.master[mine]):
                self.release_pages(written)
            self.release_pages(self.master[mine])
        self.gathered_unit = None  # a gathered copy is stale now

    def unit_params(self, i: int) -> dict[str, np.ndarray]:
        """Unit i's full parameters, all-gathered into the one reused buffer unless it
        already holds them (the last unit's forward is followed by its backward, and
        unit 0's backward by the next micro-step's forward: no gather there)."""
        unit = self.layout.units[i]
        if self.gathered_unit != i:
            if unit.padded_numel:
                send = self.shard_params[unit.shard_slice()]
                pending = self.schedule.gather_unit(send, self.gathered[: unit.padded_numel])
                self.schedule.wait(pending)
                self.param_store.after_gather(self.shard_params, self.layout, i, self.trace)
            self.gathered_unit = i
        return tensor_views(self._widened(self.gathered[: unit.padded_numel]), unit)

    def release_unit_params(self, i: int) -> None:
        """Nothing to free: the next gather overwrites the buffer."""

    def owned_slices(self) -> list[Owned]:
        if self.layout.shard_numel == 0:
            return []
        p, m = self.shard_params, self.master
        return [(p, self.shard_grads, m, self.exp_avg, self.exp_avg_sq)]

    def after_update(self) -> None:
        """No all-gather: the next forward gathers each unit when it needs it. The
        buffer's copy of a unit is stale now."""
        self.gathered_unit = None

    def stream_state(self, kinds, sink) -> None:
        """As every stage streams, with rank 0 landing units in the gathered-unit buffer
        (fp32) or the float32 scratch (16-bit parameters): no second unit-sized buffer.
        Every rank forgets which unit the buffer held, so all gather alike afterwards
        (a skipped step leaves it holding unit 0)."""
        if self.param_scratch is None:
            self.gathered_unit = None
        super().stream_state(kinds, sink)

    def _landing_buffer(self) -> np.ndarray:
        return self.gathered if self.param_scratch is None else self.param_scratch

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        return ()

    def full_parameters(self) -> dict[str, np.ndarray]:
        self.comm.set_context(where="consolidate")
        full = unpack_full(self.gather_shard(self.master), self.layout)
        self.release_offloaded()  # the master weights were read through their mapping
        return full
