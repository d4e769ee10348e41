"""The dynamic loss scale's rule (zero_ref/optim/loss_scale.py) against a plain
model of DeepSpeed's DynamicLossScaler, written the way DeepSpeed writes it
(iteration counters, `delayed_shift`, `cur_hysteresis`), step by step over
random sequences of overflows."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.optim.loss_scale import (
    LossScaleConfig,
    LossScaleError,
    LossScaleState,
    initial_state,
    next_state,
)


class DeepSpeedModel:
    """DeepSpeed's update_scale, with the growth test of its documentation (and of its
    code before v0.17.1): double when (cur_iter - last_overflow_iter) % window == 0."""

    def __init__(self, cfg: LossScaleConfig) -> None:
        self.cfg = cfg
        self.cur_scale = 2.0**cfg.initial_scale_power
        self.delayed_shift = self.cur_hysteresis = cfg.hysteresis
        self.cur_iter, self.last_overflow_iter = 0, -1

    def update_scale(self, overflow: bool) -> None:
        cfg = self.cfg
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == cfg.min_loss_scale:
                    raise LossScaleError("at minimum")
                self.cur_scale = max(self.cur_scale / 2, cfg.min_loss_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if cfg.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % cfg.loss_scale_window == 0:
                if not cfg.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= 2
        self.cur_iter += 1


configs = st.builds(
    LossScaleConfig,
    initial_scale_power=st.integers(0, 6),
    loss_scale_window=st.integers(1, 5),
    hysteresis=st.integers(1, 3),
    consecutive_hysteresis=st.booleans(),
    min_loss_scale=st.sampled_from([1.0, 0.25, 2.0**-3]),
)


@settings(max_examples=300, deadline=None)
@given(cfg=configs, overflows=st.lists(st.booleans(), max_size=60))
def test_the_scale_follows_deepspeeds_rule_step_by_step(cfg, overflows):
    model, state = DeepSpeedModel(cfg), initial_state(cfg)
    for step, overflow in enumerate(overflows):
        try:
            model.update_scale(overflow)
        except LossScaleError:
            with pytest.raises(LossScaleError, match="minimum loss scale"):
                next_state(cfg, state, overflow)
            return
        state = next_state(cfg, state, overflow)
        assert state.scale == model.cur_scale, f"step {step}"
        assert state.hysteresis_left == model.cur_hysteresis, f"step {step}"
    assert state.overflows == sum(overflows)


def test_the_documented_defaults_halve_on_the_second_overflow_and_double_after_a_window():
    cfg = LossScaleConfig()  # 2^16, window 1000, hysteresis 2
    s = initial_state(cfg)
    assert (s.scale, s.hysteresis_left) == (65536.0, 2)
    s = next_state(cfg, s, overflow=True)
    assert s.scale == 65536.0 and s.hysteresis_left == 1  # absorbed by the hysteresis
    s = next_state(cfg, s, overflow=True)
    assert s.scale == 32768.0 and s.hysteresis_left == 1  # halved; hysteresis stays used up
    for _ in range(999):
        s = next_state(cfg, s, overflow=False)
    assert s.scale == 32768.0
    s = next_state(cfg, s, overflow=False)  # the 1000th clean step
    assert (s.scale, s.hysteresis_left, s.overflows) == (65536.0, 2, 2)


def test_consecutive_hysteresis_forgives_an_overflow_after_a_clean_step():
    cfg = LossScaleConfig(consecutive_hysteresis=True)
    s = initial_state(cfg)
    for overflow in (True, False, True, False, True):
        s = next_state(cfg, s, overflow)
    assert s.scale == 65536.0  # never two overflows in a row


def test_stuck_at_the_minimum_is_an_error_not_a_silent_clamp():
    cfg = LossScaleConfig(initial_scale_power=1, hysteresis=1, min_loss_scale=1.0)
    s = next_state(cfg, initial_state(cfg), overflow=True)
    assert s.scale == 1.0  # clamped to the minimum once
    with pytest.raises(LossScaleError, match="minimum loss scale 1"):
        next_state(cfg, s, overflow=True)


def test_a_static_scale_never_moves_but_counts_the_skipped_steps():
    cfg = LossScaleConfig(loss_scale=128.0)
    s = initial_state(cfg)
    for overflow in (True, True, True, False):
        s = next_state(cfg, s, overflow)
    assert s == LossScaleState(scale=128.0, hysteresis_left=2, clean_steps=0, overflows=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss_scale": -1.0}, "loss_scale = -1.0: must be a number >= 0"),
        ({"initial_scale_power": 200}, "initial_scale_power = 200"),
        ({"loss_scale_window": 0}, "loss_scale_window = 0: must be an integer >= 1"),
        ({"hysteresis": 0}, "hysteresis = 0"),
        ({"hysteresis": True}, "hysteresis = True"),
        ({"min_loss_scale": 0.0}, "min_loss_scale = 0.0: must be a number > 0"),
        ({"consecutive_hysteresis": 1}, "consecutive_hysteresis = 1"),
        ({"initial_scale_power": 0, "min_loss_scale": 2.0}, "2^power must be >= min_loss_scale"),
    ],
)
def test_bad_settings_name_the_key_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("^", r"\^")):
        LossScaleConfig(**kwargs)
