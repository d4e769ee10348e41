"""The command line and DeepSpeed-style JSON configs: every key, bad values,
batch-size consistency, precedence (defaults < --config < flags)."""

from __future__ import annotations

import json

import pytest

from zero_ref.app.cli import UsageError, parse_args, resolve_batch
from zero_ref.app.ds_config import ConfigError, parse_config
from zero_ref.optim.lr_schedule import LRSchedule

FULL = {
    "train_batch_size": 48,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 3,
    "gradient_clipping": 0.5,
    "seed": 7,
    "optimizer": {
        "type": "Adam",
        "params": {
            "lr": 1e-3,
            "betas": [0.8, 0.95],
            "eps": 1e-6,
            "weight_decay": 0.1,
            "adam_w_mode": True,
        },
    },
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": 1000,
        "allgather_bucket_size": 5e8,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "offload_optimizer": {"device": "none", "pin_memory": True},
        "offload_param": {"device": "none"},
        "sub_group_size": 1e9,
        "stage3_prefetch_bucket_size": 1e6,
        "stage3_max_live_parameters": 1e9,
    },
    "fp16": {"enabled": False},
    "bf16": {"enabled": True},
}


def write(tmp_path, cfg) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_every_key_maps(tmp_path):
    p = parse_args(["--config", write(tmp_path, FULL)], world_size=4)
    z, r = p.zero, p.run
    assert (z.stage, z.bucket_numel, z.grad_accum, z.clip) == (3, 1000, 3, 0.5)
    assert (z.optimizer.lr, z.optimizer.betas, z.optimizer.eps) == (1e-3, (0.8, 0.95), 1e-6)
    assert z.optimizer.weight_decay == 0.1
    assert (r.batch_size, r.micro_batch_size, r.seed) == (48, 4, 7)
    notes = "\n".join(p.notes)
    for key in ("allgather_bucket_size", "offload_optimizer"):
        assert notes.count(key) == 1, key  # read and noted: no effect here, pin_memory
    for key in ("overlap_comm", "stage3_prefetch_bucket_size", "stage3_max_live_parameters"):
        assert key not in notes, key  # implemented: they set the engine's overlap
    assert z.overlap.comm and (z.overlap.prefetch_numel, z.overlap.max_live_numel) == (10**6, 10**9)
    assert "offload_param" not in notes  # device "none" asks for nothing
    assert "fp16" not in notes and "bf16" not in notes  # both implemented
    assert z.mixed_precision.dtype == "bf16"
    assert z.offload.sub_group_size == 10**9 and z.offload.optimizer == "none"  # pin_memory: noted


def test_flags_override_the_file(tmp_path):
    p = parse_args(
        ["--config", write(tmp_path, FULL), "--stage", "1", "--lr", "0.5", "--clip", "0"],
        world_size=4,
    )
    assert (p.zero.stage, p.zero.optimizer.lr, p.zero.clip) == (1, 0.5, None)


def test_unknown_keys_are_warned_by_name(tmp_path):
    cfg = {
        "train_batch_size": 8,
        "bogus_key_xyz": True,
        "zero_optimization": {"stage": 1, "round_robin_grads": True},
    }
    notes = parse_args(["--config", write(tmp_path, cfg)], world_size=2).notes
    assert "config: warning: unknown key bogus_key_xyz (ignored)" in notes
    assert (
        "config: warning: unknown key zero_optimization.round_robin_grads (ignored; did you "
        "mean zero_optimization.round_robin_gradients?)" in notes
    )


@pytest.mark.parametrize(
    "raw, meant",
    [
        ({"zero_optimization": {"zero_quantized_weight": True}}, "zero_quantized_weights"),
        ({"zero_optimization": {"zero_quantised_weight": True}}, "zero_quantized_weights"),  # 2
        ({"zero_optimization": {"Stage": 3}}, "stage"),
        ({"zero_optimization": {"offload_param": {"devic": "nvme"}}}, "offload_param.device"),
        ({"zero_optimisation": {"stage": 3}}, None),  # the section's own name
        ({"zero_optimizations": {}}, None),
    ],
)
def test_a_near_miss_of_a_zero_key_is_an_error_naming_it(raw, meant):
    """A typo (1 or 2 edits) of a ZeRO key used to be one warning, and the run trained
    without what it named (qwZ off)."""
    meant = "zero_optimization" + (f".{meant}" if meant else "")
    with pytest.raises(ConfigError, match=rf"no such key; did you mean {meant}\?"):
        parse_config(raw)


