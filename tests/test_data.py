"""The corpus loader, the character vocabulary and the reproducible batches."""

from __future__ import annotations

import numpy as np
import pytest

from zero_ref.app.data import (
    CharVocab,
    default_text,
    encode_corpus,
    load_text,
    micro_batches,
    sequence_batches,
)


def test_default_corpus_is_the_python_reference():
    text = load_text(None)
    assert len(text) > 400_000
    assert "The ``if`` statement" in text or "if_stmt" in text
    assert text == default_text()  # deterministic


def test_load_text_reads_utf8(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("héllo wörld\n", encoding="utf-8")
    assert load_text(str(path)) == "héllo wörld\n"
    assert load_text(path) == "héllo wörld\n"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt.*does not exist"):
        load_text(str(path))


def test_directory_is_not_a_corpus(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        load_text(str(tmp_path))


def test_empty_file(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.txt.*is empty"):
        load_text(str(path))


def test_binary_file(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"abc\x00\x01\x02")
    with pytest.raises(ValueError, match=r"blob\.bin.*binary.*NUL byte at offset 3"):
        load_text(str(path))


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt.*not UTF-8.*offset 3"):
        load_text(str(path))


def test_vocab_round_trip():
    text = "hello, wörld!\n\tzz"
    vocab, tokens = encode_corpus(text)
    assert vocab.chars == "".join(sorted(set(text)))
    assert vocab.size == len(set(text))
    assert tokens.dtype == np.uint8 and tokens.shape == (len(text),)  # a small vocabulary
    assert vocab.decode(tokens) == text
    assert vocab.decode(vocab.encode("low")) == "low"
    assert list(vocab.encode(vocab.chars)) == list(range(vocab.size))


def test_vocab_round_trips_the_default_corpus():
    text = load_text(None)
    vocab, tokens = encode_corpus(text)
    assert tokens.max() == vocab.size - 1
    assert vocab.decode(tokens[:5000]) == text[:5000]


def test_vocab_rejects_unknown_and_malformed():
    vocab = CharVocab.from_text("abc")
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        vocab.encode("abz")
    with pytest.raises(ValueError, match="sorted"):
        CharVocab("ba")
    with pytest.raises(ValueError, match="empty"):
        CharVocab("")


def positions(n: int) -> np.ndarray:
    """A corpus whose token is its own position, so windows are easy to check."""
    return np.arange(n, dtype=np.int32)


def test_micro_batch_shapes_and_targets():
    inputs, targets = micro_batches(positions(100), 8, 4, 3, 2, step=0, seed=0)
    assert inputs.shape == (2, 3, 4, 8) and targets.shape == (2, 3, 4)
    assert inputs.dtype == np.int32
    np.testing.assert_array_equal(np.diff(inputs, axis=-1), 1)  # contiguous windows
    np.testing.assert_array_equal(targets, inputs[..., -1] + 1)  # the next character
    assert targets.max() <= 99


def test_sequence_batch_shapes_and_shift():
    inputs, targets = sequence_batches(positions(50), 16, 2, 4, 3, step=5, seed=1)
    assert inputs.shape == targets.shape == (3, 4, 2, 16)
    np.testing.assert_array_equal(np.diff(inputs, axis=-1), 1)
    np.testing.assert_array_equal(targets, inputs + 1)
    assert targets.max() <= 49


@pytest.mark.parametrize("make", [micro_batches, sequence_batches])
def test_batches_are_reproducible(make):
    tokens = positions(10_000)
    a = make(tokens, 8, 4, 2, 3, 7, 42)
    b = make(tokens, 8, 4, 2, 3, 7, 42)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make", [micro_batches, sequence_batches])
def test_batches_differ_across_ranks_micro_steps_steps_and_seeds(make):
    tokens = positions(100_000)
    inputs, _ = make(tokens, 8, 4, 2, 2, 0, 0)
    assert not np.array_equal(inputs[:, 0], inputs[:, 1])  # ranks
    assert not np.array_equal(inputs[0], inputs[1])  # micro-steps
    assert not np.array_equal(inputs, make(tokens, 8, 4, 2, 2, 1, 0)[0])  # steps
    assert not np.array_equal(inputs, make(tokens, 8, 4, 2, 2, 0, 1)[0])  # seeds


def test_shortest_corpus_works_and_shorter_fails():
    inputs, targets = micro_batches(positions(9), 8, 2, 1, 1, 0, 0)
    np.testing.assert_array_equal(inputs[0, 0, 0], np.arange(8))
    assert targets[0, 0, 0] == 8
    with pytest.raises(ValueError, match="has 8 characters.*needs at least 9"):
        micro_batches(positions(8), 8, 2, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="has 4 characters.*needs at least 5"):
        sequence_batches(positions(4), 4, 2, 1, 1, 0, 0)


def test_too_short_corpus_file(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("abc", encoding="utf-8")
    _, tokens = encode_corpus(load_text(str(path)))
    with pytest.raises(ValueError, match="corpus too short: it has 3 characters"):
        micro_batches(tokens, 8, 1, 1, 1, 0, 0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"context": 0}, "context"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"world_size": -2}, "world_size"),
        ({"grad_accum": 1.5}, "grad_accum"),
        ({"step": -1}, "step"),
        ({"seed": -3}, "seed"),
    ],
)
def test_bad_sizes_name_the_argument(kwargs, name):
    args = dict(context=4, micro_batch_size=2, world_size=2, grad_accum=1, step=0, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"{name} = .* is not allowed"):
        micro_batches(positions(100), **args)


def test_sequence_batches_name_seq_len():
    with pytest.raises(ValueError, match="seq_len = 0"):
        sequence_batches(positions(100), 0, 1, 1, 1, 0, 0)


def test_tokens_must_be_1d_ints():
    with pytest.raises(ValueError, match="1-D int array"):
        micro_batches(np.zeros(100), 4, 1, 1, 1, 0, 0)


def test_unigram_entropy():
    import math

    from zero_ref.app.data import unigram_entropy

    assert unigram_entropy(np.array([0, 1, 0, 1], np.int32)) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([3, 3, 3], np.int32)) == 0.0
