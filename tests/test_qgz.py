"""qgZ (ZeRO++'s quantized gradients): the uneven-block quantizer's twins element by
element, in int8 and in int4 (levels, ties, zeros, subnormal scales, the nibble order and
an odd row's padding nibble), the wire's rows packed and summed as the oracle sees them,
the blocks of a bucket (never straddling a unit or a bucket; the same at every world size
when aligned), an fp16 overflow's NaN scale, the config's bits and refusals, and the
estimate equal to the ledger. The whole run is checked bit for bit against the oracle in
tests/test_parity.py, and through a checkpoint in tests/test_checkpoint_parity.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from zero_ref.app.cli import parse_args
from zero_ref.app.estimate import estimate_for
from zero_ref.comm.choose import comm_for
from zero_ref.config import ZeroConfig, ZeroPPConfig
from zero_ref.engine.init_source import RandomInit
from zero_ref.engine.ladder import make_engine
from zero_ref.formulas.memory import quantized_reduce_bytes
from zero_ref.formulas.traffic import expected_sent_bytes
from zero_ref.layout.buckets import plan_buckets
from zero_ref.layout.grad_blocks import block_starts, plan_blocks, plan_wire
from zero_ref.models.gpt import GPT, GPTConfig
from zero_ref.numerics.dtypes import FP32
from zero_ref.numerics.quantize import (
    dequantize_segments4_kernel,
    dequantize_segments4_reference,
    dequantize_segments_kernel,
    dequantize_segments_reference,
    error_bound,
    pack_rows,
    quantize_segments4_kernel,
    quantize_segments4_reference,
    quantize_segments_kernel,
    quantize_segments_reference,
    quantized_copy,
    quantized_rows,
    segment_payload_bytes,
    unpack_sum,
    value_bytes,
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


def both_twins4(x: np.ndarray, starts: np.ndarray):
    """(packed, scales, x') in int4 from the kernels and from the NumPy twins."""
    out = []
    for quant, deq in (
        (quantize_segments4_kernel, dequantize_segments4_kernel),
        (quantize_segments4_reference, dequantize_segments4_reference),
    ):
        packed, s = (
            np.full(value_bytes(x.size, 4), 0xAA, np.uint8),
            np.empty(starts.size, np.float32),
        )
        back = np.empty(x.size, np.float32)
        quant(x, starts, packed, s)
        deq(packed, s, starts, back)
        out.append((packed, s, back))
    return out


def assert_twins4(x: np.ndarray, starts: np.ndarray):
    """The int4 kernels equal their twins bit for bit; returns the kernels' (packed, s, x')."""
    (pk, sk, bk), (pr, sr, br) = both_twins4(x, starts)
    np.testing.assert_array_equal(pk, pr)
    np.testing.assert_array_equal(sk.view(np.uint32), sr.view(np.uint32))
    np.testing.assert_array_equal(bk.view(np.uint32), br.view(np.uint32))
    return pk, sk, bk


def nibbles(packed: np.ndarray) -> np.ndarray:
    """The levels of packed int4 bytes, element 2i the low nibble, 2i+1 the high one."""
    lo, hi = (packed & 0xF).astype(np.int8), (packed >> 4).astype(np.int8)
    return ((np.stack([lo, hi], axis=1).reshape(-1) ^ 8) - 8).astype(np.int8)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 13, 97])
def test_int4_kernel_equals_twin_at_awkward_sizes(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-44, 1e-40, 1e-3, 1.0, 1e30], n)).astype(np.float32)
    x[rng.random(n) < 0.2] = 0  # zeros and all-zero blocks
    starts = random_starts(rng, n)
    packed, _, _ = assert_twins4(x, starts)
    if n % 2:
        assert packed[-1] >> 4 == 0, "an odd row's padding nibble is 0"


