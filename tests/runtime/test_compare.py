import numpy as np

from graphfix.runtime.compare import compare_outputs
from graphfix.runtime.tolerances import tolerance_for


def one(ref, cand):
    (diff,) = compare_outputs({"y": ref}, {"y": cand})
    return diff


def test_fp32_within_tolerance_passes_and_outside_fails():
    ref = np.array([1.0, 100.0, 0.0], np.float32)
    assert one(ref, ref * (1 + 5e-5)).ok
    assert not one(ref, ref * (1 + 5e-4)).ok
    assert one(ref, ref + np.float32(5e-6)).ok
    assert not one(ref, ref + np.float32(1e-3)).ok


def test_fp16_is_looser_than_fp32():
    assert tolerance_for(np.float16).rtol > tolerance_for(np.float32).rtol
    ref = np.array([1.0, 2.0], np.float16)
    assert one(ref, (ref * np.float16(1.001)).astype(np.float16)).ok


def test_integers_must_be_equal():
    ref = np.array([1, 2, 3], np.int64)
    assert one(ref, ref.copy()).ok
    d = one(ref, ref + np.array([0, 0, 1]))
    assert not d.ok and d.max_abs == 1


def test_shape_dtype_missing_nan_inf():
    ref = np.array([1.0, np.nan, np.inf], np.float32)
    assert one(ref, ref.copy()).ok
    assert "NaN" in one(ref, np.array([1.0, 0.0, np.inf], np.float32)).problem
    assert "infinities" in one(ref, np.array([1.0, np.nan, -np.inf], np.float32)).problem
    assert "shape" in one(ref, ref[:2]).problem
    assert "dtype" in one(ref, ref.astype(np.float64)).problem
    (missing,) = compare_outputs({"y": ref}, {})
    assert not missing.ok and "missing" in missing.problem
