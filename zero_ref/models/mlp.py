"""The makemore-style character MLP: embed a window of characters, one tanh
hidden layer, logits for the next character (Bengio et al. 2003).

Three units, so ZeRO stage 3 has three parameter groups to gather and free in
turn: embed -> hidden -> output. Shapes: B batch, K context, E d_embed,
H d_hidden, V vocab_size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from zero_ref.models import layers
from zero_ref.models.unit import ParamSpec
from zero_ref.numerics.array_module import array_module


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of the character MLP; every field must be a positive int."""

    vocab_size: int
    context: int = 8
    d_embed: int = 16
    d_hidden: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "d_embed", "d_hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"MLPConfig.{name} = {value!r} is not allowed: it must be a positive int"
                )


def _normal(std: float) -> str:
    """The ParamSpec init string for N(0, std^2)."""
    return f"normal:{std:.6g}"


class Embedding:
    """Look up each context character's vector and concatenate them."""

    name = "embed"

    def __init__(self, config: MLPConfig):
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        c = self.config
        return [ParamSpec("table", (c.vocab_size, c.d_embed), "normal:1.0")]

    def forward(
        self, params: Mapping[str, np.ndarray], ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """ids (B, K) int -> (B, K*E); the cache is the ids themselves."""
        emb = layers.embedding_forward(ids, params["table"])  # (B, K, E)
        return emb.reshape(ids.shape[0], -1), ids

    def backward(
        self,
        params: Mapping[str, np.ndarray],
        ids: np.ndarray,
        dout: np.ndarray,
        grads: Mapping[str, np.ndarray],
    ) -> None:
        """Scatter dout (B, K*E) back into the table rows; ids have no gradient."""
        d_embed = params["table"].shape[1]
        layers.embedding_backward(ids, dout.reshape(*ids.shape, d_embed), grads["table"])
        return None


class Hidden:
    """h = tanh(x @ W + b): the one nonlinearity of the model."""

    name = "hidden"

    def __init__(self, config: MLPConfig):
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        c = self.config
        fan_in = c.context * c.d_embed
        # std 1/sqrt(fan_in) keeps the pre-activations near unit variance, since
        # the embedding rows are themselves drawn with unit variance.
        return [
            ParamSpec("weight", (fan_in, c.d_hidden), _normal(1 / math.sqrt(fan_in))),
            ParamSpec("bias", (c.d_hidden,), "zeros"),
        ]

    def forward(
        self, params: Mapping[str, np.ndarray], x: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """x (B, K*E) -> h (B, H); the cache keeps x and h (tanh' needs only h)."""
        z = layers.linear_forward(x, params["weight"], params["bias"])
        h = array_module(z).tanh(z)
        return h, (x, h)

    def backward(
        self,
        params: Mapping[str, np.ndarray],
        cache: tuple[np.ndarray, np.ndarray],
        dout: np.ndarray,
        grads: Mapping[str, np.ndarray],
    ) -> np.ndarray:
        """Write d weight, d bias; return dx (B, K*E)."""
        x, h = cache
        dpre = layers.tanh_backward(h, dout)  # (B, H)
        return layers.linear_backward(x, params["weight"], dpre, grads["weight"], grads["bias"])


class Output:
    """logits = h @ W + b, one score per vocabulary character."""

    name = "output"

    def __init__(self, config: MLPConfig):
        self.config = config

    def param_specs(self) -> list[ParamSpec]:
        c = self.config
        # Small weights make the first logits nearly equal, so the initial loss
        # is close to log(V) instead of confidently wrong.
        return [
            ParamSpec("weight", (c.d_hidden, c.vocab_size), _normal(0.1 / math.sqrt(c.d_hidden))),
            ParamSpec("bias", (c.vocab_size,), "zeros"),
        ]

    def forward(
        self, params: Mapping[str, np.ndarray], h: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """h (B, H) -> logits (B, V); the cache is h."""
        return layers.linear_forward(h, params["weight"], params["bias"]), h

    def backward(
        self,
        params: Mapping[str, np.ndarray],
        h: np.ndarray,
        dout: np.ndarray,
        grads: Mapping[str, np.ndarray],
    ) -> np.ndarray:
        """Write d weight, d bias; return dh (B, H)."""
        return layers.linear_backward(h, params["weight"], dout, grads["weight"], grads["bias"])


class CharMLP:
    """The model: units in forward order and the next-character loss."""

    def __init__(self, config: MLPConfig):
        self.config = config
        self.units = [Embedding(config), Hidden(config), Output(config)]

    def loss(self, logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy of logits (B, V) against targets (B,) int, and d/d logits."""
        return layers.cross_entropy(logits, targets)