def test_three_edits_from_a_zero_key_or_a_near_miss_elsewhere_only_warns(tmp_path):
    cfg = {
        "zero_optimization": {"zero_quantised_weigh": True},  # 3 edits away
        "gradient_clippin": 1.0,  # a near miss, but not of a ZeRO key
        "optimizer": {"params": {"lr_": 1.0}},
    }
    cfg["zero_optimization"]["offload_param.device"] = "nvme"  # a dotted path, not a typo
    notes = parse_args(["--config", write(tmp_path, cfg)], world_size=2).notes
    zo = "zero_optimization."
    assert (
        f"config: warning: unknown key {zo}zero_quantised_weigh (ignored; did you mean "
        f"{zo}zero_quantized_weights?)"
    ) in notes
    assert "unknown key gradient_clippin (ignored; did you mean gradient_clipping?)" in "".join(
        notes
    )
    assert f"config: warning: unknown key {zo}offload_param.device (ignored)" in notes
    assert any(
        "optimizer.params.lr_ (ignored; did you mean optimizer.params.lr?)" in n for n in notes
    )


# DeepSpeed's own ZeRO keys (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig, fields and
# aliases, lines ~95-376 at edaa722; offload_config.py ~24-105): none of those zero_ref does
# not read may be taken for a typo of one it does.
DEEPSPEED_ZERO_KEYS = [
    "stage",
    "contiguous_gradients",
    "reduce_scatter",
    "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce",
    "allgather_partitions",
    "allgather_bucket_size",
    "overlap_comm",
    "load_from_fp32_weights",
    "elastic_checkpoint",
    "offload_param",
    "offload_optimizer",
    "zenflow",
    "sub_group_size",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "cpu_offload",
    "prefetch_bucket_size",
    "stage3_prefetch_bucket_size",
    "param_persistence_threshold",
    "stage3_param_persistence_threshold",
    "model_persistence_threshold",
    "stage3_model_persistence_threshold",
    "max_live_parameters",
    "stage3_max_live_parameters",
    "max_reuse_distance",
    "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold",
    "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential",
    "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters",
    "legacy_stage1",
    "round_robin_gradients",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients",
    "zeropp_loco_param",
    "mics_shard_size",
    "mics_hierarchical_params_gather",
    "memory_efficient_linear",
    "pipeline_loading_checkpoint",
    "override_module_apply",
    "log_trace_cache_warnings",
    "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory",
    "leaf_module",
]
DEEPSPEED_OFFLOAD_KEYS = [
    "device",
    "nvme_path",
    "buffer_count",
    "buffer_size",
    "max_in_cpu",
    "pin_memory",
    "pipeline_read",
    "pipeline_write",
    "fast_init",
    "ratio",
    "super_offload",
    "cpuadam_cores_perc",
]


def test_no_deepspeed_zero_key_is_taken_for_a_typo():
    from zero_ref.app.ds_config import known_keys
    from zero_ref.app.ds_unknown import _siblings, near_miss

    siblings, known = _siblings(known_keys()), known_keys()
    zo = "zero_optimization."
    keys = [zo + k for k in DEEPSPEED_ZERO_KEYS]
    keys += [
        f"{zo}{b}.{k}"
        for b in ("offload_param", "offload_optimizer")
        for k in DEEPSPEED_OFFLOAD_KEYS
    ]
    assert [k for k in keys if near_miss(k, siblings, known)] == []


