"""ZeroConfig's option groups: mixed precision (with fp16's loss scaler), offload, overlap,
ZeRO++ and hybrid sharding, each a frozen dataclass that checks its own fields.

A rule joining two groups, or a group and the core (the stage, the device), is
ZeroConfig's (zero_ref/config/__init__.py). An error names a field by its setting's
name (precision, offload_optimizer, overlap_comm, ...): its flag's, its checkpoint
manifest key's. This module imports nothing of the package: the package's __init__
builds on it, and a sibling importing a sibling would run that __init__ in a circle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PRECISIONS = ("fp32", "fp16", "bf16")  # see zero_ref/engine/precision.py
OFFLOAD_DEVICES = ("none", "nvme")  # see zero_ref/offload/
OPTIMIZER_OFFLOAD = (*OFFLOAD_DEVICES, "cpu")  # cpu: ZeRO-Offload, the GPU path's (docs/gpu.md)
PROGRESS_MODES = ("test", "thread", "mpich", "none")  # zero_ref/comm/progress.py
COLLECTIVES = ("auto", "flat", "hierarchical")  # zero_ref/comm/hierarchical.py


def require(ok: bool, name: str, value: object, allowed: str) -> None:
    """ValueError naming the setting, its value and what is allowed, unless ok."""
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


def is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_positive_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def is_nonnegative_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _int(low: int, high: int | None):
    def ok(v) -> bool:
        in_range = high is None or v <= high
        return isinstance(v, int) and not isinstance(v, bool) and v >= low and in_range

    return ok


def _number(low: float, strict: bool = False):
    def ok(v) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return v > low if strict else v >= low

    return ok


@dataclass(frozen=True)
class LossScaleConfig:
    """DeepSpeed's fp16 keys, with their documented defaults. `loss_scale` > 0 is a
    static scale (never changed; an overflowing step is still skipped); 0 is dynamic."""

    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0

    def __post_init__(self) -> None:
        checks = {
            "loss_scale": (self.loss_scale, "a number >= 0 (0: dynamic)", _number(0.0)),
            "initial_scale_power": (
                self.initial_scale_power,
                "an integer in [0, 127]",
                _int(0, 127),
            ),
            "loss_scale_window": (self.loss_scale_window, "an integer >= 1", _int(1, None)),
            "hysteresis": (self.hysteresis, "an integer >= 1", _int(1, None)),
            "min_loss_scale": (self.min_loss_scale, "a number > 0", _number(0.0, strict=True)),
        }
        for name, (value, allowed, ok) in checks.items():
            if not ok(value):
                raise ValueError(f"LossScaleConfig.{name} = {value!r}: must be {allowed}")
        if not isinstance(self.consecutive_hysteresis, bool):
            raise ValueError(
                f"LossScaleConfig.consecutive_hysteresis = {self.consecutive_hysteresis!r}: "
                "must be true or false"
            )
        if not self.static and 2.0**self.initial_scale_power < self.min_loss_scale:
            raise ValueError(
                f"LossScaleConfig.initial_scale_power = {self.initial_scale_power}: 2^power "
                f"must be >= min_loss_scale = {self.min_loss_scale}"
            )

    @property
    def static(self) -> bool:
        return self.loss_scale > 0


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Mixed precision, the training the paper counts memory for (Sec. 3.1: 16-bit
    parameters and gradients, fp32 master weights and AdamW state; docs/precision.md).
    The policy that applies it: zero_ref/engine/precision.py.

    dtype         (the setting `precision`) "fp32", or mixed precision: "fp16" (with
                  loss scaling) or "bf16": 16-bit parameters and gradients, fp32 master
                  weights and AdamW state.
    grad_accum_dtype  dtype of the gradient buffers and their accumulation: None
                  (the precision's own) or "fp32" (with fp16/bf16: fp32 gradients).
    communication_data_type  dtype gradients are reduced in on the wire: None (the
                  gradients' own), or "fp32", "fp16", "bf16".
    loss_scale    fp16's loss scaler (DeepSpeed's fp16 keys); unused otherwise.
    """

    dtype: str = "fp32"
    grad_accum_dtype: str | None = None
    communication_data_type: str | None = None
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)

    def __post_init__(self) -> None:
        names = " or ".join(repr(p) for p in PRECISIONS)
        require(self.dtype in PRECISIONS, "precision", self.dtype, names)
        require(
            isinstance(self.loss_scale, LossScaleConfig),
            "loss_scale",
            self.loss_scale,
            "a LossScaleConfig",
        )
        require(
            self.grad_accum_dtype in (None, self.dtype, "fp32"),
            "grad_accum_dtype",
            self.grad_accum_dtype,
            f"None, {self.dtype!r} (the precision's own) or 'fp32'",
        )
        require(
            self.communication_data_type in (None, *PRECISIONS),
            "communication_data_type",
            self.communication_data_type,
            "None (the gradients' own dtype) or " + names,
        )

    @property
    def grad_dtype(self) -> str:
        """The dtype gradients are stored and accumulated in."""
        return self.grad_accum_dtype or self.dtype

    @property
    def comm_dtype(self) -> str:
        """The dtype gradients are reduced in on the wire."""
        return self.communication_data_type or self.grad_dtype


