"""Every setting of `python -m zero_ref.train`: the one table (what a row means:
zero_ref.app.setting). Flags, --help, DEFAULTS, the range checks, the config
dataclasses' arguments, the DeepSpeed keys and docs/flags.md are all made from it.

Precedence of a run's values: these defaults < MODEL_DEFAULTS < --config file <
flags given on the command line (zero_ref.app.cli merges them).
"""

from __future__ import annotations

from typing import Any

from zero_ref.app import ds_values as dv
from zero_ref.app.setting import Setting, ds_keys, settings_by_dest
from zero_ref.config import (
    COLLECTIVES,
    CUDA_AWARE_CHOICES,
    DEVICES,
    NONFINITE_POLICIES,
    OFFLOAD_DEVICES,
    OPTIMIZER_OFFLOAD,
    PRECISIONS,
    PROGRESS_MODES,
    STAGES,
)
from zero_ref.optim.lr_schedule import SCHEDULES

Z, A, L, R, S = "ZeroConfig.", "AdamWConfig.", "LossScaleConfig.", "RunConfig.", "LRSchedule."
# ZeroConfig's option groups (zero_ref/config/groups.py)
MP, OF, OV = "MixedPrecisionConfig.", "OffloadConfig.", "OverlapConfig."
PP, HY = "ZeroPPConfig.", "HybridConfig."
ZO = "zero_optimization."


def _clip_to_config(value: float, _: Any) -> float | None:
    return value or None  # --clip 0 (gradient_clipping 0): no clipping, ZeroConfig's None


def _size_or_word(flag: str, words: tuple[str, ...], allowed: str):
    """A group-size setting's reader: one of `words`, an integer (a DeepSpeed config's is
    one already), or nothing (unset); any other text is refused naming the flag."""

    def to_config(value: str | int | None, _: Any) -> int | str | None:
        if value is None or value in words or isinstance(value, int):
            return value
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{flag} {value!r}: allowed are {allowed}") from None

    return to_config


_hpz_to_config = _size_or_word(
    "--hpz-partition-size", ("host",), "an integer >= 1 (1: off) or 'host'"
)
_hybrid_to_config = _size_or_word(
    "--hybrid-shard-size", ("host",), "an integer >= 1 dividing the world size, or 'host'"
)
_qgz_local_to_config = _size_or_word(
    "--quantized-gradient-local-size",
    ("host", "world"),
    "'host', 'world' or an integer >= 1 dividing the ranks qgZ sums over",
)


def _accum_to_config(value: str | None, s: Any) -> str | None:
    return None if value == s["precision"] else value  # naming the precision is its default


