"""--check-oracle flags a NaN or Inf on one side of the comparison, whatever the bound
(zero_ref/oracle/bound.py's worst_violation).

No reordering of sums turns a finite value into NaN or Inf, so an element that is
non-finite on one side only (or Inf on both with opposite signs, or NaN against
Inf) is a mismatch in fast mode as in bitwise mode. The bound cannot be trusted to
say so: fast_step_bound is computed from the oracle's own state, so an oracle NaN
makes that element's bound NaN and an oracle Inf makes it Inf, and a gradient
norm near zero with clipping makes every bound Inf. The same non-finite value on
both sides (NaN and NaN, Inf and Inf) is no mismatch in fast mode."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from zero_ref.oracle.bound import RESULT_ULPS, U, worst_violation

NONFINITE = (np.nan, np.inf, -np.inf)
finite32 = st.floats(-1e6, 1e6, width=32)


def same_value(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


@st.composite
def comparisons(draw, one_sided: bool):
    """(engine, oracle, bound, indices of one-sided non-finite elements): finite
    elements inside the bound; non-finite values placed on one side (one_sided) or the
    same on both; the bound derived from the oracle as fast_step_bound derives it (its
    |oracle| term), or Inf everywhere (clipping with a norm near zero)."""
    n = draw(st.integers(1, 40))
    oracle = draw(arrays(np.float32, n, elements=finite32))
    engine = draw(arrays(np.float32, n, elements=finite32))
    slack = draw(arrays(np.float64, n, elements=st.floats(1.0, 4.0)))
    where = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    bad = []
    for i in where:
        side = draw(st.sampled_from(["engine", "oracle", "both"] if one_sided else ["same"]))
        a, b = draw(st.sampled_from(NONFINITE)), draw(st.sampled_from(NONFINITE))
        if side == "same":
            engine[i] = oracle[i] = a
        elif side == "engine":
            engine[i] = a
        elif side == "oracle":
            oracle[i] = a
        else:  # both non-finite, but not the same value
            if same_value(a, b):
                continue
            engine[i], oracle[i] = a, b
        if not same_value(float(engine[i]), float(oracle[i])):
            bad.append(i)
    with np.errstate(invalid="ignore"):
        diff = np.abs(engine.astype(np.float64) - oracle.astype(np.float64))
        bound = np.where(np.isfinite(diff), diff * slack, 0.0)
        bound += RESULT_ULPS["param"] * 2 * U * np.abs(oracle.astype(np.float64))
    if draw(st.booleans()):
        bound[:] = np.inf
    return engine, oracle, bound, bad


@given(comparisons(one_sided=True))
def test_a_non_finite_value_on_one_side_is_a_mismatch_at_that_element(case):
    engine, oracle, bound, bad = case
    for allowed in (bound, None):  # fast mode, and bitwise mode
        v = worst_violation("parameter", engine, oracle, allowed)
        if bad:
            assert v is not None, f"engine {engine[bad]} vs oracle {oracle[bad]} not flagged"
            assert v.index in bad, (v, bad)
        # nothing to claim without a one-sided element: the finite ones may differ
        # bitwise (bitwise mode) but lie inside the bound (fast mode)
        if not bad and allowed is not None:
            assert v is None, v


@given(comparisons(one_sided=False))
def test_the_same_non_finite_value_on_both_sides_is_no_mismatch(case):
    """Fast mode: NaN against NaN, Inf against the same Inf, finite elements inside the
    bound: nothing to report (the oracle took the same step)."""
    engine, oracle, bound, bad = case
    assert bad == []
    assert worst_violation("parameter", engine, oracle, bound) is None


def test_each_case_by_hand():
    """The cases the property covers, spelled out: the element named, in fast mode with
    a bound as fast_step_bound makes it (non-finite where the oracle is)."""
    for mine, theirs in [
        (np.nan, 2.0),
        (2.0, np.nan),
        (np.inf, 2.0),
        (2.0, -np.inf),
        (np.inf, -np.inf),
        (np.nan, np.inf),
    ]:
        engine = np.array([1.0, mine, 3.0], np.float32)
        oracle = np.array([1.0, theirs, 3.0], np.float32)
        bound = 1e-6 + 4 * U * np.abs(oracle.astype(np.float64))
        for allowed in (bound, np.full(3, np.inf), None):
            v = worst_violation("parameter", engine, oracle, allowed)
            assert v is not None and v.index == 1, (mine, theirs, allowed, v)
