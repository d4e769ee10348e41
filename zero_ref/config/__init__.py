"""Configuration of the optimizer and the ZeRO engine, validated once.

Frozen dataclasses: every field is checked in __post_init__ and a bad value
raises ValueError naming the field, the value and what is allowed. Argparse
and JSON live at the command-line edge (zero_ref.train), not here: the flags and
DeepSpeed keys that feed these fields are rows of zero_ref.app.settings, which take
these defaults unless they say why not (lr, clip, grad_accum: docs/flags.md). Every
config dataclass is in this package, below the code that reads it (optim, engine, app).

ZeroConfig is a small core (what every stage reads) plus one group per policy the
engine plugs in, each checking its own fields (groups.py): mixed_precision, offload,
overlap, zeropp, hybrid. The rules joining two of them are ZeroConfig's. flat() gives
the fields by their settings' names, the form a checkpoint's manifest keeps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from operator import attrgetter
from typing import Any

from zero_ref.config.groups import (
    COLLECTIVES,
    OFFLOAD_DEVICES,
    OPTIMIZER_OFFLOAD,
    PRECISIONS,
    PROGRESS_MODES,
    HybridConfig,
    LossScaleConfig,
    MixedPrecisionConfig,
    OffloadConfig,
    OverlapConfig,
    ZeroPPConfig,
    is_finite,
    is_positive_int,
    require,
)

__all__ = [
    "COLLECTIVES", "CUDA_AWARE_CHOICES", "DEFAULT_BUCKET_NUMEL", "DEVICES", "FLAT_NAMES",
    "NONFINITE_POLICIES", "OFFLOAD_DEVICES", "OPTIMIZER_OFFLOAD", "PRECISIONS",
    "PROGRESS_MODES", "STAGES", "AdamWConfig", "HybridConfig", "LossScaleConfig",
    "MixedPrecisionConfig", "OffloadConfig", "OverlapConfig", "ZeroConfig", "ZeroPPConfig",
]  # fmt: skip

STAGES = (0, 1, 2, 3)
NONFINITE_POLICIES = ("raise", "skip")  # see zero_ref/optim/nonfinite.py
# Elements per gradient bucket unless told otherwise: small enough that the default run's
# backward fires a dozen buckets and MPI's temporaries stay small; larger buckets mean
# fewer calls and faster steps for more staging memory (measured: docs/benchmarks.md).
DEFAULT_BUCKET_NUMEL = 8192
DEVICES = ("cpu", "gpu")  # where the engine's arrays live (docs/gpu.md)
CUDA_AWARE_CHOICES = ("auto", "yes", "no")  # ask the MPI library, or say (gpu/mpi_support.py)


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
        require(is_finite(self.lr) and self.lr >= 0, "lr", self.lr, "a finite number >= 0")
        ok = isinstance(self.betas, (tuple, list)) and len(self.betas) == 2
        require(ok, "betas", self.betas, "a pair (beta1, beta2)")
        betas = tuple(self.betas)
        for i, b in enumerate(betas):
            require(is_finite(b) and 0 <= b < 1, f"betas[{i}]", b, "a number in [0, 1)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        require(is_finite(self.eps) and self.eps > 0, "eps", self.eps, "a finite number > 0")
        require(
            is_finite(self.weight_decay) and self.weight_decay >= 0,
            "weight_decay",
            self.weight_decay,
            "a finite number >= 0",
        )


# Every setting of a ZeroConfig by its name (the flag's, the checkpoint manifest's key,
# what an error calls it) -> where it lives, in the order flat() gives them: the order
# the fields had before they were grouped, so a manifest saved then reads the same.
FLAT_NAMES = {
    "stage": "stage",
    "bucket_numel": "bucket_numel",
    "grad_accum": "grad_accum",
    "clip": "clip",
    "deterministic": "deterministic",
    "optimizer": "optimizer",
    "nonfinite": "nonfinite",
    "check_schedule": "check_schedule",
    "checkpoint_activations": "checkpoint_activations",
    "precision": "mixed_precision.dtype",
    "loss_scale": "mixed_precision.loss_scale",
    "grad_accum_dtype": "mixed_precision.grad_accum_dtype",
    "communication_data_type": "mixed_precision.communication_data_type",
    "offload_optimizer": "offload.optimizer",
    "offload_param": "offload.param",
    "nvme_path": "offload.nvme_path",
    "sub_group_size": "offload.sub_group_size",
    "buffer_count": "offload.buffer_count",
    "device": "device",
    "cuda_aware_mpi": "cuda_aware_mpi",
    "overlap_comm": "overlap.comm",
    "progress": "overlap.progress",
    "collectives": "overlap.collectives",
    "prefetch_numel": "overlap.prefetch_numel",
    "max_live_numel": "overlap.max_live_numel",
    "persistence_numel": "overlap.persistence_numel",
    **{name: f"zeropp.{name}" for name in (
        "quantized_weights", "quantize_block", "quantized_gradients",
        "quantized_gradient_bits", "quantized_gradient_local_size", "hpz_partition_size",
    )},
    "hybrid_shard_size": "hybrid.shard_size",
}  # fmt: skip


@dataclass(frozen=True)
class ZeroConfig:
    """What the engine does each step: the core every stage reads, and one group per
    policy (groups.py says what each field of a group does).

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
    optimizer     AdamW's hyperparameters.
    nonfinite     a NaN/Inf gradient: "raise" an error naming the parameter, or
                  "skip" the step on every rank, leaving all state untouched.
    check_schedule  debug: ranks agree on each collective before entering it,
                  so a mismatch is an error naming both sides, not a hang.
    checkpoint_activations  keep only each unit's input between forward and backward,
                  and run its forward again before its backward (one unit's
                  activations at a time, for a second forward's compute).
    device        "cpu", or "gpu": the engine's model-sized arrays are numba.cuda device
                  arrays and its update phase runs as CUDA kernels (docs/gpu.md).
    cuda_aware_mpi  "auto" (ask the MPI library), "yes" or "no": with device "gpu",
                  whether device buffers go to MPI directly or are staged through host.
    mixed_precision  dtypes and fp16's loss scaling (Sec. 3.1; docs/precision.md).
    offload       the optimizer state and parameters in host memory or on NVMe
                  (ZeRO-Offload, ZeRO-Infinity; docs/offload.md, docs/gpu.md).
    overlap       when collectives are issued and waited for; stage 3's prefetch
                  (docs/stages.md).
    zeropp        ZeRO++'s qwZ, hpZ and qgZ (docs/zeropp.md).
    hybrid        hybrid sharding: ZeRO inside groups, replicas across them.
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
    device: str = "cpu"
    cuda_aware_mpi: str = "auto"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    zeropp: ZeroPPConfig = field(default_factory=ZeroPPConfig)
    hybrid: HybridConfig = field(default_factory=HybridConfig)

    def __post_init__(self) -> None:
        stage = self.stage
        require(stage in STAGES and isinstance(stage, int), "stage", stage, "one of 0, 1, 2, 3")
        for name in ("bucket_numel", "grad_accum"):
            require(is_positive_int(getattr(self, name)), name, getattr(self, name),
                    "an integer >= 1")  # fmt: skip
        require(
            self.clip is None or (is_finite(self.clip) and self.clip > 0),
            "clip",
            self.clip,
            "None (no clipping) or a finite number > 0",
        )
        flag = self.deterministic
        require(isinstance(flag, bool), "deterministic", flag, "True or False")
        policies = " or ".join(repr(p) for p in NONFINITE_POLICIES)
        require(self.nonfinite in NONFINITE_POLICIES, "nonfinite", self.nonfinite, policies)
        for name in ("check_schedule", "checkpoint_activations"):
            flag = getattr(self, name)
            require(isinstance(flag, bool), name, flag, "True or False")
        require(
            isinstance(self.optimizer, AdamWConfig), "optimizer", self.optimizer, "an AdamWConfig"
        )
        for name, cls in (("mixed_precision", MixedPrecisionConfig), ("offload", OffloadConfig),
                          ("overlap", OverlapConfig), ("zeropp", ZeroPPConfig),
                          ("hybrid", HybridConfig)):  # fmt: skip
            require(isinstance(getattr(self, name), cls), name, getattr(self, name),
                    f"a {cls.__name__}")  # fmt: skip
        require(self.device in DEVICES, "device", self.device, "'cpu' or 'gpu'")
        require(
            self.cuda_aware_mpi in CUDA_AWARE_CHOICES,
            "cuda_aware_mpi",
            self.cuda_aware_mpi,
            "'auto', 'yes' or 'no'",
        )
        for ok, name, value, allowed in _placement_rules(self):
            require(ok, name, value, allowed)
        for ok, name, value, allowed in _zeropp_rules(self):
            require(ok, name, value, allowed)

    def flat(self) -> dict[str, Any]:
        """Every setting by its name (FLAT_NAMES), nested configs as dicts: what
        dataclasses.asdict gave before the fields were grouped, and what a checkpoint's
        manifest keeps (training.config.zero) and a resume compares."""
        values = {name: attrgetter(path)(self) for name, path in FLAT_NAMES.items()}
        return {k: asdict(v) if is_dataclass(v) else v for k, v in values.items()}


# The rules joining two groups, or a group and the core: (ok, setting, value, allowed),
# checked in order once every group has checked its own fields.
def _placement_rules(c: ZeroConfig) -> tuple[tuple[bool, str, object, str], ...]:
    """Where the state lives: offload against the stage, the precision and the device."""
    off, fp32 = c.offload, c.mixed_precision.dtype == "fp32"
    return (
        (off.param != "nvme" or c.stage == 3, "offload_param", off.param,
         "'none' below stage 3 (only stage 3 partitions the parameters)"),
        (not off.to_nvme or (isinstance(off.nvme_path, str) and bool(off.nvme_path)),
         "nvme_path", off.nvme_path,
         "a folder for the swap files when anything is offloaded to 'nvme'"),
        (off.optimizer != "nvme" or c.stage >= 1, "offload_optimizer", off.optimizer,
         "'none' at stage 0 (offload needs the optimizer state sharded: stage 1-3)"),
        (off.optimizer != "cpu" or (c.device == "gpu" and c.stage >= 1 and not fp32),
         "offload_optimizer", off.optimizer, "'none' or 'nvme' here: 'cpu' (ZeRO-Offload: "
         "fp32 master weights and AdamW state in host memory, 16-bit parameters and "
         "gradients on the GPU) needs device 'gpu', stage 1-3 and precision fp16 or bf16; "
         "on the CPU path the state is in RAM already"),
        (c.device != "gpu" or not off.to_nvme, "device", c.device,
         "'cpu' with NVMe offload (the GPU path's offload tiers are not built yet)"),
    )  # fmt: skip


def _zeropp_rules(c: ZeroConfig) -> tuple[tuple[bool, str, object, str], ...]:
    """ZeRO++ and hybrid sharding: the stages and the device each is built for, and
    what each is not built beside."""
    pp, cpu, size = c.zeropp, c.device == "cpu", c.hybrid.shard_size
    qw, hpz, qg = pp.quantized_weights, pp.hpz_partition_size, pp.quantized_gradients
    off_nvme = c.offload.to_nvme
    return (
        (not qw or c.stage == 3, "quantized_weights", qw,
         "False below stage 3 (qwZ quantizes stage 3's parameter all-gather)"),
        (not qw or cpu, "quantized_weights", qw,
         "False with device 'gpu' (qwZ is built on the CPU path only)"),
        (not qw or c.overlap.persistence_numel == 0, "persistence_numel",
         c.overlap.persistence_numel, "0 with quantized_weights (a persistent unit is "
         "gathered once for forward and backward, which need different gathers under qwZ)"),
        (hpz == 1 or c.stage == 3, "hpz_partition_size", hpz,
         "1 below stage 3 (hpZ's secondary copy serves stage 3's backward gathers)"),
        (hpz == 1 or cpu, "hpz_partition_size", hpz,
         "1 with device 'gpu' (hpZ is built on the CPU path only)"),
        (hpz == 1 or c.offload.param != "nvme", "hpz_partition_size", hpz,
         "1 with offload_param 'nvme' (the secondary copy lives in RAM, a second copy of "
         "the parameters the offload moved to disk; zero_ref does not swap it)"),
        (not qg or c.stage in (1, 2, 3), "quantized_gradients", qg,
         "False at stage 0 (qgZ quantizes the gradient buckets' reduce-scatter of stages 1-3)"),
        (not qg or cpu, "quantized_gradients", qg,
         "False with device 'gpu' (qgZ is built on the CPU path only)"),
        (size is None or c.stage >= 1, "hybrid_shard_size", size,
         "None at stage 0 (stage 0 shards nothing: every rank is a replica already; "
         "hybrid sharding needs stage 1, 2 or 3)"),
        (size is None or cpu, "hybrid_shard_size", size,
         "None with device 'gpu' (built on the CPU path only)"),
        (size is None or hpz == 1, "hybrid_shard_size", size,
         "None with hpz_partition_size != 1 (hpZ's secondary copy and hybrid sharding each "
         "split the world into groups; a secondary copy inside each shard group is not "
         "built)"),
        (size is None or not off_nvme, "hybrid_shard_size", size,
         "None with NVMe offload (the cross-group all-reduce runs on the gradient shard in "
         "RAM, and a checkpoint is written by one group; with swap files neither is built)"),
    )  # fmt: skip
