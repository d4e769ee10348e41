"""The gradient norm: the exact sum-of-squares kernel against its math.fsum twin,
invariance to how the buffer is cut into shards, and torch's clip coefficient."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zero_ref.comm.collectives import Comm
from zero_ref.optim.gradnorm import (
    BIN_SHAPE,
    bins_to_float,
    clip_coefficient,
    global_grad_norm,
    sumsq_bins,
    sumsq_bins_reference,
    sumsq_exact_reference,
    sumsq_fast,
    sumsq_fast_reference,
)

SIZES = [0, 1, 7, 13, 1009, 100003]
TINY32 = np.float32(1.4e-45)  # the smallest float32 subnormal


def spanning(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values from 1e-30 to 1e30, signs mixed, in random order, with exact zeros,
    subnormals and integers sprinkled in."""
    x = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
    kind = rng.integers(0, 20, n)  # 0: zero, 1: subnormal, 2: integer, else spanning
    x[kind == 0] = 0.0
    x[kind == 1] = TINY32 * rng.integers(1, 1 << 22, int(np.sum(kind == 1)))
    x[kind == 2] = rng.integers(1, 1 << 23, int(np.sum(kind == 2)))
    return x


def as_bits(x: float) -> int:
    return int(np.float64(x).view(np.uint64))


def exact_sumsq(x: np.ndarray) -> float:
    """The correctly rounded sum of squares, from exact rationals."""
    return float(sum((Fraction(float(v)) ** 2 for v in x), Fraction(0)))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("values", ["spanning", "normal", "zeros", "subnormal", "ascending"])
def test_kernel_bins_equal_the_twin_and_the_fsum_oracle(n, values):
    rng = np.random.default_rng(n)
    x = {
        "spanning": lambda: spanning(rng, n),
        "normal": lambda: rng.standard_normal(n).astype(np.float32),
        "zeros": lambda: np.zeros(n, np.float32),
        "subnormal": lambda: TINY32 * rng.integers(-(1 << 22), 1 << 22, n).astype(np.float32),
        "ascending": lambda: np.geomspace(1e-38, 1e38, n).astype(np.float32),
    }[values]()
    bins = sumsq_bins(x)
    assert bins.dtype == np.int64 and bins.shape == BIN_SHAPE
    assert np.array_equal(bins, sumsq_bins_reference(x))  # element by element
    assert as_bits(bins_to_float(bins)) == as_bits(sumsq_exact_reference(x))


def test_correctly_rounded_where_a_naive_sum_is_not():
    # squares 1 + 3 * 2^-54 = 1 + 1.5 ulp(1)/2: rounds up, but 1 + 2^-54 rounds back to 1
    x = np.array([1.0, 2.0**-27, 2.0**-27, 2.0**-27], np.float32)
    naive = 0.0
    for v in x.astype(np.float64):
        naive += v * v
    assert naive == 1.0
    assert bins_to_float(sumsq_bins(x)) == 1.0 + 2.0**-52 == exact_sumsq(x)


def test_nan_and_inf_make_the_sum_non_finite():
    assert math.isnan(bins_to_float(sumsq_bins(np.array([1, np.nan, np.inf], np.float32))))
    assert bins_to_float(sumsq_bins(np.array([1, -np.inf], np.float32))) == math.inf
    assert np.array_equal(
        sumsq_bins(np.array([np.nan, -np.inf], np.float32)),
        sumsq_bins_reference(np.array([np.nan, -np.inf], np.float32)),
    )


floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(floats32, min_size=0, max_size=200), st.lists(st.integers(0, 200), max_size=6))
def test_any_cut_gives_the_same_bits(values, cuts):
    """Bins of the pieces add up (in int64, in any order) to the bins of the whole."""
    x = np.array(values, np.float32)
    cuts = sorted(min(c, x.size) for c in cuts)
    pieces = np.split(x, cuts)
    summed = sum((sumsq_bins(p) for p in pieces[::-1]), np.zeros(BIN_SHAPE, np.int64))
    assert np.array_equal(summed, sumsq_bins(x))
    assert as_bits(bins_to_float(summed)) == as_bits(exact_sumsq(x))


# ---- the clip coefficient


@pytest.mark.parametrize("norm", [0.0, 1e-12, 0.5, 1.0, 3.0, 1e30])
def test_no_clip_is_one(norm):
    coef = clip_coefficient(norm, None)
    assert type(coef) is np.float32 and coef == 1


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1.0, 7.0])
@pytest.mark.parametrize("norm", [0.0, 1e-9, 0.25, 1.0, 7.0, 13.0, 1e20])
def test_clip_coefficient_is_torchs(norm, max_norm):
    """torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to <= 1."""
    coef = clip_coefficient(norm, max_norm)
    assert type(coef) is np.float32
    assert coef == np.float32(min(1.0, max_norm / (norm + 1e-6)))
    if norm <= max_norm - 1e-6:
        assert coef == 1
    if norm > max_norm:
        assert coef < 1
        assert norm * coef <= max_norm * (1 + 1e-6)


