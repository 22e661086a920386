"""graphfix.calibrate end to end on digits_dev (issue 5's acceptance) and its comparison."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from graphfix.calibration.algorithms import percentile
from graphfix.calibration.evaluate import compare
from graphfix.calibration.runner import Request, calibrate
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
    with pytest.raises(GraphfixError, match="Unknown calibration method 'kl'"):
        calibrate(model, calib, ("kl",))


def test_per_tensor_choice_among_minmax_entropy_percentile(digits):
    model, calib, test, labels = digits
    request = Request.make("minmax,entropy,percentile", {"--percentile": 99.9}, per_tensor=True)
    result = calibrate(model, calib, request, eval_data=test, labels=labels)
    (outcome,) = result.outcomes
    assert outcome.method == result.recommended == "per-tensor(minmax,entropy,percentile)"
    assert set(outcome.chosen_by_tensor) == set(result.stats)
    assert set(outcome.chosen_by_tensor.values()) <= {"minmax", "entropy", "percentile"}
    for tensor, how in outcome.chosen_by_tensor.items():  # --percentile reaches the choice
        if how == "percentile":
            assert outcome.amaxes[tensor] == percentile(result.stats[tensor], 99.9)
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


def test_one_statistics_pass_and_one_shape_inference_for_every_method(monkeypatch):
    """--method all: the model is shape-inferred once (for the statistics), the data is
    read in one pass for auto/minmax/percentile/mse and two with entropy's exact
    histogram, and the FP32 model runs once per evaluation batch (test_evaluate)."""
    from graphfix import samples
    from graphfix.calibration import runner

    fp32, _ = runner.prepare(samples.conv_bn_relu_residual())
    x = np.random.default_rng(0).standard_normal((12, 3, 32, 32)).astype(np.float32)
    data = [{"input": x[i:i + 4]} for i in range(0, 12, 4)]
    calls = []
    original = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    result = calibrate(fp32, data, ("all",), eval_data=data[:1])
    assert len(calls) == 1
    assert [o.method for o in result.outcomes] == ["auto", "entropy", "minmax", "percentile",
                                                   "mse"]
    assert any("in 2 passes (1 chunk)" in n for n in result.notes)  # entropy: exact
    calls.clear()
    one = calibrate(fp32, data, ("auto", "mse"))
    assert len(calls) == 1 and any("in 1 pass (1 chunk)" in n for n in one.notes)
    assert one.recommended == "auto" and one.outcomes[0].agreement is None


def test_a_weight_computed_from_constants_is_folded_and_quantized():
    """torch's default exporter writes GPT-2's tied lm_head weight as Transpose(embedding
    table): calibrate folds it (it used to leave the MatMul float, with the advice to run
    fold-constants) and quantizes the MatMul per channel; the table's Gather keeps the
    float table."""
    from gfhelpers import build_model
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Transpose", ["table"], ["tied"], name="tie", perm=[1, 0]),
             helper.make_node("MatMul", ["e", "tied"], ["logits"], name="head")]
    model = build_model(
        nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 3, 10])],
        [numpy_helper.from_array(table, "table")])
    data = [{"ids": rng.integers(0, 10, (2, 3))} for _ in range(4)]
    result = calibrate(model, data, ("minmax",))
    assert any(n.startswith("fold-constants") for n in result.notes)
    assert not any("'head'" in n for n in result.notes)  # not "not quantized: MatMul 'head'"
    q = result.outcome().model
    head = next(n for n in q.graph.node if n.name == "head")
    producers = {o: n for n in q.graph.node for o in n.output}
    weight_dq = producers[head.input[1]]
    assert weight_dq.op_type == "DequantizeLinear"
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    assert inits[weight_dq.input[0]].shape == (4, 10)  # the folded [K, N] weight, per channel
    assert inits[weight_dq.input[1]].shape == (10,)
    assert next(n for n in q.graph.node if n.name == "embed").input[0] == "table"
    _assert_trt_legal(q)
    onnx.checker.check_model(q, full_check=True)


def test_an_activation_shape_inference_cannot_type_keeps_its_readers_float():
    """onnxruntime's optimized models: a com.microsoft op's output has no type for ONNX's
    inference, so the statistics pass cannot expose it. The MatMul reading it stays float
    (weight too), with the reason; calibrate used to stop with 'no amax for 1 of the 2
    tensors to quantize'."""
    from gfhelpers import contrib_gelu_mlp

    rng = np.random.default_rng(1)
    model = contrib_gelu_mlp()
    data = [{"x": rng.standard_normal((2, 8)).astype(np.float32)} for _ in range(3)]
    result = calibrate(model, data, ("minmax",))
    assert result.plan.activations == ("x",) and [w[1] for w in result.plan.weights] == ["fc1"]
    note = next(n for n in result.notes if "MatMul 'fc2'" in n)
    assert "its input 'g' was not calibrated: its type is unknown" in note
    assert "com.microsoft Gelu" in note
    q = result.outcome().model
    fc2 = next(n for n in q.graph.node if n.name == "fc2")
    assert list(fc2.input) == ["g", "w2"]  # float activation, float weight
    assert sum(n.op_type == "DequantizeLinear" for n in q.graph.node) == 2  # x and w1
