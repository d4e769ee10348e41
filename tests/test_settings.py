"""Every setting is defined once (zero_ref/app/settings.py), and the flags, the range
checks, the config dataclasses' fields, the DeepSpeed keys and the docs' tables all
agree with that one definition: each test here fails when one of them drifts."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from zero_ref.app import cli
from zero_ref.app.cli import RunConfig, UsageError, parse_args
from zero_ref.app.cli_flags import build_parser
from zero_ref.app.ds_config import ConfigError, parse_config
from zero_ref.app.setting import LIBRARY_CONFIGS, Setting
from zero_ref.app.settings import (
    BY_DEST,
    DEFAULTS,
    DS_KEYS,
    MODEL_DEFAULTS,
    NOT_FED,
    NOT_SETTINGS,
    SETTINGS,
)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {**LIBRARY_CONFIGS, "RunConfig": RunConfig}


def _load_script():
    path = REPO / "scripts" / "docs" / "flag_tables.py"
    spec = importlib.util.spec_from_file_location("flag_tables", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


flag_tables = _load_script()


def _actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    return {a.dest: a for a in parser._actions if not isinstance(a, argparse._HelpAction)}


def test_every_flag_is_a_setting_and_every_setting_with_a_flag_is_one():
    actions = _actions()
    with_flag = {s.dest for s in SETTINGS if s.flag}
    assert set(actions) == with_flag
    for dest, action in actions.items():
        s = BY_DEST[dest]
        assert action.option_strings == [s.option]
        assert action.choices == (None if s.choices is None else list(s.choices))
        if s.type is bool:
            assert isinstance(action, argparse._StoreTrueAction), dest
        else:
            assert action.type is (s.type if s.type in (int, float) else None), dest
        assert action.help.startswith(s.help.replace("%", "%%")), dest


def test_defaults_and_model_defaults_name_only_settings():
    assert list(DEFAULTS) == [s.dest for s in SETTINGS]
    for model, overrides in MODEL_DEFAULTS.items():
        assert set(overrides) <= set(DEFAULTS), model
    assert set(BY_DEST["model"].choices) == set(MODEL_DEFAULTS)


def test_every_config_field_is_fed_by_exactly_one_setting_or_says_why_not():
    fed = [s.feeds for s in SETTINGS if s.feeds]
    assert len(fed) == len(set(fed)), "a field fed twice"
    for name, cls in CONFIGS.items():
        for f in fields(cls):
            key = f"{name}.{f.name}"
            assert (key in fed) != (key in NOT_SETTINGS), f"{key}: fed by one setting or listed"
    for key in fed + list(NOT_SETTINGS):
        cls_name, field_name = key.split(".")
        assert field_name in {f.name for f in fields(CONFIGS[cls_name])}, key
    assert {s.dest for s in SETTINGS if not s.feeds} == set(NOT_FED)


def _field_default(feeds: str):
    cls_name, name = feeds.split(".")
    (f,) = [f for f in fields(CONFIGS[cls_name]) if f.name == name]
    return f.default


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.feeds], ids=lambda s: s.dest)
def test_library_and_command_line_defaults_agree_or_say_why(s: Setting):
    library = _field_default(s.feeds)
    if library is MISSING:  # RunConfig, LRSchedule's lr: no library default to differ from
        assert s.library_differs is None
        return
    if s.library_differs is None:
        assert s.default == library, f"{s.dest}: {s.default!r} != {s.feeds} {library!r}"
    else:
        assert s.default != library, f"{s.dest}: says it differs from {s.feeds} but does not"
        doc = CONFIGS[s.feeds.split(".")[0]].__doc__
        at = doc.find(f"\n    {s.feeds.split('.')[1]} ")
        assert "command line" in (doc[at : at + 400] if at >= 0 else doc), s.feeds


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.cli_range and s.minimum is not None],
                         ids=lambda s: s.dest)  # fmt: skip
def test_the_command_line_refuses_a_value_below_the_minimum(s: Setting):
    assert s.dest in (cli.POSITIVE if s.minimum == 1 else cli.NON_NEGATIVE)
    below = s.type(s.minimum - 1)
    with pytest.raises(UsageError, match=f"{s.option} {below} is not allowed: it must be >= "):
        parse_args([s.option, str(below)], world_size=1)


@pytest.mark.parametrize(
    "s", [s for s in SETTINGS if s.flag and not s.cli_range], ids=lambda s: s.dest
)
def test_a_range_left_to_the_dataclass_is_still_refused(s: Setting):
    assert s.dest not in cli.POSITIVE + cli.NON_NEGATIVE
    value = str(s.type(s.minimum - 1))
    with pytest.raises(UsageError, match="bad value: .*" + s.dest):
        parse_args([s.option, value], world_size=1)


def _nested(key: str, value) -> dict:
    head, _, rest = key.partition(".")
    return {head: _nested(rest, value) if rest else value}


def _sample(s: Setting, key: str):
    """A value each DeepSpeed key accepts, other than the setting's default where it can."""
    samples = {"precision": True, "betas": [0.5, 0.75], "nvme_path": "/tmp/swap"}
    samples["hpz_partition_size"] = 2  # a str setting (it takes "host") whose key is an int
    samples["hybrid_shard_size"] = 2  # the same (mics_shard_size)
    samples["collectives"] = True  # a choice setting whose key is a bool (mics_hierarchical_...)
    if s.dest in samples:
        return samples[s.dest]
    if s.choices is not None:
        return s.choices[-1]
    if s.type is bool:
        return not s.default
    return s.type(s.minimum + 1)