@dataclass(frozen=True)
class OffloadConfig:
    """Where the optimizer state and the parameters live: ZeRO-Offload's host memory on
    the GPU path (docs/gpu.md), ZeRO-Infinity's NVMe tier on the CPU (docs/offload.md).
    The stores that hold them: zero_ref/engine/stores.py, zero_ref/offload/.

    optimizer     (the setting `offload_optimizer`) "cpu" (device "gpu", fp16/bf16:
                  ZeRO-Offload): the optimizer's float32 state in host memory, updated
                  there by the CPU AdamW; each step the 16-bit gradient shard comes
                  down, the 16-bit parameters go up.
                  "nvme": the optimizer's float32 state (master weights, m, v),
                  and at stages 2-3 the reduced gradient shard, lives in
                  memory-mapped files under nvme_path and streams through a pool
                  of buffer_count sub-groups of sub_group_size elements each step
                  (stages 1-3; stage 1's gradients stay in RAM; docs/offload.md).
                  "none": in RAM.
    param         (the setting `offload_param`) "nvme": stage 3's parameter shard
                  lives in a swap file; each unit's slice is read when it is gathered
                  (the neighbours' prefetched) and dropped from RAM after. "none": in RAM.
    nvme_path     the folder for the swap files (needed with "nvme").
    sub_group_size  elements of the optimizer state streamed through one pool buffer.
    buffer_count  the pool's buffers: one sub-group read, one computed, one written.
    """

    optimizer: str = "none"
    param: str = "none"
    nvme_path: str | None = None
    sub_group_size: int = 1 << 20
    buffer_count: int = 4

    def __post_init__(self) -> None:
        devices = " or ".join(repr(d) for d in OFFLOAD_DEVICES)
        require(
            self.optimizer in OPTIMIZER_OFFLOAD,
            "offload_optimizer",
            self.optimizer,
            devices + " or 'cpu' (with device 'gpu')",
        )
        require(
            is_positive_int(self.sub_group_size),
            "sub_group_size",
            self.sub_group_size,
            "an integer >= 1",
        )
        require(
            isinstance(self.buffer_count, int) and self.buffer_count >= 3,
            "buffer_count",
            self.buffer_count,
            "an integer >= 3 (one sub-group read, one computed, one written)",
        )
        require(self.param in OFFLOAD_DEVICES, "offload_param", self.param, devices)
        # nvme_path, needed with "nvme", is ZeroConfig's to check: after the stage's
        # refusal of the offload itself, which is the one to read first.

    @property
    def to_nvme(self) -> bool:
        """Anything in swap files: the optimizer state or the parameters."""
        return "nvme" in (self.optimizer, self.param)


