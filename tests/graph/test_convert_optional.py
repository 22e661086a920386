"""graph.convert round trips what onnx-graphsurgeon 0.6.1 loses: optional-typed tensors
and TYPE_PROTO attributes (Optional's `type`)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from graphfix import api
from graphfix.graph.convert import to_graph, to_model
from graphfix.report import PassStatus


def _model() -> onnx.ModelProto:
    """Optional() with a `type` attribute, Optional(x), an If choosing between them (its
    branches output optional tensors), OptionalHasElement; Dropout for cleanup."""
    float_type = helper.make_tensor_type_proto(TensorProto.FLOAT, None)
    optional = helper.make_optional_type_proto(float_type)

    def branch(name: str, source: str) -> onnx.GraphProto:
        out = helper.make_value_info(name, optional)
        return helper.make_graph([helper.make_node("Identity", [source], [name])], name, [],
                                 [out])

    nodes = [helper.make_node("Optional", [], ["none"], type=float_type),
             helper.make_node("Optional", ["x"], ["some"]),
             helper.make_node("If", ["c"], ["o"], then_branch=branch("a", "some"),
                              else_branch=branch("b", "none")),
             helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Dropout", ["x"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_optional_types_and_type_attributes_survive_the_round_trip():
    model = _model()
    back = to_model(to_graph(model), model)
    onnx.checker.check_model(back, full_check=True)
    optional = next(n for n in back.graph.node if n.op_type == "Optional" and not n.input)
    assert optional.attribute[0].type == onnx.AttributeProto.TYPE_PROTO
    assert optional.attribute[0].tp.tensor_type.elem_type == onnx.TensorProto.FLOAT
    branch = next(a.g for n in back.graph.node if n.op_type == "If" for a in n.attribute)
    assert branch.output[0].type.HasField("optional_type")


def test_a_model_with_optionals_is_rewritten_and_checked():
    model = _model()
    result = api.run(model, "cleanup")
    assert sorted(n.op_type for n in result.model.graph.node) == [
        "If", "Optional", "Optional", "OptionalHasElement", "Relu"]
    assert not result.report.rolled_back and result.report.check.enabled
    onnx.checker.check_model(result.model, full_check=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for cond in (True, False):
        feeds = {"x": np.array([-1.0, 2.0], np.float32), "c": np.array(cond)}
        want = ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)
        got = ort.InferenceSession(result.model.SerializeToString(), options).run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        assert bool(got[1]) == bool(want[1]) == cond


def _zipmap_model() -> onnx.ModelProto:
    """scikit-learn's classifier tail (skl2onnx): probabilities -> ai.onnx.ml ZipMap, a
    sequence of maps, beside a label Cast to its own type (what eliminate-noops removes)."""
    seq_map = helper.make_sequence_type_proto(helper.make_map_type_proto(
        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    nodes = [helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0),
             helper.make_node("Cast", ["label"], ["output_label"], to=TensorProto.INT64),
             helper.make_node("ZipMap", ["p"], ["output_probability"], domain="ai.onnx.ml",
                              classlabels_int64s=[0, 1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("output_label", TensorProto.INT64, ["N"]),
         helper.make_value_info("output_probability", seq_map)])
    model = helper.make_model(graph, ir_version=8, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_sequence_of_maps_keeps_its_type():
    """gs 0.6.1 imports ZipMap's output as a sequence of UNDEFINED tensors and wrote it
    back so: every changing pass on a scikit-learn classifier was rolled back (shape
    inference: 'type case mismatch, existing=tensor_type inferred=map_type')."""
    model = _zipmap_model()
    back = to_model(to_graph(model), model)
    assert back.graph.output[1].type == model.graph.output[1].type
    result = api.run(model, "eliminate-noops")
    assert [n.op_type for n in result.model.graph.node] == ["ArgMax", "ZipMap"]
    assert not result.report.rolled_back
    onnx.checker.check_model(result.model, full_check=True)
    assert result.model.graph.output[1].type == model.graph.output[1].type
    feeds = {"p": np.array([[0.2, 0.8], [0.9, 0.1]], np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)
    got = ort.InferenceSession(result.model.SerializeToString(), options).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]
    again = api.run(result.model, "eliminate-noops")
    assert [n.op_type for n in again.model.graph.node] == ["ArgMax", "ZipMap"]
    assert [p.status for p in again.report.passes] == [PassStatus.UNCHANGED]