@pytest.mark.parametrize("count, lines", [(5, 5), (6, 6), (12, 6), (400_000, 6)])
def test_many_unknown_keys_are_summarised(count, lines):
    from zero_ref.app.ds_config import known_keys
    from zero_ref.app.ds_unknown import unknown_key_notes

    notes = unknown_key_notes([f"k{i}" for i in range(count)], known_keys())
    assert len(notes) == lines
    assert notes[:5] == [f"config: warning: unknown key k{i} (ignored)" for i in range(5)]
    if count > 5:
        assert notes[5] == (
            f"config: warning: {count - 5:,} more unknown keys (ignored), {count:,} in all"
        )


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"seed": 1, "seed": 2}', "seed"),
        ('{"zero_optimization": {"stage": 1, "stage": 3}}', "stage"),
        ('{"fp16": {"enabled": true}, "fp16": {"enabled": false}}', "fp16"),
    ],
)
def test_a_key_given_twice_is_refused_as_deepspeed_does(tmp_path, text, key):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"config key '{key}' is given twice in one object"):
        parse_args(["--config", str(path)])


def test_a_config_nested_too_deeply_or_a_folder_is_one_clear_error(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="nested too deeply for Python's JSON reader"):
        parse_args(["--config", str(deep)])
    with pytest.raises(ConfigError, match=f"--config {tmp_path}: is a folder, not a JSON file"):
        parse_args(["--config", str(tmp_path)])


