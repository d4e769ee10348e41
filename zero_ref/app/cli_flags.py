"""The flags of `python -m zero_ref.train`, made from the settings table (argparse lives here).

Each flag is one row of zero_ref.app.settings: its spelling, type, choices and help
come from there, and so does the "(default: ...)" its help ends with. Built-in
defaults, then per-model defaults, are what a run uses where neither the --config
file nor a flag sets a key (zero_ref.app.cli merges them).
"""

from __future__ import annotations

import argparse
from typing import Any

from zero_ref.app.setting import GROUPS, Setting
from zero_ref.app.settings import DEFAULTS, MODEL_DEFAULTS, SETTINGS

__all__ = [
    "DEFAULTS",
    "MODEL_DEFAULTS",
    "UsageError",
    "build_parser",
    "default_text",
    "model_defaults",
]


class UsageError(ValueError):
    """A bad flag, value or combination; rank 0 prints it once and the job exits 2."""


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
    """One argparse group per settings group, one flag per setting that has one.

    argument_default=SUPPRESS: a flag not given is absent from the namespace, so
    parse_args can tell "given" from "defaulted" and let the --config file win."""
    p = _RankParser(
        prog="python -m zero_ref.train",
        rank=rank,
        argument_default=argparse.SUPPRESS,
        description="Train a character-level language model with ZeRO over MPI "
        "(run with: mpirun -n 4 python -m zero_ref.train). Flags override --config. "
        "Every flag with its DeepSpeed key: docs/flags.md.",
    )
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for s in SETTINGS:
        if s.flag:
            groups[s.group].add_argument(s.option, **_argparse_kwargs(s))
    return p


def _argparse_kwargs(s: Setting) -> dict[str, Any]:
    help_text = (s.help + _default_suffix(s)).replace("%", "%%")  # argparse formats help
    if s.type is bool:
        return {"action": "store_true", "help": help_text}
    kwargs: dict[str, Any] = {"help": help_text}
    if s.type in (int, float):
        kwargs["type"] = s.type
    if s.choices is not None:
        kwargs["choices"] = list(s.choices)
    return kwargs


def default_text(s: Setting) -> str | None:
    """The default in words: stated, per model where the models differ, or the value;
    None for an off switch or a value that is absent unless given."""
    if s.default_text is not None:
        return s.default_text
    if s.type is bool or s.default is None:
        return None
    per_model = model_defaults(s)
    if len(set(per_model.values())) == 1:
        return str(s.default)
    return ", ".join(f"{v} for {m}" for m, v in per_model.items())


def model_defaults(s: Setting) -> dict[str, Any]:
    """Each model's default of s: MODEL_DEFAULTS over DEFAULTS."""
    return {m: d.get(s.dest, DEFAULTS[s.dest]) for m, d in MODEL_DEFAULTS.items()}


def _default_suffix(s: Setting) -> str:
    text = default_text(s)
    suffix = f" (default: {text})" if text is not None else ""
    if s.library_differs:
        suffix += f"; {s.library_differs}"
    return suffix
