"""DeepSpeed-style JSON configs, read into zero_ref's own settings.

Every key DeepSpeed users write that means something here is mapped onto a
command-line setting (the flags override the file): the setting's row in
zero_ref.app.settings names its keys and how their values are read (DS_KEYS).
Keys we accept but do not implement yet are reported by name; real DeepSpeed
keys that mean nothing here (logging, profilers, switches for things zero_ref
always does) are reported as "accepted, no effect here"; unknown keys get a
warning naming them; a wrong type or value is an error naming the key, the
value and what is allowed.
Nothing is silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zero_ref.app.ds_unknown import refuse_near_misses
from zero_ref.app.ds_values import ConfigError
from zero_ref.app.ds_values import boolean as _bool
from zero_ref.app.ds_values import integer as _integer
from zero_ref.app.ds_values import section as _section
from zero_ref.app.settings import DS_KEYS

__all__ = ["DS_KEYS", "ConfigError", "ParsedConfig", "load_config", "parse_config"]


@dataclass
class ParsedConfig:
    settings: dict[str, Any] = field(default_factory=dict)  # flag dest -> value
    not_implemented: list[str] = field(default_factory=list)  # accepted, reported once
    no_effect: list[str] = field(default_factory=list)  # real DeepSpeed keys, moot here
    unknown: list[str] = field(default_factory=list)  # warned about


def _known(name: str, key: str) -> bool:
    """Is name (key in its section) one a setting reads? A dotted key is not: written
    inside one object, "a.b" is one odd name, not a path."""
    return "." not in key and name in DS_KEYS


def _set(out: ParsedConfig, key: str, value: Any) -> None:
    """A key one setting reads (DS_KEYS: its row in zero_ref.app.settings names the key
    and its parser); a parser's None asks for nothing (a null dtype, a disabled block)."""
    setting = DS_KEYS[key]
    parsed = setting.parse_ds(key, value)
    if parsed is not None:
        out.settings[setting.dest] = parsed
    for dest, meant in setting.implied_by(parsed).items():
        out.settings.setdefault(dest, meant)  # the flags override the file (app/cli.py)


# DeepSpeed keys read, not built: true is reported as not implemented (no effect), false
# asks for nothing. (MiCS's mics_hierarchical_params_gather is built: the collectives
# setting's key.)
ZERO_NOT_YET: tuple[str, ...] = ()
ZERO_ALWAYS_ON = (  # what zero_ref always does; false asks for something it cannot do
    "contiguous_gradients",  # buffers are always contiguous
    "reduce_scatter",  # gradients are always reduce-scattered (stages 1-3)
    "allgather_partitions",  # parameters are always all-gathered (stages 1-2)
)
# Real DeepSpeed keys with no counterpart here: logging, profiling, runtime switches.
NO_EFFECT = (
    "wall_clock_breakdown",
    "steps_per_print",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "memory_breakdown",
    "dump_state",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
)
ZERO_NO_EFFECT = (
    "round_robin_gradients",  # orders CPU-offload gradient copies
    "ignore_unused_parameters",  # every zero_ref parameter is used
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "memory_efficient_linear",
    "use_multi_rank_bucket_allreduce",
    "log_trace_cache_warnings",
    "stage3_gather_16bit_weights_on_model_save",  # --export always consolidates
    "stage3_gather_fp16_weights_on_model_save",
    # stages 1-2 all-gather each unit's updated parameters in one call of its own (its
    # rows are contiguous per unit; a piece across units would need a derived datatype)
    "allgather_bucket_size",
)


