"""AdamW: the fused Numba kernel against its NumPy twin, bit for bit, and both
against a float64 textbook AdamW written from torch.optim.AdamW's formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zero_ref.config import AdamWConfig
from zero_ref.optim.adamw import AdamWScalars, adamw_kernel, adamw_reference, adamw_scalars, with_lr

SIZES = [0, 1, 7, 13, 1009, 100003]
CONFIGS = [
    AdamWConfig(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    AdamWConfig(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    AdamWConfig(lr=3e-4, betas=(0.5, 0.5), eps=1e-3, weight_decay=0.1),
    AdamWConfig(lr=1.0, betas=(0.95, 0.9999), eps=1e-8, weight_decay=0.01),
    AdamWConfig(lr=1e-2, betas=(0.3, 0.9), eps=1e-8, weight_decay=0.1),  # torch's other lerp
    AdamWConfig(lr=1e-2, betas=(0.0, 0.9), eps=1e-8, weight_decay=0.0),
]
STEPS = 4


def draw_grad(rng: np.random.Generator, n: int) -> np.ndarray:
    """Gradients spanning eight orders of magnitude, signs mixed, 5% exact zeros."""
    g = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 2, n)
    g[rng.random(n) < 0.05] = 0.0
    return g.astype(np.float32)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def textbook_adamw(p, g, m, v, t: int, cfg: AdamWConfig) -> None:
    """torch.optim.AdamW's step, written out in float64, in place."""
    beta1, beta2 = cfg.betas
    p *= 1 - cfg.lr * cfg.weight_decay
    m[...] = beta1 * m + (1 - beta1) * g
    v[...] = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - beta2**t) + cfg.eps
    p -= cfg.lr / (1 - beta1**t) * m / denom


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"lr{c.lr}-b{c.betas}-wd{c.weight_decay}")
@pytest.mark.parametrize("n", SIZES)
def test_kernel_is_bitwise_its_reference(n, cfg):
    rng = np.random.default_rng([n, int(cfg.lr * 1e4)])
    param = rng.standard_normal(n).astype(np.float32)
    kernel_state = [param.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    twin_state = [param.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    for t in range(1, STEPS + 1):
        grad = draw_grad(rng, n)
        s = adamw_scalars(cfg, t)
        adamw_kernel(kernel_state[0], grad, kernel_state[1], kernel_state[2], s)
        adamw_reference(twin_state[0], grad, twin_state[1], twin_state[2], s)
        for name, k, r in zip(
            ("param", "exp_avg", "exp_avg_sq"), kernel_state, twin_state, strict=True
        ):
            assert k.dtype == np.float32, name
            np.testing.assert_array_equal(bits(k), bits(r), err_msg=f"{name} at step {t}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"lr{c.lr}-b{c.betas}-wd{c.weight_decay}")
@pytest.mark.parametrize("update", [adamw_kernel, adamw_reference])
@pytest.mark.parametrize("n", [1, 7, 1009, 100003])
def test_matches_float64_textbook_adamw(n, update, cfg):
    """Each float32 rounding is relative to the magnitudes that enter it. p: two
    ulps a step (rounding 1 - lr wd to float32, p * decay, p - update) plus the
    terms of its update; m: the largest |m| or |g| seen; v: v itself. 1e-5 of a
    magnitude is ~80 float32 epsilons."""
    rng = np.random.default_rng(n)
    param = rng.standard_normal(n).astype(np.float32)
    p32, m32, v32 = param.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    p64, m64, v64 = param.astype(np.float64), np.zeros(n), np.zeros(n)
    beta1, beta2 = cfg.betas
    p_budget, m_scale = np.zeros(n), np.zeros(n)
    for t in range(1, STEPS + 1):
        grad = draw_grad(rng, n)
        update(p32, grad, m32, v32, adamw_scalars(cfg, t))
        m_scale = np.maximum(m_scale, np.maximum(np.abs(m64), np.abs(grad)))
        decay_term = np.abs(p64) * cfg.lr * cfg.weight_decay
        textbook_adamw(p64, grad.astype(np.float64), m64, v64, t, cfg)
        denom = np.sqrt(v64) / math.sqrt(1 - beta2**t) + cfg.eps
        step_term = cfg.lr / (1 - beta1**t) * m_scale / denom
        ulp = np.spacing(np.abs(p64).astype(np.float32)).astype(np.float64)
        p_budget += 2 * ulp + 1e-5 * (decay_term + step_term)
        assert np.all(np.abs(v32 - v64) <= 1e-5 * v64), f"exp_avg_sq at step {t}"
        assert np.all(np.abs(m32 - m64) <= 1e-5 * m_scale), f"exp_avg at step {t}"
        assert np.all(np.abs(p32 - p64) <= p_budget), f"param at step {t}"


def test_one_step_by_hand():
    """Step 1 from zero state: m = (1-b1) g, v = (1-b2) g^2, the bias corrections
    cancel them, so p' = p (1 - lr wd) - lr g / (|g| + eps): a step of about lr."""
    cfg = AdamWConfig(lr=0.5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for update in (adamw_kernel, adamw_reference):
        p, g = np.array([1.0, -2.0, 3.0], np.float32), np.array([4.0, -0.25, 0.0], np.float32)
        m, v = np.zeros(3, np.float32), np.zeros(3, np.float32)
        update(p, g, m, v, adamw_scalars(cfg, 1))
        np.testing.assert_allclose(p, [0.5, -1.5, 3.0], rtol=1e-6)


def test_kernel_writes_only_its_views():
    """The shard is a view into a bigger buffer; its neighbours stay untouched."""
    cfg = AdamWConfig(lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(0)
    buffers = [rng.standard_normal(31).astype(np.float32) for _ in range(4)]
    buffers[3] = np.abs(buffers[3])  # v >= 0
    before = [b.copy() for b in buffers]
    adamw_kernel(*(b[5:18] for b in buffers), adamw_scalars(cfg, 3))
    for i, (b, old) in enumerate(zip(buffers, before, strict=True)):
        np.testing.assert_array_equal(bits(b[:5]), bits(old[:5]))
        np.testing.assert_array_equal(bits(b[18:]), bits(old[18:]))
        changed = not np.array_equal(b[5:18], old[5:18])
        assert changed == (i != 1)  # the gradient (1) is read, never written


def good_shard(n: int = 7) -> list[np.ndarray]:
    return [np.zeros(n, np.float32) for _ in range(4)]


@pytest.mark.parametrize(
    "position, bad",
    [
        (0, np.zeros(7, np.float64)),
        (1, np.zeros(7, np.float64)),
        (2, np.zeros(7, np.float16)),
        (3, np.zeros((7, 1), np.float32)),
        (0, np.zeros((1, 7), np.float32)),
        (1, np.zeros(6, np.float32)),
        (3, np.zeros(8, np.float32)),
        (2, np.zeros(14, np.float32)[::2]),
    ],
    ids=["param64", "grad64", "m16", "v2d", "param2d", "grad-short", "v-long", "m-strided"],
)
def test_kernel_rejects_bad_arrays(position, bad):
    arrays = good_shard()
    arrays[position] = bad
    with pytest.raises(ValueError, match="1-D contiguous float32"):
        adamw_kernel(*arrays, adamw_scalars(AdamWConfig(), 1))


@pytest.mark.parametrize("step", [0, -1])
def test_scalars_count_steps_from_one(step):
    with pytest.raises(ValueError, match=f"step={step}"):
        adamw_scalars(AdamWConfig(), step)


def test_scalars_are_float32_and_follow_the_formula():
    cfg = AdamWConfig(lr=2e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)
    s = adamw_scalars(cfg, 3)
    assert isinstance(s, AdamWScalars)
    for name in AdamWScalars.__dataclass_fields__:
        expected = bool if name == "lerp_from_end" else np.float32
        assert type(getattr(s, name)) is expected, name
    assert (
        s.lerp_from_end is False and adamw_scalars(AdamWConfig(betas=(0.3, 0.9)), 1).lerp_from_end
    )
    assert s.decay == np.float32(1 - 2e-3 * 0.05)
    assert s.step_size == np.float32(2e-3 / (1 - 0.8**3))
    assert s.bias_correction2_sqrt == np.float32(math.sqrt(1 - 0.99**3))
    assert (s.one_minus_beta1, s.beta2, s.one_minus_beta2) == tuple(
        np.float32(x) for x in (1 - 0.8, 0.99, 1 - 0.99)
    )
    assert s.eps == np.float32(1e-7)


def test_with_lr_overrides_only_the_learning_rate():
    cfg = AdamWConfig(lr=1e-3, weight_decay=0.2)
    assert with_lr(cfg, None) is cfg
    assert with_lr(cfg, 5e-4) == AdamWConfig(lr=5e-4, weight_decay=0.2)
    assert cfg.lr == 1e-3


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"lr": -1e-3}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"lr": float("inf")}, "lr"),
        ({"betas": (1.0, 0.999)}, r"betas\[0\]"),
        ({"betas": (-0.1, 0.999)}, r"betas\[0\]"),
        ({"betas": (0.9, 1.0)}, r"betas\[1\]"),
        ({"betas": (0.9, float("nan"))}, r"betas\[1\]"),
        ({"betas": (0.9, 0.99, 0.9)}, "betas"),
        ({"eps": 0.0}, "eps"),
        ({"eps": -1e-8}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"weight_decay": float("nan")}, "weight_decay"),
    ],
)
def test_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        AdamWConfig(**kwargs)


