import numpy as np

from graphfix.runtime.compare import compare_outputs
from graphfix.runtime.tolerances import FLOOR_FACTOR, Tolerance, tolerance_for


def one(ref, cand, **kw):
    (diff,) = compare_outputs({"y": ref}, {"y": cand}, **kw)
    return diff


def test_error_is_measured_against_the_tensor_scale_not_each_element():
    # A deep network's logits: scale 400, one element near zero. Reassociation moves every
    # element by ~1e-7 of the scale (6e-5 absolute): the near-zero one by 30% of itself.
    ref = np.array([400.0, -250.0, 2e-4], np.float32)
    noise = np.array([6e-5, -6e-5, 6e-5], np.float32)
    d = one(ref, ref + noise)
    assert d.ok
    assert 1e-7 < d.scaled < 2e-7
    assert not np.isclose(ref[2] + noise[2], ref[2], rtol=1e-4, atol=1e-5)  # the old verdict
    # The same tensor with one element 1e-4 of the scale off: a bug, not rounding.
    assert not one(ref, ref + np.array([0, 0, 0.04], np.float32)).ok


def test_the_bound_is_10_units_of_1e_6_of_the_scale_for_fp32():
    ref = np.linspace(-1, 1, 101).astype(np.float32) * 100
    step = np.zeros_like(ref)
    step[50] = 100 * 0.9e-5  # an element at 0, moved by 0.9e-5 of the scale: kept
    assert one(ref, ref + step).ok
    step[50] = 100 * 1.2e-5  # 1.2e-5 of the scale: refused
    assert not one(ref, ref + step).ok


def test_the_models_noise_floor_widens_the_bound():
    ref = np.array([1.0, 0.0], np.float32)
    cand = ref + np.float32(1e-3)
    assert not one(ref, cand).ok
    assert not one(ref, cand, floors={"y": 1e-3 / FLOOR_FACTOR / 2}).ok
    assert one(ref, cand, floors={"y": 1e-3 / FLOOR_FACTOR * 1.01}).ok


def test_all_zero_reference_allows_only_tiny_absolute_noise():
    ref = np.zeros(4, np.float32)
    assert one(ref, ref + np.float32(1e-8)).ok
    assert not one(ref, ref + np.float32(1e-5)).ok


def test_fp16_is_looser_than_fp32():
    assert tolerance_for(np.float16).scale > tolerance_for(np.float32).scale
    ref = np.array([1.0, 2.0], np.float16)
    assert one(ref, (ref * np.float16(1.001)).astype(np.float16)).ok


def test_user_tolerance_is_elementwise_only():
    ref = np.array([400.0, 2e-4], np.float32)
    cand = ref + np.float32(6e-5)
    assert not one(ref, cand, float_tolerance=Tolerance(1e-4, 1e-5, 0.0)).ok
    assert one(ref, cand, float_tolerance=Tolerance(1e-4, 1e-4, 0.0)).ok


def test_integers_must_be_equal():
    ref = np.array([1, 2, 3], np.int64)
    assert one(ref, ref.copy()).ok
    d = one(ref, ref + np.array([0, 0, 1]))
    assert not d.ok and d.max_abs == 1
    assert one(np.array([True, False]), np.array([True, False])).ok
    assert not one(np.array([True, False]), np.array([True, True])).ok


def test_shape_dtype_missing_nan_inf():
    ref = np.array([1.0, np.nan, np.inf], np.float32)
    assert one(ref, ref.copy()).ok
    assert "NaN" in one(ref, np.array([1.0, 0.0, np.inf], np.float32)).problem
    assert "infinity" in one(ref, np.array([1.0, np.nan, -np.inf], np.float32)).problem
    assert "infinity where" in one(np.ones(2, np.float32), np.array([1, np.inf],
                                                                   np.float32)).problem
    assert "shape" in one(ref, ref[:2]).problem
    assert "dtype" in one(ref, ref.astype(np.float64)).problem
    (missing,) = compare_outputs({"y": ref}, {})
    assert not missing.ok and "missing" in missing.problem


def test_describe_names_the_numbers():
    ref = np.array([400.0, 1.0], np.float32)
    text = one(ref, ref + np.float32(0.5)).describe()
    assert text.startswith("y: max abs 0.5 = 0.0013 of max|ref| 400, SQNR 55 dB")
    assert text.endswith("(allowed 0.004)")
    assert one(ref, ref.copy()).describe() == "y: exact"


def test_an_empty_optional_compares_equal_only_to_an_empty_optional():
    # onnxruntime returns None for an empty optional output (ONNX's test_if_opt with its
    # condition true): it was "missing from the rewritten model" though both were empty
    same, = compare_outputs({"o": None}, {"o": None})
    assert same.ok and same.max_abs == 0.0
    one, = compare_outputs({"o": None}, {"o": np.zeros(2, np.float32)})
    assert not one.ok and one.problem == "an empty optional in one model only"
    other, = compare_outputs({"o": np.zeros(2, np.float32)}, {"o": None})
    assert not other.ok and other.problem == "an empty optional in one model only"
    gone, = compare_outputs({"o": None}, {})
    assert not gone.ok and gone.problem == "missing from the rewritten model"
