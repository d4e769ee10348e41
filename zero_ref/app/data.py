"""The character corpus and its deterministic batching (no MPI here).

Data parallelism in ZeRO means every rank sees a different micro-batch. Here
each optimizer step's micro-batches for *all* ranks are drawn from one
generator seeded by (seed, step), so any process -- in particular the
single-rank oracle that replays the whole world -- can rebuild exactly what
rank r saw at micro-step i. Shapes: k grad_accum micro-steps, W world size,
b micro-batch size, K context window, T sequence length.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


def default_text() -> str:
    """The Python language reference shipped with CPython (~465k characters).

    Joined in sorted key order so that every machine builds the same corpus.
    """
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics))


def load_text(path: str | os.PathLike[str] | None) -> str:
    """Read a UTF-8 text corpus; None means `default_text()`.

    Raises FileNotFoundError if the path is missing, ValueError if it is not a
    regular file, is empty, holds NUL bytes (binary) or is not valid UTF-8.
    """
    if path is None:
        return default_text()
    if not os.path.exists(path):
        raise FileNotFoundError(f"corpus file {os.fspath(path)!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"corpus path {os.fspath(path)!r} is not a regular file")
    with open(path, "rb") as f:
        raw = f.read()
    return _decode_corpus(raw, os.fspath(path))


def _decode_corpus(raw: bytes, where: str) -> str:
    if not raw:
        raise ValueError(f"corpus file {where!r} is empty (0 bytes)")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ValueError(
            f"corpus file {where!r} looks binary: it contains a NUL byte at offset {nul}"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"corpus file {where!r} is not UTF-8 text: invalid byte at offset {exc.start}"
        ) from None


ENCODE_CHUNK = 1 << 18  # characters encoded at a time


@dataclass(frozen=True)
class CharVocab:
    """A character-level vocabulary: token id i is the i-th of the sorted `chars`."""

    chars: str
    _codepoints: np.ndarray = field(init=False, repr=False, compare=False)  # (V,) sorted

    def __post_init__(self) -> None:
        if not self.chars:
            raise ValueError("CharVocab.chars is empty: a vocabulary needs at least one character")
        if list(self.chars) != sorted(set(self.chars)):
            raise ValueError("CharVocab.chars must be sorted and free of duplicates")
        object.__setattr__(self, "_codepoints", _codepoints(self.chars))

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The vocabulary of every distinct character in `text`."""
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """str -> (len(text),) token ids in the smallest unsigned dtype that holds the
        vocabulary (uint8 for up to 256 characters: the corpus is every rank's, so it
        costs a quarter of int32); unknown characters are an error. Batches are int32.
        Encoded ENCODE_CHUNK characters at a time, so its temporaries (about 20 bytes
        a character) stay a few MiB whatever the corpus's size."""
        out = np.empty(len(text), np.min_scalar_type(max(self.size - 1, 0)))
        for start in range(0, len(text), ENCODE_CHUNK):
            piece = text[start : start + ENCODE_CHUNK]
            cps = _codepoints(piece)
            ids = np.searchsorted(self._codepoints, cps)  # vectorised dict lookup
            ids = np.minimum(ids, self.size - 1)
            unknown = self._codepoints[ids] != cps
            if unknown.any():
                bad = piece[int(np.argmax(unknown))]
                raise ValueError(f"character {bad!r} is not in the vocabulary of {self.size}")
            out[start : start + len(piece)] = ids
        return out

    def decode(self, ids: np.ndarray) -> str:
        """Token ids (any shape, flattened) -> str."""
        return "".join(self.chars[i] for i in np.asarray(ids).reshape(-1))


def _codepoints(text: str) -> np.ndarray:
    """Unicode code points of `text` as a (len(text),) uint32 array."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def encode_corpus(text: str) -> tuple[CharVocab, np.ndarray]:
    """Build the vocabulary of `text` and encode it: (vocab, tokens (N,) uint8/16/32)."""
    vocab = CharVocab.from_text(text)
    return vocab, vocab.encode(text)


def unigram_entropy(tokens: np.ndarray) -> float:
    """Entropy of the character frequencies, nats per character: the loss of a model
    that ignores context, the bar a language model must get below."""
    counts = np.bincount(tokens)
    p = counts[counts > 0] / tokens.size
    return float(-(p * np.log(p)).sum())


def micro_batches(
    tokens: np.ndarray,
    context: int,
    micro_batch_size: int,
    world_size: int,
    grad_accum: int,
    step: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Windows and next characters for one optimizer step, for every rank.

    Returns inputs (k, W, b, K) and targets (k, W, b): targets[i, r, j] is the
    character that follows the window inputs[i, r, j]. Rank r uses [:, r].
    """
    shape = (grad_accum, world_size, micro_batch_size)
    starts = _window_starts(tokens, "context", context, shape, step, seed)
    idx = starts[..., None] + np.arange(context)  # (k, W, b, K)
    return tokens[idx].astype(np.int32), tokens[starts + context].astype(np.int32)


def sequence_batches(
    tokens: np.ndarray,
    seq_len: int,
    micro_batch_size: int,
    world_size: int,
    grad_accum: int,
    step: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequences for one optimizer step, for every rank, for sequence models.

    Returns inputs (k, W, b, T) and targets (k, W, b, T), targets being the
    inputs shifted left by one character. Rank r uses [:, r].
    """
    shape = (grad_accum, world_size, micro_batch_size)
    starts = _window_starts(tokens, "seq_len", seq_len, shape, step, seed)
    idx = starts[..., None] + np.arange(seq_len)  # (k, W, b, T)
    return tokens[idx].astype(np.int32), tokens[idx + 1].astype(np.int32)


def _window_starts(
    tokens: np.ndarray,
    window_name: str,
    window: int,
    shape: tuple[int, int, int],
    step: int,
    seed: int,
) -> np.ndarray:
    """Random window starts of `shape` (k, W, b), each leaving room for one more character."""
    names = (window_name, "grad_accum", "world_size", "micro_batch_size")
    for name, value in zip(names, (window, *shape), strict=True):
        _check_int(name, value, minimum=1)
    _check_int("step", step, minimum=0)
    _check_int("seed", seed, minimum=0)
    _check_tokens(tokens, window)
    # The stream depends on nothing but (seed, step): not on rank, world or history.
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, len(tokens) - window, size=shape)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} = {value!r} is not allowed: it must be an int >= {minimum}")


def _check_tokens(tokens: np.ndarray, window: int) -> None:
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D int array, got {tokens.dtype} {tokens.shape}")
    if len(tokens) < window + 1:
        raise ValueError(
            f"corpus too short: it has {len(tokens)} characters but a window of "
            f"{window} needs at least {window + 1} (the window plus its next character)"
        )