def test_config_rejects_scalar_betas_with_value_error():
    with pytest.raises(ValueError, match="^betas="):
        AdamWConfig(betas=0.9)


def test_config_accepts_edges():
    cfg = AdamWConfig(lr=0, betas=[0, 0], eps=1e-30, weight_decay=0)
    assert cfg.betas == (0.0, 0.0) and isinstance(cfg.betas, tuple)


def test_beta1_zero_makes_m_equal_g_exactly_as_torch_lerp_does():
    """torch evaluates lerp(m, g, w) as g - (g - m)(1 - w) when w >= 0.5; with
    beta1 = 0 (w = 1) that is g exactly, even next to a huge m."""
    s = adamw_scalars(AdamWConfig(betas=(0.0, 0.9)), 1)
    for update in (adamw_reference, adamw_kernel):
        p, g = np.zeros(3, np.float32), np.array([1.0, -2.0, 3.0], np.float32)
        m, v = np.full(3, 1e8, np.float32), np.zeros(3, np.float32)
        update(p, g, m, v, s)
        assert np.array_equal(m, g)


def lerp_from_start(m: np.ndarray, g: np.ndarray, w: np.float32) -> np.ndarray:
    """torch's lerp(m, g, w) for |w| < 0.5, in float32."""
    return m + w * (g - m)


