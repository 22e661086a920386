"""Restriction sentences settled by inputs: ranks, static dims, element types, constant
inputs, index values — and sentences other rules or sentences answer."""

from __future__ import annotations

import numpy as np
from doctorhelpers import findings, messages, model, said, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F = TP.FLOAT
ONLY = ["restrictions"]


def test_hardmax_axis_dimension_must_be_static():
    node = helper.make_node("Hardmax", ["x"], ["y"], name="hm", axis=1)
    dynamic = model([node], [vi("x", F, [2, "classes"])], [vi("y", F, None)], opset=13)
    assert said(dynamic, "10.16") == [
        ("Hardmax: dimension 1 of its input is dynamic ('classes')",
         "matrix 10.16, Hardmax restriction: `axis` dimension of input must be a build-time "
         "constant")]
    static = model([node], [vi("x", F, ["n", 5])], [vi("y", F, None)], opset=13)
    assert findings(static, "10.16", ONLY) == []  # only the axis dimension counts


def test_eye_like_input_must_be_static():
    node = helper.make_node("EyeLike", ["x"], ["y"], name="eye")
    m = model([node], [vi("x", F, ["n", 4])], [vi("y", F, None)])
    assert messages(m, "10.16") == ["EyeLike: input dimensions [0] are dynamic"]


def test_rotary_embedding_position_ids_must_be_int64():
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope")
    inputs = [vi("x", F, [1, 2, 3, 8]), vi("cos", F, [16, 4]), vi("sin", F, [16, 4])]
    bad = model([node], [*inputs, vi("pos", TP.INT32, [1, 3])], [vi("y", F, None)], opset=23)
    assert messages(bad, "10.16") == ["RotaryEmbedding: `position_ids` is INT32"]
    good = model([node], [*inputs, vi("pos", TP.INT64, [1, 3])], [vi("y", F, None)], opset=23)
    assert findings(good, "10.16", ONLY) == []


def stft(signal_shape):
    step = numpy_helper.from_array(np.array(4, np.int64), "step")
    window = numpy_helper.from_array(np.ones(8, np.float32), "window")
    node = helper.make_node("STFT", ["signal", "step", "window"], ["y"], name="stft")
    return model([node], [vi("signal", F, signal_shape)], [vi("y", F, None)], [step, window])


def test_stft_signal_must_be_real():
    assert messages(stft([1, 64, 2]), "10.16") == [
        "STFT: its signal is complex (last dimension 2)"]
    assert findings(stft([1, 64, 1]), "10.16", ONLY) == []


def test_tensor_scatter_ranks_and_default_axis():
    node = helper.make_node("TensorScatter", ["cache", "update"], ["y"], name="ts")
    m = model([node], [vi("cache", F, [1, 2, 16, 8]), vi("update", F, [1, 2, 1, 8])],
              [vi("y", F, None)], opset=24)
    assert findings(m, "10.16", ONLY) == []  # axis defaults to -2, as the matrix wants
    bad = helper.make_node("TensorScatter", ["cache", "update"], ["y"], name="ts", axis=1)
    m3 = model([bad], [vi("cache", F, [2, 16, 8]), vi("update", F, [2, 1, 8])],
               [vi("y", F, None)], opset=24)
    assert messages(m3, "10.16") == [
        "TensorScatter: `past_cache` has rank 3, `update` has rank 3",
        "TensorScatter: `axis` is 1"]


def test_float_range_needs_constant_inputs_on_8_0():
    node = helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range")
    delta = numpy_helper.from_array(np.array(1.0, np.float32), "delta")
    m = model([node], [vi("start", F, []), vi("limit", F, [])], [vi("y", F, None)], [delta],
              opset=11)
    assert messages(m, "8.0") == [
        "Range: its inputs are FLOAT and `start`, `limit` computed at run time"]
    ints = model([node], [vi("start", TP.INT64, []), vi("limit", TP.INT64, [])],
                 [vi("y", TP.INT64, None)],
                 [numpy_helper.from_array(np.array(1, np.int64), "delta")], opset=11)
    assert findings(ints, "8.0", ONLY) == []


def test_negative_gather_indices_are_one_finding_on_8_0():
    indices = numpy_helper.from_array(np.array([-1], np.int64), "i")
    node = helper.make_node("Gather", ["x", "i"], ["y"], name="g")
    m = model([node], [vi("x", F, [4])], [vi("y", F, None)], [indices])
    assert said(m, "8.0") == [("Gather: it has negative indices",
                               "matrix 8.0, Gather restriction: Only positive indices (>=0) "
                               "are supported")]