def load_config(path: str | Path) -> ParsedConfig:
    """Read and map a DeepSpeed-style JSON file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--config {path}: is a folder, not a JSON file")
    if not path.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_refuse_duplicates)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config {path}: not valid JSON ({e})") from e
    except RecursionError:
        raise ConfigError(
            f"--config {path}: nested too deeply for Python's JSON reader (a DeepSpeed "
            "config is a few levels deep)"
        ) from None
    return parse_config(_section("<top level>", raw))


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """One JSON object; a key written twice is an error, not "the last one wins"
    (DeepSpeed's dict_raise_error_on_duplicate_keys, deepspeed/runtime/config_utils.py)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"config key {key!r} is given twice in one object: keep one")
        out[key] = value
    return out


def parse_config(raw: dict) -> ParsedConfig:
    out = ParsedConfig()
    for key, value in raw.items():
        if _known(key, key):
            _set(out, key, value)
        elif key == "optimizer":
            _optimizer(_section(key, value), out)
        elif key == "zero_optimization":
            _zero(_section(key, value), out)
        elif key in ("fp16", "bf16", "bfloat16"):  # "bfloat16" is DeepSpeed's alias
            _precision(key.replace("bfloat16", "bf16"), _section(key, value), out)
        elif key == "data_types":
            _data_types(_section(key, value), out)
        elif key == "prescale_gradients":
            if _bool(key, value):  # divide before the sum: other rounding than zero_ref's
                out.not_implemented.append(f"{key} = true (zero_ref divides after the sum)")
            else:
                out.no_effect.append(key)
        elif key == "checkpoint":
            _checkpoint(_section(key, value), out)
        elif key in NO_EFFECT:
            out.no_effect.append(key)
        else:
            out.unknown.append(key)
    refuse_near_misses(out.unknown, known_keys())
    return out


def known_keys() -> frozenset[str]:
    """Every dotted key this reader knows (reads, reports or accepts): what an unknown
    key is compared with (zero_ref.app.ds_unknown)."""
    zo, offload = "zero_optimization.", ("offload_optimizer", "offload_param")
    names = {*DS_KEYS, *NO_EFFECT, "optimizer.type", "optimizer.params.adam_w_mode"}
    names |= {"prescale_gradients", "zero_optimization.offload_param.buffer_count"}
    names |= {zo + k for k in (*offload, *ZERO_NOT_YET, *ZERO_ALWAYS_ON, *ZERO_NO_EFFECT)}
    names |= {"zero_optimization.offload_param.max_in_cpu"}
    for block in offload:
        names |= {f"{zo}{block}.{k}" for k in (*OFFLOAD_NO_EFFECT, "buffer_size", "device")}
    for block in ("fp16", "bf16", "bfloat16"):
        names |= {f"{block}.{k}" for k in (*PRECISION_NO_EFFECT, "enabled")}
    names |= {"fp16.fp16_master_weights_and_grads", "bf16.fp16_master_weights_and_grads"}
    names |= {f"checkpoint.{k}" for k in CHECKPOINT_KEYS}
    return frozenset(names)


CHECKPOINT_KEYS = ("tag_validation", "load_universal", "use_node_local_storage", "parallel_write")


def _checkpoint(section: dict, out: ParsedConfig) -> None:
    """DeepSpeed's "checkpoint" section. Its save folder is an API argument there
    (--save-dir here); what its keys switch on, zero_ref always does."""
    for key, value in section.items():
        name = f"checkpoint.{key}"
        if key == "tag_validation":
            if not isinstance(value, str) or value.lower() not in ("ignore", "warn", "fail"):
                raise ConfigError(f"config {name} = {value!r}: allowed 'Ignore', 'Warn', 'Fail'")
            if value.lower() == "fail":
                out.no_effect.append(f"{name} (zero_ref always refuses a bad checkpoint)")
            else:
                out.not_implemented.append(f"{name} = {value} (zero_ref always fails)")
        elif key == "load_universal":
            _bool(name, value)  # every zero_ref checkpoint loads at any world size and stage
            out.no_effect.append(f"{name} (every checkpoint loads at any world size and stage)")
        elif key == "use_node_local_storage":
            if _bool(name, value):
                out.not_implemented.append(f"{name} = true (one shared folder)")
            else:
                out.no_effect.append(name)
        elif key == "parallel_write":
            out.no_effect.append(f"{name} (every rank writes its own file)")
        else:
            out.unknown.append(name)


def _optimizer(section: dict, out: ParsedConfig) -> None:
    for key, value in section.items():
        if key == "type":
            if value not in ("AdamW", "Adam"):
                raise ConfigError(f"config optimizer.type = {value!r}: allowed 'AdamW', 'Adam'")
        elif key == "params":
            _optimizer_params(_section("optimizer.params", value), out)
        else:
            out.unknown.append(f"optimizer.{key}")


def _optimizer_params(params: dict, out: ParsedConfig) -> None:
    for key, value in params.items():
        name = f"optimizer.params.{key}"
        if _known(name, key):
            _set(out, name, value)
        elif key == "adam_w_mode":
            # DeepSpeed's "Adam" defaults to decoupled weight decay (AdamW); that is ours.
            if _bool(name, value) is False:
                out.not_implemented.append(f"{name} = false (L2-regularized Adam)")
        else:
            out.unknown.append(name)


def _zero(section: dict, out: ParsedConfig) -> None:
    for key, value in section.items():
        name = f"zero_optimization.{key}"
        if _known(name, key):
            _set(out, name, value)
        elif key in ("offload_optimizer", "offload_param"):
            _offload(key, _section(name, value), out)
        elif key in ZERO_ALWAYS_ON:
            if _bool(name, value) is False:
                out.not_implemented.append(f"{name} = false (zero_ref always does this)")
        elif key in ZERO_NOT_YET:
            if _enabled(value):
                out.not_implemented.append(name)
        elif key in ZERO_NO_EFFECT:
            out.no_effect.append(name)
        else:
            out.unknown.append(name)


OFFLOAD_NO_EFFECT = (
    "pin_memory",  # no GPU: nothing to pin
    "pipeline_read",  # reads are always pipelined
    "pipeline_write",  # writes are always pipelined
    "fast_init",
    "ratio",
)


def _offload(block: str, section: dict, out: ParsedConfig) -> None:
    """DeepSpeed's offload_optimizer / offload_param blocks: device nvme (here: swap
    files under nvme_path); offload_optimizer's device cpu is --offload-optimizer cpu,
    ZeRO-Offload, which needs --device gpu (on the CPU path it is the same error as
    the flag's: the state is in RAM already); buffer_count is the optimizer pool's
    size (the parameters need no pool: one unit at a time)."""
    for key, value in section.items():
        name = f"zero_optimization.{block}.{key}"
        if key == "device" and block == "offload_param" and value == "cpu":
            out.not_implemented.append(f"{name} = cpu (parameters on the CPU: not built)")
        elif _known(name, key):
            _set(out, name, value)
        elif key in ("buffer_count", "max_in_cpu") and block == "offload_param":
            _integer(0)(name, _whole(name, value))
            out.no_effect.append(f"{name} (one unit's slice in RAM at a time, two prefetched)")
        elif key == "buffer_size":
            out.not_implemented.append(f"{name} (the pool holds sub_group_size elements each)")
        elif key in OFFLOAD_NO_EFFECT:
            out.no_effect.append(name)
        else:
            out.unknown.append(name)


def _whole(key: str, v: Any) -> Any:
    """DeepSpeed writes sizes as 1e9: a float with an integer value is that integer."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _enabled(value: Any) -> bool:
    """Does a not-yet-implemented option ask for anything? (false / device none / 0 do not)."""
    if isinstance(value, dict):
        return value.get("device", "none") != "none"
    return bool(value)


PRECISION_NO_EFFECT = (
    "auto_cast",  # the model always computes in float32 on 16-bit values
    "immediate_grad_update",  # gradients are always reduced as buckets fill
    "check_grad_overflow",  # overflow is always checked (bf16 too)
)


def _precision(key: str, section: dict, out: ParsedConfig) -> None:
    """DeepSpeed's fp16 and bf16 blocks. Enabled, they set the precision (both at
    once is an error, as in DeepSpeed); the fp16 block's keys set the loss scaler."""
    for name, value in section.items():
        full = f"{key}.{name}"
        if name == "enabled":
            if _bool(full, value) and out.settings.get("precision", key) != key:
                raise ConfigError("config enables both fp16 and bf16: enable one of them")
            _set(out, full, value)
        elif _known(full, name):  # the fp16 block's loss-scaler keys
            _set(out, full, value)
        elif name in PRECISION_NO_EFFECT:
            out.no_effect.append(full)
        elif name == "fp16_master_weights_and_grads" and _bool(full, value):
            out.not_implemented.append(f"{full} = true (master weights are always fp32)")
        else:
            out.unknown.append(full)


def _data_types(section: dict, out: ParsedConfig) -> None:
    """DeepSpeed's data_types block: grad_accum_dtype is the gradients' dtype."""
    for name, value in section.items():
        full = f"data_types.{name}"
        if _known(full, name):
            _set(out, full, value)
        else:
            out.unknown.append(full)