@pytest.mark.parametrize("size, expected", [("host", "host"), (1, 1), (2, 2)])
def test_the_hpz_key_takes_what_the_flag_takes(tmp_path, size, expected):
    cfg = {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": size}}
    from_key = parse_args(["--config", write(tmp_path, cfg)], world_size=2).zero
    from_flag = parse_args(["--stage", "3", "--hpz-partition-size", str(size)], world_size=2)
    assert (
        from_key.zeropp.hpz_partition_size == from_flag.zero.zeropp.hpz_partition_size == expected
    )
    for bad in ("hosts", 0, True, 1.5):
        with pytest.raises(ConfigError, match="must be an integer >= 1 or 'host'"):
            parse_config({"zero_optimization": {"zero_hpz_partition_size": bad}})


def test_real_deepspeed_keys_that_mean_nothing_here_are_not_unknown(tmp_path):
    cfg = {
        "train_batch_size": 8,
        "wall_clock_breakdown": True,
        "steps_per_print": 10,
        "zero_allow_untested_optimizer": True,
        "prescale_gradients": False,
        "zero_optimization": {"stage": 1, "round_robin_gradients": True},
    }
    notes = parse_args(["--config", write(tmp_path, cfg)], world_size=2).notes
    for key in (
        "wall_clock_breakdown",
        "steps_per_print",
        "zero_allow_untested_optimizer",
        "prescale_gradients",
        "zero_optimization.round_robin_gradients",
    ):
        assert f"config: {key} is accepted, no effect here" in notes
    assert not any("unknown" in n for n in notes)


def test_switches_zero_ref_cannot_turn_off_are_warnings(tmp_path):
    cfg = {"prescale_gradients": True, "zero_optimization": {"reduce_scatter": False}}
    notes = parse_args(["--config", write(tmp_path, cfg)], world_size=2).notes
    assert any("warning: prescale_gradients = true" in n for n in notes)
    assert any("warning: zero_optimization.reduce_scatter = false" in n for n in notes)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"train_batch_size": "32"}, "train_batch_size = '32'"),
        ({"train_batch_size": 0}, "train_batch_size = 0"),
        ({"gradient_clipping": -1}, "gradient_clipping = -1"),
        ({"optimizer": {"type": "SGD"}}, "optimizer.type = 'SGD'"),
        ({"optimizer": {"params": {"betas": [0.9]}}}, "optimizer.params.betas"),
        ({"optimizer": {"params": {"lr": "fast"}}}, "optimizer.params.lr = 'fast'"),
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage = 4"),
        ({"zero_optimization": {"stage": True}}, "zero_optimization.stage = True"),
        ({"zero_optimization": []}, "zero_optimization = []"),
        ({"bf16": {"enabled": "yes"}}, "bf16.enabled = 'yes'"),
        (
            {"zero_optimization": {"overlap_comm": False, "contiguous_gradients": "no"}},
            "contiguous_gradients = 'no'",
        ),
    ],
)
def test_bad_values_name_key_and_value(cfg, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config(cfg)


def test_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_args(["--config", str(bad)])
    with pytest.raises(FileNotFoundError, match="no such file"):
        parse_args(["--config", str(tmp_path / "nope.json")])


# DeepSpeed's dtype names, as its source reads them (at edaa722): data_types.grad_accum_dtype
# through DtypeEnum (deepspeed/runtime/config.py ~101-107, matched exactly: "FP16" is no
# member), communication_data_type through get_communication_data_type (~209-223: the value
# lower-cased, then only fp32, fp16 and bf16; "half" is refused there).
DTYPE_ENUM = {
    **dict.fromkeys(("torch.float16", "fp16", "float16", "half"), "fp16"),
    **dict.fromkeys(("torch.float32", "fp32", "float32", "float"), "fp32"),
    **dict.fromkeys(("torch.bfloat16", "bf16", "bfloat16"), "bf16"),
}
COMM_DTYPES = {name: name.lower() for name in ("fp32", "fp16", "bf16", "FP32", "Fp16", "BF16")}


@pytest.mark.parametrize("name, dtype", sorted(DTYPE_ENUM.items()))
def test_every_grad_accum_dtype_name_means_what_it_means_in_deepspeed(tmp_path, name, dtype):
    precision = "bf16" if dtype == "fp32" else dtype  # fp32 accumulation under bf16
    cfg = {precision: {"enabled": True}, "data_types": {"grad_accum_dtype": name}}
    zero = parse_args(["--config", write(tmp_path, cfg)], world_size=2).zero
    assert zero.mixed_precision.grad_dtype == dtype, name


@pytest.mark.parametrize("name, dtype", sorted(COMM_DTYPES.items()))
def test_every_communication_dtype_name_means_what_it_means_in_deepspeed(tmp_path, name, dtype):
    cfg = {"bf16": {"enabled": True}, "communication_data_type": name}
    if dtype == "fp16":
        cfg = {"fp16": {"enabled": True}, "communication_data_type": name}
    zero = parse_args(["--config", write(tmp_path, cfg)], world_size=2).zero
    assert zero.mixed_precision.comm_dtype == dtype, name


def test_dtype_names_deepspeed_does_not_read_are_refused():
    from zero_ref.app.ds_values import COMM_DATA_TYPES, DATA_TYPES

    assert DATA_TYPES == DTYPE_ENUM  # nothing accepted that DeepSpeed reads otherwise
    assert {v.lower() for v in COMM_DTYPES} == set(COMM_DATA_TYPES)
    for name in ("half", "float16", "bfloat16", "float", "torch.float16", "int8", "fp8", 16):
        with pytest.raises(ConfigError, match="communication_data_type = .*fp32', 'fp16', 'bf16"):
            parse_config({"communication_data_type": name})
    for name in ("FP16", "Half", "int8", "fp64", "", 32):
        with pytest.raises(ConfigError, match="grad_accum_dtype = .*DeepSpeed's dtype names"):
            parse_config({"data_types": {"grad_accum_dtype": name}})


@pytest.mark.parametrize(
    "batch, micro, accum, world, expected",
    [
        (32, None, None, 4, (32, 8, 1)),
        (32, 4, None, 4, (32, 4, 2)),
        (32, None, 2, 4, (32, 4, 2)),
        (None, 4, 2, 4, (32, 4, 2)),
        (None, 4, None, 4, (16, 4, 1)),
        (24, 2, 3, 4, (24, 2, 3)),
    ],
)
def test_batch_sizes_resolve_like_deepspeed(batch, micro, accum, world, expected):
    assert resolve_batch(batch, micro, accum, world) == expected


@pytest.mark.parametrize(
    "batch, micro, accum, world",
    [
        (32, 4, 3, 4),  # 4 * 3 * 4 = 48 != 32
        (30, None, None, 4),  # not divisible by world
        (32, 3, None, 4),  # not divisible by micro * world
    ],
)
def test_inconsistent_batch_sizes_are_errors(batch, micro, accum, world):
    with pytest.raises(UsageError):
        resolve_batch(batch, micro, accum, world)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stage", "4"], "invalid choice: 4"),
        (["--steps", "0"], "--steps 0 is not allowed"),
        (["--bucket-numel", "0"], "--bucket-numel 0 is not allowed"),
        (["--lr", "-1"], "lr=-1.0 is not allowed"),
        (["--warmup-steps", "5", "--steps", "3"], "warmup_steps=5"),
        (["--min-lr", "1", "--lr", "0.1"], "min_lr=1.0"),
        (["--model", "rnn"], "invalid choice: 'rnn'"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_flags_raise_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv, world_size=2)


def test_gpt_context_default_and_schedule():
    p = parse_args(
        [
            "--model",
            "gpt",
            "--lr-schedule",
            "cosine",
            "--warmup-steps",
            "10",
            "--steps",
            "100",
            "--min-lr",
            "1e-4",
        ],
        world_size=1,
    )
    assert p.run.context == 64
    s = p.run.lr_schedule
    assert s(5) == pytest.approx(s.lr / 2) and s(10) == s.lr
    assert s(100) == pytest.approx(1e-4)
    assert all(s(i) >= s(i + 1) for i in range(10, 100))


def test_lr_schedule_validation():
    with pytest.raises(ValueError, match="lr schedule 'linear'"):
        LRSchedule(1.0, 10, kind="linear")


def test_betas_outside_zero_one_name_the_config_key():
    with pytest.raises(ConfigError, match=r"optimizer.params.betas\[1\] = 1.5"):
        parse_config({"optimizer": {"params": {"betas": [0.9, 1.5]}}})


MOOT_CASES = [  # flags, the note's start or None (the setting does something there)
    (["--overlap-comm", "--stage", "0"], "--overlap-comm (zero_optimization.overlap_comm)"),
    (["--overlap-comm", "--stage", "1"], None),
    (["--progress", "thread", "--stage", "2"], "--progress thread has no effect without"),
    (["--progress", "mpich", "--stage", "3"], "--progress mpich has no effect without"),
    (["--progress", "thread", "--stage", "2", "--overlap-comm"], None),
    (["--progress", "test", "--stage", "2"], None),  # the default: nothing was asked
    (["--prefetch-numel", "0", "--stage", "2", "--overlap-comm"], "--prefetch-numel 0 (zero_"),
    (["--prefetch-numel", "9", "--stage", "3"], "--prefetch-numel 9 (zero_optimization.stage3_"),
    (["--prefetch-numel", "0", "--stage", "3", "--overlap-comm"], None),
    (["--max-live-numel", "1", "--stage", "2"], "--max-live-numel 1 (zero_optimization.stage3_"),
    (["--max-live-numel", "1", "--stage", "3"], None),
    (["--persistence-numel", "5", "--stage", "0"], "--persistence-numel 5 (zero_optimization."),
    (["--persistence-numel", "5", "--stage", "3"], None),
]


@pytest.mark.parametrize("flags, note", MOOT_CASES)
def test_a_setting_the_others_make_moot_says_so(flags, note):
    notes = [n for n in parse_args(["--model", "mlp", *flags], 2).notes if "no effect" in n]
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(f"config: {note}"), notes


def test_a_moot_key_says_so_as_its_flag_does(tmp_path):
    cfg = {"zero_optimization": {"stage": 1, "stage3_max_live_parameters": 5}}
    from_key = parse_args(["--config", write(tmp_path, cfg)], 2).notes
    from_flags = parse_args(["--stage", "1", "--max-live-numel", "5"], 2).notes
    assert [n for n in from_key if "no effect" in n] == [n for n in from_flags if "no effect" in n]
    assert any("stage3_max_live_parameters) has no effect below stage 3" in n for n in from_key)


def test_the_live_budget_is_checked_only_at_stage_3():
    """stage3_max_live_parameters at stage 1 was refused as below "what stage 3 must hold"."""
    from zero_ref.config import OverlapConfig, ZeroConfig
    from zero_ref.formulas.memory import overlap_buffers

    for stage in (0, 1, 2):
        overlap_buffers(
            [100, 300], ZeroConfig(stage=stage, overlap=OverlapConfig(max_live_numel=5))
        )
    overlap_buffers([100, 300], ZeroConfig(stage=3, overlap=OverlapConfig(max_live_numel=300)))
    with pytest.raises(ValueError, match="max_live_numel=299 .* allowed: >= 300"):
        overlap_buffers([100, 300], ZeroConfig(stage=3, overlap=OverlapConfig(max_live_numel=299)))
