"""graphfix.calibrate end to end on digits_dev (issue 5's acceptance) and its comparison."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graphfix.calibration.evaluate import compare
from graphfix.calibration.runner import calibrate
from graphfix.errors import GraphfixError
from graphfix.runtime.data import open_data


@pytest.fixture(scope="module")
def digits(request):
    from conftest import SHARED_MODELS

    model_path = SHARED_MODELS / "digits_dev.onnx"
    data_path = SHARED_MODELS / "digits_dev_data.npz"
    if not model_path.exists():
        pytest.skip("../shared/models is not available")
    model = onnx.load(model_path)
    calib = open_data(data_path, model, data_key="calib", batch_size=50)
    test = open_data(data_path, model, data_key="test", batch_size=100)
    with np.load(data_path) as archive:
        labels = archive["test_labels"]
    return model, calib, test, labels


def test_digits_accuracy_within_one_point_of_fp32(digits):
    model, calib, test, labels = digits
    result = calibrate(model, calib, ("entropy", "minmax", "percentile"), eval_data=test,
                       labels=labels)
    assert result.notes and result.notes[0].startswith("fold-bn")
    for outcome in result.outcomes:
        a = outcome.agreement
        assert a.samples == 397
        assert a.accuracy >= a.reference_accuracy - 0.01, (outcome.method, a)
        _assert_trt_legal(outcome.model)
    assert result.recommended in ("entropy", "minmax", "percentile")


def _assert_trt_legal(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    inits = {t.name: t for t in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zero is not None:
            assert zero.data_type == onnx.TensorProto.INT8
            assert not numpy_helper.to_array(zero).any()
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            assert inits[node.input[0]].data_type == onnx.TensorProto.INT8


def test_identical_models_agree_fully(digits):
    model, _, test, labels = digits
    a = compare(model, model, test, labels)
    assert (a.samples, a.sqnr_db, a.top1_agreement) == (397, float("inf"), 1.0)
    assert a.accuracy == a.reference_accuracy


def test_unknown_method_is_a_user_error(digits):
    model, calib, _, _ = digits
    with pytest.raises(GraphfixError, match="unknown calibration method"):
        calibrate(model, calib, ("kl",))


def test_per_tensor_choice_among_minmax_entropy_percentile(digits):
    model, calib, test, labels = digits
    result = calibrate(model, calib, ("entropy",), per_tensor=True, eval_data=test,
                       labels=labels)
    (outcome,) = result.outcomes
    assert outcome.method == "entropy+per-tensor"
    assert set(outcome.chosen_by_tensor) == set(result.stats)
    assert set(outcome.chosen_by_tensor.values()) <= {"minmax", "entropy", "percentile"}
    assert outcome.agreement.accuracy >= outcome.agreement.reference_accuracy - 0.01


def test_opset_11_models_are_moved_to_13_before_quantizing(shared_model):
    """ppocr (Paddle, opset 11, '?' dims) calibrates end to end: Q/DQ needs opset 13."""
    model = onnx.load(shared_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"))
    x = np.random.default_rng(0).random((8, 3, 48, 192), dtype=np.float32)
    data = [{"x": x[i:i + 4]} for i in range(0, 8, 4)]
    result = calibrate(model, data, ("minmax",), eval_data=data)
    assert any(n.startswith("opset{version=13}") for n in result.notes)
    quantized = result.outcome().model
    assert next(o.version for o in quantized.opset_import if o.domain == "") >= 13
    assert result.outcome().agreement.sqnr_db > 15
