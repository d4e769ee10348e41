"""The command line of `python -m zero_ref.train`: flags (and a DeepSpeed-style
--config file) -> validated, frozen configs.

Precedence: built-in defaults < per-model defaults < --config file < flags given
on the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from zero_ref.app.cli_flags import DEFAULTS, MODEL_DEFAULTS, UsageError, build_parser
from zero_ref.app.ds_config import ParsedConfig, load_config
from zero_ref.config import AdamWConfig, ZeroConfig
from zero_ref.optim.loss_scale import LossScaleConfig
from zero_ref.optim.lr_schedule import LRSchedule

__all__ = ["Parsed", "RunConfig", "UsageError", "build_parser", "parse_args", "resolve_batch"]


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs besides the engine's ZeroConfig."""

    model: str
    data: str | None
    steps: int
    batch_size: int  # global: micro batch x grad_accum x world size
    micro_batch_size: int
    seed: int
    log_every: int
    quiet: bool
    init: str | None
    export: str | None
    log_jsonl: str | None
    trace: str | None
    save_dir: str | None
    save_every: int | None
    keep_last: int | None
    resume: str | None
    stop_at_step: int | None
    check_oracle: bool
    print_params: bool
    sample_chars: int
    context: int
    d_embed: int
    d_hidden: int
    n_layer: int
    n_head: int
    d_model: int
    lr_schedule: LRSchedule


@dataclass(frozen=True)
class Parsed:
    run: RunConfig
    zero: ZeroConfig
    notes: tuple[str, ...]  # config warnings and notes: printed in every mode, --quiet too


def parse_args(argv: Sequence[str] | None, world_size: int = 1, rank: int = 0) -> Parsed:
    """Flags (+ --config) -> configs; any bad value raises UsageError naming it."""
    given = vars(build_parser(rank).parse_args(argv))
    file = load_config(given["config"]) if given.get("config") else ParsedConfig()
    model = given.get("model", DEFAULTS["model"])
    s = {**DEFAULTS, **MODEL_DEFAULTS[model], **file.settings, **given}
    if "micro_batch_size" in file.settings or "micro_batch_size" in given:
        s["batch_size"] = {**file.settings, **given}.get("batch_size")  # derive it instead
    _check_ranges(s)
    _check_checkpoint_flags(s)
    s["batch_size"], s["micro_batch_size"], s["grad_accum"] = resolve_batch(
        s["batch_size"], s["micro_batch_size"], s["grad_accum"], world_size
    )
    zero = _zero_config(s)
    schedule = _schedule(s)
    run_fields = {f.name for f in fields(RunConfig)} - {"lr_schedule"}
    run = RunConfig(**{k: s[k] for k in run_fields}, lr_schedule=schedule)
    notes = [
        f"config: warning: {k} is accepted but not implemented yet; it has no effect"
        for k in file.not_implemented
    ]
    notes += [f"config: warning: unknown key {k} (ignored)" for k in file.unknown]
    notes += [f"config: {k} is accepted, no effect here" for k in file.no_effect]
    return Parsed(run, zero, tuple(notes))


def resolve_batch(
    batch: int | None, micro: int | None, accum: int | None, world: int
) -> tuple[int, int, int]:
    """DeepSpeed's rule: train_batch_size = micro batch x accumulation x world size.

    Any two determine the third; all three must agree; one alone takes the others'
    defaults (accumulation 1)."""
    if batch is None and micro is None:
        raise UsageError("give a batch size or a micro batch size")
    if accum is None:
        if batch is not None and micro is not None:
            if batch % (micro * world):
                raise UsageError(
                    f"batch size {batch} (--batch-size / train_batch_size) is not a multiple of "
                    f"micro batch {micro} x {world} ranks"
                )
            accum = batch // (micro * world)
        else:
            accum = 1
    if micro is None:
        if batch % (accum * world):
            raise UsageError(
                f"batch size {batch} (--batch-size / train_batch_size) does not split over "
                f"grad-accum {accum} x "
                f"{world} ranks: it must be a multiple of {accum * world}"
            )
        micro = batch // (accum * world)
    if batch is None:
        batch = micro * accum * world
    if batch != micro * accum * world:
        raise UsageError(
            f"batch sizes disagree: train batch {batch} != micro batch {micro} x "
            f"grad-accum {accum} x {world} ranks = {micro * accum * world}"
        )
    return batch, micro, accum