# One row per setting: Setting(dest, group, help, type, default, ...); a row without a
# default takes the one of the field it feeds. Hand-aligned, so ruff format keeps out.
# fmt: off
ENGINE = (
    Setting("stage", "engine", "0: data parallel; 1: +optimizer state sharded; "
            "2: +gradients sharded; 3: +parameters sharded", int, choices=STAGES,
            ds=(ZO + "stage",), feeds=Z + "stage"),
    Setting("bucket_numel", "engine", "elements per gradient bucket: stage 0's allreduce "
            "chunks, stage 1's reduce-scatter after backward, stages 2-3's during backward",
            int, minimum=1, ds=(ZO + "reduce_bucket_size",), feeds=Z + "bucket_numel"),
    Setting("grad_accum", "engine", "micro-steps summed before each update", int, None,
            minimum=1, ds=("gradient_accumulation_steps",), feeds=Z + "grad_accum",
            default_text="1, or derived from the batch sizes",
            library_differs="ZeroConfig's is 1: the library has no batch sizes to derive "
            "it from"),
    Setting("clip", "engine", "max global gradient norm; 0 turns clipping off", float, 1.0,
            minimum=0, ds=("gradient_clipping",), feeds=Z + "clip", to_config=_clip_to_config,
            library_differs="ZeroConfig's is None: the library clips only when asked"),
    Setting("deterministic", "engine", "reduce in rank order: parameters bitwise equal to "
            "the single-rank oracle (docs/determinism.md)", bool, feeds=Z + "deterministic"),
    Setting("nonfinite", "engine", "a NaN/Inf gradient: raise an error naming the parameter, "
            "or skip the step on every rank with all state untouched",
            choices=NONFINITE_POLICIES, feeds=Z + "nonfinite"),
    Setting("checkpoint_activations", "engine", "keep only each unit's input between forward "
            "and backward and recompute the rest: less memory, one more forward", bool,
            feeds=Z + "checkpoint_activations"),
    Setting("check_schedule", "engine", "debug: ranks agree on each collective before "
            "entering it, so a mismatch is an error naming both sides instead of a hang "
            "(docs/reliability.md)", bool, feeds=Z + "check_schedule"),
    Setting("quantized_weights", "engine", "stage 3, ZeRO++'s qwZ: each unit's forward "
            "all-gather in int8 with one float32 scale per --quantize-block elements, "
            "dequantized on every rank; backward gathers full precision, or with hpZ reads "
            "forward's dequantized values from the secondary copy (docs/zeropp.md)",
            bool, ds=(ZO + "zero_quantized_weights",), feeds=PP + "quantized_weights"),
    Setting("quantize_block", "engine", "elements per qwZ block (one scale each); every "
            "unit is padded to a multiple of world size x block, so blocks never straddle "
            "two ranks and results do not depend on the world size (DeepSpeed has no key: "
            "its CUDAQuantizer picks groups near 8000 elements of each rank's partition)",
            int, minimum=1, cli_range=False, feeds=PP + "quantize_block"),
    Setting("quantized_gradients", "engine", "stages 1-3, ZeRO++'s qgZ: each gradient "
            "bucket's reduce-scatter as int8 (or int4: --quantized-gradient-bits) blocks "
            "(one float32 scale per --quantize-block elements at most) through an Alltoall, "
            "dequantized and summed in rank order in float32 (docs/zeropp.md). The flag "
            "alone is int8; the DeepSpeed key true is int4, DeepSpeed's",
            bool, ds=(ZO + "zero_quantized_gradients",), feeds=PP + "quantized_gradients",
            # DeepSpeed's qgZ is always int4: all_to_all_quant_reduce passes 4 bits to every
            # quantizer call (deepspeed/runtime/comm/coalesced_collectives.py at edaa722,
            # lines 57, 64-66, 71-72), and it has no key for the bits
            ds_implies=((True, {"quantized_gradient_bits": 4}),)),
    Setting("quantized_gradient_bits", "engine", "qgZ's bits: 8 (int8, levels -127..127) "
            "or 4 (int4, levels -7..7, two values a byte: half the bytes, a 18x coarser step). "
            "DeepSpeed has no key: its qgZ always sends int4 (levels -8..7), so a --config "
            "that turns zero_quantized_gradients on means 4 unless this flag says 8",
            int, choices=(8, 4), feeds=PP + "quantized_gradient_bits",
            default_text="8; 4 where a --config turns zero_quantized_gradients on"),
    Setting("quantized_gradient_local_size", "engine", "qgZ's hops: groups of this many "
            "consecutive ranks ('host': the ranks sharing a host) sum each bucket inside "
            "the group first, then requantize and cross to the other groups, as "
            "DeepSpeed's all_to_all_quant_reduce does across nodes; 'world': one Alltoall "
            "over every rank. A group of one rank or of all of them is one hop. DeepSpeed "
            "has no key: its local group is a node's GPUs",
            str, minimum=1, cli_range=False,
            allowed="'host', 'world' or an integer >= 1 dividing the ranks qgZ sums over",
            feeds=PP + "quantized_gradient_local_size", to_config=_qgz_local_to_config),
    Setting("hpz_partition_size", "engine", "stage 3, ZeRO++'s hpZ: a secondary copy of the "
            "parameters sharded over groups of this many consecutive ranks ('host': the "
            "ranks sharing a host, MPI's shared-memory split), filled from each unit's "
            "first gather after an update; backward gathers inside the group from it "
            "(docs/zeropp.md). 1: off; an integer must divide the world size",
            str, minimum=1, cli_range=False,
            allowed="an integer >= 1 dividing the world size, or 'host'",
            ds=(ZO + "zero_hpz_partition_size",), ds_parse=dv.size_or_words("host"),
            feeds=PP + "hpz_partition_size", to_config=_hpz_to_config),
    Setting("hybrid_shard_size", "engine", "stages 1-3, hybrid sharding (FSDP's "
            "HYBRID_SHARD, DeepSpeed's MiCS): ZeRO inside groups of this many consecutive "
            "ranks ('host': the ranks sharing a host), the groups replicas of one another, "
            "the gradient shard all-reduced across the groups once per step "
            "(docs/zeropp.md). Unset: ZeRO over the whole world",
            str, minimum=1, cli_range=False,
            allowed="an integer >= 1 dividing the world size, or 'host'",
            ds=(ZO + "mics_shard_size",), ds_parse=dv.shard_size,
            feeds=HY + "shard_size", to_config=_hybrid_to_config,
            default_text="unset (off; DeepSpeed's -1)"),
)
PRECISION = (
    Setting("precision", "precision", "fp16/bf16: 16-bit parameters and gradients, fp32 "
            "master weights and AdamW state (the paper's 16 bytes per parameter); fp16 "
            "scales the loss", choices=PRECISIONS,
            ds=("fp16.enabled", "bf16.enabled", "bfloat16.enabled"),
            ds_parse=dv.enabled_precision, feeds=MP + "dtype"),
    Setting("grad_accum_dtype", "precision", "dtype gradients are kept and summed in",
            choices=PRECISIONS, allowed="the precision's own, or fp32",
            ds=("data_types.grad_accum_dtype",), ds_parse=dv.data_type,
            feeds=MP + "grad_accum_dtype", to_config=_accum_to_config,
            default_text="the precision's"),
    Setting("communication_data_type", "precision", "dtype gradients are reduced in on the "
            "wire", choices=PRECISIONS, ds=("communication_data_type",),
            ds_parse=dv.comm_data_type,
            feeds=MP + "communication_data_type", default_text="the gradients'"),
    Setting("loss_scale", "precision", "fp16: a static loss scale, or 0 for dynamic scaling",
            float, minimum=0, cli_range=False, ds=("fp16.loss_scale",), feeds=L + "loss_scale"),
    Setting("initial_scale_power", "precision", "fp16: dynamic scaling starts at 2^N", int,
            minimum=0, maximum=127, cli_range=False, allowed="an integer in [0, 127]",
            ds=("fp16.initial_scale_power",), feeds=L + "initial_scale_power"),
    Setting("loss_scale_window", "precision", "fp16: double the scale after this many clean "
            "steps", int, minimum=1, cli_range=False, ds=("fp16.loss_scale_window",),
            feeds=L + "loss_scale_window"),
    Setting("hysteresis", "precision", "fp16: overflows the scale absorbs before it halves; "
            "clean steps do not refill them until the scale doubles (each clean step does "
            "with fp16.consecutive_hysteresis)", int, minimum=1, cli_range=False,
            ds=("fp16.hysteresis",), feeds=L + "hysteresis"),
    Setting("consecutive_hysteresis", "precision", "fp16: every clean step refills the "
            "hysteresis, so only overflows in a row halve the scale", bool,
            ds=("fp16.consecutive_hysteresis",), feeds=L + "consecutive_hysteresis", flag=False),
    Setting("min_loss_scale", "precision", "fp16: the scale never halves below this", float,
            minimum=0, minimum_open=True, cli_range=False, allowed="a number > 0",
            ds=("fp16.min_loss_scale",),
            feeds=L + "min_loss_scale"),
)
OFFLOAD = (
    Setting("offload_optimizer", "offload", "nvme: the optimizer's fp32 state (master, m, v), "
            "and at stages 2-3 the reduced gradient shard, in swap files under "
            "--nvme-path, streamed through a buffer pool each step (stages 1-3; stage 1's "
            "gradients stay in RAM); cpu (with --device gpu, fp16/bf16): ZeRO-Offload, "
            "the state and its update on the CPU", choices=OPTIMIZER_OFFLOAD,
            ds=(ZO + "offload_optimizer.device",), ds_parse=dv.offload_device,
            feeds=OF + "optimizer"),
    Setting("offload_param", "offload", "nvme: stage 3's parameter shard in a swap file, each "
            "unit read when it is gathered (its neighbours prefetched)",
            choices=OFFLOAD_DEVICES, ds=(ZO + "offload_param.device",),
            ds_parse=dv.offload_device, feeds=OF + "param"),
    Setting("nvme_path", "offload", "folder for the swap files (with an nvme offload)",
            allowed="a folder", ds=(ZO + "offload_optimizer.nvme_path",
                                    ZO + "offload_param.nvme_path"),
            ds_parse=dv.folder, feeds=OF + "nvme_path"),
    Setting("sub_group_size", "offload", "elements per offloaded optimizer sub-group", int,
            minimum=1, cli_range=False, ds=(ZO + "sub_group_size",),
            ds_parse=dv.whole_integer(1), feeds=OF + "sub_group_size"),
    Setting("buffer_count", "offload", "sub-groups in RAM at once (read, compute, write; at "
            "least 3)", int, minimum=3, cli_range=False,
            ds=(ZO + "offload_optimizer.buffer_count",), feeds=OF + "buffer_count"),
)
OVERLAP = (
    Setting("overlap_comm", "overlap", "issue collectives and wait for them later (values "
            "unchanged): stages 1-2 reduce buckets while backward goes on and each unit "
            "waits only for its own all-gather; stage 3 gathers units ahead of use", bool,
            ds=(ZO + "overlap_comm",), feeds=OV + "comm"),
    Setting("progress", "overlap", "what advances an issued collective: test (MPI_Testall "
            "at unit boundaries), thread (a polling thread), mpich (MPICH's progress "
            "thread: launch with MPIR_CVAR_ASYNC_PROGRESS=1), none (only the wait)",
            choices=PROGRESS_MODES, feeds=OV + "progress"),
    Setting("collectives", "overlap", "all-gather and reduce-scatter: flat (MPI's), "
            "hierarchical (inside each host, then across hosts: each byte crosses the link "
            "once; hpZ's and hybrid sharding's groups too where they span hosts) or auto "
            "(hierarchical on more than one host with more than one rank on some host)",
            choices=COLLECTIVES, ds=(ZO + "mics_hierarchical_params_gather",),
            ds_parse=dv.hierarchical_gather, feeds=OV + "collectives"),
    Setting("prefetch_numel", "overlap", "stage 3 with --overlap-comm: elements of upcoming "
            "units gathered ahead of use (0: none)", int, None, minimum=0,
            ds=(ZO + "stage3_prefetch_bucket_size",), ds_parse=dv.whole_integer(0),
            feeds=OV + "prefetch_numel", default_text="one unit ahead"),
    Setting("max_live_numel", "overlap", "stage 3: the most gathered-parameter elements a "
            "rank holds at once, prefetched ones included (at least the widest unit)", int,
            None, minimum=1, ds=(ZO + "stage3_max_live_parameters",),
            ds_parse=dv.whole_integer(1), feeds=OV + "max_live_numel",
            default_text="no bound beyond the prefetch"),
    Setting("persistence_numel", "overlap", "stage 3: units with fewer elements stay "
            "gathered from their first gather until the update", int, minimum=0,
            ds=(ZO + "stage3_param_persistence_threshold",), ds_parse=dv.whole_integer(0),
            feeds=OV + "persistence_numel"),
)
DEVICE = (
    Setting("device", "device", "gpu: the engine's arrays in device memory, the update phase "
            "as CUDA kernels, collectives staged through host (numba-cuda's simulator for "
            "now)", choices=DEVICES, ds=("device",), feeds=Z + "device"),
    Setting("cuda_aware_mpi", "device", "with --device gpu: ask the MPI library whether it "
            "reads device memory (auto), or say so", choices=CUDA_AWARE_CHOICES,
            ds=("cuda_aware_mpi",), feeds=Z + "cuda_aware_mpi"),
)
OPTIMIZER = (
    Setting("lr", "optimizer", "peak learning rate", float, 3e-3, minimum=0, cli_range=False,
            ds=("optimizer.params.lr",), feeds=A + "lr",
            library_differs="AdamWConfig's is 1e-3, torch.optim.AdamW's; 3e-3 is this "
            "command line's peak for its small models, with warmup and (gpt) cosine decay"),
    Setting("weight_decay", "optimizer", "decoupled weight decay", float, minimum=0,
            cli_range=False, ds=("optimizer.params.weight_decay",), feeds=A + "weight_decay"),
    Setting("betas", "optimizer", "AdamW's (beta1, beta2)", tuple,
            allowed="two numbers in [0, 1)", ds=("optimizer.params.betas",),
            ds_parse=dv.betas, feeds=A + "betas", flag=False),
    Setting("eps", "optimizer", "AdamW's epsilon", float, minimum=0, minimum_open=True,
            cli_range=False,
            allowed="a number > 0", ds=("optimizer.params.eps",), feeds=A + "eps", flag=False),
    Setting("lr_schedule", "optimizer", "after warmup: constant, or cosine decay to --min-lr "
            "at the last step", choices=SCHEDULES, feeds=S + "kind"),
    Setting("warmup_steps", "optimizer", "linear warmup steps", int, minimum=0, maximum="steps",
            allowed="an integer in [0, --steps]", feeds=S + "warmup_steps",
            default_text="5% of --steps, at most 50, for gpt; 0 for mlp"),
    Setting("min_lr", "optimizer", "final learning rate of the cosine schedule", float,
            minimum=0, maximum="lr", allowed="a number in [0, --lr]", feeds=S + "min_lr"),
)
RUN = (
    Setting("steps", "run", "optimizer steps", int, 2000, minimum=1, feeds=R + "steps"),
    Setting("batch_size", "run", "global batch = micro batch x grad-accum x world size", int,
            256, minimum=1, ds=("train_batch_size",), feeds=R + "batch_size"),
    Setting("micro_batch_size", "run", "sequences per rank per micro-step", int, None,
            minimum=1, ds=("train_micro_batch_size_per_gpu",), feeds=R + "micro_batch_size",
            default_text="derived from --batch-size"),
    Setting("seed", "run", "seed for initial weights and batches", int, 0, minimum=0,
            ds=("seed",), feeds=R + "seed"),
    Setting("data", "run", "UTF-8 text file to train on", default=None, allowed="a file",
            feeds=R + "data", default_text="the Python language reference shipped with "
            "CPython, pydoc_data.topics"),
    Setting("log_every", "run", "print the loss every N steps", int, 100, minimum=1,
            feeds=R + "log_every"),
    Setting("quiet", "run", "no progress bar or loss lines, only the final report", bool,
            False, feeds=R + "quiet"),
    Setting("check_oracle", "run", "rank 0 also runs the single-rank oracle on the same "
            "micro-batches and prints the largest parameter difference each step (0 in "
            "--deterministic mode)", bool, False, feeds=R + "check_oracle"),
    Setting("sample_chars", "run", "characters to generate at the end (0: none)", int, 200,
            minimum=0, feeds=R + "sample_chars"),
)
FILES = (
    Setting("config", "files", "DeepSpeed-style JSON config (docs/configs/)", default=None,
            allowed="a JSON file"),
    Setting("init", "files", "named initial parameters (.npz or .safetensors)", default=None,
            allowed="a file", feeds=R + "init"),
    Setting("export", "files", "write consolidated final parameters (.safetensors)",
            default=None, feeds=R + "export"),
    Setting("log_jsonl", "files", "one JSON object per step; the last holds every rank's "
            "memory and communication ledger", default=None, feeds=R + "log_jsonl"),
    Setting("trace", "files", "every rank's timeline (units' forward and backward, "
            "collectives with their bytes, host<->device copies, the optimizer step, "
            "swap-file reads and writes, checkpoint writes and reads, ledger bytes) as "
            "Chrome/Perfetto trace JSON", default=None, feeds=R + "trace"),
)
CHECKPOINTS = (
    Setting("save_dir", "checkpoints", "save checkpoints into this folder (DIR/step_000123/, "
            "DIR/latest), always at the end of the run", default=None, allowed="a folder",
            feeds=R + "save_dir"),
    Setting("save_every", "checkpoints", "also save every N steps (needs --save-dir)", int,
            None, minimum=1, feeds=R + "save_every"),
    Setting("keep_last", "checkpoints", "keep only the newest K checkpoints", int, None,
            minimum=1, feeds=R + "keep_last", default_text="all"),
    Setting("resume", "checkpoints", "continue from a checkpoint: a folder (its latest tag) "
            "or DIR/step_000123; any world size and stage", default=None, feeds=R + "resume"),
    Setting("stop_at_step", "checkpoints", "end the run after step N (saving a checkpoint "
            "with --save-dir), keeping --steps as the schedule's length: for a run split "
            "over several jobs", int, None, minimum=1, maximum="steps",
            allowed="an integer in [1, --steps]",
            feeds=R + "stop_at_step"),
)
MODEL = (
    Setting("model", "model", "character MLP or a small GPT", default="gpt",
            choices=("mlp", "gpt"), feeds=R + "model"),
    Setting("print_params", "model", "list parameter names, shapes and counts, then exit",
            bool, False, feeds=R + "print_params"),
    Setting("context", "model", "characters of context", int, 8, minimum=1, feeds=R + "context"),
    Setting("d_embed", "model", "mlp: embedding width", int, 16, minimum=1, feeds=R + "d_embed"),
    Setting("d_hidden", "model", "mlp: hidden width", int, 256, minimum=1, feeds=R + "d_hidden"),
    Setting("n_layer", "model", "gpt: transformer blocks", int, 2, minimum=1, feeds=R + "n_layer"),
    Setting("n_head", "model", "gpt: attention heads", int, 4, minimum=1, feeds=R + "n_head"),
    Setting("d_model", "model", "gpt: model width", int, 64, minimum=1, feeds=R + "d_model"),
)
# fmt: on
SETTINGS = (
    ENGINE + PRECISION + OFFLOAD + OVERLAP + DEVICE + OPTIMIZER + RUN + FILES + CHECKPOINTS + MODEL
)
BY_DEST = settings_by_dest(SETTINGS)
DS_KEYS = ds_keys(SETTINGS)  # "zero_optimization.stage" -> the stage's Setting
DEFAULTS = {s.dest: s.default for s in SETTINGS}

