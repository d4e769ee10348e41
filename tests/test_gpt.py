"""Tests of the GPT units: finite-difference gradients, causality, config, sampling."""

from __future__ import annotations

import numpy as np
import pytest

from zero_ref.models.gpt import (
    GPT,
    Block,
    Embeddings,
    GPTConfig,
    Head,
    generate,
    param_numel,
)
from zero_ref.models.gradcheck import check_unit_backward, unit_params64
from zero_ref.models.transformer import (
    attention_backward,
    attention_forward,
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
)
from zero_ref.models.unit import ParamSpec, forward_all, init_params, unit_params_view

TINY = GPTConfig(vocab_size=11, context=4, n_layer=2, n_head=2, d_model=8)


# --- the functional pieces, wrapped as units so gradcheck can drive them -----


class LayerNormUnit:
    name = "layernorm"

    def param_specs(self):
        return [ParamSpec("gain", (8,)), ParamSpec("bias", (8,))]

    def forward(self, p, x):
        return layernorm_forward(x, p["gain"], p["bias"])

    def backward(self, p, cache, dout, g):
        return layernorm_backward(cache, p["gain"], dout, g["gain"], g["bias"])


class GeluUnit:
    name = "gelu"

    def param_specs(self):
        return []

    def forward(self, p, x):
        return gelu_forward(x), x

    def backward(self, p, x, dout, g):
        return gelu_backward(x, dout)


class AttentionUnit:
    name = "attention"

    def __init__(self, C: int, n_head: int):
        self.C, self.n_head = C, n_head

    def param_specs(self):
        C = self.C
        return [
            ParamSpec("qkv_w", (C, 3 * C)),
            ParamSpec("qkv_b", (3 * C,)),
            ParamSpec("proj_w", (C, C)),
            ParamSpec("proj_b", (C,)),
        ]

    def forward(self, p, x):
        return attention_forward(x, p["qkv_w"], p["qkv_b"], p["proj_w"], p["proj_b"], self.n_head)

    def backward(self, p, cache, dout, g):
        return attention_backward(
            cache, p["qkv_w"], p["proj_w"], dout, g["qkv_w"], g["qkv_b"], g["proj_w"], g["proj_b"]
        )


