"""What a setting is: one knob of `python -m zero_ref.train`, defined once.

One `Setting` per knob (the table of them: zero_ref.app.settings) says its name,
type, default, allowed values, help, the DeepSpeed JSON key(s) that set it and the
config field it feeds. Everything else is generated from that table, so a flag, a
key and a doc cannot disagree:

    the argparse flags and --help          zero_ref.app.cli_flags.build_parser
    DEFAULTS, the range checks             zero_ref.app.cli (POSITIVE, NON_NEGATIVE)
    ZeroConfig/AdamWConfig/... from flags  zero_ref.app.cli (fed)
    the DeepSpeed keys and their parsers   zero_ref.app.ds_config (DS_KEYS)
    docs/flags.md, docs' flag tables       scripts/docs/flag_tables.py (tests/test_settings.py)

A setting that feeds a library field (`feeds="ZeroConfig.stage"`) takes that
field's default unless it names its own; where the command line's default differs
from the library's, `library_differs` says why, and --help, docs/flags.md and the
dataclass's docstring all say it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from zero_ref.app import ds_values
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


class _Library:
    def __repr__(self) -> str:
        return "LIBRARY"


LIBRARY: Any = _Library()  # default: the one of the library field the setting feeds
LIBRARY_CONFIGS = {
    c.__name__: c
    for c in (ZeroConfig, AdamWConfig, LossScaleConfig, LRSchedule, MixedPrecisionConfig,
              OffloadConfig, OverlapConfig, ZeroPPConfig, HybridConfig)
}  # fmt: skip

GROUPS = {  # argparse groups of --help, in order; docs/flags.md has one table each
    "engine": "ZeRO engine",
    "precision": "mixed precision (docs/precision.md)",
    "offload": "offload (docs/offload.md)",
    "overlap": "overlap and prefetch (docs/stages.md)",
    "device": "device (docs/gpu.md)",
    "optimizer": "optimizer (AdamW) and schedule",
    "run": "run",
    "files": "files",
    "checkpoints": "checkpoints (docs/checkpoints.md)",
    "model": "model",
}


@dataclass(frozen=True)
class Setting:
    """One knob. `dest` is its name everywhere: argparse's dest, the key of the merged
    settings dict, and (with `feeds`) the config field it becomes.

    type        int, float, str or bool (bool: an on/off flag, `--x` turns it on)
    choices     the allowed values, or None; `minimum` the smallest allowed number
                (`minimum_open`: only numbers above it); `maximum` the largest, a
                number or the dest of the setting that bounds it ("steps")
    cli_range   True: the command line refuses a value below `minimum` itself
                ("--steps 0 is not allowed: it must be >= 1"); False: the config
                dataclass it feeds checks it, with that dataclass's message
    allowed     what the docs say is allowed, where choices/minimum do not say it all
    ds          the DeepSpeed keys (dotted paths) that set it; `ds_parse` reads their
                value (derived from type/choices/minimum when None; ds_values)
    feeds       "Class.field" it becomes; `to_config(value, settings)` converts it
    flag        False: set only by a --config file (there is no --betas)
    default_text  what --help and the docs say the default is, where it is derived
    ds_implies  what a value of its DeepSpeed key means there beyond this setting:
                (value, {dest: value}) pairs, applied unless a flag sets that dest
                (zero_quantized_gradients true is int4 in DeepSpeed)
    """

    dest: str
    group: str
    help: str
    type: type = str
    default: Any = LIBRARY
    choices: tuple | None = None
    minimum: int | float | None = None
    minimum_open: bool = False
    maximum: int | float | str | None = None
    cli_range: bool = True
    allowed: str | None = None
    ds: tuple[str, ...] = ()
    ds_parse: ds_values.Parser | None = None
    feeds: str | None = None
    to_config: Callable[[Any, Mapping[str, Any]], Any] | None = None
    flag: bool = True
    default_text: str | None = None
    library_differs: str | None = None
    ds_implies: tuple[tuple[Any, Mapping[str, Any]], ...] = ()

    def __post_init__(self) -> None:
        if self.default is LIBRARY:
            if self.feeds is None:
                raise ValueError(f"setting {self.dest}: LIBRARY default but it feeds nothing")
            object.__setattr__(self, "default", library_default(self.feeds))
        if self.group not in GROUPS:
            raise ValueError(f"setting {self.dest}: unknown group {self.group!r}")

    @property
    def option(self) -> str:
        """The flag's spelling: --bucket-numel for bucket_numel."""
        return "--" + self.dest.replace("_", "-")

    def parse_ds(self, key: str, value: Any) -> Any:
        """A DeepSpeed key's value as this setting's, or ConfigError naming the key."""
        return self.ds_parser()(key, value)

    def implied_by(self, parsed: Any) -> Mapping[str, Any]:
        """The other settings a parsed DeepSpeed value means (ds_implies), or none."""
        return next((more for value, more in self.ds_implies if value == parsed), {})

    def ds_parser(self) -> ds_values.Parser:
        if self.ds_parse is not None:
            return self.ds_parse
        if self.choices is not None:
            return ds_values.one_of(*self.choices)
        if self.type is bool:
            return ds_values.boolean
        if self.type is int:
            return ds_values.integer(self.minimum)
        if self.type is float:
            return ds_values.number(self.minimum)
        raise ValueError(f"setting {self.dest}: name a ds_parse for its DeepSpeed key")

    def allowed_text(self) -> str:
        """The allowed values in words, for the docs' tables."""
        if self.allowed:
            return self.allowed
        if self.choices is not None:
            return ", ".join(f"`{c}`" for c in self.choices)
        if self.type is bool:
            return "on or off" if self.flag else "true or false"
        if self.minimum is not None:
            return f"{'an integer' if self.type is int else 'a number'} >= {self.minimum}"
        return "a path"


def library_default(feeds: str) -> Any:
    """The default of a library dataclass field named "Class.field"."""
    cls_name, name = feeds.split(".")
    (f,) = [f for f in fields(LIBRARY_CONFIGS[cls_name]) if f.name == name]
    if f.default is MISSING:
        raise ValueError(f"{feeds} has no default: give the setting one")
    return f.default


def settings_by_dest(settings: tuple[Setting, ...]) -> dict[str, Setting]:
    """dest -> Setting, refusing a name defined twice."""
    out: dict[str, Setting] = {}
    for s in settings:
        if s.dest in out:
            raise ValueError(f"setting {s.dest} is defined twice")
        out[s.dest] = s
    return out


def ds_keys(settings: tuple[Setting, ...]) -> dict[str, Setting]:
    """DeepSpeed key -> the one Setting it sets, refusing a key claimed twice."""
    out: dict[str, Setting] = {}
    for s in settings:
        for key in s.ds:
            if key in out:
                raise ValueError(f"DeepSpeed key {key} set by {out[key].dest} and {s.dest}")
            out[key] = s
    return out


def fed(settings: Mapping[str, Any], cls_name: str, table: tuple[Setting, ...]) -> dict:
    """The keyword arguments of cls_name from the merged settings: each setting that
    feeds one of its fields, converted by its to_config."""
    out = {}
    for s in table:
        if s.feeds and s.feeds.split(".")[0] == cls_name:
            value = settings[s.dest]
            out[s.feeds.split(".")[1]] = s.to_config(value, settings) if s.to_config else value
    return out