POSITIVE = (
    "steps",
    "log_every",
    "context",
    "d_embed",
    "d_hidden",
    "n_layer",
    "n_head",
    "d_model",
    "bucket_numel",
    "grad_accum",
    "batch_size",
    "micro_batch_size",
    "save_every",
    "keep_last",
    "stop_at_step",
)
NON_NEGATIVE = ("seed", "sample_chars", "clip", "warmup_steps", "min_lr")


def _check_ranges(s: dict) -> None:
    for k in POSITIVE:
        if s[k] is not None and s[k] < 1:
            raise UsageError(f"--{k.replace('_', '-')} {s[k]} is not allowed: it must be >= 1")
    for k in NON_NEGATIVE:
        if s[k] is not None and s[k] < 0:
            raise UsageError(f"--{k.replace('_', '-')} {s[k]} is not allowed: it must be >= 0")


def _check_checkpoint_flags(s: dict) -> None:
    for key in ("save_every", "keep_last"):
        if s[key] is not None and not s["save_dir"]:
            raise UsageError(f"--{key.replace('_', '-')} needs --save-dir: where to save")
    if s["resume"] and s["init"]:
        raise UsageError(
            "--resume and --init both give the starting parameters: use one "
            "(--resume also restores AdamW's state, the step and the data position)"
        )
    if s["stop_at_step"] is not None and s["stop_at_step"] > s["steps"]:
        raise UsageError(
            f"--stop-at-step {s['stop_at_step']} is past --steps {s['steps']}: it must be "
            "at most the run's length"
        )


def _zero_config(s: dict) -> ZeroConfig:
    try:
        optimizer = AdamWConfig(
            lr=s["lr"], betas=s["betas"], eps=s["eps"], weight_decay=s["weight_decay"]
        )
        return ZeroConfig(
            stage=s["stage"],
            bucket_numel=s["bucket_numel"],
            grad_accum=s["grad_accum"],
            clip=s["clip"] or None,
            deterministic=s["deterministic"],
            optimizer=optimizer,
            nonfinite=s["nonfinite"],
            check_schedule=s["check_schedule"],
            checkpoint_activations=s["checkpoint_activations"],
            precision=s["precision"],
            loss_scale=LossScaleConfig(**{f.name: s[f.name] for f in fields(LossScaleConfig)}),
            grad_accum_dtype=_accum_dtype(s),
            communication_data_type=s["communication_data_type"],
            offload_optimizer=s["offload_optimizer"],
            offload_param=s["offload_param"],
            nvme_path=s["nvme_path"],
            sub_group_size=s["sub_group_size"],
            buffer_count=s["buffer_count"],
            device=s["device"],
            cuda_aware_mpi=s["cuda_aware_mpi"],
        )
    except ValueError as e:
        raise UsageError(f"bad value: {e}") from e


def _accum_dtype(s: dict) -> str | None:
    """--grad-accum-dtype naming the precision itself is its default (None)."""
    accum = s["grad_accum_dtype"]
    return None if accum == s["precision"] else accum


def _schedule(s: dict) -> LRSchedule:
    warmup = s["warmup_steps"]
    if warmup is None:  # the model's default: 5% of the run, at most 50 steps
        warmup = min(50, s["steps"] // 20)
    try:
        return LRSchedule(s["lr"], s["steps"], warmup, s["lr_schedule"], s["min_lr"])
    except ValueError as e:
        raise UsageError(f"bad value: {e}") from e