def _x64(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _ids(B: int, T: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, size=(B, T))


def test_layernorm_gradcheck():
    unit = LayerNormUnit()
    check_unit_backward(unit, _x64(2, 3, 8), unit_params64(unit, seed=0))


def test_gelu_gradcheck():
    check_unit_backward(GeluUnit(), _x64(2, 3, 8) * 2, {})


@pytest.mark.parametrize("T, n_head", [(1, 2), (4, 1), (4, 2), (3, 4)])
def test_attention_gradcheck(T, n_head):
    unit = AttentionUnit(C=8, n_head=n_head)
    check_unit_backward(unit, _x64(2, T, 8), unit_params64(unit, seed=0))


# --- the GPT units ----------------------------------------------------------


def test_embeddings_gradcheck():
    unit = Embeddings(TINY)
    ids = np.array([[1, 5, 1], [5, 0, 10]])  # repeated ids must accumulate; T < context
    check_unit_backward(unit, ids, unit_params64(unit, seed=0))


@pytest.mark.parametrize("T", [1, 4])
def test_block_gradcheck(T):
    unit = Block(TINY, index=0)
    check_unit_backward(unit, _x64(2, T, 8), unit_params64(unit, seed=0))


def test_head_gradcheck():
    unit = Head(TINY)
    check_unit_backward(unit, _x64(2, 3, 8), unit_params64(unit, seed=0))


def _loss_full(model, params, ids, targets) -> float:
    return model.loss(forward_all(model, params, ids), targets)[0]


def _grads_full(model, params, ids, targets) -> dict[str, np.ndarray]:
    """Forward through every unit, then backward in reverse, as the engine does."""
    x, caches = ids, []
    for unit in model.units:
        x, cache = unit.forward(unit_params_view(unit, params), x)
        caches.append(cache)
    _, dx = model.loss(x, targets)
    grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
    for unit, cache in zip(reversed(model.units), reversed(caches), strict=True):
        dx = unit.backward(unit_params_view(unit, params), cache, dx, unit_params_view(unit, grads))
    assert dx is None
    return grads


def test_whole_model_gradients_match_finite_differences():
    model = GPT(TINY)
    params = {k: v.astype(np.float64) * 10 for k, v in init_params(model, seed=3).items()}
    params = {k: v + 0.1 * _x64(*v.shape, seed=i) for i, (k, v) in enumerate(params.items())}
    ids, targets = _ids(2, 4), _ids(2, 4, seed=5)
    grads = _grads_full(model, params, ids, targets)
    eps = 1e-6
    for name, value in params.items():
        numeric = np.zeros_like(value)
        flat = value.reshape(-1)
        for i in range(flat.size):
            orig = flat[i]
            flat[i] = orig + eps
            up = _loss_full(model, params, ids, targets)
            flat[i] = orig - eps
            down = _loss_full(model, params, ids, targets)
            flat[i] = orig
            numeric.reshape(-1)[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_float32_stays_float32():
    model = GPT(TINY)
    params = init_params(model, seed=0)
    ids, targets = _ids(2, 4), _ids(2, 4, seed=5)
    assert forward_all(model, params, ids).dtype == np.float32
    grads = _grads_full(model, params, ids, targets)
    assert all(g.dtype == np.float32 and np.all(np.isfinite(g)) for g in grads.values())


def test_causal_mask_holds():
    model = GPT(TINY)
    params = {k: v * 20 for k, v in init_params(model, seed=0).items()}  # make attention sharp
    ids = _ids(2, 4)
    changed = ids.copy()
    changed[:, 2] = (changed[:, 2] + 1) % TINY.vocab_size
    before, after = forward_all(model, params, ids), forward_all(model, params, changed)
    np.testing.assert_array_equal(before[:, :2], after[:, :2])
    assert not np.allclose(before[:, 2:], after[:, 2:])


def test_param_count_formula():
    model = GPT(TINY)
    assert param_numel(TINY) == sum(s.numel for u in model.units for s in u.param_specs())
    assert [u.name for u in model.units] == ["embed", "block0", "block1", "head"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vocab_size": 0}, "vocab_size = 0"),
        ({"context": -1}, "context = -1"),
        ({"n_layer": 1.5}, "n_layer = 1.5"),
        ({"n_head": True}, "n_head = True"),
        ({"n_head": 3}, "d_model = 8: must be divisible by n_head = 3"),
    ],
)
def test_config_validation(kwargs, message):
    fields = {"vocab_size": 11, "context": 4, "n_layer": 2, "n_head": 2, "d_model": 8}
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**fields, **kwargs})


def test_embeddings_reject_bad_ids():
    params = init_params(GPT(TINY), seed=0)
    unit = Embeddings(TINY)
    with pytest.raises(ValueError, match="exceeds context"):
        unit.forward(unit_params_view(unit, params), np.zeros((1, 5), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        unit.forward(unit_params_view(unit, params), np.full((1, 2), 11))


def test_generate_length_and_range():
    model = GPT(TINY)
    params = init_params(model, seed=0)
    prompt = _ids(2, 3)
    out = generate(model, params, prompt, n_new=6, rng=np.random.default_rng(0))
    assert out.shape == (2, 9)  # runs past the 4-token context by cropping
    np.testing.assert_array_equal(out[:, :3], prompt)
    assert out.min() >= 0 and out.max() < TINY.vocab_size


def test_generate_low_temperature_is_greedy():
    model = GPT(TINY)
    params = {k: v * 10 for k, v in init_params(model, seed=0).items()}
    prompt = _ids(2, 2)
    out = generate(model, params, prompt, n_new=1, rng=np.random.default_rng(0), temperature=1e-4)
    greedy = forward_all(model, params, prompt)[:, -1].argmax(axis=-1)
    np.testing.assert_array_equal(out[:, -1], greedy)