@dataclass(frozen=True)
class OverlapConfig:
    """When each collective is issued and waited for, and what stage 3 keeps gathered
    (docs/stages.md, "Overlap and prefetch"; the schedule: engine/collective_schedule.py).
    Values do not change with any of these; only when bytes move.

    comm          (the setting `overlap_comm`) issue collectives and wait for them later,
                  so communication hides behind compute (DeepSpeed's overlap_comm):
                  stages 1-2 reduce each bucket while backward goes on (two staging
                  buffers) and each unit waits only for its own all-gather of updated
                  parameters; stage 3 gathers units ahead of use.
                  False: every collective blocks, in the oracle's order of MPI calls.
    progress      what advances an issued collective (zero_ref/comm/progress.py): "test"
                  (MPI_Testall at unit boundaries), "thread" (a polling thread), "mpich"
                  (MPICH's own progress thread), "none" (only the wait).
    collectives   "flat" (MPI's one-level all-gather and reduce-scatter), "hierarchical"
                  (two levels: inside each host, then across hosts; every byte crosses
                  the link once, zero_ref/comm/hierarchical.py; hosts of any sizes, and
                  hpZ's and hybrid's groups where they span hosts) or "auto"
                  (hierarchical when the job spans more than one host with more than one
                  rank on some host; else flat).
    prefetch_numel  stage 3 with overlap_comm: units gathered ahead of use, in elements
                  (DeepSpeed's stage3_prefetch_bucket_size): as many upcoming units as
                  fit; None: one unit ahead (FSDP's forward/backward prefetch); 0: none.
    max_live_numel  stage 3: the most gathered-parameter elements a rank holds at once,
                  prefetched ones included (stage3_max_live_parameters); None: no bound
                  beyond prefetch_numel. At least the widest unit.
    persistence_numel  stage 3: units with fewer elements than this stay gathered from
                  their first gather until the update (stage3_param_persistence_threshold).
    """

    comm: bool = False
    progress: str = "test"
    collectives: str = "auto"
    prefetch_numel: int | None = None
    max_live_numel: int | None = None
    persistence_numel: int = 0

    def __post_init__(self) -> None:
        require(isinstance(self.comm, bool), "overlap_comm", self.comm, "True or False")
        modes = ", ".join(repr(m) for m in PROGRESS_MODES)
        require(self.progress in PROGRESS_MODES, "progress", self.progress, modes)
        kinds = ", ".join(repr(m) for m in COLLECTIVES)
        require(self.collectives in COLLECTIVES, "collectives", self.collectives, kinds)
        for name, value in (("prefetch_numel", self.prefetch_numel),
                            ("max_live_numel", self.max_live_numel)):  # fmt: skip
            require(
                value is None or is_nonnegative_int(value), name, value, "None or an integer >= 0"
            )
        require(
            self.max_live_numel is None or self.max_live_numel >= 1,
            "max_live_numel",
            self.max_live_numel,
            "None or an integer >= 1 (at least the widest unit)",
        )
        require(
            is_nonnegative_int(self.persistence_numel),
            "persistence_numel",
            self.persistence_numel,
            "an integer >= 0",
        )


