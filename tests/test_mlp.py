"""The character MLP: config checks, per-unit and whole-model gradient checks,
and a short SGD run whose loss must fall."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from zero_ref.app.data import encode_corpus, micro_batches
from zero_ref.models import layers
from zero_ref.models.mlp import CharMLP, Embedding, Hidden, MLPConfig, Output
from zero_ref.models.unit import full_name, init_params, named_shapes
from zero_ref.testing.gradcheck import check_unit_backward, unit_params64

TINY = MLPConfig(vocab_size=7, context=3, d_embed=4, d_hidden=5)


def local(params: dict[str, np.ndarray], unit) -> dict[str, np.ndarray]:
    """The unit's slice of a global-name parameter dict, keyed by local names."""
    return {s.name: params[full_name(unit, s)] for s in unit.param_specs()}


def loss_and_grads(model: CharMLP, params, inputs, targets, grads=None):
    """Forward through every unit, the loss, then backward in reverse order."""
    x, caches = inputs, []
    for unit in model.units:
        x, cache = unit.forward(local(params, unit), x)
        caches.append(cache)
    loss, dx = model.loss(x, targets)
    if grads is None:
        grads = {k: np.full_like(v, np.nan) for k, v in params.items()}
    for unit, cache in zip(reversed(model.units), reversed(caches), strict=True):
        dx = unit.backward(local(params, unit), cache, dx, local(grads, unit))
    assert dx is None, "the embedding has no input gradient"
    return loss, grads


@pytest.mark.parametrize(
    "field, value",
    [("vocab_size", 0), ("context", -1), ("d_embed", 2.0), ("d_hidden", True)],
)
def test_config_rejects_non_positive_ints(field, value):
    kwargs = {"vocab_size": 5, field: value}
    with pytest.raises(ValueError, match=rf"MLPConfig\.{field} = .*positive int"):
        MLPConfig(**kwargs)


def test_param_names_shapes_and_init():
    cfg = MLPConfig(vocab_size=11, context=4, d_embed=3, d_hidden=9)
    model = CharMLP(cfg)
    assert [u.name for u in model.units] == ["embed", "hidden", "output"]
    assert named_shapes(model) == [
        ("embed.table", (11, 3)),
        ("hidden.weight", (12, 9)),
        ("hidden.bias", (9,)),
        ("output.weight", (9, 11)),
        ("output.bias", (11,)),
    ]
    hidden_w = model.units[1].param_specs()[0]
    assert float(hidden_w.init.split(":")[1]) == pytest.approx(1 / math.sqrt(12), rel=1e-5)
    params = init_params(model, seed=0)
    assert all(v.dtype == np.float32 for v in params.values())
    assert not params["hidden.bias"].any() and not params["output.bias"].any()


def test_forward_shapes():
    model = CharMLP(TINY)
    params = init_params(model, seed=1)
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, size=(6, TINY.context))
    x = ids
    shapes = []
    for unit in model.units:
        x, _ = unit.forward(local(params, unit), x)
        shapes.append(x.shape)
    assert shapes == [(6, 12), (6, 5), (6, 7)]


def test_initial_loss_is_near_uniform():
    cfg = MLPConfig(vocab_size=50, context=4)
    model = CharMLP(cfg)
    params = init_params(model, seed=0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(64, 4))
    loss, _ = loss_and_grads(model, params, ids, rng.integers(0, 50, size=64))
    assert abs(loss - math.log(50)) < 0.1


@pytest.mark.parametrize("seed", [0, 1])
def test_embedding_gradcheck(seed):
    unit = Embedding(TINY)
    # Repeated ids in the batch check that their gradients accumulate.
    ids = np.random.default_rng(seed).integers(0, 3, size=(4, TINY.context))
    check_unit_backward(unit, ids, unit_params64(unit, seed), seed=seed)


@pytest.mark.parametrize("batch", [0, 1, 7, 64])
def test_embedding_backward_is_bitwise_add_at(batch):
    """The scatter-add kernel the Embedding unit uses adds exactly as np.add.at does."""
    unit = Embedding(MLPConfig(vocab_size=5, context=3, d_embed=7))
    rng = np.random.default_rng(batch)
    ids = rng.integers(0, 5, size=(batch, 3))  # 5 ids, many repeats
    dout = rng.standard_normal((batch, 3 * 7)).astype(np.float32)
    table = np.zeros((5, 7), np.float32)
    grads = {"table": np.full_like(table, np.nan)}
    unit.backward({"table": table}, ids, dout, grads)
    want = np.full_like(table, np.nan)
    layers.embedding_backward_reference(ids, dout.reshape(batch, 3, 7), want)
    np.testing.assert_array_equal(grads["table"], want)


@pytest.mark.parametrize("unit_cls, width", [(Hidden, 12), (Output, 5)])
def test_linear_units_gradcheck(unit_cls, width):
    unit = unit_cls(TINY)
    x = np.random.default_rng(3).standard_normal((4, width))
    check_unit_backward(unit, x, unit_params64(unit, seed=4), seed=5)


def test_whole_model_matches_finite_differences():
    model = CharMLP(TINY)
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(v.shape) * 0.5 for k, v in init_params(model, 0).items()}
    ids = rng.integers(0, TINY.vocab_size, size=(5, TINY.context))
    targets = rng.integers(0, TINY.vocab_size, size=5)
    _, grads = loss_and_grads(model, params, ids, targets)
    eps = 1e-6
    for name, value in params.items():
        flat, numeric = value.reshape(-1), np.zeros(value.size)
        for i in range(flat.size):
            orig = flat[i]
            flat[i] = orig + eps
            up = loss_and_grads(model, params, ids, targets)[0]
            flat[i] = orig - eps
            down = loss_and_grads(model, params, ids, targets)[0]
            flat[i] = orig
            numeric[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(
            grads[name].reshape(-1), numeric, rtol=1e-5, atol=1e-8, err_msg=name
        )


def test_backward_overwrites_stale_gradients():
    model = CharMLP(TINY)
    params = init_params(model, seed=2)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, TINY.vocab_size, size=(4, TINY.context))
    targets = rng.integers(0, TINY.vocab_size, size=4)
    _, clean = loss_and_grads(model, params, ids, targets)
    stale = {k: np.full_like(v, 123.0) for k, v in params.items()}
    _, again = loss_and_grads(model, params, ids, targets, grads=stale)
    assert again is stale
    for name in params:
        np.testing.assert_array_equal(again[name], clean[name], err_msg=name)


def test_sgd_makes_the_loss_fall():
    start = time.perf_counter()
    text = "the quick brown fox jumps over the lazy dog. " * 40
    vocab, tokens = encode_corpus(text)
    cfg = MLPConfig(vocab_size=vocab.size, context=4, d_embed=8, d_hidden=64)
    model = CharMLP(cfg)
    params = init_params(model, seed=0)
    losses = []
    for step in range(50):
        inputs, targets = micro_batches(tokens, cfg.context, 32, 1, 1, step, seed=0)
        loss, grads = loss_and_grads(model, params, inputs[0, 0], targets[0, 0])
        losses.append(loss)
        for name, g in grads.items():
            params[name] -= 0.5 * g
    first, last = losses[0], np.mean(losses[-5:])
    assert first == pytest.approx(math.log(vocab.size), abs=0.1)
    # The text repeats one sentence, so a 4-character window nearly fixes the next.
    assert last < 0.3 * first, f"loss went {first:.3f} -> {last:.3f}"
    assert time.perf_counter() - start < 3.0