@pytest.mark.parametrize("key", sorted(DS_KEYS))
def test_every_deepspeed_key_sets_its_setting(key):
    s = DS_KEYS[key]
    sample = _sample(s, key)
    parsed = parse_config(_nested(key, sample))
    assert list(parsed.settings) == [s.dest, *s.implied_by(sample)], key
    assert not (parsed.unknown or parsed.not_implemented or parsed.no_effect), key
    assert key in s.ds


def test_a_dotted_name_inside_an_object_is_one_unknown_key_not_a_path():
    raw = {"fp16.enabled": True, "zero_optimization": {"offload_optimizer.device": "nvme"}}
    parsed = parse_config(raw)
    assert parsed.settings == {}
    assert parsed.unknown == ["fp16.enabled", "zero_optimization.offload_optimizer.device"]


@pytest.mark.parametrize("key", sorted(k for k in DS_KEYS if DS_KEYS[k].minimum is not None))
def test_every_numeric_deepspeed_key_refuses_a_value_below_its_minimum(key):
    s = DS_KEYS[key]
    with pytest.raises(ConfigError, match=f"config {key} = "):
        parse_config(_nested(key, s.minimum - 1))


@pytest.mark.parametrize("path", sorted((REPO / "docs" / "configs").glob("*.json")),
                         ids=lambda p: p.name)  # fmt: skip
def test_each_example_config_sets_only_through_its_keys(path):
    import json

    raw = json.loads(path.read_text())
    leaves = dict(_leaves(raw))
    parsed = parse_config(raw)
    set_by = {DS_KEYS[k].dest for k in leaves if k in DS_KEYS}
    assert set(parsed.settings) <= set_by, path.name


def test_the_config_reader_sets_a_setting_only_through_its_definition():
    """ds_config stores a value in one place, _set, which looks the key up in DS_KEYS:
    a key read by hand elsewhere would bypass the definition (and the docs' tables)."""
    source = (REPO / "zero_ref" / "app" / "ds_config.py").read_text()
    assert source.count("out.settings[") == 1 and "out.settings[setting.dest]" in source


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_the_docs_flag_tables_are_what_the_settings_give():
    stale = flag_tables.stale()
    assert not stale, "stale (run python scripts/docs/flag_tables.py): " + ", ".join(
        map(str, stale)
    )


def test_an_edited_or_missing_flag_table_is_caught():
    page = flag_tables.flags_page()
    assert "`--bucket-numel` | `zero_optimization.reduce_bucket_size` | `8192`" in page
    marked = "x\n<!-- flags: precision -->\n| old hand-written table |\n<!-- /flags -->\ny"
    fixed = flag_tables.rewrite_marked(marked)
    assert "old hand-written" not in fixed and "`fp16.hysteresis`" in fixed
    assert fixed.startswith("x\n<!-- flags: precision -->\n") and fixed.endswith("-->\ny")
    with pytest.raises(ValueError, match="no group"):
        flag_tables.rewrite_marked("<!-- flags: nothing -->\n<!-- /flags -->")


# ---- every range at both ends, from the table: a new numeric setting is covered as it is
# added (a range that needs other settings around it names them in RANGE_CONTEXT)

NUMERIC = [s for s in SETTINGS if s.type in (int, float) and s.minimum is not None]
BOUNDING = {"steps": 40, "lr": 0.5}  # what a setting bounding another is set to
RANGE_CONTEXT = {
    "save_every": ["--save-dir", "ckpt"],
    "keep_last": ["--save-dir", "ckpt"],
    "lr": ["--min-lr", "0"],  # the schedule's floor must stay below the peak (gpt: 3e-4)
}


def _step(s: Setting, value, up: bool):
    if s.type is int:
        return value + (1 if up else -1)
    return math.nextafter(float(value), math.inf if up else -math.inf)


def range_ends(s: Setting) -> list[tuple[object, bool, object]]:
    """(value, accepted, the bound a refusal must name) at each end of s's range and one
    step beyond it."""
    low = s.minimum
    ends = [(_step(s, low, True), True, low), (low, False, low)] if s.minimum_open else [
        (low, True, low), (_step(s, low, False), False, low)
    ]  # fmt: skip
    if s.maximum is not None:
        high = BOUNDING[s.maximum] if isinstance(s.maximum, str) else s.maximum
        ends += [(high, True, high), (_step(s, high, True), False, high)]
    return ends