def test_norm_equal_to_max_still_scales_slightly():
    assert clip_coefficient(1.0, 1.0) == np.float32(1.0 / (1.0 + 1e-6)) < 1


# ---- global_grad_norm on one rank


def grads_of_sizes(rng: np.random.Generator, sizes) -> list[np.ndarray]:
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32) for n in sizes]


@pytest.mark.parametrize("sizes", [[], [0], [1], [7, 0, 13], [1009, 1, 100003]])
def test_exact_norm_without_comm(sizes):
    grads = grads_of_sizes(np.random.default_rng(len(sizes)), sizes)
    everything = np.concatenate(grads) if grads else np.zeros(0, np.float32)
    expected = math.sqrt(sumsq_exact_reference(everything))
    assert as_bits(global_grad_norm(grads, None, exact=True)) == as_bits(expected)


@pytest.mark.parametrize("sizes", [[], [0], [1], [7, 0, 13], [1009, 1, 100003]])
def test_fast_norm_without_comm(sizes):
    grads = grads_of_sizes(np.random.default_rng(len(sizes)), sizes)
    fast = global_grad_norm(grads, None, exact=False)
    assert as_bits(fast) == as_bits(math.sqrt(sum(sumsq_fast(g) for g in grads)))
    everything = np.concatenate(grads) if grads else np.zeros(0, np.float32)
    exact = math.sqrt(sumsq_exact_reference(everything))
    assert fast == pytest.approx(exact, rel=1e-5, abs=0.0)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 13, 1009, (1 << 16) - 1, 1 << 16, (1 << 16) + 7])
def test_fast_kernel_is_bitwise_its_twin(n):
    """Same chunks, same 8 lanes, same order: the Numba kernel and NumPy agree to the bit."""
    x = spanning(np.random.default_rng(n), n)
    assert as_bits(sumsq_fast(x)) == as_bits(sumsq_fast_reference(x))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_fast_kernel_passes_nan_and_inf_on_like_its_twin(bad):
    """In fast mode this sum is the NaN/Inf detector: one bad element anywhere in any
    chunk makes the sum non-finite, in the kernel as in the twin."""
    x = spanning(np.random.default_rng(3), (1 << 16) + 7)
    for where in (0, 1 << 15, x.size - 1):
        y = x.copy()
        y[where] = bad
        fast, twin = sumsq_fast(y), sumsq_fast_reference(y)
        assert not math.isfinite(fast) and math.isnan(fast) == math.isnan(twin)


@pytest.mark.parametrize("threads", [1, 2])
def test_fast_kernel_does_not_depend_on_the_thread_count(threads):
    """Chunks are fixed, so the partial sums and their order do not move with threads."""
    import numba

    x = spanning(np.random.default_rng(11), 5 * (1 << 16) + 3)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        assert as_bits(sumsq_fast(x)) == as_bits(sumsq_fast_reference(x))
    finally:
        numba.set_num_threads(before)


def test_fast_sum_of_squares_is_within_1e_5_at_ten_million_elements():
    """The float32 dot product it replaced was off by a relative 7.7e-5 here."""
    rng = np.random.default_rng(10**7)
    x = (rng.standard_normal(10**7) * rng.lognormal(0, 2, 10**7)).astype(np.float32)
    exact = bins_to_float(sumsq_bins(x))
    assert abs(sumsq_fast(x) - exact) <= 1e-12 * exact  # float64: far inside 1e-5
    assert abs(float(np.dot(x, x)) - exact) > 1e-6 * exact  # float32 is not (the old way)


def test_exact_norm_over_a_comm(mpi_comm):
    """Every rank holds the same slices: the norm is that of W copies of them."""
    grads = grads_of_sizes(np.random.default_rng(0), [7, 13, 1009])
    comm = Comm(mpi_comm)
    everything = np.concatenate(grads * comm.size)
    expected = math.sqrt(sumsq_exact_reference(everything))
    assert as_bits(global_grad_norm(grads, comm, exact=True)) == as_bits(expected)
    assert comm.ledger.current["norm"].calls == 1


def test_fast_norm_over_a_comm(mpi_comm):
    grads = grads_of_sizes(np.random.default_rng(0), [7, 13, 1009])
    comm = Comm(mpi_comm)
    local = global_grad_norm(grads, None, exact=False)
    total = global_grad_norm(grads, comm, exact=False)
    assert total == pytest.approx(local * math.sqrt(comm.size), rel=1e-6)
    if comm.size == 1:
        assert as_bits(total) == as_bits(local)
