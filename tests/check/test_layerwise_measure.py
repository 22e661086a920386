"""The numbers behind a layer-wise row: per-sample measures, their aggregation, and the
amplification rule of origins."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphfix.check._inline import Producer
from graphfix.check._origins import ERROR_FLOOR, amplification, find_origins
from graphfix.check.layerwise import TensorResult
from graphfix.runtime.measure import Tally, common_dtype, measure
from graphfix.runtime.tolerances import tolerance_for


def test_equal_tensors_are_exact():
    a = np.array([1.0, -2.0, 0.0], np.float32)
    m = measure(a, a.copy(), "strict", 20.0)
    assert (m.ok, m.max_abs, m.max_rel, m.sqnr_db, m.error) == (True, 0.0, 0.0, math.inf, 0.0)


def test_strict_numbers_follow_their_definitions():
    ref = np.array([10.0, -4.0, 0.0], np.float32)
    cand = np.array([10.5, -4.0, 1e-6], np.float32)
    m = measure(ref, cand, "strict", 20.0)
    allowed = tolerance_for(np.float32).scale * 10  # the scale-relative bound, S = 10
    assert not m.ok
    assert m.max_abs == pytest.approx(0.5)
    assert m.allowed == pytest.approx(allowed)
    assert m.max_rel == pytest.approx(max(0.5 / 10, 1e-6 / allowed))  # near zero: vs the bound
    assert m.error == pytest.approx(0.5 / 10)  # relative to the tensor's magnitude
    signal, noise = 100 + 16, 0.25 + 1e-12
    assert m.sqnr_db == pytest.approx(10 * math.log10(signal / noise), rel=1e-6)


def test_within_tolerance_is_ok_in_strict_mode():
    ref = np.linspace(-3, 3, 50).astype(np.float32)
    assert measure(ref, ref * (1 + 1e-6), "strict", 20.0).ok
    assert not measure(ref, ref * (1 + 1e-3), "strict", 20.0).ok


def test_sqnr_mode_uses_the_threshold_and_the_noise_ratio():
    ref = np.ones(100, np.float32)
    cand = ref + np.float32(0.05)  # SQNR = 10 log10(1 / 0.0025) = 26 dB
    m = measure(ref, cand, "sqnr", 20.0)
    assert m.ok and m.sqnr_db == pytest.approx(26.02, abs=0.01)
    assert m.error == pytest.approx(10 ** (-m.sqnr_db / 10))
    assert not measure(ref, cand, "sqnr", 30.0).ok


def test_zero_reference_and_nan_placement():
    zero = np.zeros(4, np.float32)
    m = measure(zero, zero + np.float32(1), "sqnr", 20.0)
    assert (m.sqnr_db, m.error, m.ok) == (-math.inf, math.inf, False)
    nan = np.array([np.nan, 1.0], np.float32)
    m = measure(nan, np.array([1.0, 1.0], np.float32), "strict", 20.0)
    assert (m.ok, m.max_abs, m.error) == (False, math.inf, math.inf)
    assert measure(nan, nan.copy(), "strict", 20.0).ok  # NaN in the same places


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_measuring_leaves_both_arrays_as_they_were(dtype):
    """measure works in place on its own float64 copies, never on the caller's arrays
    (a float64 input included, whose cast could have been a view)."""
    rng = np.random.default_rng(2)
    ref = (rng.standard_normal((4, 5)) * 9).astype(dtype)
    cand = ref + np.ones_like(ref)
    ref_before, cand_before = ref.copy(), cand.copy()
    m = measure(ref, cand, "strict", 20.0)
    assert not m.ok and m.max_abs == 1.0
    np.testing.assert_array_equal(ref, ref_before)
    np.testing.assert_array_equal(cand, cand_before)


def test_huge_finite_values_that_overflow_a_sum_still_compare():
    """float64 values near the maximum overflow a sum to inf: the NaN/infinity test then
    looks at every value, and finds none."""
    ref = np.full(4, 1e308)
    m = measure(ref, ref.copy(), "strict", 20.0)
    assert m.ok and m.max_abs == 0.0 and not m.problem


def test_integer_and_mixed_dtypes():
    ref = np.array([1, 2, 3], np.int64)
    assert measure(ref, ref.astype(np.int32), "strict", 20.0).ok
    m = measure(ref, np.array([1, 2, 4], np.int32), "sqnr", 20.0)
    assert not m.ok and m.max_abs == 1.0  # integers are exact in every mode
    half = np.array([1.0, 2.0], np.float32)
    assert measure(half, (half * (1 + 2e-3)).astype(np.float16), "strict", 20.0).ok  # fp16 tol
    assert common_dtype(np.dtype(np.float32), np.dtype(np.int64)) is None
    assert measure(half, ref[:2], "strict", 20.0) == "dtype float32 vs int64"
    assert measure(half, half.reshape(2, 1), "strict", 20.0) == "shape 2 vs 2x1"
    assert measure([1.0], half, "strict", 20.0) == "not a tensor"


def test_tally_keeps_the_worst_sample_and_extremes():
    tally = Tally("t")
    ref = np.array([1.0, 2.0], np.float32)
    for sample, delta in enumerate([0.0, 0.5, 0.1]):
        tally.add(sample, ref, ref + np.float32(delta), "strict", 20.0)
    assert tally.compared and not tally.ok and tally.worst == 1
    assert tally.max_abs == pytest.approx(0.5) and tally.dtype == "float32"
    assert tally.sqnr_db == pytest.approx(10 * math.log10(5 / 0.5), rel=1e-6)


def _row(name: str, order: int, ok: bool | None, worst: int | None = 0) -> TensorResult:
    return TensorResult(name, name, f"Op '{name}'", "Op", "float32", "compared", 0.0, 0.0,
                        0.0, worst, ok, order)


def _tally(error: float, ok: bool) -> Tally:
    t = Tally("x")
    t.errors, t.oks = {0: error}, {0: ok}
    return t


def test_origins_need_amplification_and_look_through_uncompared_tensors():
    """a (exact) -> b (1e-3, fails: origin) -> m (merged) -> c (2e-3, inherits)
    -> d (0.5, fails: amplifies 250x)."""
    producers = {n: Producer(f"Op '{n}'", "Op", n, (i,))
                 for n, i in [("b", "a"), ("m", "b"), ("c", "m"), ("d", "c")]}
    tallies = {"a": _tally(0.0, True), "b": _tally(1e-3, False), "c": _tally(2e-3, False),
               "d": _tally(0.5, False)}
    rows = [_row("a", 0, True), _row("b", 1, False), _row("m", 2, None, None),
            _row("c", 3, False), _row("d", 4, False)]
    origins = find_origins(rows, tallies, producers)
    assert [o.name for o in origins] == ["b", "d"]
    assert origins[0].amplification == pytest.approx(1e-3 / ERROR_FLOOR)
    assert origins[1].input_error == pytest.approx(2e-3)
    assert origins[1].amplification == pytest.approx(250)
    assert [o.name for o in find_origins(rows, tallies, producers, 1.5)] == ["b", "d", "c"]


def test_amplification_of_infinite_errors():
    assert amplification(math.inf, math.inf) == 1.0
    assert amplification(math.inf, 1.0) == math.inf
    assert amplification(1.0, 0.0) == 1.0 / ERROR_FLOOR


def _measured(ref: np.ndarray, cand: np.ndarray) -> Tally:
    tally = Tally("t")
    tally.add(0, ref, cand, "strict", 20.0, tolerance_for(np.dtype(np.float32)))
    return tally


@pytest.mark.parametrize("operand_ok", [True, False])
def test_an_exp_is_allowed_its_operands_error_only_where_the_operand_agrees(operand_ok):
    from graphfix.check._widen import widen_by_operands

    x = np.linspace(3.5, 4.0, 64, dtype=np.float32)
    # the operand: off by 2e-5 (5e-6 of its scale, within the bound), or by 2e-3 (fails)
    shift = np.float32(2e-5 if operand_ok else 2e-3)
    operand = _measured(x, x + shift)
    assert operand.oks[0] is operand_ok
    y = np.exp(x.astype(np.float64))
    # the Exp off by what that shift becomes through it: over its own bound, within
    # max|y| d e^d
    exp = _measured(y.astype(np.float32), np.exp(x.astype(np.float64) + 2e-5).astype(
        np.float32))
    assert not exp.oks[0]
    widen_by_operands({"x": operand, "y": exp}, {"y": Producer("Exp 'e'", "Exp", "e", ("x",))})
    assert exp.oks[0] is operand_ok
