"""The 16-bit roundings (zero_ref/numerics/rounding.py): each Numba kernel against its NumPy twin
and against NumPy's / ml_dtypes' casts, element by element and bit for bit, at awkward
sizes and on the values where rounding is hard; the NaN rule (torch's); and the paths
of zero_ref/numerics/dtypes.py the engine calls, which must run the kernels."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.numerics import rounding as R
from zero_ref.numerics.dtypes import HOST, accumulate_rounded, round_into, rounded, widen_into

FP16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
SIZES = [0, 1, 7, 13, 257, 1021, 4099]  # and primes

# float32 bit patterns where a rounding can go wrong, with why
SPECIAL = {
    0x00000000: "+0",
    0x80000000: "-0",
    0x7F800000: "+Inf",
    0xFF800000: "-Inf",
    0x7FC00000: "quiet NaN",
    0xFFC00000: "-quiet NaN",
    0x7FC12345: "quiet NaN, payload",
    0x7FFFFFFF: "quiet NaN, every payload bit",
    0xFFFFFFFF: "-quiet NaN, every payload bit",
    0x7F800001: "signalling NaN, least payload",
    0xFF800001: "-signalling NaN",
    0x7FA00000: "signalling NaN, high payload",
    0x7F802000: "signalling NaN, payload at fp16's lsb",
    0x00000001: "least float32 subnormal",
    0x807FFFFF: "-largest float32 subnormal",
    0x00400000: "float32 subnormal",
    0x7F7FFFFF: "largest float32",
    0xFF7FFFFF: "-largest float32",
    0x477FE000: "65504, fp16's largest",
    0x477FEFFF: "just below 65520: 65504",
    0x477FF000: "65520, the tie: Inf (65504 is odd)",
    0xC77FF000: "-65520: -Inf",
    0x47800000: "65536: Inf",
    0x3F801000: "1 + 2^-11: fp16 tie, even below",
    0x3F803000: "1 + 3*2^-11: fp16 tie, even above",
    0xBF803000: "-(1 + 3*2^-11)",
    0x3F801001: "just above an fp16 tie",
    0x3F800FFF: "just below an fp16 tie",
    0x3F7FF000: "below 1 by half an fp16 ulp: tie to 1",
    0x33800000: "2^-24, fp16's least subnormal",
    0x33000000: "2^-25, the tie with 0: +0",
    0xB3000000: "-2^-25: -0",
    0x33000001: "just above 2^-25: 2^-24",
    0x33C00000: "3*2^-25: tie between 1 and 2 units, to 2",
    0x34200000: "5*2^-25: tie between 2 and 3 units, to 2",
    0x387FC000: "fp16's largest subnormal",
    0x387FE000: "tie between the largest subnormal and the least normal",
    0x387FFFFF: "just below 2^-14: 2^-14",
    0x38800000: "2^-14, fp16's least normal",
    0x3F808000: "1 + 2^-8: bf16 tie, even below",
    0x3F818000: "1 + 3*2^-8: bf16 tie, even above",
    0x3F808001: "just above a bf16 tie",
    0x7F7F0000: "bf16's largest",
    0x7F7F8000: "tie above bf16's largest: Inf",
    0xFF7F8000: "-: -Inf",
    0x7F7F7FFF: "just below that tie: bf16's largest",
    0x00010000: "bf16's least subnormal",
    0x00008000: "half of it, a tie: +0",
    0x00018000: "tie between 1 and 2 bf16 units: 2",
}
SPECIAL_BITS = np.array(list(SPECIAL), np.uint32)


def nan_rule(src_bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """What a NaN must become: torch's c10 rule (fp16 sign | 0x7E00, bf16 0x7FC0)."""
    if dtype == FP16:
        return ((src_bits >> 16) & 0x8000 | R.FP16_QUIET_NAN).astype(np.uint16)
    return np.full(src_bits.shape, R.BF16_QUIET_NAN, np.uint16)


