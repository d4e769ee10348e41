"""Tests of the GPT units: fast kernels against their twins, finite-difference
gradients, causality, determinism, config, sampling."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from zero_ref.models import layers
from zero_ref.models.gpt import (
    GPT,
    AttentionBranch,
    Embeddings,
    GPTConfig,
    Head,
    MLPBranch,
    generate,
    param_numel,
)
from zero_ref.models.layers import (
    gelu_backward,
    gelu_forward,
    layernorm_backward,
    layernorm_forward,
)
from zero_ref.models.transformer import (
    attention_backward,
    attention_forward,
    causal_softmax,
    causal_softmax_backward,
    causal_softmax_backward_reference,
    causal_softmax_reference,
)
from zero_ref.models.unit import (
    ParamSpec,
    forward_all,
    init_params,
    loss_and_grads,
    unit_params_view,
)
from zero_ref.testing.gradcheck import check_unit_backward, unit_params64

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
        y, gate = gelu_forward(x)
        return y, (x, gate)

    def backward(self, p, cache, dout, g):
        x, gate = cache
        return gelu_backward(x, gate, dout)


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


# --- fast kernels against their NumPy twins, element by element ---------------

AWKWARD = [0, 1, 7, 131]  # empty, one, a prime below and above a SIMD width
DTYPES_RTOL = [(np.float32, 2e-5), (np.float64, 1e-12)]


def _awkward(shape, dtype, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("n", AWKWARD)
@pytest.mark.parametrize("dtype, rtol", DTYPES_RTOL)
def test_gelu_matches_tanh_formula(n, dtype, rtol):
    x, dy = _awkward(n, dtype), _awkward(n, dtype, seed=1)
    y, s = gelu_forward(x)
    dx = gelu_backward(x, s, dy)
    y_ref, s_ref = layers.gelu_forward_reference(x)
    dx_ref = layers.gelu_backward_reference(x, s_ref, dy)
    assert y.dtype == s.dtype == dx.dtype == dtype
    # The twin's 1 + tanh(u) cancels for negative x: it is off by about eps * |x|.
    atol = 4 * np.finfo(dtype).eps * max(1.0, np.abs(x).max(initial=0))
    np.testing.assert_allclose(y, y_ref, rtol=rtol, atol=atol)
    np.testing.assert_allclose(s, s_ref, rtol=rtol, atol=atol)
    np.testing.assert_allclose(dx, dx_ref, rtol=rtol, atol=atol * np.abs(dy).max(initial=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_far_tails(dtype):
    """exp(-2u) overflows for x below about -10 (float32): quietly, to the right limit."""
    x = np.array([-1e4, -200, -12, -10, -8, 8, 10, 12, 200, 1e4], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, s = gelu_forward(x)
        dx = gelu_backward(x, s, np.ones_like(x))
    x64 = x.astype(np.float64)  # 1 + tanh(u) = 2 / (1 + exp(-2u)), without tanh's cancellation
    with np.errstate(over="ignore"):
        y_true = x64 / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    rtol = 1e-5 if dtype == np.float32 else 1e-12  # exp(-2u) of a rounded -2u, |2u| ~ 50
    np.testing.assert_allclose(y, y_true, rtol=rtol, atol=1e-37)
    assert np.all((s >= 0) & (s <= 1)) and np.all(np.isfinite(dx))
    np.testing.assert_allclose(dx, (x > 0).astype(dtype), atol=1e-6)  # slope 0, then 1


@pytest.mark.parametrize("n", AWKWARD)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_backward_is_bitwise_add_at(n, dtype):
    ids = np.random.default_rng(n).integers(0, 5, size=(1, n))  # many repeats
    dout = _awkward((1, n, 7), dtype)
    fast, ref = np.full((6, 7), np.nan, dtype), np.full((6, 7), np.nan, dtype)
    layers.embedding_backward(ids, dout, fast)
    layers.embedding_backward_reference(ids, dout, ref)
    np.testing.assert_array_equal(fast, ref)  # same additions, same order


@pytest.mark.parametrize("rows, C", [(0, 8), (1, 1), (7, 13), (131, 64)])
@pytest.mark.parametrize("dtype, rtol", DTYPES_RTOL)
def test_layernorm_matches_twin(rows, C, dtype, rtol):
    x, dy = _awkward((rows, C), dtype, seed=1), _awkward((rows, C), dtype, seed=2)
    gain, bias = _awkward(C, dtype, seed=3), _awkward(C, dtype, seed=4)
    y, cache = layernorm_forward(x, gain, bias)
    y_ref, cache_ref = layers.layernorm_forward_reference(x, gain, bias)
    for got, want in [(y, y_ref), (cache.xhat, cache_ref.xhat), (cache.rstd, cache_ref.rstd)]:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    grads = [np.full(C, np.nan, dtype) for _ in range(4)]
    dx = layernorm_backward(cache, gain, dy, grads[0], grads[1])
    dx_ref = layers.layernorm_backward_reference(cache_ref, gain, dy, grads[2], grads[3])
    atol = rtol * max(1.0, rows)  # dgain, dbias sum over the rows in another order
    np.testing.assert_allclose(dx, dx_ref, rtol=rtol, atol=atol)
    np.testing.assert_allclose(grads[0], grads[2], rtol=rtol, atol=atol)
    np.testing.assert_allclose(grads[1], grads[3], rtol=rtol, atol=atol)


@pytest.mark.parametrize("T", [1, 2, 7, 64])
@pytest.mark.parametrize("dtype, rtol", DTYPES_RTOL)
def test_causal_softmax_matches_twin(T, dtype, rtol):
    scores, datt = _awkward((2, 3, T, T), dtype, scale=4), _awkward((2, 3, T, T), dtype, seed=1)
    att = causal_softmax(scores.copy(), 0.3)
    att_ref = causal_softmax_reference(scores.copy(), 0.3)
    np.testing.assert_allclose(att, att_ref, rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(att[..., np.triu(np.ones((T, T), bool), k=1)], 0)
    np.testing.assert_allclose(att.sum(axis=-1), 1, rtol=rtol)
    dscores = causal_softmax_backward(att, datt.copy(), 0.3)
    dscores_ref = causal_softmax_backward_reference(att_ref, datt.copy(), 0.3)
    np.testing.assert_allclose(dscores, dscores_ref, rtol=rtol, atol=rtol)


def _attention_by_head(x, qkv_w, qkv_b, proj_w, proj_b, n_head):
    """Causal self-attention written out one sequence and one head at a time."""
    B, T, C = x.shape
    hs = C // n_head
    out = np.empty_like(x)
    for b in range(B):
        q, k, v = np.split(x[b] @ qkv_w + qkv_b, 3, axis=-1)  # (T, C) each
        heads = []
        for h in range(n_head):
            cols = slice(h * hs, (h + 1) * hs)
            scores = q[:, cols] @ k[:, cols].T / math.sqrt(hs)  # (T, T)
            scores[np.triu(np.ones((T, T), bool), k=1)] = -np.inf
            att = np.exp(scores - scores.max(axis=-1, keepdims=True))
            heads.append(att / att.sum(axis=-1, keepdims=True) @ v[:, cols])
        out[b] = np.concatenate(heads, axis=-1) @ proj_w + proj_b
    return out


@pytest.mark.parametrize("T, n_head", [(1, 1), (5, 2), (7, 4)])
def test_attention_matches_per_head_definition(T, n_head):
    unit = AttentionUnit(C=8, n_head=n_head)
    p = unit_params64(unit, seed=0)
    x = _x64(3, T, 8)
    out, _ = unit.forward(p, x)
    want = _attention_by_head(x, p["qkv_w"], p["qkv_b"], p["proj_w"], p["proj_b"], n_head)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_fwd_bwd_is_deterministic():
    model = GPT(GPTConfig(vocab_size=13, context=16, n_layer=2, n_head=4, d_model=32))
    params = init_params(model, seed=0)
    ids, targets = (np.random.default_rng(s).integers(0, 13, size=(3, 16)) for s in (1, 2))
    loss_a, grads_a = loss_and_grads(model, params, ids, targets)
    loss_b, grads_b = loss_and_grads(model, params, ids, targets)
    assert loss_a == loss_b
    for name, g in grads_a.items():
        np.testing.assert_array_equal(g, grads_b[name], err_msg=name)


# --- the GPT units ----------------------------------------------------------


def test_embeddings_gradcheck():
    unit = Embeddings(TINY)
    ids = np.array([[1, 5, 1], [5, 0, 10]])  # repeated ids must accumulate; T < context
    check_unit_backward(unit, ids, unit_params64(unit, seed=0))


@pytest.mark.parametrize("branch", [AttentionBranch, MLPBranch])
@pytest.mark.parametrize("T", [1, 4])
def test_block_gradcheck(T, branch):
    unit = branch(TINY, index=0)
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
    assert [u.name for u in model.units] == [
        "embed",
        "block0.attn",
        "block0.mlp",
        "block1.attn",
        "block1.mlp",
        "head",
    ]


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