def _context(s: Setting) -> list[str]:
    bounds = [f"--{k}" for k in BOUNDING if s.maximum == k]
    return RANGE_CONTEXT.get(s.dest, []) + [a for b in bounds for a in (b, str(BOUNDING[b[2:]]))]


def _names(message: str, bound) -> bool:
    """Does the message name the bound (0 or 0.0, 127, lr=0.5), not just the value?"""
    number = re.escape(str(bound)) + (r"(\.0)?" if float(bound).is_integer() else "")
    return re.search(rf"(?<![\d.e-]){number}(?![\d])", message) is not None


def _fed(parsed, s: Setting):
    cls, name = s.feeds.split(".")
    owner = {
        "RunConfig": parsed.run,
        "ZeroConfig": parsed.zero,
        "AdamWConfig": parsed.zero.optimizer,
        "LossScaleConfig": parsed.zero.mixed_precision.loss_scale,
        "LRSchedule": parsed.run.lr_schedule,
        "MixedPrecisionConfig": parsed.zero.mixed_precision,
        "OffloadConfig": parsed.zero.offload,
        "OverlapConfig": parsed.zero.overlap,
        "ZeroPPConfig": parsed.zero.zeropp,
        "HybridConfig": parsed.zero.hybrid,
    }[cls]
    return getattr(owner, name)


def _expect(s: Setting, accepted: bool, bound, parse):
    if accepted:
        return parse()
    with pytest.raises(ValueError) as refused:
        parse()
    assert _names(str(refused.value), bound), f"{s.dest}: {refused.value}"
    return None


@pytest.mark.parametrize("s", [s for s in NUMERIC if s.flag], ids=lambda s: s.dest)
def test_every_flag_range_holds_at_both_ends(s: Setting, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for value, accepted, bound in range_ends(s):
        argv = [*_context(s), f"{s.option}={value!r}"]  # "=": argparse reads -1 as a flag
        parsed = _expect(s, accepted, bound, lambda argv=argv: parse_args(argv, world_size=1))
        if parsed is not None and s.feeds:
            expected = s.to_config(value, {}) if s.to_config else value
            assert _fed(parsed, s) == expected, (s.dest, value)


@pytest.mark.parametrize(
    "s, key", [(s, k) for s in NUMERIC for k in s.ds], ids=lambda x: getattr(x, "dest", x)
)
def test_every_deepspeed_key_range_holds_at_both_ends(s: Setting, key: str, tmp_path):
    """stage3_prefetch_bucket_size: 0 was refused while --prefetch-numel 0 was allowed."""
    for i, (value, accepted, bound) in enumerate(range_ends(s)):
        path = tmp_path / f"ds{i}.json"
        path.write_text(json.dumps(_nested(key, value)))
        argv = [*_context(s), "--config", str(path)]
        parsed = _expect(s, accepted, bound, lambda argv=argv: parse_args(argv, world_size=1))
        if parsed is not None and s.feeds:
            expected = s.to_config(value, {}) if s.to_config else value
            assert _fed(parsed, s) == expected, (key, value)


LIBRARY_BASE = {"LRSchedule": {"lr": BOUNDING["lr"], "total_steps": BOUNDING["steps"]}}


@pytest.mark.parametrize(
    "s", [s for s in NUMERIC if s.feeds and s.feeds.split(".")[0] in LIBRARY_CONFIGS],
    ids=lambda s: s.dest,
)  # fmt: skip
def test_every_library_range_holds_at_both_ends(s: Setting):
    """ZeroConfig, AdamWConfig, LossScaleConfig and LRSchedule themselves, as a user of the
    library (or of the oracle) builds them: initial_scale_power=127 must be allowed by
    a check whose message allows [0, 127]."""
    cls_name, name = s.feeds.split(".")
    cls = LIBRARY_CONFIGS[cls_name]
    for value, accepted, bound in range_ends(s):
        given = s.to_config(value, {}) if s.to_config else value
        kwargs = {**LIBRARY_BASE.get(cls_name, {}), name: given}
        made = _expect(s, accepted, bound, lambda kwargs=kwargs: cls(**kwargs))
        assert made is None or getattr(made, name) == given


def test_the_range_ends_cover_both_kinds_of_bound():
    """The generator itself: an open minimum, a fixed maximum and one set by another
    setting each give their two ends."""
    ends = {s.dest: range_ends(s) for s in NUMERIC}
    assert ends["initial_scale_power"] == [(0, True, 0), (-1, False, 0), (127, True, 127),
                                           (128, False, 127)]  # fmt: skip
    assert ends["min_loss_scale"][:2] == [(5e-324, True, 0), (0, False, 0)]
    assert ends["stop_at_step"][2:] == [(40, True, 40), (41, False, 40)]
    assert ends["prefetch_numel"] == [(0, True, 0), (-1, False, 0)]