def cast_bits(src_bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """NumPy's (fp16) or ml_dtypes' (bf16) cast, with the NaN rule put in."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = src_bits.view(np.float32).astype(dtype).view(np.uint16)
    nan = (src_bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, nan_rule(src_bits, dtype), out)


KERNELS = {
    FP16: (R.round_fp16_kernel, R.round_fp16_reference),
    BF16: (R.round_bf16_kernel, R.round_bf16_reference),
}


def three_ways(src_bits: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    """(kernel, twin, cast) results for 1-D src_bits."""
    kernel, twin = KERNELS[dtype]
    k = np.full(src_bits.size, 0xDEAD, np.uint16)
    kernel(src_bits[np.newaxis, :], k[np.newaxis, :])
    t = np.full(src_bits.size, 0xBEEF, np.uint16)
    twin(src_bits, t)
    return k, t, cast_bits(src_bits, dtype)


def assert_same(src_bits, *results):
    for r in results[1:]:
        bad = np.flatnonzero(r != results[0])
        assert bad.size == 0, [
            (hex(src_bits[i]), SPECIAL.get(int(src_bits[i]), ""), *(hex(x[i]) for x in results))
            for i in bad[:8]
        ]


def awkward_bits(n: int, seed: int) -> np.ndarray:
    """n float32 bit patterns: the special ones in turn, and random ones between."""
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    out[::2] = np.resize(SPECIAL_BITS, out[::2].size)
    return out


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_every_special_value_rounds_alike_three_ways(dtype):
    assert_same(SPECIAL_BITS, *three_ways(SPECIAL_BITS, dtype))


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("n", SIZES)
def test_kernel_twin_and_cast_agree_at_awkward_sizes(dtype, n):
    src = awkward_bits(n, n)
    assert_same(src, *three_ways(src, dtype))


def test_the_special_values_round_to_what_their_names_say():
    """A few by hand, so the three ways cannot agree on a wrong answer."""
    want16 = {
        0x477FF000: 0x7C00,
        0x477FEFFF: 0x7BFF,
        0x3F801000: 0x3C00,
        0x3F803000: 0x3C02,
        0x33000000: 0x0000,
        0xB3000000: 0x8000,
        0x33000001: 0x0001,
        0x33C00000: 0x0002,
        0x34200000: 0x0002,
        0x387FE000: 0x0400,
        0x7F800001: 0x7E00,
        0xFF800001: 0xFE00,
        0x7FFFFFFF: 0x7E00,
        0x00000001: 0x0000,
        0x807FFFFF: 0x8000,
    }
    want_bf16 = {
        0x3F808000: 0x3F80,
        0x3F818000: 0x3F82,
        0x7F7F8000: 0x7F80,
        0x00008000: 0x0000,
        0x00018000: 0x0002,
        0xFFFFFFFF: 0x7FC0,
        0xFF800001: 0x7FC0,
    }
    for dtype, want in ((FP16, want16), (BF16, want_bf16)):
        src = np.array(list(want), np.uint32)
        expected = np.array(list(want.values()), np.uint16)
        k, t, _ = three_ways(src, dtype)
        assert_same(src, expected, k, t)


def test_a_strided_sweep_of_all_float32_patterns():
    """Every 4,093rd float32 bit pattern (1.05M, every exponent and sign), and every
    sign/exponent/high-mantissa half with the low 16 bits at fp16's and bf16's ties and
    their neighbours: the kernels, their twins and the casts agree on each."""
    strided = np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32)
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x7FFF, 0x8000, 0x8001])
    highs = np.arange(1 << 16, dtype=np.uint64) << 16
    ties = (highs[:, None] | lows[None, :].astype(np.uint64)).ravel().astype(np.uint32)
    for src in (strided, ties):
        for dtype in (FP16, BF16):
            assert_same(src, *three_ways(src, dtype))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, (1 << 32) - 1), max_size=64))
def test_any_float32_patterns_round_alike_three_ways(patterns):
    src = np.array(patterns, np.uint32)
    for dtype in (FP16, BF16):
        assert_same(src, *three_ways(src, dtype))


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_widening_every_16_bit_pattern_is_exact_three_ways(dtype):
    """All 65,536 patterns: kernel, twin and cast give the same float32 bits (a NaN keeps
    its sign and payload, as NumPy's and ml_dtypes' casts keep them)."""
    h = np.arange(1 << 16, dtype=np.uint16)
    kernel, twin = (
        (R.widen_fp16_kernel, R.widen_fp16_reference)
        if dtype == FP16
        else (R.widen_bf16_kernel, R.widen_bf16_reference)
    )
    k, t = np.zeros(h.size, np.uint32), np.ones(h.size, np.uint32)
    kernel(h[np.newaxis, :], k[np.newaxis, :])
    twin(h, t)
    cast = h.view(dtype).astype(np.float32).view(np.uint32)
    assert_same(h, cast, k, t)


WIDEN_KERNELS = {
    FP16: (R.widen_fp16_kernel, R.widen_fp16_reference),
    BF16: (R.widen_bf16_kernel, R.widen_bf16_reference),
}


def test_the_cpu_kernels_float_steps_give_the_integer_steps_bits():
    """fp16_bits_by_float_py and fp16_widened_bits_by_float_py (the CPU kernels' steps,
    partly in float32) against fp16_bits_py and fp16_widened_bits_py (the NumPy twins'
    and the device's integer steps), run as plain Python: every fp16 pattern widened;
    the special values, and at every float32 exponent and sign the significands at and
    beside fp16's ties and carries, rounded."""
    for h in range(1 << 16):
        assert R.fp16_widened_bits_by_float_py(h) == R.fp16_widened_bits_py(h), hex(h)
    lows = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x3001, 0x400000, 0x7FFFFF])
    highs = np.arange(1 << 9, dtype=np.uint64) << 23  # sign and exponent
    near_ties = (highs[:, None] | lows[None, :].astype(np.uint64)).ravel().astype(np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf by design; NaNs signal
        for b in np.concatenate([SPECIAL_BITS, near_ties]):
            got = R.fp16_bits_by_float_py(b.view(np.float32))
            assert got == R.fp16_bits_py(int(b)), (hex(b), hex(got))


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_the_kernels_loops_for_adjacent_and_gappy_rows_agree(dtype):
    """Each kernel has two copies of its loop: rows whose elements are adjacent (the
    engine's layouts: the copy LLVM vectorises) and rows with gaps between elements.
    Both, rounding and widening, on the same values: the same bits as the cast, and
    nothing written between the elements."""
    src_bits = awkward_bits(3 * 41, 11).reshape(3, 41)
    want = cast_bits(src_bits.ravel(), dtype)
    kernel, _ = KERNELS[dtype]
    adjacent = np.zeros((3, 41), np.uint16)
    kernel(src_bits, adjacent)
    gappy_src = np.zeros((3, 82), np.uint32)
    gappy_src[:, ::2] = src_bits
    into_gaps, from_gaps = np.zeros((3, 123), np.uint16), np.zeros((3, 41), np.uint16)
    kernel(src_bits, into_gaps[:, ::3])
    kernel(gappy_src[:, ::2], from_gaps)
    assert_same(src_bits.ravel(), want, adjacent.ravel(), into_gaps[:, ::3].ravel())
    assert_same(src_bits.ravel(), want, from_gaps.ravel())
    assert not into_gaps[:, 1::3].any() and not into_gaps[:, 2::3].any()
    widen, _ = WIDEN_KERNELS[dtype]
    wide, wide_gappy = np.zeros((3, 41), np.uint32), np.zeros((3, 82), np.uint32)
    widen(adjacent, wide)
    widen(into_gaps[:, ::3], wide_gappy[:, ::2])
    cast = adjacent.view(dtype).astype(np.float32).view(np.uint32)
    assert_same(adjacent.ravel(), cast.ravel(), wide.ravel(), wide_gappy[:, ::2].ravel())
    assert not wide_gappy[:, 1::2].any()


# ---- the paths the engine calls (zero_ref/numerics/dtypes.py)


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_round_into_applies_the_rule_on_every_layout_the_engine_passes(dtype):
    """1-D views, the (W, columns) staging slices of a bucket (strided 2-D views), and
    a 3-D array: each gets the kernels' bits, NaNs quieted by torch's rule (NumPy's own
    cast, which the engine used before, kept a signalling NaN's payload: 0x7C01)."""
    src_bits = awkward_bits(4 * 37, 5)
    src = src_bits.view(np.float32)
    want = cast_bits(src_bits, dtype)
    flat = np.zeros(src.size + 3, dtype)
    round_into(flat[3:], src)
    assert_same(src_bits, want, flat[3:].view(np.uint16))
    staging = np.zeros((4, 50), dtype)
    rows = np.zeros((4, 60), np.float32)
    rows[:, 11:48] = src.reshape(4, 37)
    round_into(staging[:, 2:39], rows[:, 11:48])
    assert_same(src_bits, want, staging[:, 2:39].ravel().view(np.uint16))
    cube = np.zeros((2, 2, 37), dtype)
    HOST.round_into(cube, src.reshape(2, 2, 37))
    assert_same(src_bits, want, cube.view(np.uint16).ravel())
    gappy = np.zeros((2, 5, 40), dtype)[:, :4, ::2]  # no (rows, cols) view: the twin runs
    part = src.reshape(2, 2, 37)[:, :, :20].repeat(2, axis=1)  # (2, 4, 20)
    round_into(gappy, part)
    assert_same(
        part.view(np.uint32).ravel(),
        cast_bits(part.view(np.uint32).ravel(), dtype),
        gappy.copy().view(np.uint16).ravel(),
    )


def test_accumulate_widen_and_rounded_use_the_same_rule():
    """accumulate_rounded adds in float32 and rounds once; an fp16 overflow of the sum
    is Inf; Inf + -Inf is the canonical NaN (0x7E00 with its sign, never a payload)."""
    acc = np.array([2048.0, 1.0, 65504.0, np.inf], np.float16)
    accumulate_rounded(acc, np.array([1.0, 2**-11, 16.0, -np.inf], np.float16))
    assert acc.view(np.uint16)[:3].tolist() == [0x6800, 0x3C00, 0x7C00]
    assert acc.view(np.uint16)[3] & 0x7FFF == 0x7E00  # the NaN's sign is the CPU's choice
    b = np.array([1.0, np.nan], BF16)
    accumulate_rounded(b, np.array([2**-8, 1.0], np.float32))
    assert b.view(np.uint16).tolist() == [0x3F80, 0x7FC0]
    wide = widen_into(np.empty(3, np.float32), np.array([2**-24, -0.0, 65504], np.float16))
    assert wide.view(np.uint32).tolist() == [0x33800000, 0x80000000, 0x477FE000]
    snan = np.array([0x7F800001, 0x3F801000], np.uint32).view(np.float32)
    assert rounded(snan, FP16).view(np.uint32).tolist() == [0x7FC00000, 0x3F800000]
    across = round_into(np.empty(2, FP16), np.array([1 + 2**-7, np.nan], BF16))  # via float32
    assert across.view(np.uint16).tolist() == [0x3C08, 0x7E00]


# rows whose float32 sums are a tie, an overflow, or a NaN in the 16-bit format
FUSED_CASES = {
    FP16: [
        (0x3C00, 0x1000),
        (0x3C01, 0x1000),
        (0x7BFF, 0x7BFF),
        (0x7C00, 0xFC00),
        (0x0001, 0x8001),
    ],
    BF16: [
        (0x3F80, 0x3B80),
        (0x3F81, 0x3B80),
        (0x7F7F, 0x7F7F),
        (0x7F80, 0xFF80),
        (0x0001, 0x8001),
    ],
}


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [*SIZES, 2048, 2049])
def test_the_fused_16_bit_sum_rounds_once_what_the_unfused_sum_would(dtype, world, n):
    """sum_widened_rows_rounded (the 16-bit reduce-scatter's local pass, tiled): kernel,
    twin, and sum_widened_rows then round_into agree bit for bit, across tile edges,
    with sums that tie (1 + half an ulp, either parity), overflow to Inf, are
    Inf + -Inf, or cancel subnormals to zero."""
    rng = np.random.default_rng(world * 7000 + n)
    words = rng.integers(0, 1 << 16, (world, n), dtype=np.uint64).astype(np.uint16)
    words[:, ::3] &= 0x83FF  # subnormals and zeros
    if world == 2:
        for j, (a, b) in enumerate(FUSED_CASES[dtype][:n]):
            words[:, j] = a, b
    fp16 = dtype == FP16
    k, t = np.full(n, 7, np.uint16), np.full(n, 9, np.uint16)
    R.sum_widened_rows_rounded_kernel(words, k, fp16)
    R.sum_widened_rows_rounded_reference(words, t, fp16)
    total = HOST.sum_widened_rows(words.view(dtype), np.empty(n, np.float32))
    unfused = round_into(np.empty(n, dtype), total).view(np.uint16)
    fused = HOST.sum_widened_rows_rounded(words.view(dtype), np.empty(n, dtype)).view(np.uint16)
    # a NaN's sign is the adder's choice of operand (LLVM may commute an add): the
    # magnitudes agree everywhere, the signs wherever the sum is not NaN
    assert_same(words[0], *(x & 0x7FFF for x in (unfused, k, t, fused)))
    nan = np.isnan(total)
    assert_same(words[0][~nan], *(x[~nan] for x in (unfused, k, t, fused)))
    if world == 2 and n >= 5:
        tie_even, tie_odd, overflow, nan, cancelled = k[:5]
        assert tie_even == FUSED_CASES[dtype][0][0]  # 1 + half an ulp: stays at even 1
        assert tie_odd == FUSED_CASES[dtype][1][0] + 1  # odd + half an ulp: up to even
        assert overflow == (0x7C00 if fp16 else 0x7F80)
        assert nan & 0x7FFF == (R.FP16_QUIET_NAN if fp16 else R.BF16_QUIET_NAN)  # fp16: its sign
        assert cancelled == 0


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("n", SIZES)
def test_the_fused_16_bit_sum_is_widen_then_add_in_rank_order(dtype, world, n):
    """sum_widened_rows (the 16-bit sum over ranks): kernel, twin, and the NumPy it
    replaced (rows cast to float32, then added left to right) agree bit for bit, with
    subnormals, overflow to Inf, Inf + -Inf and NaNs among the words."""
    rng = np.random.default_rng(world * 1000 + n)
    words = rng.integers(0, 1 << 16, (world, n), dtype=np.uint64).astype(np.uint16)
    words[:, ::3] &= 0x83FF  # subnormals and zeros
    if n > 2 and world > 1:
        inf = 0x7C00 if dtype == FP16 else 0x7F80
        words[0, 1], words[1, 1] = inf, inf | 0x8000
    by_numpy = words[0].view(dtype).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(1, world):
            by_numpy += words[r].view(dtype).astype(np.float32)
    fp16 = dtype == FP16
    k, t = np.full(n, 7.0, np.float32), np.full(n, 9.0, np.float32)
    R.sum_widened_rows_kernel(words, k, fp16)
    R.sum_widened_rows_reference(words, t, fp16)
    nan = np.isnan(by_numpy)
    assert np.array_equal(np.isnan(k), nan) and np.array_equal(np.isnan(t), nan)
    assert_same(
        words[0], by_numpy[~nan].view(np.uint32), k[~nan].view(np.uint32), t[~nan].view(np.uint32)
    )
    assert_same(
        words[0],
        k.view(np.uint32),
        HOST.sum_widened_rows(words.view(dtype), np.empty(n, np.float32)).view(np.uint32),
    )
