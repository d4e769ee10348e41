"""The flags of `python -m zero_ref.train` and their defaults (argparse lives here).

Built-in defaults, then per-model defaults, are what a run uses where neither the
--config file nor a flag sets a key (zero_ref.app.cli merges them).
"""

from __future__ import annotations

import argparse

from zero_ref.config import DEFAULT_BUCKET_NUMEL
from zero_ref.optim.lr_schedule import SCHEDULES


class UsageError(ValueError):
    """A bad flag, value or combination; rank 0 prints it once and the job exits 2."""


DEFAULTS = {
    "stage": 2,
    "bucket_numel": DEFAULT_BUCKET_NUMEL,
    "grad_accum": None,
    "clip": 1.0,
    "deterministic": False,
    "nonfinite": "raise",
    "check_schedule": False,
    "checkpoint_activations": False,
    "precision": "fp32",
    "grad_accum_dtype": None,
    "communication_data_type": None,
    "loss_scale": 0.0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "consecutive_hysteresis": False,
    "min_loss_scale": 1.0,
    "offload_optimizer": "none",
    "offload_param": "none",
    "nvme_path": None,
    "sub_group_size": 1 << 20,
    "buffer_count": 4,
    "device": "cpu",
    "cuda_aware_mpi": "auto",
    "lr": 3e-3,
    "weight_decay": 0.01,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "lr_schedule": "constant",
    "warmup_steps": 0,
    "min_lr": 0.0,
    "steps": 2000,
    "batch_size": 256,
    "micro_batch_size": None,
    "seed": 0,
    "data": None,
    "log_every": 100,
    "quiet": False,
    "sample_chars": 200,
    "check_oracle": False,
    "init": None,
    "export": None,
    "log_jsonl": None,
    "trace": None,
    "save_dir": None,
    "save_every": None,
    "keep_last": None,
    "resume": None,
    "stop_at_step": None,
    "config": None,
    "print_params": False,
    "model": "gpt",
    "context": 8,
    "d_embed": 16,
    "d_hidden": 256,
    "n_layer": 2,
    "n_head": 4,
    "d_model": 64,
}
# Per-model defaults, sized so that the default run takes one to two minutes at 4
# ranks on 2 cores; they apply unless the flag or the --config file sets the key.
MODEL_DEFAULTS = {
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


class _RankParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, and prints help on rank 0 only."""

    def __init__(self, *args, rank: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rank = rank

    def error(self, message: str) -> None:
        raise UsageError(message)

    def print_help(self, file=None) -> None:
        if self.rank == 0:
            super().print_help(file)


def build_parser(rank: int = 0) -> argparse.ArgumentParser:
    p = _RankParser(
        prog="python -m zero_ref.train",
        rank=rank,
        argument_default=argparse.SUPPRESS,
        description="Train a character-level language model with ZeRO over MPI "
        "(run with: mpirun -n 4 python -m zero_ref.train). Flags override --config.",
    )
    _engine_flags(p.add_argument_group("ZeRO engine"))
    _precision_flags(p.add_argument_group("mixed precision (docs/precision.md)"))
    _offload_flags(p.add_argument_group("offload (docs/offload.md)"))
    _device_flags(p.add_argument_group("device (docs/gpu.md)"))
    _optimizer_flags(p.add_argument_group("optimizer (AdamW) and schedule"))
    _run_flags(p.add_argument_group("run"))
    _file_flags(p.add_argument_group("files"))
    _checkpoint_flags(p.add_argument_group("checkpoints (docs/checkpoints.md)"))
    _model_flags(p.add_argument_group("model"))
    return p


def _d(key: str) -> str:
    """' (default: X)', or per model where the models differ."""
    per_model = {m: d.get(key, DEFAULTS[key]) for m, d in MODEL_DEFAULTS.items()}
    if len(set(per_model.values())) == 1:
        return f" (default: {DEFAULTS[key]})"
    return " (default: " + ", ".join(f"{v} for {m}" for m, v in per_model.items()) + ")"


def _engine_flags(g) -> None:
    g.add_argument(
        "--stage",
        type=int,
        choices=[0, 1, 2, 3],
        help="0: data parallel; "
        "1: +optimizer state sharded; 2: +gradients sharded; 3: +parameters "
        "sharded" + _d("stage"),
    )
    g.add_argument(
        "--bucket-numel",
        type=int,
        help="elements per gradient reduce-scatter bucket, stages 2-3" + _d("bucket_numel"),
    )
    g.add_argument(
        "--grad-accum",
        type=int,
        help="micro-steps summed before each update (default: 1, or derived from the batch sizes)",
    )
    g.add_argument(
        "--clip", type=float, help="max global gradient norm; 0 turns clipping off" + _d("clip")
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="reduce in rank order: "
        "parameters bitwise equal to the single-rank oracle (docs/determinism.md)",
    )
    g.add_argument(
        "--nonfinite",
        choices=["raise", "skip"],
        help="a NaN/Inf gradient: raise an error naming the parameter, or skip the step on "
        "every rank with all state untouched" + _d("nonfinite"),
    )
    g.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="keep only each unit's input between forward and backward and recompute "
        "the rest: less memory, one more forward",
    )
    g.add_argument(
        "--check-schedule",
        action="store_true",
        help="debug: ranks agree on each collective before entering it, so a mismatch is an "
        "error naming both sides instead of a hang (docs/reliability.md)",
    )


def _precision_flags(g) -> None:
    dtypes = ["fp32", "fp16", "bf16"]
    g.add_argument(
        "--precision",
        choices=dtypes,
        help="fp16/bf16: 16-bit parameters and gradients, fp32 master weights and AdamW "
        "state (the paper's 16 bytes per parameter); fp16 scales the loss" + _d("precision"),
    )
    g.add_argument(
        "--grad-accum-dtype",
        choices=dtypes,
        help="dtype gradients are kept and summed in (default: the precision's)",
    )
    g.add_argument(
        "--communication-data-type",
        choices=dtypes,
        help="dtype gradients are reduced in on the wire (default: the gradients')",
    )
    g.add_argument(
        "--loss-scale",
        type=float,
        help="fp16: a static loss scale, or 0 for dynamic scaling" + _d("loss_scale"),
    )
    g.add_argument(
        "--initial-scale-power",
        type=int,
        help="fp16: dynamic scaling starts at 2^N" + _d("initial_scale_power"),
    )
    g.add_argument(
        "--loss-scale-window",
        type=int,
        help="fp16: double the scale after this many clean steps" + _d("loss_scale_window"),
    )
    g.add_argument(
        "--hysteresis",
        type=int,
        help="fp16: overflows in a row before the scale halves" + _d("hysteresis"),
    )
    g.add_argument(
        "--min-loss-scale",
        type=float,
        help="fp16: the scale never halves below this" + _d("min_loss_scale"),
    )


def _device_flags(g) -> None:
    g.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        help="gpu: the engine's arrays in device memory, the update phase as CUDA kernels, "
        "collectives staged through host (numba-cuda's simulator for now)" + _d("device"),
    )
    g.add_argument(
        "--cuda-aware-mpi",
        choices=["auto", "yes", "no"],
        help="with --device gpu: ask the MPI library whether it reads device memory "
        "(auto), or say so" + _d("cuda_aware_mpi"),
    )


def _offload_flags(g) -> None:
    g.add_argument(
        "--offload-optimizer",
        choices=["none", "nvme", "cpu"],
        help="nvme: the optimizer's fp32 state (master, m, v) in swap files under "
        "--nvme-path, streamed through a buffer pool each step (stages 1-3); cpu (with "
        "--device gpu, fp16/bf16): ZeRO-Offload, the state and its update on the CPU"
        + _d("offload_optimizer"),
    )
    g.add_argument(
        "--offload-param",
        choices=["none", "nvme"],
        help="nvme: stage 3's parameter shard in a swap file, each unit read when it is "
        "gathered (its neighbours prefetched)" + _d("offload_param"),
    )
    g.add_argument("--nvme-path", help="folder for the swap files (with an nvme offload)")
    g.add_argument(
        "--sub-group-size",
        type=int,
        help="elements per offloaded optimizer sub-group" + _d("sub_group_size"),
    )
    g.add_argument(
        "--buffer-count",
        type=int,
        help="sub-groups in RAM at once (read, compute, write; at least 3)" + _d("buffer_count"),
    )


def _optimizer_flags(g) -> None:
    g.add_argument("--lr", type=float, help="peak learning rate" + _d("lr"))
    g.add_argument("--weight-decay", type=float, help="decoupled weight decay" + _d("weight_decay"))
    g.add_argument(
        "--lr-schedule",
        choices=SCHEDULES,
        help="after warmup: constant, or "
        "cosine decay to --min-lr at the last step" + _d("lr_schedule"),
    )
    g.add_argument(
        "--warmup-steps",
        type=int,
        help="linear warmup steps (default: 5%% of --steps, at most 50, for gpt; 0 for mlp)",
    )
    g.add_argument(
        "--min-lr", type=float, help="final learning rate of the cosine schedule" + _d("min_lr")
    )


def _run_flags(g) -> None:
    g.add_argument("--steps", type=int, help="optimizer steps" + _d("steps"))
    g.add_argument(
        "--batch-size",
        type=int,
        help="global batch = micro batch x grad-accum x world size" + _d("batch_size"),
    )
    g.add_argument(
        "--micro-batch-size",
        type=int,
        help="sequences per rank per micro-step (default: derived from --batch-size)",
    )
    g.add_argument("--seed", type=int, help="seed for initial weights and batches" + _d("seed"))
    g.add_argument(
        "--data",
        help="UTF-8 text file to train on (default: the Python language "
        "reference shipped with CPython, pydoc_data.topics)",
    )
    g.add_argument("--log-every", type=int, help="print the loss every N steps" + _d("log_every"))
    g.add_argument(
        "--quiet", action="store_true", help="no progress bar or loss lines, only the final report"
    )
    g.add_argument(
        "--check-oracle",
        action="store_true",
        help="rank 0 also runs the "
        "single-rank oracle on the same micro-batches and prints the largest "
        "parameter difference each step (0 in --deterministic mode)",
    )
    g.add_argument(
        "--sample-chars",
        type=int,
        help="characters to generate at the end (0: none)" + _d("sample_chars"),
    )


def _file_flags(g) -> None:
    g.add_argument("--config", help="DeepSpeed-style JSON config (docs/configs/)")
    g.add_argument("--init", help="named initial parameters (.npz or .safetensors)")
    g.add_argument("--export", help="write consolidated final parameters (.safetensors)")
    g.add_argument(
        "--log-jsonl",
        help="one JSON object per step; the last holds every "
        "rank's memory and communication ledger",
    )
    g.add_argument(
        "--trace",
        help="every rank's timeline (units' forward and backward, collectives with their "
        "bytes, host<->device copies, the optimizer step, swap-file reads and writes, "
        "checkpoint writes and reads, ledger bytes) as Chrome/Perfetto trace JSON",
    )


def _checkpoint_flags(g) -> None:
    g.add_argument(
        "--save-dir",
        help="save checkpoints into this folder (DIR/step_000123/, DIR/latest), "
        "always at the end of the run",
    )
    g.add_argument("--save-every", type=int, help="also save every N steps (needs --save-dir)")
    g.add_argument(
        "--keep-last", type=int, help="keep only the newest K checkpoints (default: all)"
    )
    g.add_argument(
        "--resume",
        help="continue from a checkpoint: a folder (its latest tag) or DIR/step_000123; "
        "any world size and stage",
    )
    g.add_argument(
        "--stop-at-step",
        type=int,
        help="end the run after step N (saving a checkpoint with --save-dir), keeping --steps "
        "as the schedule's length: for a run split over several jobs",
    )


def _model_flags(g) -> None:
    g.add_argument(
        "--model", choices=["mlp", "gpt"], help="character MLP or a small GPT" + _d("model")
    )
    g.add_argument(
        "--print-params",
        action="store_true",
        help="list parameter names, shapes and counts, then exit",
    )
    g.add_argument("--context", type=int, help="characters of context" + _d("context"))
    g.add_argument("--d-embed", type=int, help="mlp: embedding width" + _d("d_embed"))
    g.add_argument("--d-hidden", type=int, help="mlp: hidden width" + _d("d_hidden"))
    g.add_argument("--n-layer", type=int, help="gpt: transformer blocks" + _d("n_layer"))
    g.add_argument("--n-head", type=int, help="gpt: attention heads" + _d("n_head"))
    g.add_argument("--d-model", type=int, help="gpt: model width" + _d("d_model"))
