"""Checkpoint and export I/O over a stage's state: what each rank saves, loads and
streams to rank 0, unit by unit, whatever the stage (the checkpoint writer,
zero_ref/checkpoint/, and the oracle check, zero_ref/app/oracle_check.py, read
the engine through these).

A stage keeps each state buffer ("param": the float32 master weights, "exp_avg",
"exp_avg_sq") whole or as this rank's shard (Sec. 5.1: P_os shards the optimizer
state, Sec. 5.3: P_os+g+p the parameters too); `state_buffers` says which.
Every stage saves the same slices, so a checkpoint does not depend on the stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from zero_ref.engine.init_source import InitSource
from zero_ref.layout.flat import UnitLayout, rank_rows, shard_range

StateSink = Callable[[str, UnitLayout, np.ndarray], None]  # (kind, unit, padded flat range)


class StateIO:
    """stream_state, owned_state and load_state over `state_buffers` (what a stage keeps whole)."""

    def stream_state(self, kinds: Sequence[str], sink: StateSink) -> None:
        """Hand rank 0 each unit's padded range of each state buffer in `kinds`
        ("param", "exp_avg", "exp_avg_sq"), unit after unit: sink(kind, unit, flat)
        runs on rank 0 alone. A collective; no rank ever holds a full-size copy
        (with hybrid sharding each shard group gathers to its first rank; rank 0's
        group is the one that hands it on)
        (a buffer this rank keeps whole is lent as a view, a sharded one is
        gathered one unit at a time into a landing buffer on rank 0 only)."""
        self.settle()
        self.comm.set_context(where="consolidate")
        lend = self.params.lender(self._landing_buffer)  # stage 3 lends its gathered unit
        landing = None  # rank 0's, made when a sharded buffer first needs it
        for unit in self.layout.units:
            for kind in kinds:
                whole, shard = self.state_buffers(kind)
                if whole is not None:
                    flat = whole[unit.full_slice()]  # lent as a view: no copy
                else:
                    if self.shard_rank == 0 and landing is None:
                        landing = lend()
                    flat = None if landing is None else landing[: unit.padded_numel]
                    if unit.padded_numel:
                        mine = shard[unit.shard_slice()]
                        self.shard_comm.gather_to_root(mine, flat, "consolidate")
                    self.release_pages(shard[unit.shard_slice()])
                if self.rank == 0:
                    sink(kind, unit, self.place.to_host(flat))  # host memory: a device's copied
        if self.memory.holds("buffers", "landing"):
            self.memory.drop("buffers", "landing")
        self.release_offloaded()

    def owned_state(self, kind: str, unit: UnitLayout) -> np.ndarray:
        """This rank's slice of `unit` in state buffer `kind` ("param", "exp_avg",
        "exp_avg_sq"), as a view: what this rank's checkpoint file holds. Every stage
        saves the same slices, so a checkpoint does not depend on the stage."""
        self.settle()
        whole, shard = self.state_buffers(kind)
        if whole is not None:
            return self.place.to_host(rank_rows(whole[unit.full_slice()], unit)[self.shard_rank])
        return self.place.to_host(shard[unit.shard_slice()])

    def load_state(self, kind: str, source: InitSource) -> None:
        """Overwrite state buffer `kind` with what `source` holds for it, reading only
        what this rank keeps: whole units where it keeps the buffer whole, its own
        slices where the stage shards it (resuming from a checkpoint). "param" fills
        the master weights and, rounded, the 16-bit parameters, as at creation."""
        self.settle()
        if kind == "param":
            self.params.fill(source)
        else:
            whole, shard = self.state_buffers(kind)
            for unit in self.layout.units:
                if whole is not None:
                    self.ctx.fill(source, unit, whole[unit.full_slice()], 0, unit.padded_numel)
                else:
                    lo = shard_range(unit.padded_numel, self.shard_rank, self.shard_world).offset
                    self.ctx.fill(
                        source, unit, shard[unit.shard_slice()], lo, lo + unit.shard_numel
                    )
                    self.release_pages(shard[unit.shard_slice()])
        self.release_offloaded()

    def _landing_buffer(self) -> np.ndarray:
        """Where rank 0 receives a sharded unit: a buffer of the widest unit, made on
        first use and held while streaming (stage 3 lends its idle gathered-unit buffer
        instead: zero_ref/engine/gathered_unit.py)."""
        return self.place.empty("buffers", "landing", self.layout.widest_unit_numel)

    def state_buffers(self, kind: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(the full buffer if this rank keeps it whole, else None; its shard buffer).
        "param" is the float32 master weights (the parameters themselves in fp32)."""
        buffer = {"param": self.master, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        whole = any(buffer[kind] is kept for kept in self._kept_whole())
        return (buffer[kind], None) if whole else (None, buffer[kind])

    def _kept_whole(self) -> tuple[np.ndarray, ...]:
        """The state buffers this rank keeps whole: the parameters' as the stage holds
        them, and m and v unless the optimizer state is sharded (stage 0 keeps all)."""
        optimizer = () if self.optimizer_sharded else (self.exp_avg, self.exp_avg_sq)
        return (*self.params.kept_whole(), *optimizer)
