"""Dynamic loss scaling for fp16 training: the rule, as pure arithmetic.

fp16 keeps 10 mantissa bits and a range of about 6e-8 .. 65504, so small
gradients underflow to zero. Mixed-precision training (Micikevicius et al.,
2018; the ZeRO paper's Sec. 3.1 setting) multiplies the loss by a scale S
before backward, so every gradient is S times larger, and divides by S again
before the optimizer step. Too large an S overflows to Inf/NaN: that step is
skipped on every rank and S shrinks; after a run of clean steps S grows again.

The rule is DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py,
`update_scale`), with its configuration keys:

  overflow:  if hysteresis is 1, or only one overflow of it is left: S = max(S / 2,
             min_loss_scale), and if S was already min_loss_scale, stop with an error
             (training cannot go on); otherwise one fewer overflow is left. Either way
             the count of clean steps restarts.
  clean:     with consecutive_hysteresis the hysteresis is refilled at once; after
             every loss_scale_window clean steps since the last overflow (or the
             start), S doubles and (without consecutive_hysteresis) the hysteresis is
             refilled.

Two choices differ from DeepSpeed, on purpose. S doubles on the window-th clean
step, as DeepSpeed's documentation says and its code did before v0.17.1 (since
then: the window+1-th). And the caller unscales with the S that backward used,
returned before the update: DeepSpeed updates S first, so on a growth step its
gradients are divided by twice the scale that multiplied them (DeepSpeed issue
#2686).

The state is a few plain numbers, so a checkpoint stores it as JSON fields. The
configuration (LossScaleConfig) is zero_ref/config/groups.py's, beside the other frozen
configs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from zero_ref.config import LossScaleConfig


class LossScaleError(RuntimeError):
    """Gradients overflow even at min_loss_scale: the run cannot continue."""


@dataclass(frozen=True)
class LossScaleState:
    """Where the scaler stands: plain numbers, saved in checkpoints as they are."""

    scale: float
    hysteresis_left: int  # overflows still absorbed before the scale halves
    clean_steps: int  # clean steps since the last overflow (or the start)
    overflows: int = 0  # steps skipped for an overflow, over the whole run


def initial_state(cfg: LossScaleConfig) -> LossScaleState:
    scale = cfg.loss_scale if cfg.static else 2.0**cfg.initial_scale_power
    return LossScaleState(scale=scale, hysteresis_left=cfg.hysteresis, clean_steps=0)


def next_state(cfg: LossScaleConfig, state: LossScaleState, overflow: bool) -> LossScaleState:
    """The state after a step whose gradients did (overflow=True) or did not overflow.
    Raises LossScaleError when an overflow would halve a scale at min_loss_scale."""
    if cfg.static:
        return replace(state, overflows=state.overflows + overflow)
    if overflow:
        return _after_overflow(cfg, state)
    return _after_clean_step(cfg, state)


def _after_overflow(cfg: LossScaleConfig, state: LossScaleState) -> LossScaleState:
    left = state.hysteresis_left
    scale = state.scale
    if cfg.hysteresis == 1 or left == 1:  # the hysteresis is used up: halve
        if scale == cfg.min_loss_scale:
            raise LossScaleError(
                f"fp16 gradients overflow even at the minimum loss scale {scale:g} "
                f"(min_loss_scale): the model diverged, or lower the learning rate, or use bf16"
            )
        scale = max(scale / 2, cfg.min_loss_scale)  # the hysteresis stays used up
    else:
        left -= 1
    return LossScaleState(scale, left, clean_steps=0, overflows=state.overflows + 1)


def _after_clean_step(cfg: LossScaleConfig, state: LossScaleState) -> LossScaleState:
    left = cfg.hysteresis if cfg.consecutive_hysteresis else state.hysteresis_left
    clean, scale = state.clean_steps + 1, state.scale
    if clean % cfg.loss_scale_window == 0:
        scale *= 2
        left = cfg.hysteresis
    return LossScaleState(scale, left, clean, state.overflows)