@dataclass(frozen=True)
class ZeroPPConfig:
    """ZeRO++ (Wang et al. 2023): qwZ (Sec. 3.1), hpZ (Sec. 3.2) and qgZ (Sec. 3.3), each
    off by default (docs/zeropp.md). Which stages each serves is ZeroConfig's rule.

    quantized_weights  stage 3 (qwZ, zero_quantized_weights): each unit's forward
                  all-gather sends every rank's slice as int8 with one float32 scale per
                  block (zero_ref/numerics/quantize.py); backward gathers full precision, or
                  with hpZ reads forward's dequantized values from the secondary copy.
    quantize_block  elements per quantization block; with quantized_weights each unit
                  is padded to a multiple of world size * quantize_block, so blocks never
                  straddle two ranks' slices and results do not depend on the world size.
    quantized_gradients  stages 1-3 (qgZ, zero_quantized_gradients): each gradient
                  bucket's reduce-scatter sends every destination block as int8 with one
                  float32 scale per block of at most quantize_block elements (a unit's own
                  grid, zero_ref/layout/grad_blocks.py) through an Alltoall; each rank
                  dequantizes, sums in rank order in float32 and rounds once.
    quantized_gradient_bits  qgZ's bits: 8 (int8, levels -127..127) or 4 (int4, levels
                  -7..7, two values a byte: ZeRO++'s and DeepSpeed's bits for gradients;
                  DeepSpeed's levels are -8..7).
    quantized_gradient_local_size  qgZ's hops (Sec. 3.3, DeepSpeed's
                  all_to_all_quant_reduce): "host" (the default: the ranks sharing a host,
                  MPI's shared-memory split) or an integer L dividing the ranks qgZ sums
                  over; with groups of L consecutive ranks that are neither one rank nor
                  all of them, each bucket goes in two hops: quantized to the ranks of the
                  group, summed there in float32, requantized, then to one rank of each
                  other group (zero_ref/comm/reduction.py). "world": always one hop (the
                  Alltoall over every rank). On one host "host" is one hop.
    hpz_partition_size  stage 3 (hpZ, zero_hpz_partition_size): 1 is off; an
                  integer G > 1 (dividing the world size, checked by the engine) keeps a
                  secondary copy of the parameters sharded over each group of G
                  consecutive ranks, and backward's all-gathers run in the group from it;
                  "host": the groups are the ranks sharing a host (MPI's shared-memory
                  split). Without qwZ values do not change; with it the copy holds
                  forward's dequantized values, which backward then reads
                  (zero_ref/engine/secondary_copy.py).
    """

    quantized_weights: bool = False
    quantize_block: int = 2048
    quantized_gradients: bool = False
    quantized_gradient_bits: int = 8
    quantized_gradient_local_size: int | str = "host"
    hpz_partition_size: int | str = 1

    def __post_init__(self) -> None:
        require(
            isinstance(self.quantized_weights, bool),
            "quantized_weights",
            self.quantized_weights,
            "True or False",
        )
        require(
            is_positive_int(self.quantize_block),
            "quantize_block",
            self.quantize_block,
            "an integer >= 1",
        )
        size = self.hpz_partition_size
        require(
            size == "host" or is_positive_int(size),
            "hpz_partition_size",
            size,
            "an integer >= 1 (1: off) or 'host' (the ranks sharing a host)",
        )
        self._check_qgz()

    def _check_qgz(self) -> None:
        require(
            isinstance(self.quantized_gradients, bool),
            "quantized_gradients",
            self.quantized_gradients,
            "True or False",
        )
        bits, local = self.quantized_gradient_bits, self.quantized_gradient_local_size
        name = "quantized_gradient_bits"
        require(isinstance(bits, int) and bits in (8, 4), name, bits, "8 (int8) or 4 (int4)")
        require(
            self.quantized_gradients or bits == 8,
            name,
            bits,
            "8 (its default) without quantized_gradients (the bits are qgZ's)",
        )
        name = "quantized_gradient_local_size"
        require(
            local in ("host", "world") or is_positive_int(local),
            name,
            local,
            "'host', 'world' or an integer >= 1 dividing the ranks qgZ sums over",
        )
        require(
            self.quantized_gradients or local == "host",
            name,
            local,
            "'host' (its default) without quantized_gradients (the hops are qgZ's)",
        )


@dataclass(frozen=True)
class HybridConfig:
    """Hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed MiCS's mics_shard_size; docs/
    zeropp.md, "Hybrid sharding"; zero_ref/engine/hybrid.py): ZeRO inside groups of
    ranks, the groups holding replicas.

    shard_size    (the setting `hybrid_shard_size`) stages 1-3: None is off (ZeRO over the
                  whole world); an integer G (dividing the world size, checked by the
                  engine) runs ZeRO inside each group of G consecutive ranks as if the
                  world were G, the groups holding replicas, and once per step (at the
                  accumulation boundary, as MiCS does) the reduced gradient shard is
                  all-reduced across the groups among the ranks holding the same shard;
                  "host": the groups are the ranks sharing a host.
    """

    shard_size: int | str | None = None

    def __post_init__(self) -> None:
        size = self.shard_size
        require(
            size is None or size == "host" or is_positive_int(size),
            "hybrid_shard_size",
            size,
            "None (off), an integer >= 1 dividing the world size, or 'host'",
        )
