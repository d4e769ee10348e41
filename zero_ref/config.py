"""Configuration of the optimizer, fp16's loss scaler and the ZeRO engine, validated once.

Frozen dataclasses: every field is checked in __post_init__ and a bad value
raises ValueError naming the field, the value and what is allowed. Argparse
and JSON live at the command-line edge (zero_ref.train), not here: the flags and
DeepSpeed keys that feed these fields are rows of zero_ref.app.settings, which take
these defaults unless they say why not (lr, clip, grad_accum: docs/flags.md). Every
config dataclass is here, below the code that reads it (optim, engine, app).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

STAGES = (0, 1, 2, 3)
NONFINITE_POLICIES = ("raise", "skip")  # see zero_ref/optim/nonfinite.py
PRECISIONS = ("fp32", "fp16", "bf16")  # see zero_ref/engine/precision.py
OFFLOAD_DEVICES = ("none", "nvme")  # see zero_ref/offload/
OPTIMIZER_OFFLOAD = (*OFFLOAD_DEVICES, "cpu")  # cpu: ZeRO-Offload, the GPU path's (docs/gpu.md)
# Elements per gradient bucket unless told otherwise: small enough that the default run's
# backward fires a dozen buckets and MPI's temporaries stay small; larger buckets mean
# fewer calls and faster steps for more staging memory (measured: docs/benchmarks.md).
DEFAULT_BUCKET_NUMEL = 8192
DEVICES = ("cpu", "gpu")  # where the engine's arrays live (docs/gpu.md)
PROGRESS_MODES = ("test", "thread", "mpich", "none")  # zero_ref/comm/progress.py
COLLECTIVES = ("auto", "flat", "hierarchical")  # zero_ref/comm/hierarchical.py
CUDA_AWARE_CHOICES = ("auto", "yes", "no")  # ask the MPI library, or say (gpu/mpi_support.py)


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is not allowed: {name} must be {allowed}")


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class AdamWConfig:
    """Hyperparameters of AdamW, with the meaning and the defaults torch.optim.AdamW
    gives them. The command line's --lr default is 3e-3 instead, the peak of its
    schedule for its small default models (warmup, then cosine decay for gpt)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        _require(_finite(self.lr) and self.lr >= 0, "lr", self.lr, "a finite number >= 0")
        ok = isinstance(self.betas, (tuple, list)) and len(self.betas) == 2
        _require(ok, "betas", self.betas, "a pair (beta1, beta2)")
        betas = tuple(self.betas)
        for i, b in enumerate(betas):
            _require(_finite(b) and 0 <= b < 1, f"betas[{i}]", b, "a number in [0, 1)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        _require(_finite(self.eps) and self.eps > 0, "eps", self.eps, "a finite number > 0")
        _require(
            _finite(self.weight_decay) and self.weight_decay >= 0,
            "weight_decay",
            self.weight_decay,
            "a finite number >= 0",
        )


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
class ZeroConfig:
    """What the engine does each step.

    stage         0 = plain data parallel, 1 = + optimizer state sharded,
                  2 = + gradients sharded, 3 = + parameters sharded.
    bucket_numel  elements per gradient bucket: stage 0's allreduce chunks, stage 1's
                  reduce-scatter after backward, stages 2-3's during backward; the one
                  default, DEFAULT_BUCKET_NUMEL, is the command line's and
                  docs/configs' too (what a bucket trades: docs/benchmarks.md).
    grad_accum    micro-steps whose gradients are summed before one update (the
                  command line derives it from the batch sizes).
    clip          max global gradient norm, or None for no clipping (the default;
                  the command line's --clip is 1.0, and its 0 is None here).
    deterministic reduce in rank order so results are bitwise those of the
                  single-rank oracle (see docs/determinism.md).
    nonfinite     a NaN/Inf gradient: "raise" an error naming the parameter, or
                  "skip" the step on every rank, leaving all state untouched.
    check_schedule  debug: ranks agree on each collective before entering it,
                  so a mismatch is an error naming both sides, not a hang.
    checkpoint_activations  keep only each unit's input between forward and backward,
                  and run its forward again before its backward (one unit's
                  activations at a time, for a second forward's compute).
    precision     "fp32", or mixed precision: "fp16" (with loss scaling) or "bf16":
                  16-bit parameters and gradients, fp32 master weights and AdamW
                  state (docs/precision.md).
    loss_scale    fp16's loss scaler (DeepSpeed's fp16 keys); unused otherwise.
    grad_accum_dtype  dtype of the gradient buffers and their accumulation: None
                  (the precision's own) or "fp32" (with fp16/bf16: fp32 gradients).
    communication_data_type  dtype gradients are reduced in on the wire: None (the
                  gradients' own), or "fp32", "fp16", "bf16".
    offload_optimizer  "cpu" (device "gpu", fp16/bf16: ZeRO-Offload): the optimizer's
                  float32 state in host memory, updated there by the CPU AdamW; each
                  step the 16-bit gradient shard comes down, the 16-bit parameters go up.
                  "nvme": the optimizer's float32 state (master weights, m, v),
                  and at stages 2-3 the reduced gradient shard, lives in
                  memory-mapped files under nvme_path and streams through a pool
                  of buffer_count sub-groups of sub_group_size elements each step
                  (stages 1-3; stage 1's gradients stay in RAM; docs/offload.md).
                  "none": in RAM.
    offload_param "nvme": stage 3's parameter shard lives in a swap file; each unit's
                  slice is read when it is gathered (the neighbours' prefetched) and
                  dropped from RAM after. "none": in RAM.
    nvme_path     the folder for the swap files (needed with "nvme").
    device        "cpu", or "gpu": the engine's model-sized arrays are numba.cuda device
                  arrays and its update phase runs as CUDA kernels (docs/gpu.md).
    cuda_aware_mpi  "auto" (ask the MPI library), "yes" or "no": with device "gpu",
                  whether device buffers go to MPI directly or are staged through host.
    overlap_comm  issue collectives and wait for them later, so communication hides
                  behind compute (DeepSpeed's overlap_comm; engine/collective_schedule.py):
                  stages 1-2 reduce each bucket while backward goes on (two staging
                  buffers) and each unit waits only for its own all-gather of updated
                  parameters; stage 3 gathers units ahead of use. Values do not change.
                  False: every collective blocks, in the oracle's order of MPI calls.
    progress      what advances an issued collective (zero_ref/comm/progress.py): "test"
                  (MPI_Testall at unit boundaries), "thread" (a polling thread), "mpich"
                  (MPICH's own progress thread), "none" (only the wait).
    collectives   "flat" (MPI's one-level all-gather and reduce-scatter), "hierarchical"
                  (two levels: inside each host, then across hosts; every byte crosses
                  the link once, zero_ref/comm/hierarchical.py) or "auto" (hierarchical
                  when the job spans more than one host with more than one rank on each
                  and the engine has no hpZ, hybrid or ZeRO++ groups; else flat).
    prefetch_numel  stage 3 with overlap_comm: units gathered ahead of use, in elements
                  (DeepSpeed's stage3_prefetch_bucket_size): as many upcoming units as
                  fit; None: one unit ahead (FSDP's forward/backward prefetch); 0: none.
    max_live_numel  stage 3: the most gathered-parameter elements a rank holds at once,
                  prefetched ones included (stage3_max_live_parameters); None: no bound
                  beyond prefetch_numel. At least the widest unit.
    persistence_numel  stage 3: units with fewer elements than this stay gathered from
                  their first gather until the update (stage3_param_persistence_threshold).
    quantized_weights  stage 3 (ZeRO++'s qwZ, zero_quantized_weights): each unit's forward
                  all-gather sends every rank's slice as int8 with one float32 scale per
                  block (zero_ref/numerics/quantize.py); backward gathers full precision, or with
                  hpZ reads forward's dequantized values from the secondary copy.
    quantize_block  elements per quantization block; with quantized_weights each unit
                  is padded to a multiple of world size * quantize_block, so blocks never
                  straddle two ranks' slices and results do not depend on the world size.
    quantized_gradients  stages 1-3 (ZeRO++'s qgZ, zero_quantized_gradients): each gradient
                  bucket's reduce-scatter sends every destination block as int8 with one
                  float32 scale per block of at most quantize_block elements (a unit's own
                  grid, zero_ref/layout/grad_blocks.py) through an Alltoall; each rank
                  dequantizes, sums in rank order in float32 and rounds once.
    quantized_gradient_bits  qgZ's bits: 8 (int8, levels -127..127) or 4 (int4, levels
                  -7..7, two values a byte: ZeRO++'s and DeepSpeed's bits for gradients;
                  DeepSpeed's levels are -8..7).
    quantized_gradient_local_size  qgZ's hops (ZeRO++ Sec. 3.3, DeepSpeed's
                  all_to_all_quant_reduce): "host" (the default: the ranks sharing a host,
                  MPI's shared-memory split) or an integer L dividing the ranks qgZ sums
                  over; with groups of L consecutive ranks that are neither one rank nor
                  all of them, each bucket goes in two hops: quantized to the ranks of the
                  group, summed there in float32, requantized, then to one rank of each
                  other group (zero_ref/comm/reduction.py). "world": always one hop (the
                  Alltoall over every rank). On one host "host" is one hop.
    hpz_partition_size  stage 3 (ZeRO++'s hpZ, zero_hpz_partition_size): 1 is off; an
                  integer G > 1 (dividing the world size, checked by the engine) keeps a
                  secondary copy of the parameters sharded over each group of G
                  consecutive ranks, and backward's all-gathers run in the group from it;
                  "host": the groups are the ranks sharing a host (MPI's shared-memory
                  split). Without qwZ values do not change; with it the copy holds
                  forward's dequantized values, which backward then reads
                  (zero_ref/engine/secondary_copy.py).
    hybrid_shard_size  stages 1-3, hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed MiCS's
                  mics_shard_size): None is off (ZeRO over the whole world); an integer G
                  (dividing the world size, checked by the engine) runs ZeRO inside each
                  group of G consecutive ranks as if the world were G, the groups holding
                  replicas, and once per step (at the accumulation boundary, as MiCS does)
                  the reduced gradient shard is all-reduced across the groups among the
                  ranks holding the same shard; "host": the groups are the ranks sharing a
                  host (zero_ref/engine/hybrid.py).
    """

    stage: int = 2
    bucket_numel: int = DEFAULT_BUCKET_NUMEL
    grad_accum: int = 1
    clip: float | None = None
    deterministic: bool = False
    optimizer: AdamWConfig = field(default_factory=AdamWConfig)
    nonfinite: str = "raise"
    check_schedule: bool = False
    checkpoint_activations: bool = False
    precision: str = "fp32"
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    grad_accum_dtype: str | None = None
    communication_data_type: str | None = None
    offload_optimizer: str = "none"
    offload_param: str = "none"
    nvme_path: str | None = None
    sub_group_size: int = 1 << 20
    buffer_count: int = 4
    device: str = "cpu"
    cuda_aware_mpi: str = "auto"
    overlap_comm: bool = False
    progress: str = "test"
    collectives: str = "auto"
    prefetch_numel: int | None = None
    max_live_numel: int | None = None
    persistence_numel: int = 0
    quantized_weights: bool = False
    quantize_block: int = 2048
    quantized_gradients: bool = False
    quantized_gradient_bits: int = 8
    quantized_gradient_local_size: int | str = "host"
    hpz_partition_size: int | str = 1
    hybrid_shard_size: int | str | None = None

    def __post_init__(self) -> None:
        _require(
            self.stage in STAGES and isinstance(self.stage, int),
            "stage",
            self.stage,
            "one of 0, 1, 2, 3",
        )
        _require(
            _positive_int(self.bucket_numel), "bucket_numel", self.bucket_numel, "an integer >= 1"
        )
        _require(_positive_int(self.grad_accum), "grad_accum", self.grad_accum, "an integer >= 1")
        _require(
            self.clip is None or (_finite(self.clip) and self.clip > 0),
            "clip",
            self.clip,
            "None (no clipping) or a finite number > 0",
        )
        _require(
            isinstance(self.deterministic, bool),
            "deterministic",
            self.deterministic,
            "True or False",
        )
        _require(
            self.nonfinite in NONFINITE_POLICIES,
            "nonfinite",
            self.nonfinite,
            " or ".join(repr(p) for p in NONFINITE_POLICIES),
        )
        _require(
            isinstance(self.check_schedule, bool),
            "check_schedule",
            self.check_schedule,
            "True or False",
        )
        _require(
            isinstance(self.checkpoint_activations, bool),
            "checkpoint_activations",
            self.checkpoint_activations,
            "True or False",
        )
        _require(
            isinstance(self.optimizer, AdamWConfig), "optimizer", self.optimizer, "an AdamWConfig"
        )
        self._check_precision()
        self._check_offload()
        self._check_device()
        self._check_overlap()
        self._check_zeropp()
        self._check_hpz()
        self._check_qgz()
        self._check_hybrid()

    def _check_hybrid(self) -> None:
        size, name = self.hybrid_shard_size, "hybrid_shard_size"
        _require(
            size is None or size == "host" or _positive_int(size),
            name,
            size,
            "None (off), an integer >= 1 dividing the world size, or 'host'",
        )
        if size is None:
            return
        refusals = (
            (self.stage >= 1, "None at stage 0 (stage 0 shards nothing: every rank is a "
             "replica already; hybrid sharding needs stage 1, 2 or 3)"),
            (self.device == "cpu", "None with device 'gpu' (built on the CPU path only)"),
            (self.hpz_partition_size == 1, "None with hpz_partition_size != 1 (hpZ's "
             "secondary copy and hybrid sharding each split the world into groups; a "
             "secondary copy inside each shard group is not built)"),
            (self.offload_optimizer != "nvme" and self.offload_param != "nvme", "None with "
             "NVMe offload (the cross-group all-reduce runs on the gradient shard in RAM, "
             "and a checkpoint is written by one group; with swap files neither is built)"),
        )  # fmt: skip
        for ok, allowed in refusals:
            _require(ok, name, size, allowed)

    def _check_qgz(self) -> None:
        _require(
            isinstance(self.quantized_gradients, bool),
            "quantized_gradients",
            self.quantized_gradients,
            "True or False",
        )
        _require(
            isinstance(self.quantized_gradient_bits, int)
            and self.quantized_gradient_bits in (8, 4),
            "quantized_gradient_bits",
            self.quantized_gradient_bits,
            "8 (int8) or 4 (int4)",
        )
        _require(
            self.quantized_gradients or self.quantized_gradient_bits == 8,
            "quantized_gradient_bits",
            self.quantized_gradient_bits,
            "8 (its default) without quantized_gradients (the bits are qgZ's)",
        )
        local = self.quantized_gradient_local_size
        _require(
            local in ("host", "world") or _positive_int(local),
            "quantized_gradient_local_size",
            local,
            "'host', 'world' or an integer >= 1 dividing the ranks qgZ sums over",
        )
        _require(
            self.quantized_gradients or local == "host",
            "quantized_gradient_local_size",
            local,
            "'host' (its default) without quantized_gradients (the hops are qgZ's)",
        )
        if not self.quantized_gradients:
            return
        _require(
            self.stage in (1, 2, 3),
            "quantized_gradients",
            self.quantized_gradients,
            "False at stage 0 (qgZ quantizes the gradient buckets' reduce-scatter of stages 1-3)",
        )
        _require(
            self.device == "cpu",
            "quantized_gradients",
            self.quantized_gradients,
            "False with device 'gpu' (qgZ is built on the CPU path only)",
        )

    def _check_zeropp(self) -> None:
        _require(
            isinstance(self.quantized_weights, bool),
            "quantized_weights",
            self.quantized_weights,
            "True or False",
        )
        _require(
            _positive_int(self.quantize_block),
            "quantize_block",
            self.quantize_block,
            "an integer >= 1",
        )
        if not self.quantized_weights:
            return
        _require(
            self.stage == 3,
            "quantized_weights",
            self.quantized_weights,
            "False below stage 3 (qwZ quantizes stage 3's parameter all-gather)",
        )
        _require(
            self.device == "cpu",
            "quantized_weights",
            self.quantized_weights,
            "False with device 'gpu' (qwZ is built on the CPU path only)",
        )
        _require(
            self.persistence_numel == 0,
            "persistence_numel",
            self.persistence_numel,
            "0 with quantized_weights (a persistent unit is gathered once for forward and "
            "backward, which need different gathers under qwZ)",
        )

    def _check_hpz(self) -> None:
        size = self.hpz_partition_size
        _require(
            size == "host" or _positive_int(size),
            "hpz_partition_size",
            size,
            "an integer >= 1 (1: off) or 'host' (the ranks sharing a host)",
        )
        if size == 1:
            return
        _require(
            self.stage == 3,
            "hpz_partition_size",
            size,
            "1 below stage 3 (hpZ's secondary copy serves stage 3's backward gathers)",
        )
        _require(
            self.device == "cpu",
            "hpz_partition_size",
            size,
            "1 with device 'gpu' (hpZ is built on the CPU path only)",
        )
        _require(
            self.offload_param != "nvme",
            "hpz_partition_size",
            size,
            "1 with offload_param 'nvme' (the secondary copy lives in RAM, a second copy of "
            "the parameters the offload moved to disk; zero_ref does not swap it)",
        )

    def groups_in_use(self) -> str:
        """The settings that give the engine group collectives or byte payloads that the
        two-level collectives do not cover ("" when none)."""
        used = [
            ("hpz_partition_size", self.hpz_partition_size != 1),
            ("hybrid_shard_size", self.hybrid_shard_size is not None),
            ("quantized_gradients", self.quantized_gradients),
            ("quantized_weights", self.quantized_weights),
        ]
        return ", ".join(name for name, on in used if on)

    def _check_overlap(self) -> None:
        _require(
            isinstance(self.overlap_comm, bool), "overlap_comm", self.overlap_comm, "True or False"
        )
        modes = ", ".join(repr(m) for m in PROGRESS_MODES)
        _require(self.progress in PROGRESS_MODES, "progress", self.progress, modes)
        kinds = ", ".join(repr(m) for m in COLLECTIVES)
        _require(self.collectives in COLLECTIVES, "collectives", self.collectives, kinds)
        if self.collectives == "hierarchical" and self.groups_in_use():
            raise ValueError(
                f"collectives 'hierarchical' with {self.groups_in_use()}: not implemented "
                "(their group collectives are flat); use collectives 'flat' or 'auto'"
            )
        for name in ("prefetch_numel", "max_live_numel"):
            value = getattr(self, name)
            _require(
                value is None or _nonnegative_int(value), name, value, "None or an integer >= 0"
            )
        _require(
            self.max_live_numel is None or self.max_live_numel >= 1,
            "max_live_numel",
            self.max_live_numel,
            "None or an integer >= 1 (at least the widest unit)",
        )
        _require(
            _nonnegative_int(self.persistence_numel),
            "persistence_numel",
            self.persistence_numel,
            "an integer >= 0",
        )

    def _check_device(self) -> None:
        _require(self.device in DEVICES, "device", self.device, "'cpu' or 'gpu'")
        _require(
            self.cuda_aware_mpi in CUDA_AWARE_CHOICES,
            "cuda_aware_mpi",
            self.cuda_aware_mpi,
            "'auto', 'yes' or 'no'",
        )
        if self.offload_optimizer == "cpu":
            _require(
                self.device == "gpu" and self.stage >= 1 and self.precision != "fp32",
                "offload_optimizer",
                self.offload_optimizer,
                "'none' or 'nvme' here: 'cpu' (ZeRO-Offload: fp32 master weights and AdamW "
                "state in host memory, 16-bit parameters and gradients on the GPU) needs "
                "device 'gpu', stage 1-3 and precision fp16 or bf16; on the CPU path the "
                "state is in RAM already",
            )
        if self.device == "gpu":
            _require(
                "nvme" not in (self.offload_optimizer, self.offload_param),
                "device",
                self.device,
                "'cpu' with NVMe offload (the GPU path's offload tiers are not built yet)",
            )

    def _check_offload(self) -> None:
        devices = " or ".join(repr(d) for d in OFFLOAD_DEVICES)
        _require(
            self.offload_optimizer in OPTIMIZER_OFFLOAD,
            "offload_optimizer",
            self.offload_optimizer,
            devices + " or 'cpu' (with device 'gpu')",
        )
        _require(
            _positive_int(self.sub_group_size),
            "sub_group_size",
            self.sub_group_size,
            "an integer >= 1",
        )
        _require(
            isinstance(self.buffer_count, int) and self.buffer_count >= 3,
            "buffer_count",
            self.buffer_count,
            "an integer >= 3 (one sub-group read, one computed, one written)",
        )
        _require(
            self.offload_param in OFFLOAD_DEVICES, "offload_param", self.offload_param, devices
        )
        if self.offload_param == "nvme":
            _require(
                self.stage == 3,
                "offload_param",
                self.offload_param,
                "'none' below stage 3 (only stage 3 partitions the parameters)",
            )
        if "nvme" in (self.offload_optimizer, self.offload_param):
            _require(
                isinstance(self.nvme_path, str) and bool(self.nvme_path),
                "nvme_path",
                self.nvme_path,
                "a folder for the swap files when anything is offloaded to 'nvme'",
            )
        if self.offload_optimizer == "nvme":
            _require(
                self.stage >= 1,
                "offload_optimizer",
                self.offload_optimizer,
                "'none' at stage 0 (offload needs the optimizer state sharded: stage 1-3)",
            )

    def _check_precision(self) -> None:
        names = " or ".join(repr(p) for p in PRECISIONS)
        _require(self.precision in PRECISIONS, "precision", self.precision, names)
        _require(
            isinstance(self.loss_scale, LossScaleConfig),
            "loss_scale",
            self.loss_scale,
            "a LossScaleConfig",
        )
        accum = (None, self.precision, "fp32")
        _require(
            self.grad_accum_dtype in accum,
            "grad_accum_dtype",
            self.grad_accum_dtype,
            f"None, {self.precision!r} (the precision's own) or 'fp32'",
        )
        _require(
            self.communication_data_type in (None, *PRECISIONS),
            "communication_data_type",
            self.communication_data_type,
            "None (the gradients' own dtype) or " + names,
        )

    @property
    def grad_dtype(self) -> str:
        """The dtype gradients are stored and accumulated in."""
        return self.grad_accum_dtype or self.precision

    @property
    def comm_dtype(self) -> str:
        """The dtype gradients are reduced in on the wire."""
        return self.communication_data_type or self.grad_dtype


def _positive_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _nonnegative_int(x: object) -> bool:
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
