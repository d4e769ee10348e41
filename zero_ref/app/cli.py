"""The command line of `python -m zero_ref.train`: flags (and a DeepSpeed-style
--config file) -> validated, frozen configs.

Precedence: built-in defaults < per-model defaults < --config file < flags given
on the command line. Every setting, its default and range, and the config field it
becomes, is one row of zero_ref.app.settings; this module merges and checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zero_ref.app.cli_flags import DEFAULTS, MODEL_DEFAULTS, UsageError, build_parser
from zero_ref.app.cli_notes import moot_notes
from zero_ref.app.ds_config import ParsedConfig, known_keys, load_config
from zero_ref.app.ds_unknown import unknown_key_notes
from zero_ref.app.setting import fed
from zero_ref.app.settings import SETTINGS
from zero_ref.config import (
    AdamWConfig,
    HybridConfig,
    LossScaleConfig,
    MixedPrecisionConfig,
    OffloadConfig,
    OverlapConfig,
    ZeroConfig,
    ZeroPPConfig,
)
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
    run = RunConfig(**fed(s, "RunConfig", SETTINGS), lr_schedule=schedule)
    notes = [
        f"config: warning: {k} is accepted but not implemented yet; it has no effect"
        for k in file.not_implemented
    ]
    notes += unknown_key_notes(file.unknown, known_keys())
    notes += [f"config: {k} is accepted, no effect here" for k in file.no_effect]
    notes += moot_notes(s)
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


# The settings whose lower bound the command line checks itself (the rest are checked
# by the config dataclass they feed, whose message names the field); >= 1 ones first.
RANGED = tuple(sorted((x for x in SETTINGS if x.cli_range and x.minimum is not None),
                      key=lambda x: -x.minimum))  # fmt: skip
POSITIVE = tuple(x.dest for x in RANGED if x.minimum == 1)
NON_NEGATIVE = tuple(x.dest for x in RANGED if x.minimum == 0)


def _check_ranges(s: dict) -> None:
    for x in RANGED:
        if s[x.dest] is not None and s[x.dest] < x.minimum:
            raise UsageError(f"{x.option} {s[x.dest]} is not allowed: it must be >= {x.minimum}")


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
    """ZeroConfig (with its AdamWConfig and option groups, LossScaleConfig inside
    MixedPrecisionConfig) from the settings that feed their fields; a value a dataclass
    refuses is a UsageError with its message."""

    def made(cls, **inner):
        return cls(**fed(s, cls.__name__, SETTINGS), **inner)

    try:
        return ZeroConfig(
            **fed(s, "ZeroConfig", SETTINGS),
            optimizer=made(AdamWConfig),
            mixed_precision=made(MixedPrecisionConfig, loss_scale=made(LossScaleConfig)),
            offload=made(OffloadConfig),
            overlap=made(OverlapConfig),
            zeropp=made(ZeroPPConfig),
            hybrid=made(HybridConfig),
        )
    except ValueError as e:
        raise UsageError(f"bad value: {e}") from e


def _schedule(s: dict) -> LRSchedule:
    schedule = fed(s, "LRSchedule", SETTINGS)
    if schedule["warmup_steps"] is None:  # the model's default: 5% of the run, at most 50
        schedule["warmup_steps"] = min(50, s["steps"] // 20)
    try:
        return LRSchedule(s["lr"], s["steps"], **schedule)
    except ValueError as e:
        raise UsageError(f"bad value: {e}") from e
