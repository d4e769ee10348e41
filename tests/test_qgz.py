"""qgZ (ZeRO++'s quantized gradients): the uneven-block quantizer's twins element by
element, the blocks of a bucket (never straddling a unit or a bucket; the same at every
world size when aligned), the Comm's quantized reduce-scatter against the oracle's view
of it at 1, 2 and 3 ranks (tests/mpi_qgz_check.py), an fp16 overflow's NaN scale, the
config's refusals, and the estimate equal to the ledger. The whole run is checked bit for
bit against the oracle in tests/test_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.estimate import estimate_for
from zero_ref.layout.buckets import plan_buckets
from zero_ref.layout.grad_blocks import block_starts, plan_blocks
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.quantize import (
    dequantize_segments_kernel,
    dequantize_segments_reference,
    quantize_segments_kernel,
    quantize_segments_reference,
    quantized_rows,
)

SMALL_GPT = GPTConfig(vocab_size=37, context=16, n_layer=2, n_head=2, d_model=22)


def random_starts(rng: np.random.Generator, n: int) -> np.ndarray:
    """Block starts of a row of n: 0, then a random increasing subset of [1, n)."""
    if n == 0:
        return np.zeros(0, np.int64)
    cuts = rng.choice(np.arange(1, n), size=rng.integers(0, n), replace=False) if n > 1 else []
    return np.unique(np.concatenate([[0], cuts])).astype(np.int64)


def both_twins(x: np.ndarray, starts: np.ndarray):
    """(q, scales, x') from the kernels and from the NumPy twins."""
    out = []
    for quant, deq in (
        (quantize_segments_kernel, dequantize_segments_kernel),
        (quantize_segments_reference, dequantize_segments_reference),
    ):
        q, s = np.full(x.size, 99, np.int8), np.empty(starts.size, np.float32)
        back = np.empty(x.size, np.float32)
        quant(x, starts, q, s)
        deq(q, s, starts, back)
        out.append((q, s, back))
    return out


@pytest.mark.parametrize("n", [0, 1, 7, 13, 97])
def test_kernel_equals_twin_at_awkward_sizes(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-40, 1e-3, 1.0, 1e30], n)).astype(np.float32)
    x[rng.random(n) < 0.2] = 0  # ties, zeros and all-zero blocks
    starts = random_starts(rng, n)
    (qk, sk, bk), (qr, sr, br) = both_twins(x, starts)
    np.testing.assert_array_equal(qk, qr)
    np.testing.assert_array_equal(sk.view(np.uint32), sr.view(np.uint32))
    np.testing.assert_array_equal(bk.view(np.uint32), br.view(np.uint32))


