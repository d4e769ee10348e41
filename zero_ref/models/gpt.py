"""A small decoder-only GPT (GPT-2 layout, pre-LN, untied head) as ZeRO units.

The model is the unit list [Embeddings, (AttentionBranch, MLPBranch) * n_layer,
Head]; each unit is one ZeRO-3 gather unit, so stage 3 holds at most one
branch's full parameters at a time (the MLP's 8C^2, two thirds of a block).
The math lives in `transformer.py` and `layers.py`; this file only names the
parameters, connects the residual stream and caches what backward needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

import numpy as np

from zero_ref.models.layers import (
    cross_entropy,
    embedding_backward,
    embedding_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
    sum_rows_into,
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
        sum_rows_into(dout, dpos[:T])  # every sequence shares the position rows
        dpos[T:] = 0  # rows past T were not used by this batch
        return None


class ResidualBranch:
    """One pre-LN residual branch: x + f(ln(x)). A GPT block is two of them,
    attention then MLP, and each is its own ZeRO-3 gather unit: stage 3 then
    holds one branch's parameters at a time (at most 8C^2, the MLP's), not a
    whole block's 12C^2. DeepSpeed gathers per submodule for the same reason.

    Subclasses name their parameters after the layer norm's and implement
    `branch_forward(p, h) -> (y, cache)` and `branch_backward(p, cache, dy, g) -> dh`.
    """

    def __init__(self, config: GPTConfig, index: int, kind: str) -> None:
        self.name = f"block{index}.{kind}"
        self.config = config

    def ln_specs(self) -> list[ParamSpec]:
        C = self.config.d_model
        return [ParamSpec("ln.gain", (C,), "ones"), ParamSpec("ln.bias", (C,), "zeros")]

    def proj_init(self) -> str:
        # GPT-2 scales the projections into the residual stream down by depth,
        # so the stream's variance does not grow with n_layer.
        return f"normal:{0.02 / math.sqrt(2 * self.config.n_layer)}"

    def forward(self, p: Params, x: np.ndarray) -> tuple[np.ndarray, tuple]:
        h, ln = layernorm_forward(x, p["ln.gain"], p["ln.bias"])
        y, cache = self.branch_forward(p, h)
        return x + y, (ln, cache)  # (B, T, C) residual stream

    def backward(self, p: Params, cache: tuple, dout: np.ndarray, g: Params) -> np.ndarray:
        ln, branch = cache
        dh = self.branch_backward(p, branch, dout, g)
        # The residual passes dout through untouched; the branch adds its own part.
        return dout + layernorm_backward(ln, p["ln.gain"], dh, g["ln.gain"], g["ln.bias"])


class AttentionBranch(ResidualBranch):
    """x + attn(ln(x)): causal multi-head self-attention, 4C^2 + 7C parameters."""

    def __init__(self, config: GPTConfig, index: int) -> None:
        super().__init__(config, index, "attn")

    def param_specs(self) -> list[ParamSpec]:
        C = self.config.d_model
        return [
            *self.ln_specs(),
            ParamSpec("qkv.weight", (C, 3 * C), "normal:0.02"),
            ParamSpec("qkv.bias", (3 * C,), "zeros"),
            ParamSpec("proj.weight", (C, C), self.proj_init()),
            ParamSpec("proj.bias", (C,), "zeros"),
        ]

    def branch_forward(self, p: Params, h: np.ndarray) -> tuple[np.ndarray, AttentionCache]:
        return attention_forward(
            h,
            p["qkv.weight"],
            p["qkv.bias"],
            p["proj.weight"],
            p["proj.bias"],
            self.config.n_head,
        )

    def branch_backward(
        self, p: Params, cache: AttentionCache, dy: np.ndarray, g: Params
    ) -> np.ndarray:
        return attention_backward(
            cache,
            p["qkv.weight"],
            p["proj.weight"],
            dy,
            g["qkv.weight"],
            g["qkv.bias"],
            g["proj.weight"],
            g["proj.bias"],
        )


class MLPBranch(ResidualBranch):
    """x + mlp(ln(x)): C -> 4C -> GELU -> C, 8C^2 + 7C parameters."""

    def __init__(self, config: GPTConfig, index: int) -> None:
        super().__init__(config, index, "mlp")

    def param_specs(self) -> list[ParamSpec]:
        C = self.config.d_model
        return [
            *self.ln_specs(),
            ParamSpec("fc.weight", (C, 4 * C), "normal:0.02"),
            ParamSpec("fc.bias", (4 * C,), "zeros"),
            ParamSpec("proj.weight", (4 * C, C), self.proj_init()),
            ParamSpec("proj.bias", (C,), "zeros"),
        ]

    def branch_forward(self, p: Params, h: np.ndarray) -> tuple[np.ndarray, MLPCache]:
        return mlp_forward(h, p["fc.weight"], p["fc.bias"], p["proj.weight"], p["proj.bias"])

    def branch_backward(self, p: Params, cache: MLPCache, dy: np.ndarray, g: Params) -> np.ndarray:
        return mlp_backward(
            cache,
            p["fc.weight"],
            p["proj.weight"],
            dy,
            g["fc.weight"],
            g["fc.bias"],
            g["proj.weight"],
            g["proj.bias"],
        )


def block(config: GPTConfig, index: int) -> list[Unit]:
    """Transformer block `index` (pre-LN): its attention branch, then its MLP branch."""
    return [AttentionBranch(config, index), MLPBranch(config, index)]


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
    """The unit list [embed, block0.attn, block0.mlp, .., head] and its cross-entropy loss."""

    def __init__(self, config: GPTConfig) -> None:
        self.config = config
        blocks = [unit for i in range(config.n_layer) for unit in block(config, i)]
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
