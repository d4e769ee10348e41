"""How one value of a DeepSpeed-style JSON config is checked and converted.

Each function takes the key as written in the file ("zero_optimization.stage") and
its value, and returns the value zero_ref's setting takes, or raises ConfigError
naming the key, the value and what is allowed. zero_ref.app.settings names, per
setting, which of these reads its key; zero_ref.app.ds_config walks the file.
A parser that returns None means "this value asks for nothing" (the setting
keeps its default), as DeepSpeed's null data types and disabled blocks do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Parser = Callable[[str, Any], Any]


class ConfigError(ValueError):
    """A config key with a wrong type or value."""


def integer(minimum: int) -> Parser:
    """An integer >= minimum (a JSON true is not an integer here)."""

    def check(key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"config {key} = {v!r}: must be an integer >= {minimum}")
        return v

    return check


def number(minimum: float) -> Parser:
    """A number >= minimum, returned as a float."""

    def check(key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= minimum:
            raise ConfigError(f"config {key} = {v!r}: must be a number >= {float(minimum)}")
        return float(v)

    return check


def whole_integer(minimum: int) -> Parser:
    """DeepSpeed writes sizes as 1e9: a float with an integer value is that integer."""
    inner = integer(minimum)

    def check(key: str, v: Any) -> int:
        return inner(key, int(v) if isinstance(v, float) and v.is_integer() else v)

    return check


def one_of(*allowed: object) -> Parser:
    """One of the allowed values; integer choices (the stage) refuse true/false."""
    if all(isinstance(a, int) for a in allowed):

        def check_int(key: str, v: Any) -> Any:
            if isinstance(v, bool) or v not in allowed:
                names = ", ".join(str(a) for a in allowed)
                raise ConfigError(f"config {key} = {v!r}: must be one of {names}")
            return v

        return check_int

    def check(key: str, v: Any) -> Any:
        if v not in allowed:
            raise ConfigError(f"config {key} = {v!r}: allowed are {', '.join(map(str, allowed))}")
        return v

    return check


def boolean(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"config {key} = {v!r}: must be true or false")
    return v


def section(key: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise ConfigError(f"config {key} = {v!r}: must be an object {{...}}")
    return v


def betas(key: str, v: Any) -> tuple[float, float]:
    """optimizer.params.betas: a list [beta1, beta2], each in [0, 1)."""
    if not (isinstance(v, list) and len(v) == 2):
        raise ConfigError(f"config {key} = {v!r}: must be a list [beta1, beta2]")
    return tuple(_beta(f"{key}[{i}]", b) for i, b in enumerate(v))


def _beta(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise ConfigError(f"config {key} = {v!r}: must be a number in [0, 1)")
    return float(v)


def shard_size(key: str, v: Any) -> int | None:
    """zero_optimization.mics_shard_size: DeepSpeed's -1 (its default) is off, None here;
    else an integer >= 1 (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig)."""
    if v == -1 and not isinstance(v, bool):
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"config {key} = {v!r}: must be -1 (off) or an integer >= 1")
    return v


def hierarchical_gather(key: str, v: Any) -> str | None:
    """zero_optimization.mics_hierarchical_params_gather: true asks for the two-level
    collectives ("hierarchical": MiCS's intra-node and inter-node gather groups,
    deepspeed/runtime/zero/mics.py has_hierarchical_all_gather_groups, are what
    HierarchicalComm's host and cross levels are); false asks for nothing."""
    return "hierarchical" if boolean(key, v) else None


def offload_device(key: str, v: Any) -> str:
    """An offload block's device; "cpu" for parameters is reported by ds_config."""
    if v not in ("none", "nvme", "cpu"):
        raise ConfigError(f"config {key} = {v!r}: allowed 'none', 'nvme', 'cpu'")
    return v


def folder(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"config {key} = {v!r}: must be a folder path")
    return v


# DeepSpeed's names for a dtype (deepspeed/runtime/config.py, DtypeEnum, ~lines 101-107:
# each member's values, matched exactly); int8 is no gradient dtype here.
DATA_TYPES = {
    **dict.fromkeys(("torch.float16", "fp16", "float16", "half"), "fp16"),
    **dict.fromkeys(("torch.float32", "fp32", "float32", "float"), "fp32"),
    **dict.fromkeys(("torch.bfloat16", "bf16", "bfloat16"), "bf16"),
}
# communication_data_type has its own reader there (get_communication_data_type, ~lines
# 209-223): the value lower-cased, then only these three.
COMM_DATA_TYPES = ("fp32", "fp16", "bf16")


def data_type(key: str, v: Any) -> str | None:
    """data_types.grad_accum_dtype: a dtype by any of DeepSpeed's DtypeEnum names; null
    asks for the default."""
    if v is None:
        return None
    if not isinstance(v, str) or v not in DATA_TYPES:
        names = ", ".join(repr(n) for n in DATA_TYPES)
        raise ConfigError(f"config {key} = {v!r}: allowed are DeepSpeed's dtype names {names}")
    return DATA_TYPES[v]


def comm_data_type(key: str, v: Any) -> str | None:
    """communication_data_type: 'fp32', 'fp16' or 'bf16' in any case, as DeepSpeed reads
    it (not its other dtype names: DeepSpeed refuses "half" here); null: the gradients'."""
    if v is None:
        return None
    if not isinstance(v, str) or v.lower() not in COMM_DATA_TYPES:
        raise ConfigError(
            f"config {key} = {v!r}: allowed are 'fp32', 'fp16', 'bf16' (any case; DeepSpeed "
            "reads no other name for this key)"
        )
    return v.lower()


def size_or_words(*words: str) -> Parser:
    """A group size: an integer >= 1 or one of `words` ('host'), as the flag takes it."""

    def check(key: str, v: Any) -> int | str:
        if v in words and isinstance(v, str):
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            names = " or ".join(repr(w) for w in words)
            raise ConfigError(f"config {key} = {v!r}: must be an integer >= 1 or {names}")
        return v

    return check


def enabled_precision(key: str, v: Any) -> str | None:
    """fp16.enabled / bf16.enabled: true picks that block's precision, false nothing."""
    return key.split(".")[0] if boolean(key, v) else None
