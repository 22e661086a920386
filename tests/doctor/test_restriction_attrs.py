"""Restriction sentences settled by attributes: recurrent activations and layout, Resize
modes and axes, Einsum equations, Attention, DeformConv and Pad — per TensorRT version,
as the matrix states them."""

from __future__ import annotations

import numpy as np
import pytest
from doctorhelpers import findings, messages, model, recurrent, said, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F = TP.FLOAT
ONLY = ["restrictions"]


@pytest.mark.parametrize(("op", "forward", "reverse"), [
    ("LSTM", ["Sigmoid", "Tanh", "Tanh"], ["Sigmoid", "Relu", "Tanh"]),
    ("GRU", ["Sigmoid", "Tanh"], ["HardSigmoid", "Tanh"]),
    ("RNN", ["Tanh"], ["Relu"]),
])
@pytest.mark.parametrize("trt", ["8.6", "10.16"])
def test_bidirectional_activations_must_match(op, forward, reverse, trt):
    found = said(recurrent(op, forward + reverse), trt)
    assert found == [(f"{op}: forward activations {forward}, reverse {reverse}",
                      f"matrix {trt}, {op} restriction: For bidirectional {op}s, activation "
                      "functions must be the same for both the forward and reverse pass")]


@pytest.mark.parametrize("activations", [None, ["Sigmoid", "Tanh", "Tanh"] * 2,
                                         ["sigmoid", "tanh", "tanh", "Sigmoid", "Tanh", "Tanh"]])
def test_matching_or_default_activations_are_met_silently(activations):
    assert findings(recurrent("LSTM", activations), "10.16", ONLY) == []


def test_forward_lstm_any_activations_is_met_silently():
    m = recurrent("LSTM", ["Sigmoid", "Relu", "Tanh"], direction="forward")
    assert findings(m, "10.16", ONLY) == []


def test_lstm_layout_and_input_forget_from_10_1_only():
    m = recurrent("LSTM", direction="forward", layout=1, input_forget=1)
    assert messages(m, "10.16") == ["LSTM: `input_forget` is 1", "LSTM: `layout` is 1"]
    assert messages(m, "10.1") == ["LSTM: `input_forget` is 1", "LSTM: `layout` is 1"]
    assert findings(m, "10.0", ONLY) == []  # the 10.0 matrix states neither


def test_layout_of_an_opset_without_it_is_met():
    assert findings(recurrent("LSTM", direction="forward", opset=13), "10.16", ONLY) == []


def resize(opset=19, inputs=("x", "", "scales"), inits=None, **attrs):
    scales = numpy_helper.from_array(np.array([2, 2], np.float32), "scales")
    node = helper.make_node("Resize", list(inputs), ["y"], name="rs", **attrs)
    graph_inputs = [vi("x", F, [1, 1, 4, 4])] + (
        [vi("scales", F, [2])] if inits == [] else [])
    return model([node], graph_inputs, [vi("y", F, None)],
                 [scales] if inits is None else inits, opset=opset)


def test_resize_axes_with_scales_computed_at_run_time_must_be_iota():
    m = resize(inits=[], axes=[2, 3])
    fact = ("matrix 10.16, Resize restriction: When `scales` is a tensor input, `axes` must be "
            "an iota vector of length rank(input)")
    assert said(m, "10.16") == [
        ("Resize: `scales` is computed at run time and `axes` is [2, 3], not 0..3", fact)]
    assert findings(m, "8.6", ONLY) == []  # not in the 8.6 matrix
    assert findings(resize(axes=[2, 3]), "10.16", ONLY) == []  # constant scales: reordered


@pytest.mark.parametrize(("attrs", "message"), [
    ({"nearest_mode": "floor"}, None),
    ({"mode": "linear", "nearest_mode": "round_prefer_ceil"}, None),
    ({"keep_aspect_ratio_policy": "not_larger"},
     "Resize: keep_aspect_ratio_policy is 'not_larger'"),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, "Resize: mode is 'cubic'"),
])
def test_resize_attributes(attrs, message):
    m = resize(inputs=("x", "", "", "sizes"), inits=[numpy_helper.from_array(
        np.array([1, 1, 8, 8], np.int64), "sizes")], **attrs)
    assert messages(m, "10.16") == ([message] if message else [])


def test_resize_policy_of_an_opset_without_it_is_met():
    m = resize(opset=13, inputs=("x", "", "scales4"), inits=[numpy_helper.from_array(
        np.array([1, 1, 2, 2], np.float32), "scales4")])
    assert findings(m, "10.16", ONLY) == []


