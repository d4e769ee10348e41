"""The engine every stage is: its policies, chosen once from the configuration, and the
stage's two parts (ZeRO, Sec. 5: a stage says only what it partitions and which
collectives it runs).

Chosen once: the placement of model-sized arrays (RAM or device: placement_for), the
host placement (ZeRO-Offload's RAM), the compute of the update (compute_for), the
precision (engine/precision.py: dtypes, widening and rounding, master weights, loss
scaling), the collective schedule (engine/collective_schedule.py), the swap folder and
the optimizer-state store (engine/stores.py), the Comm the stages shard over (the
world, or with hybrid sharding a group of it: engine/hybrid.py), and the hooks tools
act at (engine/hooks.py). Then the stage's parts, from engine/ladder.py's table: how it
holds parameters (`self.params`) and gradients (`self.grads`). The step itself is
engine/step.py; checkpoint I/O engine/state_io.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zero_ref.comm.collectives import Comm
from zero_ref.config import ZeroConfig
from zero_ref.engine.collective_schedule import schedule_for
from zero_ref.engine.compute import compute_for
from zero_ref.engine.context import StageContext
from zero_ref.engine.hooks import EngineHooks
from zero_ref.engine.hybrid import replica_sent_bytes, replicas_for
from zero_ref.engine.init_source import InitSource, as_init_source
from zero_ref.engine.memory import MemoryLedger
from zero_ref.engine.placement import HostPlacement, placement_for
from zero_ref.engine.precision import Precision
from zero_ref.engine.state_io import StateIO
from zero_ref.engine.step import SharedStep
from zero_ref.engine.stores import optimizer_store_for, swap_for
from zero_ref.layout.flat import FlatLayout, Owned, layout_align, model_layout
from zero_ref.models.unit import Model
from zero_ref.optim.loss_scale import LossScaleState


def _check_comm_matches(comm: Comm, cfg: ZeroConfig) -> None:
    """One determinism switch: the Comm's sums must follow cfg.deterministic, as the
    norm does, or a run would be half deterministic (build it with comm_for)."""
    if comm.reduction.deterministic != cfg.deterministic:
        raise ValueError(
            f"ZeroConfig.deterministic={cfg.deterministic} but the Comm reduces with "
            f"{type(comm.reduction).__name__}: build the Comm with "
            "zero_ref.comm.choose.comm_for(mpi_comm, cfg)"
        )
    if cfg.check_schedule:
        comm.check_schedule = True


class Engine(SharedStep, StateIO):
    """The policies, and the stage as two parts (engine/ladder.py's STAGES): `params`
    (ReplicatedParams, ShardUpdatedParams or GatheredParams) and `grads`
    (AllReducedGrads, ReduceScatteredGrads or ShardedGrads)."""

    def __init__(
        self,
        parts,  # the stage's row of engine/ladder.py's STAGES
        model: Model,
        init_params: InitSource | Mapping[str, np.ndarray],
        cfg: ZeroConfig,
        comm: Comm,
        hooks: EngineHooks | None = None,
    ) -> None:
        self.model, self.cfg, self.comm, self.stage = model, cfg, comm, parts.stage
        self.optimizer_sharded = parts.optimizer_sharded
        self.hooks = hooks or EngineHooks()  # named points for tools (engine/hooks.py)
        self.world, self.rank = comm.size, comm.rank
        # hybrid sharding: the stages shard over a group of the world (engine/hybrid.py)
        self.hybrid = replicas_for(cfg, comm)
        self.shard_comm = self.hybrid.shard
        self.shard_world, self.shard_rank = self.shard_comm.size, self.shard_comm.rank
        self.layout: FlatLayout = model_layout(model, self.shard_world, layout_align(cfg))
        self.memory = MemoryLedger()
        self.place = placement_for(cfg.device, self.memory, self.where)  # model-sized arrays
        self.host_place = HostPlacement(self.memory)  # RAM, whatever the device (ZeRO-Offload)
        self.compute = compute_for(
            cfg.device, cfg.offload.optimizer, self.host_place, self.place, comm.ledger
        )
        comm.track_memory(self.memory)  # host staging buffers (--device gpu), if any
        self.precision = Precision.of(cfg)  # the dtype of each kind of array
        self.scaler: LossScaleState | None = self.precision.initial_scaler()
        self.step_count = 0
        _check_comm_matches(comm, cfg)
        self.schedule = schedule_for(cfg, self.shard_comm)  # when collectives are waited for
        self.swap = swap_for(
            cfg, self.stage, self.optimizer_numel, self.precision.bytes, self.rank,
            self.memory, comm.mpi,
        )  # fmt: skip
        self.nvme = self.swap.nvme  # the swap folder (offloaded state), or None
        self.optimizer_store = optimizer_store_for(cfg, self.place, self.host_place, self.swap)
        self.ctx = StageContext(
            cfg, self.layout, self.place, self.precision, self.schedule, self.swap, comm,
            self.shard_comm,
        )  # fmt: skip
        # 16-bit parameters: the optimizer's float32 master weights, kept where m and v are
        self.params = parts.params(self.ctx, lambda: self._optimizer_array("master_params"))
        self.params.fill(as_init_source(init_params, model))
        self.grads = parts.grads(self.ctx, self._grad_divisor)
        self.exp_avg = self._optimizer_array("exp_avg")  # AdamW's m and v (float32)
        self.exp_avg_sq = self._optimizer_array("exp_avg_sq")
        rows = self.grads.streamed_rows
        self.optimizer_store.start(self.layout, self.stage, cfg, self.place, rows)

    @property
    def optimizer_numel(self) -> int:
        """Elements of each optimizer array this rank keeps: all (stage 0), or its shard."""
        return self.layout.shard_numel if self.optimizer_sharded else self.layout.full_numel

    def _optimizer_array(self, name: str) -> np.ndarray:
        """A float32 optimizer array of this rank's size, where the store keeps them."""
        return self.optimizer_store.zeros(name, self.optimizer_numel)

    @property
    def trace(self):
        """The zero_ref.io.trace.Trace the run attached (--trace), or None."""
        return self.ctx.trace

    @property
    def offloaded(self):
        """The offloaded optimizer step (an OffloadedUpdate: its trace, --trace), or None."""
        return self.optimizer_store.offloaded

    # ---- the stage: what the step and the tools read of its two parts
    def unit_params(self, i: int, upcoming=(), forward: bool = False) -> dict[str, np.ndarray]:
        """Unit i's parameters as the model reads them (`upcoming`: the reads that follow,
        which stage 3 may gather ahead)."""
        return self.params.read(i, upcoming, forward)

    def release_unit_params(self, i: int, forward: bool = False) -> None:
        """Compute is done with unit i (stage 3 lets its gathered buffer go)."""
        self.params.release(i, forward)

    def unit_grads(self, i: int) -> dict[str, np.ndarray]:
        """Where backward writes unit i's float32 gradients."""
        return self.grads.unit_grads(i)

    def owned_slices(self) -> list[Owned]:
        """(param, grad, master, exp_avg, exp_avg_sq) 1-D views this rank updates; master
        is param itself when parameters are float32."""
        return self.params.owned(self.grads, self.exp_avg, self.exp_avg_sq)

    def norm_comm(self) -> Comm | None:
        """Who holds the other parts of the gradient (None: this rank holds all of it;
        with hybrid sharding every shard group holds the whole sum)."""
        return self.shard_comm if self.optimizer_sharded else None

    def gathers(self):
        """Stage 3's all-gathers of each unit per step where its plan holds more than one
        unit (prefetch buffers, persistent units); None: the paper's one at a time."""
        return self.params.gathers()

    @property
    def qgz_local_size(self) -> int | None:
        """The ranks of qgZ's first hop, as MPI split them (None: one hop): the oracle's."""
        return self.grads.qgz_local_size

    # what tests and tools read by name (each is one part's)
    full_params = property(lambda self: self.params.full_params)
    shard_params = property(lambda self: self.params.shard_params)
    master = property(lambda self: self.params.master)
    gathered = property(lambda self: self.params.gathered)
    unit_gather = property(lambda self: self.params.unit_gather)
    buckets = property(lambda self: self.grads.buckets)
    grad_shard = property(lambda self: self.grads.grad_shard)
    shard_grads = property(lambda self: self.grads.shard_grads)
    grad_quantization = property(lambda self: self.grads.grad_quantization)

    # ---- the run around the step
    def where(self) -> str:
        """'rank r, step s' (or set-up, before step 1): for errors raised deep inside."""
        step = self.comm.step
        return f"rank {self.rank}, " + (f"step {step}" if step else "set-up (before step 1)")

    def release_pages(self, view: np.ndarray) -> None:
        """Drop a view of a swap-file array (a unit's slice) from RAM after bulk access
        through its mapping, so that filling, loading or streaming offloaded state
        holds one unit of it at a time, not the whole; a view of RAM: nothing."""
        self.swap.release_pages(view)

    def release_offloaded(self) -> None:
        """After bulk access to swap-file state through its mappings (a checkpoint, a
        stream to rank 0, a load): drop those pages from RAM. Nothing in RAM runs."""
        self.swap.release_all()

    def settle(self) -> None:
        """Wait for every collective still in flight (--overlap-comm): before state is
        read or written from outside the step (checkpoints, exports, the oracle check)."""
        self.params.settle()
        self.schedule.settle()

    def close(self) -> None:
        """Wait for what is in flight, stop the progress policy and the I/O threads,
        remove the swap files (a clean end of the run), then free the parts' own groups
        (qgZ's hops, hpZ's partition: collectives, on every rank)."""
        self.settle()
        self.schedule.close()
        self.hybrid.close()
        self.optimizer_store.close()
        self.swap.close()
        self.grads.close()
        self.params.close()

    @property
    def device_description(self) -> str | None:
        """The device that holds the model's arrays (--device gpu), or None: RAM."""
        return getattr(self.place, "description", None)

    def hybrid_sent_bytes(self) -> int:
        """Bytes this rank sends per step in hybrid sharding's all-reduce across the shard
        groups (ledger kind allreduce_hybrid; 0 without hybrid sharding)."""
        numels = [o.grad.size for o in self.owned_slices()]
        return replica_sent_bytes(numels, self.hybrid.replicas, self.precision.bytes.grad)

    def memory_report(self) -> dict:
        """The memory ledger as plain data: bytes by category in RAM, on disk, on the
        device, and the peaks (zero_ref/engine/memory.py's MemoryLedger.report)."""
        return self.memory.report()

    def buffer_bytes(self) -> dict[str, int]:
        """Each buffer this rank holds in RAM now, by its ledger name."""
        return self.memory.bytes_by_name("buffers")

    def stale_swap_folders(self) -> list[str]:
        """Swap folders a killed run left under --nvme-path, which this engine removed."""
        return [str(p) for p in self.nvme.stale] if self.nvme is not None else []

    def attach_trace(self, trace) -> None:
        """Record on `trace` (a zero_ref.io.trace.Trace, --trace) from now on: the units
        and the update (and the saves, zero_ref/checkpoint/writer.py), the Comm ledger's
        collectives and copies, the offloaded update's swap reads, AdamW sub-groups and
        writes."""
        self.ctx.trace = self.comm.ledger.trace = trace
        if self.offloaded is not None:
            self.offloaded.trace = trace
