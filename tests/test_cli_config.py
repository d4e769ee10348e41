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
    assert z.overlap_comm and (z.prefetch_numel, z.max_live_numel) == (10**6, 10**9)
    assert "offload_param" not in notes  # device "none" asks for nothing
    assert "fp16" not in notes and "bf16" not in notes  # both implemented
    assert z.precision == "bf16"
    assert z.sub_group_size == 10**9 and z.offload_optimizer == "none"  # pin_memory: noted


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
        "zero_optimization": {"stage": 1, "round_robin_gradientz": True},
    }
    notes = parse_args(["--config", write(tmp_path, cfg)], world_size=2).notes
    assert any("warning: unknown key bogus_key_xyz" in n for n in notes)
    assert any("warning: unknown key zero_optimization.round_robin_gradientz" in n for n in notes)


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