def einsum(equation, *shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], name="es", equation=equation)
    return model([node], [vi(n, F, s) for n, s in zip(names, shapes, strict=True)],
                 [vi("y", F, None)], opset=12)


@pytest.mark.parametrize(("m", "expected"), [
    (einsum("ij,jk->ik", [2, 3], [3, 4]), []),
    (einsum("...ij,jk->...ik", [5, 2, 3], [3, 4]),
     ["Einsum: its equation '...ij,jk->...ik' uses an ellipsis"]),
    (einsum("ii->i", [3, 3]), ["Einsum: its equation 'ii->i' takes a diagonal ('ii')"]),
    (einsum("ij,jk->ik", [2, 1], [3, 4]),
     ["Einsum: index 'j' has sizes [1, 3] in different inputs"]),
])
def test_einsum_on_8_6(m, expected):
    assert messages(m, "8.6") == expected
    assert findings(m, "10.16", ONLY) == []  # the 10.x matrices state no Einsum restriction


def test_einsum_broadcast_of_unknown_sizes_is_unchecked():
    m = einsum("ij,jk->ik", [2, "n"], [3, 4])
    assert said(m, "8.6", "restriction-unchecked") == [
        ("Einsum: TensorRT states a restriction doctor cannot check from the model alone",
         "matrix 8.6, Einsum restriction: Broadcasting between inputs is not supported")]


def attention(q_shape=(1, 2, 3, 8), outputs=("y",), inputs=("q", "k", "v"), **attrs):
    node = helper.make_node("Attention", list(inputs), list(outputs), name="att", **attrs)
    kv = [1, 2, 3, 8]
    graph_inputs = [vi("q", F, list(q_shape)), vi("k", F, kv), vi("v", F, kv)] + [
        vi(n, F, [1, 2, 3, 8]) for n in inputs[3:] if n]
    return model([node], graph_inputs, [vi(o, F, None) for o in outputs if o], opset=23)


def test_attention_in_4d_without_extras_is_met():
    assert findings(attention(), "10.16", ONLY) == []


@pytest.mark.parametrize(("m", "message"), [
    (attention(q_shape=(1, 3, 16), q_num_heads=2, kv_num_heads=2), "Attention: `Q` has rank 3"),
    (attention(inputs=("q", "k", "v", "", "pk", "pv")),
     "Attention: it has `past_key`, `past_value`"),
    (attention(outputs=("y", "pk_out")), "Attention: it has `present_key`"),
    (attention(softcap=2.0, qk_matmul_output_mode=0), "Attention: `softcap` is 2.0"),
    (attention(q_num_heads=4), "Attention: `q_num_heads` is 4 but dimension 1 of input 0 is 2"),
])
def test_attention_restrictions_from_10_16(m, message):
    assert messages(m, "10.16") == [message]
    assert findings(m, "10.1", ONLY) == []  # 10.1 does not list Attention


def test_deform_conv_pads_and_spatial_rank():
    w = numpy_helper.from_array(np.zeros((2, 1, 3, 3), np.float32), "w")
    node = helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name="dc",
                            pads=[1, 0, 0, 1])
    m = model([node], [vi("x", F, [1, 1, 8, 8]), vi("off", F, [1, 18, 6, 6])],
              [vi("y", F, None)], [w], opset=19)
    assert messages(m, "10.16") == ["DeformConv: pads [1, 0, 0, 1]"]
    w3 = numpy_helper.from_array(np.zeros((2, 1, 3, 3, 3), np.float32), "w")
    node3 = helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name="dc")
    m3 = model([node3], [vi("x", F, [1, 1, 8, 8, 8]), vi("off", F, [1, 54, 6, 6, 6])],
               [vi("y", F, None)], [w3], opset=19)
    assert messages(m3, "10.16") == ["DeformConv: 3-D DeformConv (only 1-D or 2-D are supported)"]


def pad(mode="constant", pads=(0, 0, 1, 1, 0, 0, 1, 1), value=0.0):
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value")]
    node = helper.make_node("Pad", ["x", "pads", "value"], ["y"], name="pad", mode=mode)
    return model([node], [vi("x", F, [1, 1, 4, 4])], [vi("y", F, None)], inits, opset=13)


@pytest.mark.parametrize(("m", "expected"), [
    (pad(), []),
    (pad(mode="reflect"), ["Pad: mode is 'reflect'"]),
    (pad(value=1.5), ["Pad: its constant value is 1.5"]),
    (pad(pads=(0, 1, 1, 1, 0, 1, 1, 1)), ["Pad: it pads 3 dimensions"]),
])
def test_pad_on_8_0_only(m, expected):
    assert messages(m, "8.0") == expected
    assert findings(m, "8.2", ONLY) == []