def lerp_from_end(m: np.ndarray, g: np.ndarray, w: np.float32) -> np.ndarray:
    """torch's lerp(m, g, w) for |w| >= 0.5, in float32."""
    return g - (g - m) * (np.float32(1) - w)


@pytest.mark.parametrize(
    "beta1, from_end",
    [
        (0.5, True),  # w = 0.5 exactly: torch takes the from-end branch
        (0.5 + 2**-24, False),  # w = 0.5 - 2^-24, the float32 just below 0.5
        (0.5 - 2**-24, True),  # w = 0.5 + 2^-24, the float32 just above 0.5
    ],
)
@pytest.mark.parametrize("update", [adamw_kernel, adamw_reference])
def test_lerp_branch_at_the_half_boundary(update, beta1, from_end):
    """torch.lerp switches formula at |w| >= 0.5 (w = 1 - beta1, in float32); the two
    formulas round differently, so taking the wrong one at beta1 = 0.5 is a last-bit
    difference only inputs where they disagree can show."""
    s = adamw_scalars(AdamWConfig(lr=1e-3, betas=(beta1, 0.999), weight_decay=0.0), 1)
    w = np.float32(1.0 - beta1)
    assert s.one_minus_beta1 == w and s.lerp_from_end is from_end
    rng = np.random.default_rng(0)
    m = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-4, 4, 4096)).astype(np.float32)
    g = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-4, 4, 4096)).astype(np.float32)
    start, end = lerp_from_start(m, g, w), lerp_from_end(m, g, w)
    differ = bits(start) != bits(end)
    assert differ.sum() > 100  # the inputs can tell the branches apart
    m, g = m[differ], g[differ]
    exp_avg = m.copy()
    update(np.zeros_like(m), g, exp_avg, np.zeros_like(m), s)
    expected = lerp_from_end(m, g, w) if from_end else lerp_from_start(m, g, w)
    np.testing.assert_array_equal(bits(exp_avg), bits(expected))
