"""Large finite float tensors are measured a block at a time (`measure._blocked`): the
same verdict and numbers as the whole-tensor float64 computation, the sums of squares
behind SQNR up to their rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graphfix.runtime import measure as m
from graphfix.runtime.tolerances import Tolerance, tolerance_for

N = 3 * m._BLOCK + 123  # noqa: SLF001 - three whole blocks and a part of one


def _pair(dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal(N) * 3).astype(dtype)
    ref[N // 2] = -50  # the largest magnitude is a negative value's
    cand = (ref.astype(np.float64) + rng.standard_normal(N) * 1e-5).astype(dtype)
    return ref, cand


def _both(monkeypatch, ref, cand, **kwargs) -> tuple[m.Measure, m.Measure]:
    blocked = m.measure(ref, cand, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(m, "_BLOCKED", ())
        whole = m.measure(ref, cand, **kwargs)
    return blocked, whole


def _same(blocked: m.Measure, whole: m.Measure) -> None:
    assert (blocked.ok, blocked.max_abs, blocked.max_rel, blocked.scale, blocked.allowed,
            blocked.tolerance, blocked.problem) == (
        whole.ok, whole.max_abs, whole.max_rel, whole.scale, whole.allowed,
        whole.tolerance, whole.problem)
    if math.isfinite(whole.sqnr_db):
        assert blocked.sqnr_db == pytest.approx(whole.sqnr_db, rel=1e-12)
    else:
        assert blocked.sqnr_db == whole.sqnr_db
    assert blocked.error == pytest.approx(whole.error, rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_blocked_measure_is_the_whole_tensors(monkeypatch, dtype):
    ref, cand = _pair(dtype)
    for kwargs in [{}, {"floor": 1e-3}, {"mode": m.SQNR, "threshold": 40.0},
                   {"tolerance": Tolerance(1e-4, 0.0, 0.0)}]:
        blocked, whole = _both(monkeypatch, ref, cand, **kwargs)
        _same(blocked, whole)
    assert whole.max_abs > 0 and 0 < whole.scale < math.inf


def test_a_single_element_past_the_bound_in_the_last_block_fails(monkeypatch):
    ref, _ = _pair(np.float32)
    for tol in [tolerance_for(np.dtype(np.float32)), Tolerance(1e-4, 0.0, 0.0)]:
        cand = ref.copy()
        blocked, whole = _both(monkeypatch, ref, cand, tolerance=tol)
        _same(blocked, whole)
        assert blocked.ok and blocked.max_abs == 0 and blocked.sqnr_db == math.inf
        cand[-1] += 0.5
        blocked, whole = _both(monkeypatch, ref, cand, tolerance=tol)
        _same(blocked, whole)
        assert not blocked.ok and blocked.max_abs == 0.5


def test_an_all_zero_reference_and_non_finite_values(monkeypatch):
    zeros = np.zeros(N, np.float32)
    other = zeros.copy()
    other[7] = 1e-3
    blocked, whole = _both(monkeypatch, zeros, other)
    _same(blocked, whole)
    assert not blocked.ok and blocked.scale == 0 and blocked.sqnr_db == -math.inf
    ref, cand = _pair(np.float32)
    ref[5] = cand[5] = np.nan  # the same places: measured over the finite ones
    _same(*_both(monkeypatch, ref, cand))
    cand[6] = np.inf
    blocked = m.measure(ref, cand)
    assert blocked.problem == "NaN or infinity where the reference is finite"


def test_the_noise_floor_of_a_large_output_is_measured_over_the_finite_elements():
    from graphfix.runtime.outputs import _floor_and_scale

    ref, other = _pair(np.float32)
    expect = (float(np.abs(ref.astype(np.float64) - other).max()), 50.0)
    assert _floor_and_scale(ref, other) == expect
    ref[N // 2] = np.nan  # the largest is gone: elements finite in both count
    other[-1] = np.inf
    both = np.isfinite(ref) & np.isfinite(other)
    expect = (float(np.abs(ref[both].astype(np.float64) - other[both]).max()),
              float(np.abs(ref[both]).max()))
    assert _floor_and_scale(ref, other) == expect and expect[1] < 50
    other[-1], other[N // 2] = other[-2], np.nan  # the same places: measure's own way
    both = np.isfinite(ref) & np.isfinite(other)
    assert _floor_and_scale(ref, other) == (
        float(np.abs(ref[both].astype(np.float64) - other[both]).max()),
        float(np.abs(ref[both]).max()))
    assert _floor_and_scale(ref[:0], other[:0]) == (0.0, 0.0)


def test_a_value_past_float16s_range_is_measured_as_float16_would_hold_it(monkeypatch):
    """float32 against float16 compares at float16, where 1e5 is infinite: not finite,
    so not blocked; both ways say so."""
    ref, cand = _pair(np.float32)
    ref[9] = 1e5
    cand16 = cand.astype(np.float16)
    blocked, whole = _both(monkeypatch, ref, cand16)
    _same(blocked, whole)
    assert blocked.problem == "NaN or infinity in different places"
    cand16[9] = np.inf  # where float16 puts it: the finite ones are measured
    blocked, whole = _both(monkeypatch, ref, cand16)
    _same(blocked, whole)
    assert blocked.problem == "" and blocked.scale < 1e5