@settings(max_examples=200, deadline=None)
@given(
    x=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_kernel_equals_twin_on_any_finite_floats(x, seed):
    x = np.array(x, np.float32)
    starts = random_starts(np.random.default_rng(seed), x.size)
    (qk, sk, bk), (qr, sr, br) = both_twins(x, starts)
    np.testing.assert_array_equal(qk, qr)
    np.testing.assert_array_equal(sk.view(np.uint32), sr.view(np.uint32))
    np.testing.assert_array_equal(bk.view(np.uint32), br.view(np.uint32))
    assert np.all(np.abs(qk.astype(np.int32)) <= 127)


def test_a_non_finite_block_sends_a_nan_scale_and_dequantizes_to_nan():
    """An fp16 overflow (Inf) or a NaN: the block's scale is NaN, every value of that
    block comes back NaN (its destination's sum is non-finite: the step is skipped),
    and the other blocks are untouched."""
    x = np.array([1.0, np.inf, 2.0, 3.0, -np.inf, 4.0, np.nan], np.float32)
    starts = np.array([0, 2, 4, 6], np.int64)
    for _q, s, back in both_twins(x, starts):
        assert np.isnan(s[[0, 2, 3]]).all() and np.isfinite(s[1])
        assert np.isnan(back[[0, 1, 4, 5, 6]]).all()
        np.testing.assert_allclose(back[2:4], x[2:4], rtol=0.5 / 127)


def test_error_per_block_is_at_most_half_a_step():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((3, 1000)).astype(np.float32)
    starts = np.arange(0, 1000, 64, dtype=np.int64)
    back = quantized_rows(rows, starts)
    for lo, hi in zip(starts, [*starts[1:], 1000], strict=True):
        amax = np.abs(rows[:, lo:hi]).max(axis=1)
        err = np.abs(back[:, lo:hi] - rows[:, lo:hi]).max(axis=1)
        assert np.all(err <= amax * (0.5 / 127) * (1 + 1e-6))


def test_blocks_never_straddle_a_unit_or_a_bucket():
    numels, block = [5, 0, 17, 3, 40], 4
    offsets = list(np.cumsum([0, *numels[:-1]]))
    plan = plan_buckets(numels, offsets, 11, 1)
    ends = set(np.cumsum(numels).tolist()) | set(offsets)
    for bucket in plan:
        starts = block_starts(offsets, numels, bucket, block) + bucket.shard_offset
        bounds = [*starts, bucket.shard_offset + bucket.shard_numel]
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            assert 0 < hi - lo <= block
            unit = max(i for i, o in enumerate(offsets) if o <= lo and numels[i])
            assert hi <= offsets[unit] + numels[unit], (lo, hi, "straddles a unit")
            assert lo in ends or (lo - offsets[unit]) % block == 0 or lo == bucket.shard_offset


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_aligned_blocks_are_the_units_own_at_every_world_size(world):
    """Units padded to W x block (qwZ's alignment) and buckets of a multiple of block
    columns: block b of destination d is always the unit's elements [d s + b k, ...) with
    s a multiple of k, i.e. the unit's own grid of blocks, whatever W."""
    block = 8
    padded = [-(-n // (world * block)) * world * block for n in (30, 100, 7)]
    for columns, blocks in plan_blocks(padded, world, world * block * 3, block):
        assert columns % block == 0 and blocks == columns // block


def test_config_refuses_stage_0_and_the_gpu():
    with pytest.raises(ValueError, match="quantized_gradients.*stage 0"):
        ZeroConfig(stage=0, quantized_gradients=True)
    with pytest.raises(ValueError, match="quantized_gradients.*gpu"):
        ZeroConfig(stage=3, quantized_gradients=True, device="gpu")
    with pytest.raises(ValueError, match="quantized_gradients"):
        ZeroConfig(stage=3, quantized_gradients=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("a small corpus; its vocabulary is all the model needs here.\n" * 4)
    return str(path)


@pytest.mark.parametrize(
    "stage, flags",
    [
        (1, []),
        (2, ["--precision", "bf16", "--grad-accum", "2"]),
        (3, ["--overlap-comm"]),
        (3, ["--quantized-weights", "--quantize-block", "16", "--precision", "fp16"]),
    ],
)
def test_estimate_equals_the_ledger_with_qgz(corpus, stage, flags):
    """qgZ's send and receive bytes (per staging lane) are in the ledger and the estimate."""
    argv = ["--data", corpus, "--stage", str(stage), "--bucket-numel", "96"]
    parsed = parse_args([*argv, "--quantized-gradients", "--quantize-block", "16", *flags], 1)
    model = GPT(SMALL_GPT)
    engine = make_engine(
        model, RandomInit(model, 0), parsed.zero, comm_for(MPI.COMM_SELF, parsed.zero)
    )
    est = estimate_for(parsed, model, 1)
    held = engine.memory.bytes_by_category()
    buffers = engine.buffer_bytes()
    engine.close()
    assert held == {k: getattr(est, k) for k in held}
    assert buffers["qgz_send"] == buffers["qgz_recv"] > 0
    assert ("qgz_send (lane 1)" in buffers) == ("--overlap-comm" in flags)