@settings(max_examples=100, deadline=None)
@given(
    x=st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_int4_kernel_equals_twin_on_any_finite_floats(x, seed):
    x = np.array(x, np.float32)
    packed, _, _ = assert_twins4(x, random_starts(np.random.default_rng(seed), x.size))
    q = nibbles(packed)[: x.size]
    assert np.all(np.abs(q) <= 7), "level -8 is never used: -7..7 is symmetric"


def test_int4_levels_ties_and_nibble_order():
    """One block, amax 7: scale 1, so x / scale is x and the levels are rint(x), ties to
    even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2); element 2i is the low nibble."""
    x = np.array([0.5, 1.5, 2.5, -2.5, -7.0, 7.0, 3.49, 0.0, -0.5], np.float32)
    packed, s, back = assert_twins4(x, np.array([0], np.int64))
    assert s[0] == 1.0
    levels = [0, 2, 2, -2, -7, 7, 3, 0, 0]
    np.testing.assert_array_equal(nibbles(packed)[: x.size], levels)
    assert packed[0] == (2 << 4) | 0 and packed[2] == (0x7 << 4) | 0x9  # -7: 0b1001, 7 high
    assert packed[-1] == 0  # -0.5 -> level 0 (a tie to even) in the low nibble, padding high
    np.testing.assert_array_equal(back, np.array(levels, np.float32))


def test_int4_all_equal_block_and_zero_block_are_exact():
    """A block of one value v is amax everywhere: level 7, back to 7 * (v / 7), v up to one
    rounding of the scale; a block of zeros has scale 0 and comes back 0."""
    x = np.array([0.3] * 5 + [0.0] * 4 + [-2.0] * 3, np.float32)
    _, s, back = assert_twins4(x, np.array([0, 5, 9], np.int64))
    assert s[1] == 0 and np.all(back[5:9] == 0)
    np.testing.assert_array_equal(back[:5], np.float32(7) * np.float32(np.float32(0.3) / 7))
    np.testing.assert_array_equal(back[9:], np.float32(-2.0))


def test_int4_subnormal_scales_clip_to_7():
    """amax so small that amax / 7 is subnormal: the scale's rounding can be far below
    amax / 7, |x / scale| then passes 7.5, and the level is clipped to 7 (never 8 or -8);
    an amax below 7 * 2^-150 gives scale 0, the block 0."""
    tiny = np.float32(2.0**-149)
    clipped = 0
    for amax_steps in range(1, 200):
        x = np.array([amax_steps, -amax_steps, 1, 0, amax_steps // 2], np.float32) * tiny
        packed, s, back = assert_twins4(x, np.array([0], np.int64))
        q = nibbles(packed)[: x.size]
        assert np.all(np.abs(q) <= 7)
        if s[0] == 0:
            assert np.all(back == 0) and amax_steps < 4  # amax / 7 rounds to 0 below 3.5 tiny
        elif amax_steps / (float(s[0]) / float(tiny)) >= 7.5:  # rint would give 8
            assert q[0] == 7 and q[1] == -7
            clipped += 1
    assert clipped > 0, "no subnormal scale was rounded far enough down to need the clip"


def test_int4_a_non_finite_block_sends_a_nan_scale():
    x = np.array([1.0, np.inf, 2.0, 3.0, -np.inf, 4.0, np.nan], np.float32)
    starts = np.array([0, 2, 4, 6], np.int64)
    for _p, s, back in both_twins4(x, starts):
        assert np.isnan(s[[0, 2, 3]]).all() and np.isfinite(s[1])
        assert np.isnan(back[[0, 1, 4, 5, 6]]).all()
        np.testing.assert_allclose(back[2:4], x[2:4], rtol=0.5 / 7)


@pytest.mark.parametrize("bits, qmax", [(8, 127), (4, 7)])
def test_error_per_block_is_at_most_half_a_step_in_both(bits, qmax):
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((3, 999)).astype(np.float32)
    starts = np.arange(0, 999, 50, dtype=np.int64)
    back = quantized_rows(rows, starts, bits)
    for lo, hi in zip(starts, [*starts[1:], 999], strict=True):
        amax = np.abs(rows[:, lo:hi]).max(axis=1)
        err = np.abs(back[:, lo:hi] - rows[:, lo:hi]).max(axis=1)
        assert np.all(err <= amax * (0.5 / qmax) * (1 + 1e-6))
        assert bits == 8 or np.all(err > amax * (0.5 / 127))  # int4 is coarser


@pytest.mark.parametrize("bits", [8, 4])
def test_packed_rows_sum_to_the_oracles_view(bits):
    """pack_rows then unpack_sum (the wire, without MPI) is the rank-order sum of
    quantized_rows (the oracle's view), bitwise; each row is segment_payload_bytes long,
    an int4 row half of int8's values (rounded up) plus the same scales."""
    rng = np.random.default_rng(bits)
    rows = rng.standard_normal((3, 11)).astype(np.float32)
    starts = np.array([0, 3, 4, 9], np.int64)
    payload = segment_payload_bytes(11, 4, bits)
    assert payload == {8: 11 + 16, 4: 6 + 16}[bits]
    send = np.zeros((3, payload), np.uint8)
    pack_rows(rows, starts, send, bits)
    total, scratch = np.empty(11, np.float32), np.empty(11, np.float32)
    unpack_sum(send, starts, total, scratch, bits)
    expected = quantized_rows(rows, starts, bits)
    expected = (expected[0] + expected[1]) + expected[2]
    np.testing.assert_array_equal(total.view(np.uint32), expected.view(np.uint32))


def test_wire_plan_int4_is_half_the_values_plus_the_same_scales():
    """plan_wire: an int4 row carries ceil(C / 2) bytes of each bucket's C columns, int8's
    C, and both one scale a block."""
    padded = [24, 6, 42]
    for world, bucket in ((1, 7), (2, 10), (3, 9)):
        w8, w4 = (plan_wire(padded, world, bucket, 4, bits) for bits in (8, 4))
        plan = plan_blocks(padded, world, bucket, 4)
        assert w8.blocks == w4.blocks == sum(b for _, b in plan)
        assert w8.value_bytes == sum(c for c, _ in plan) == sum(padded) // world
        assert w4.value_bytes == sum((c + 1) // 2 for c, _ in plan)
        assert w4.row_bytes == w4.value_bytes + 4 * w4.blocks
    with pytest.raises(ValueError, match="bits=2"):
        plan_wire(padded, 1, 8, 4, 2)


def test_expected_bytes_int4_send_half_the_values_and_the_same_scales():
    """The ledger's formula: a micro-step's qgZ reduce-scatter sends (W-1) x row_bytes; the
    int8 wire's equals the old count-of-blocks form, and int4's is (W-1) x (ceil(C/2) summed
    + the same 4 bytes a block)."""
    padded, world, k = [24, 6, 42], 3, 2
    w8, w4 = (plan_wire(padded, world, 9, 4, bits) for bits in (8, 4))
    sent = {w.bits: expected_sent_bytes(2, padded, world, k, FP32, grad_blocks=w) for w in (w8, w4)}
    params = (
        expected_sent_bytes(2, padded, world, k, FP32) - k * (world - 1) * sum(padded) * 4 // world
    )
    assert sent[8] == expected_sent_bytes(2, padded, world, k, FP32, grad_blocks=w8.blocks)
    assert sent[8] - params == k * (world - 1) * (sum(padded) // world + 4 * w8.blocks)
    assert sent[4] - params == k * (world - 1) * (w4.value_bytes + 4 * w4.blocks)
    assert w4.value_bytes < w8.value_bytes <= 2 * w4.value_bytes


def test_estimate_holds_int4_wire_buffers_of_half_the_values():
    """The estimate's qgz_send / qgz_recv in int4: W rows of the widest bucket's ceil(C/2)
    bytes and its scales (the engine's, tests below check them equal)."""
    padded, world, bucket, block = [24, 6, 42], 2, 14, 4
    rows = {
        bits: max(
            segment_payload_bytes(c, b, bits) for c, b in plan_blocks(padded, world, bucket, block)
        )
        for bits in (8, 4)
    }
    for bits in (8, 4):
        held = quantized_reduce_bytes(padded, world, bucket, block, 2, bits)
        assert held["qgz_send"] == held["qgz_recv (lane 1)"] == world * rows[bits]
    assert rows[4] < rows[8]


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
        ZeroConfig(stage=0, zeropp=ZeroPPConfig(quantized_gradients=True))
    with pytest.raises(ValueError, match="quantized_gradients.*gpu"):
        ZeroConfig(stage=3, device="gpu", zeropp=ZeroPPConfig(quantized_gradients=True))
    with pytest.raises(ValueError, match="quantized_gradients"):
        ZeroConfig(stage=3, zeropp=ZeroPPConfig(quantized_gradients=1))


def test_a_deepspeed_config_means_int4_as_in_deepspeed_and_a_flag_keeps_int8(tmp_path):
    """zero_optimization.zero_quantized_gradients: true is int4, what DeepSpeed always sends
    (its all_to_all_quant_reduce passes 4 bits; it has no key for them); the flag
    --quantized-gradient-bits 8 given beside it keeps int8, and false leaves qgZ off."""
    path = tmp_path / "ds.json"
    for on, expected in ((True, (True, 4)), (False, (False, 8))):
        path.write_text(json.dumps({"zero_optimization": {"zero_quantized_gradients": on}}))
        zero = parse_args(["--config", str(path), "--stage", "3"], 1).zero
        assert (zero.zeropp.quantized_gradients, zero.zeropp.quantized_gradient_bits) == expected
    path.write_text('{"zero_optimization": {"stage": 3, "zero_quantized_gradients": true}}')
    for flags, bits in ((["--quantized-gradient-bits", "8"], 8), (["--quantized-gradients"], 4)):
        zero = parse_args(["--config", str(path), *flags], 1).zero
        assert zero.zeropp.quantized_gradients and zero.zeropp.quantized_gradient_bits == bits


def test_config_and_flags_take_the_bits():
    """--quantized-gradients alone is int8, as before; --quantized-gradient-bits 4 is int4;
    other bits, or bits without qgZ, are refused naming the field."""
    assert parse_args(["--quantized-gradients"], 1).zero.zeropp.quantized_gradient_bits == 8
    parsed = parse_args(["--quantized-gradients", "--quantized-gradient-bits", "4"], 1)
    assert (
        parsed.zero.zeropp.quantized_gradients and parsed.zero.zeropp.quantized_gradient_bits == 4
    )
    with pytest.raises(ValueError, match="quantized_gradient_bits=2.*8 .int8. or 4"):
        ZeroConfig(
            stage=2, zeropp=ZeroPPConfig(quantized_gradients=True, quantized_gradient_bits=2)
        )
    with pytest.raises(ValueError, match="quantized_gradient_bits=4.*without quantized_grad"):
        ZeroConfig(stage=2, zeropp=ZeroPPConfig(quantized_gradient_bits=4))
    with pytest.raises(ValueError, match="quantized-gradient-bits: invalid choice: 2"):
        parse_args(["--quantized-gradients", "--quantized-gradient-bits", "2"], 1)
    with pytest.raises(ValueError, match="quantized_gradient_bits=4.*without quantized_grad"):
        parse_args(["--quantized-gradient-bits", "4"], 1)


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
        (2, ["--quantized-gradient-bits", "4", "--precision", "bf16", "--grad-accum", "2"]),
        (3, ["--quantized-gradient-bits", "4", "--overlap-comm"]),
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


def _round_trip(kind: str, x: np.ndarray) -> np.ndarray:
    """x (one block) quantized and dequantized by qwZ's kernel or qgZ's in int8 / int4."""
    if kind == "qwz":
        return quantized_copy(x, x.size)
    return quantized_rows(x[None, :], np.array([0], np.int64), int(kind[-1]))[0]


KINDS = [("qwz", 127), ("qgz8", 127), ("qgz4", 7)]


@pytest.mark.parametrize("kind, qmax", KINDS)
def test_the_error_bound_holds_from_the_smallest_subnormal_to_large_values(kind, qmax):
    """error_bound (half a step, float32's roundings, and the absolute part a subnormal
    scale adds) holds for blocks of amax 2^-149 to 2^100, values drawn and values on
    the half steps; the half step alone holds wherever the scale is normal."""
    rng = np.random.default_rng(7)
    for exponent in range(-149, 101, 3):
        for _ in range(4):
            amax = np.float32(2.0**exponent * rng.uniform(1, 2))
            x = (rng.uniform(-1, 1, 257) * amax).astype(np.float32)
            x[:2] = amax, -amax
            x[2:10] = (np.arange(8) + 0.5) * amax / qmax  # on the half steps
            x = x.astype(np.float32)
            real = float(np.abs(x).max())
            err = float(np.max(np.abs(_round_trip(kind, x).astype(np.float64) - x)))
            assert err <= error_bound(real, qmax), (exponent, err, real)
            if real >= qmax * 2.0**-126:  # a normal scale: the half step, to float32's roundings
                assert err <= real / (2 * qmax) * (1 + (4 * qmax + 2) * 2.0**-24)


@pytest.mark.parametrize(
    "kind, qmax, zero_up_to", [(k, q, 63 if q == 127 else 3) for k, q in KINDS]
)
def test_below_the_threshold_the_scale_is_zero_and_every_value_is_zero(kind, qmax, zero_up_to):
    """amax / qmax <= 2^-150 rounds the scale to 0 (int8: amax <= 63 x 2^-149, int4: 3 x
    2^-149): every value is 0, an error of amax, 2 qmax half steps but within
    error_bound; one subnormal more and the scale is 2^-149, the values kept."""
    tiny = np.float32(2.0**-149)
    low = np.array([zero_up_to, -1, 2, 0], np.float32) * tiny
    np.testing.assert_array_equal(_round_trip(kind, low), 0)
    assert zero_up_to * 2.0**-149 <= error_bound(zero_up_to * 2.0**-149, qmax)
    above = np.array([zero_up_to + 1, -1, 2, 0], np.float32) * tiny
    np.testing.assert_array_equal(_round_trip(kind, above), above)


@pytest.mark.parametrize("kind, qmax, m", [("qwz", 127, 177), ("qgz8", 127, 177), ("qgz4", 7, 10)])
def test_a_subnormal_scale_breaks_the_half_step_by_its_clip(kind, qmax, m):
    """amax = m x 2^-149 with m / qmax < 1.5: the scale rounds to 2^-149 and the largest
    value is clipped to qmax x 2^-149, m - qmax subnormals off: over 4 half steps of
    amax / qmax, within error_bound's absolute part."""
    tiny = np.float32(2.0**-149)
    x = np.array([m, 1, 0, 0], np.float32) * tiny
    err = abs(float(_round_trip(kind, x)[0]) - m * 2.0**-149)
    assert err == (m - qmax) * 2.0**-149 > 4 * m * 2.0**-149 / (2 * qmax)
    assert err <= error_bound(m * 2.0**-149, qmax)