# Per-model defaults, over DEFAULTS: sized so that the default run (gpt) takes about
# 30 s at 4 ranks on 2 cores (README); a flag or the --config file still wins.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": {
        "context": 64,
        "steps": 800,
        "batch_size": 32,
        "lr_schedule": "cosine",
        "warmup_steps": None,  # 5% of the steps, at most 50
        "min_lr": 3e-4,
    },
    "mlp": {},
}

# Settings that feed no config field, and config fields that no setting feeds: why.
NOT_FED = {"config": "the file parse_args reads the other settings from"}
NOT_SETTINGS = {
    "ZeroConfig.optimizer": "the AdamWConfig built from lr, weight_decay, betas, eps",
    "MixedPrecisionConfig.loss_scale": "the LossScaleConfig built from the fp16 settings",
    "ZeroConfig.mixed_precision": "the MixedPrecisionConfig built from the precision settings",
    "ZeroConfig.offload": "the OffloadConfig built from the offload settings",
    "ZeroConfig.overlap": "the OverlapConfig built from the overlap and prefetch settings",
    "ZeroConfig.zeropp": "the ZeroPPConfig built from the ZeRO++ settings",
    "ZeroConfig.hybrid": "the HybridConfig built from hybrid_shard_size",
    "RunConfig.lr_schedule": "the LRSchedule built from lr, steps and the schedule settings",
    "LRSchedule.lr": "the lr setting, AdamWConfig's peak too",
    "LRSchedule.total_steps": "the steps setting (RunConfig.steps)",
}
