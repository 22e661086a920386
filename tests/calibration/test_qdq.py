"""graphfix.calibration.qdq: the Q/DQ form TensorRT takes (INT8 zero points of 0, per-channel
axes, float bias, names), onnx.checker, onnxruntime numerics, doctor's Q/DQ rules, user
errors, and digits_dev's accuracy after fold-bn (the issue's acceptance)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import build_model
from onnx import helper, numpy_helper
from qdqhelpers import (
    assert_close_to_fp32,
    assert_trt_form,
    conv,
    conv_relu_conv,
    dq_node,
    dq_sources,
    feeds,
    gemm_model,
    init,
    node,
    observed_amaxes,
    quantized,
    residual_model,
    vi,
)

from graphfix.calibration import qdq
from graphfix.errors import GraphfixError
from graphfix.runtime.session import make_session


def test_conv_relu_conv_placement_and_form():
    model = conv_relu_conv()
    plan, q = quantized(model)
    assert plan.activations == ("x", "r")
    assert plan.weights == (("w1", "conv1", 0), ("w2", "conv2", 0))
    assert plan.edges == (("x", "conv1", 0), ("r", "conv2", 0))
    assert (plan.shared, plan.skipped) == ((), ())
    assert dq_sources(q) == {("conv1", 0): "x", ("conv1", 1): "w1", ("conv2", 0): "r",
                             ("conv2", 1): "w2"}
    assert node(q, "conv1").input[2] == "b1"  # bias stays float
    assert node(q, "relu").input == ["c1"]  # the Conv output is not quantized
    for name, channels in (("w1", 8), ("w2", 4)):
        dq = dq_node(q, f"{name}_quantized")
        assert dq.name == f"{name}_DequantizeLinear"
        assert helper.get_attribute_value(dq.attribute[0]) == 0
        scale = numpy_helper.to_array(next(t for t in q.graph.initializer
                                           if t.name == f"{name}_scale"))
        assert scale.shape == (channels,)
    assert [n.name for n in q.graph.node if n.op_type == "QuantizeLinear"] == \
        ["x_QuantizeLinear", "r_QuantizeLinear"]
    assert_trt_form(q)
    assert_close_to_fp32(model, q)
    assert [o.name for o in q.graph.output] == ["y"]


def test_activation_scale_is_amax_over_127_and_zero_amax_is_tiny():
    model = conv_relu_conv()
    plan = qdq.plan(model)
    q = qdq.quantize(model, plan, {"x": 2.54, "r": 0.0})
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    assert inits["x_scale"] == np.float32(0.02) and inits["x_scale"].shape == ()
    assert inits["r_scale"] == np.float32(qdq.MIN_SCALE)


def test_quantize_leaves_the_input_model_alone():
    model = conv_relu_conv()
    before = model.SerializeToString()
    quantized(model)
    assert model.SerializeToString() == before


@pytest.mark.parametrize("trans_b, axis", [(1, 0), (0, 1)])
def test_gemm_weight_is_per_output_channel(trans_b, axis):
    model = gemm_model(trans_b)
    plan, q = quantized(model)
    assert plan.weights == (("w", "gemm", axis),)
    assert dq_sources(q) == {("gemm", 0): "x", ("gemm", 1): "w"}
    assert node(q, "gemm").input[2] == "b"
    dq = dq_node(q, "w_quantized")
    assert helper.get_attribute_value(dq.attribute[0]) == axis
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_matmul_with_2d_weight_uses_the_last_axis():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = build_model(nodes, [vi("x", [2, 3, 8])], [vi("y", None)], [init("w", [8, 5])])
    plan, q = quantized(model)
    assert plan.weights == (("w", "mm", 1),)
    assert dq_sources(q) == {("mm", 0): "x", ("mm", 1): "w"}
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_conv_transpose_with_groups_is_per_channel_on_axis_1():
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv", group=2,
                              strides=[2, 2])]
    model = build_model(nodes, [vi("x", [1, 4, 5, 5])], [vi("y", None)],
                        [init("w", [4, 3, 3, 3], 1), init("b", [6], 2)])
    plan, q = quantized(model)
    assert plan.weights == (("w", "deconv", 1),)
    dq = dq_node(q, "w_quantized")
    assert helper.get_attribute_value(dq.attribute[0]) == 1
    scale = next(numpy_helper.to_array(t) for t in q.graph.initializer if t.name == "w_scale")
    assert scale.shape == (3,)  # W is [C_in, C_out / group, kH, kW]
    assert node(q, "deconv").input[2] == "b"
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_a_weight_shared_by_two_convs_gets_one_dequantize():
    nodes = [conv("conv1", "x", "w", "a"), conv("conv2", "x", "w", "b"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    model = build_model(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], [init("w", [3, 3, 3, 3])])
    _, q = quantized(model)
    assert [n.name for n in q.graph.node if n.op_type == "DequantizeLinear"].count(
        "w_DequantizeLinear") == 1
    assert node(q, "conv1").input[1] == node(q, "conv2").input[1]
    assert_trt_form(q)


def test_per_tensor_weights():
    model = conv_relu_conv()
    plan = qdq.plan(model)
    q = qdq.quantize(model, plan, observed_amaxes(model, plan.activations, [feeds(model)]),
                     per_channel=False)
    dq = dq_node(q, "w1_quantized")
    assert list(dq.attribute) == []
    scale = next(numpy_helper.to_array(t) for t in q.graph.initializer if t.name == "w1_scale")
    assert scale.shape == ()
    assert_trt_form(q)


def test_quantize_weight_rounds_half_to_even_and_clips():
    w = np.array([[127.0, 0.5, 1.5, -2.5], [0.0, 0.0, 0.0, 0.0]], np.float32)
    q, scale = qdq.quantize_weight(w, 0)
    np.testing.assert_array_equal(scale, np.array([1.0, qdq.MIN_SCALE], np.float32))
    np.testing.assert_array_equal(q, [[127, 0, 2, -2], [0, 0, 0, 0]])
    assert q.dtype == np.int8
    q, scale = qdq.quantize_weight(np.array([[-254.0], [1.0]], np.float32), None)
    assert scale == np.float32(2.0) and q.ravel().tolist() == [-127, 0]


def test_bad_amaxes_are_user_errors():
    model = conv_relu_conv()
    plan = qdq.plan(model)
    with pytest.raises(GraphfixError, match="no amax for 1 of the 2 tensors"):
        qdq.quantize(model, plan, {"x": 1.0})
    with pytest.raises(GraphfixError, match="not a finite number"):
        qdq.quantize(model, plan, {"x": 1.0, "r": float("nan")})
    with pytest.raises(GraphfixError, match="not a finite number"):
        qdq.quantize(model, plan, {"x": -1.0, "r": 1.0})


def test_a_plan_for_another_model_is_refused():
    plan = qdq.plan(conv_relu_conv())
    with pytest.raises(GraphfixError, match="plan does not match the model"):
        qdq.quantize(gemm_model(1), plan, {"x": 1.0, "r": 1.0})


def test_plan_without_edges_quantizes_every_reader():
    model = residual_model()
    full = qdq.plan(model)
    bare = qdq.QuantPlan(full.activations, full.weights, full.shared, full.skipped)
    q = qdq.quantize(model, bare, {"x": 1.0, "r": 2.0})
    assert ("add", 1) in dq_sources(q) and ("conv2", 0) in dq_sources(q)


def test_low_opset_is_refused_or_converted():
    model = conv_relu_conv()
    model.opset_import[0].version = 12
    onnx.checker.check_model(model)
    plan = qdq.plan(model)
    amaxes = {"x": 3.0, "r": 3.0}
    with pytest.raises(GraphfixError, match="opset\\{version=13\\}"):
        qdq.quantize(model, plan, amaxes)
    q = qdq.quantize(model, plan, amaxes, opset=13)
    assert q.opset_import[0].version == 13
    assert_trt_form(q)
    with pytest.raises(GraphfixError, match="needs opset 13"):
        qdq.quantize(model, plan, amaxes, opset=12)


def test_an_already_quantized_model_is_refused():
    _, q = quantized(conv_relu_conv())
    with pytest.raises(GraphfixError, match="already quantized"):
        qdq.plan(q)


def test_digits_dev_after_fold_bn_keeps_accuracy_within_one_point(shared_model):
    """The issue's acceptance: symmetric INT8 Q/DQ, amaxes = max |x| over 64 calibration
    samples, accuracy on the 397 held-apart test images within 1 point of FP32."""
    import graphfix.api

    model = onnx.load(shared_model("digits_dev.onnx"))
    with np.load(shared_model("digits_dev_data.npz")) as data:
        calib, test, labels = data["calib"], data["test"], data["test_labels"]
    with pytest.raises(GraphfixError, match="fold-bn"):
        qdq.plan(model)
    fp32 = graphfix.api.run(model, passes="fold-bn", check=False).model
    plan = qdq.plan(fp32)
    assert len(plan.weights) == 5 and plan.skipped == ()
    amaxes = observed_amaxes(fp32, plan.activations,
                             [{"input": calib[i:i + 16]} for i in range(0, 64, 16)])
    q = qdq.quantize(fp32, plan, amaxes)
    assert_trt_form(q)

    def accuracy(m):
        logits = make_session(m).run(None, {"input": test})[0]
        return float((logits.argmax(axis=1) == labels).mean())

    ref, got = accuracy(fp32), accuracy(q)
    assert ref > 0.98
    assert got >= ref - 0.01, (ref, got)


def test_nodes_sharing_a_name_cannot_be_planned_for():
    model = conv_relu_conv()
    model.graph.node[2].name = "conv1"  # two nodes named conv1
    with pytest.raises(GraphfixError, match="no input 0 'x' of node 'conv1'"):
        qdq.quantize(model, qdq.plan(model), {"x": 1.0, "r": 1.0})
