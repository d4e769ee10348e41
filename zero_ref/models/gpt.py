"""A small decoder-only GPT (GPT-2 layout, pre-LN, untied head) as ZeRO units.

The model is the unit list [Embeddings, Block * n_layer, Head]; each unit is
one ZeRO-3 gather unit, so stage 3 holds at most one block's full parameters
at a time. The math lives in `transformer.py` and `layers.py`; this file only
names the parameters, wires the residual stream and caches what backward needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from zero_ref.models.layers import (
    LayerNormCache,
    cross_entropy,
    embedding_backward,
    embedding_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
)
from zero_ref.models.transformer import (
    AttentionCache,
    MLPCache,
    attention_backward,
    attention_forward,
    mlp_backward,
    mlp_forward,
)
from zero_ref.models.unit import ParamSpec, Unit, forward_all

Params = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the model. `context` is the longest sequence it can attend over."""

    vocab_size: int
    context: int
    n_layer: int
    n_head: int
    d_model: int

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"GPTConfig.{field.name} = {value!r}: must be a positive int")
        if self.d_model % self.n_head:
            raise ValueError(
                f"GPTConfig.d_model = {self.d_model}: must be divisible by "
                f"n_head = {self.n_head} (a multiple of {self.n_head})"
            )


def param_numel(config: GPTConfig) -> int:
    """Parameter count: V*C + context*C + n_layer*(12*C^2 + 13*C) + 2*C + C*V."""
    V, C = config.vocab_size, config.d_model
    embed = V * C + config.context * C
    block = 12 * C * C + 13 * C  # qkv 3C^2+3C, proj C^2+C, fc 4C^2+4C, proj 4C^2+C, 2 LNs 4C
    head = 2 * C + C * V
    return embed + config.n_layer * block + head


