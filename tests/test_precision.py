"""Mixed precision (docs/precision.md): the roundings, the loss scale's trajectory in a
real run, the configuration keys, and a resumed fp16 run.

The property tests in tests/test_parity.py draw precision with every other option
and check each step bitwise against the oracle; here are the checks that need a
particular setting."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from tests.test_loss_scale import DeepSpeedModel
from tests.test_parity import MLP, check_bitwise, pinned, run
from zero_ref.app.cli import parse_args
from zero_ref.app.ds_config import ConfigError, parse_config
from zero_ref.comm.collectives import Comm
from zero_ref.config import MixedPrecisionConfig, ZeroConfig
from zero_ref.engine.ladder import make_engine
from zero_ref.engine.precision import Precision
from zero_ref.models.unit import ParamSpec, init_params
from zero_ref.numerics.dtypes import accumulate_rounded, round_into, rounded
from zero_ref.optim.loss_scale import LossScaleConfig
from zero_ref.optim.nonfinite import NonFiniteGradientError
from zero_ref.testing.engine_state import full_parameters

BF16 = np.dtype(ml_dtypes.bfloat16)


# ---- the roundings (zero_ref/numerics/dtypes.py)


def test_rounding_is_to_nearest_even():
    """Ties go to the even neighbour in both formats; fp16 overflows to Inf."""
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 65519.0, -(2.0**-25)], np.float32)
    assert rounded(x, np.dtype(np.float16)).tolist() == [1.0, 1 + 2**-9, np.inf, 65504.0, -0.0]
    y = np.array([1 + 2**-8, 1 + 3 * 2**-8, 3.0e38], np.float32)
    assert rounded(y, BF16).tolist()[:2] == [1.0, 1 + 2**-6]
    assert np.isfinite(rounded(y, BF16)[2])  # bf16 keeps float32's range


def test_accumulation_adds_in_float32_and_rounds_once():
    acc = np.array([2048.0, 1.0], np.float16)
    accumulate_rounded(acc, np.array([1.0, 2**-11], np.float16))
    assert acc.tolist() == [2048.0, 1.0]  # 2049 ties to even; 1 + 2^-11 ties to 1
    f = np.array([1.0], np.float32)
    accumulate_rounded(f, np.array([2**-11], np.float16))
    assert f.tolist() == [1 + 2**-11]
    out = np.empty(1, np.float16)
    assert round_into(out, np.array([1e6], np.float32)).tolist() == [np.inf]


# ---- configuration


def test_zero_config_names_what_is_allowed():
    with pytest.raises(ValueError, match="precision='fp8'.*'fp32' or 'fp16' or 'bf16'"):
        ZeroConfig(mixed_precision=MixedPrecisionConfig(dtype="fp8"))
    with pytest.raises(ValueError, match="grad_accum_dtype='fp16'.*'bf16'.*'fp32'"):
        ZeroConfig(mixed_precision=MixedPrecisionConfig(dtype="bf16", grad_accum_dtype="fp16"))
    with pytest.raises(ValueError, match="communication_data_type='int8'"):
        ZeroConfig(mixed_precision=MixedPrecisionConfig(communication_data_type="int8"))
    mixed = MixedPrecisionConfig(dtype="bf16", grad_accum_dtype="fp32")
    p = Precision.of(ZeroConfig(mixed_precision=mixed))
    assert (p.param, p.grad, p.comm) == (BF16, np.dtype(np.float32), np.dtype(np.float32))
    assert p.mixed and not p.scaled


def test_deepspeed_fp16_block_maps_with_documented_defaults(tmp_path):
    """An enabled fp16 block with no other keys gets DeepSpeed's documented defaults
    (2^16, hysteresis 2), not the 2^32 and hysteresis 1 DeepSpeed's ZeRO silently
    used before its fix (PR #4986)."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"fp16": {"enabled": True}}))
    z = parse_args(["--config", str(path)], world_size=2).zero
    assert z.mixed_precision.dtype == "fp16"
    assert z.mixed_precision.loss_scale == LossScaleConfig()
    ls = z.mixed_precision.loss_scale
    assert (ls.initial_scale_power, ls.hysteresis) == (16, 2)
    keys = {
        "fp16": {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": 12,
            "loss_scale_window": 500,
            "hysteresis": 3,
            "consecutive_hysteresis": True,
            "min_loss_scale": 0.5,
            "auto_cast": False,
        },
        "data_types": {"grad_accum_dtype": "fp32"},
        "communication_data_type": "bf16",
    }
    path.write_text(json.dumps(keys))
    p = parse_args(["--config", str(path)], world_size=2)
    ls = p.zero.mixed_precision.loss_scale
    assert (ls.initial_scale_power, ls.loss_scale_window, ls.hysteresis) == (12, 500, 3)
    assert ls.consecutive_hysteresis and ls.min_loss_scale == 0.5
    assert (p.zero.mixed_precision.grad_dtype, p.zero.mixed_precision.comm_dtype) == (
        "fp32",
        "bf16",
    )
    assert any("auto_cast" in note for note in p.notes)


def test_bf16_block_and_bad_values():
    assert parse_config({"bf16": {"enabled": True}}).settings["precision"] == "bf16"
    assert parse_config({"bfloat16": {"enabled": True}}).settings["precision"] == "bf16"
    with pytest.raises(ConfigError, match="enable one of them"):
        parse_config({"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    with pytest.raises(ConfigError, match="communication_data_type = 'int8'.*'fp16'"):
        parse_config({"communication_data_type": "int8"})
    with pytest.raises(ConfigError, match="fp16.hysteresis = 0"):
        parse_config({"fp16": {"enabled": True, "hysteresis": 0}})


def test_flags_set_the_scaler():
    z = parse_args(
        ["--precision", "fp16", "--loss-scale", "128", "--min-loss-scale", "0.25"], world_size=2
    ).zero
    ls = z.mixed_precision.loss_scale
    assert ls.static and ls.loss_scale == 128.0
    z = parse_args(["--precision", "bf16", "--grad-accum-dtype", "bf16"], world_size=2).zero
    assert z.mixed_precision.grad_dtype == "bf16" and z.mixed_precision.grad_accum_dtype is None


# ---- the loss scale in a real run


@pytest.mark.parametrize("stage, world", [(1, 2), (3, 3)])
def test_forced_overflows_follow_the_rule_step_by_step(mpi_pools, stage, world):
    """A scale far too large for fp16: the first steps overflow and are skipped on
    every rank (bitwise the oracle, which finds the overflow in its own gradients),
    the scale halves after `hysteresis` overflows, and grows after each window of
    clean steps, exactly as a plain model of DeepSpeed's rule says."""
    loss_scale = {"initial_scale_power": 20, "hysteresis": 2, "loss_scale_window": 2}
    drawn = pinned(
        MLP,
        stage=stage,
        world=world,
        grad_accum=1,
        steps=14,
        lrs=[None] * 14,
        precision={"precision": "fp16", "loss_scale": loss_scale},
    )
    result = run(mpi_pools, drawn)
    check_bitwise(result)
    rule = DeepSpeedModel(LossScaleConfig(**loss_scale))
    for i, step in enumerate(result["steps"]):
        assert step["loss_scale"] == rule.cur_scale, f"step {i}"
        rule.update_scale(step["skipped"])
    skipped = [s["skipped"] for s in result["steps"]]
    assert skipped[:2] == [True, True] and not all(skipped)
    scales = [s["loss_scale"] for s in result["steps"]]
    assert any(b > a for a, b in zip(scales, scales[1:], strict=False)), scales


class InfUnit:
    """One parameter whose gradient holds an Inf: what an overflowing layer writes."""

    name = "bad"

    def param_specs(self):
        return [ParamSpec("w", (3,), "ones")]

    def forward(self, params, x):
        return x, x

    def backward(self, params, cache, dout, grads):
        grads["w"][...] = np.array([1.0, np.inf, 2.0], np.float32) * dout
        return None


class InfModel:
    units = [InfUnit()]

    def loss(self, output, targets):
        return 0.0, np.ones((), np.float32)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_inf_is_caught_before_the_master_weights(stage):
    """bf16 has no loss scaler, but a NaN/Inf gradient is still found on every rank and
    never reaches the float32 master weights: "raise" names the element, "skip" skips
    the step (DeepSpeed's bf16 optimizer only checked after an Inf poisoned master
    weights: PR #6976)."""
    model, comm = InfModel(), Comm(MPI.COMM_SELF)
    x = np.zeros((1, 1), np.float32)
    cfg = ZeroConfig(stage=stage, mixed_precision=MixedPrecisionConfig(dtype="bf16"))
    engine = make_engine(model, init_params(model, 0), cfg, comm)
    with pytest.raises(NonFiniteGradientError, match=r"bad\.w\[1\] at step 1"):
        engine.train_step(x, x)
    engine = make_engine(model, init_params(model, 0), replace(cfg, nonfinite="skip"), comm)
    result = engine.train_step(x, x)
    assert result.skipped and engine.step_count == 0
    assert full_parameters(engine)["bad.w"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "name, stage, precision", [("stage3_fp16", 3, "fp16"), ("stage2_bf16", 2, "bf16")]
)
def test_example_configs_ask_for_mixed_precision(name, stage, precision):
    path = Path(__file__).parent.parent / "docs" / "configs" / f"{name}.json"
    p = parse_args(["--config", str(path)], world_size=4)
    assert (p.zero.stage, p.zero.mixed_precision.dtype) == (stage, precision)
    assert p.zero.mixed_precision.loss_scale == LossScaleConfig() and not p.notes