class Embeddings:
    """Token plus learned position embeddings: ids (B, T) int -> (B, T, C)."""

    def __init__(self, config: GPTConfig) -> None:
        self.name = "embed"
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        cfg = self.config
        return [
            ParamSpec("token.weight", (cfg.vocab_size, cfg.d_model), "normal:0.02"),
            ParamSpec("position.weight", (cfg.context, cfg.d_model), "normal:0.01"),
        ]

    def forward(self, params: Params, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _check_ids(ids, self.config)
        T = ids.shape[1]
        tokens = embedding_forward(ids, params["token.weight"])  # (B, T, C)
        return tokens + params["position.weight"][:T], ids  # the ids are the whole cache

    def backward(self, params: Params, ids: np.ndarray, dout: np.ndarray, grads: Params) -> None:
        embedding_backward(ids, dout, grads["token.weight"])
        T = ids.shape[1]
        dpos = grads["position.weight"]
        np.sum(dout, axis=0, out=dpos[:T])  # every sequence shares the position rows
        dpos[T:] = 0  # rows past T were not used by this batch
        return None


class BlockCache(NamedTuple):
    ln1: LayerNormCache
    attn: AttentionCache
    ln2: LayerNormCache
    mlp: MLPCache


class Block:
    """One pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, config: GPTConfig, index: int) -> None:
        self.name = f"block{index}"
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        C = self.config.d_model
        # GPT-2 scales the projections into the residual stream down by depth,
        # so the stream's variance does not grow with n_layer.
        proj = f"normal:{0.02 / math.sqrt(2 * self.config.n_layer)}"
        return [
            ParamSpec("ln1.gain", (C,), "ones"),
            ParamSpec("ln1.bias", (C,), "zeros"),
            ParamSpec("attn.qkv.weight", (C, 3 * C), "normal:0.02"),
            ParamSpec("attn.qkv.bias", (3 * C,), "zeros"),
            ParamSpec("attn.proj.weight", (C, C), proj),
            ParamSpec("attn.proj.bias", (C,), "zeros"),
            ParamSpec("ln2.gain", (C,), "ones"),
            ParamSpec("ln2.bias", (C,), "zeros"),
            ParamSpec("mlp.fc.weight", (C, 4 * C), "normal:0.02"),
            ParamSpec("mlp.fc.bias", (4 * C,), "zeros"),
            ParamSpec("mlp.proj.weight", (4 * C, C), proj),
            ParamSpec("mlp.proj.bias", (C,), "zeros"),
        ]

    def forward(self, p: Params, x: np.ndarray) -> tuple[np.ndarray, BlockCache]:
        h1, ln1 = layernorm_forward(x, p["ln1.gain"], p["ln1.bias"])
        a, attn = attention_forward(
            h1,
            p["attn.qkv.weight"],
            p["attn.qkv.bias"],
            p["attn.proj.weight"],
            p["attn.proj.bias"],
            self.config.n_head,
        )
        x = x + a  # (B, T, C) residual stream
        h2, ln2 = layernorm_forward(x, p["ln2.gain"], p["ln2.bias"])
        m, mlp = mlp_forward(
            h2, p["mlp.fc.weight"], p["mlp.fc.bias"], p["mlp.proj.weight"], p["mlp.proj.bias"]
        )
        return x + m, BlockCache(ln1, attn, ln2, mlp)

    def backward(self, p: Params, cache: BlockCache, dout: np.ndarray, g: Params) -> np.ndarray:
        # The residual passes dout through untouched; each branch adds its own part.
        dh2 = mlp_backward(
            cache.mlp,
            p["mlp.fc.weight"],
            p["mlp.proj.weight"],
            dout,
            g["mlp.fc.weight"],
            g["mlp.fc.bias"],
            g["mlp.proj.weight"],
            g["mlp.proj.bias"],
        )
        dx = dout + layernorm_backward(cache.ln2, p["ln2.gain"], dh2, g["ln2.gain"], g["ln2.bias"])
        dh1 = attention_backward(
            cache.attn,
            p["attn.qkv.weight"],
            p["attn.proj.weight"],
            dx,
            g["attn.qkv.weight"],
            g["attn.qkv.bias"],
            g["attn.proj.weight"],
            g["attn.proj.bias"],
        )
        return dx + layernorm_backward(cache.ln1, p["ln1.gain"], dh1, g["ln1.gain"], g["ln1.bias"])


class Head:
    """Final layer norm and the (untied) LM head: (B, T, C) -> logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        self.name = "head"
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        C, V = self.config.d_model, self.config.vocab_size
        return [
            ParamSpec("ln.gain", (C,), "ones"),
            ParamSpec("ln.bias", (C,), "zeros"),
            ParamSpec("lm_head.weight", (C, V), "normal:0.02"),
        ]

    def forward(self, p: Params, x: np.ndarray) -> tuple[np.ndarray, tuple]:
        h, ln = layernorm_forward(x, p["ln.gain"], p["ln.bias"])  # (B, T, C)
        return linear_forward(h, p["lm_head.weight"], None), (ln, h)

    def backward(self, p: Params, cache: tuple, dout: np.ndarray, g: Params) -> np.ndarray:
        ln, h = cache
        dh = linear_backward(h, p["lm_head.weight"], dout, g["lm_head.weight"], None)
        return layernorm_backward(ln, p["ln.gain"], dh, g["ln.gain"], g["ln.bias"])


class GPT:
    """The unit list [embed, block0 .. block{n-1}, head] and its cross-entropy loss."""

    def __init__(self, config: GPTConfig) -> None:
        self.config = config
        blocks = [Block(config, i) for i in range(config.n_layer)]
        self.units: list[Unit] = [Embeddings(config), *blocks, Head(config)]

    def loss(self, output: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T)."""
        return cross_entropy(output, targets)


def generate(
    model: GPT,
    params: Params,
    prompt_ids: np.ndarray,
    n_new: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
) -> np.ndarray:
    """Sample n_new tokens after prompt_ids (B, T0) from a model whose parameters are
    all in `params`: returns (B, T0 + n_new) ids."""
    forward = lambda ids: forward_all(model, params, ids)  # noqa: E731
    return generate_with(forward, model.config.context, prompt_ids, n_new, rng, temperature)


def generate_with(
    forward: Callable[[np.ndarray], np.ndarray],
    context: int,
    prompt_ids: np.ndarray,
    n_new: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
) -> np.ndarray:
    """generate, given forward(ids (B, T)) -> logits (B, T, V): a sharded engine's
    forward gathers one unit at a time, so no rank needs every parameter.

    Each step reruns the whole (cropped) window, with no key/value cache:
    slow, but it uses exactly the units' training forward.
    """
    if temperature <= 0:
        raise ValueError(f"generate: temperature = {temperature!r}: must be > 0")
    ids = np.asarray(prompt_ids)
    for _ in range(n_new):
        window = ids[:, -context:]  # the model has no positions past context
        logits = forward(window)[:, -1, :]  # (B, V)
        next_ids = _sample(logits.astype(np.float64) / temperature, rng)  # (B,)
        ids = np.concatenate([ids, next_ids[:, None].astype(ids.dtype)], axis=1)
    return ids


def _sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One id per row of logits (B, V), drawn from their softmax by inverse CDF."""
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    cdf = np.cumsum(probs, axis=-1)  # (B, V)
    u = rng.random((logits.shape[0], 1)) * cdf[:, -1:]  # scale instead of normalizing
    return np.minimum((cdf <= u).sum(axis=-1), logits.shape[-1] - 1)


def _check_ids(ids: np.ndarray, config: GPTConfig) -> None:
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"Embeddings: ids must be int (B, T), got {ids.dtype} {ids.shape}")
    if ids.shape[1] > config.context:
        raise ValueError(f"Embeddings: T = {ids.shape[1]} exceeds context = {config.context}")
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ValueError(f"Embeddings: ids must lie in [0, {config.vocab_size})")
