import onnx
from onnx import TensorProto, helper

from graphfix.graph import to_graph, to_model
from graphfix.passes.base import PassContext
from graphfix.passes.fix_shapes import FixShapes
from graphfix.passes.manager import Verifier


def test_negative_dims_become_unknown_and_shape_inference_agrees():
    # paddle2onnx writes -1 for unknown dims; ONNX dims are >= 0
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [-1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Neg", ["r"], ["y"])], "g", [x], [y], value_info=[r])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    graph = to_graph(model)
    assert graph.outputs[0].shape == [None, 3]
    assert graph.tensors()["r"].shape == [None, 3]
    out = to_model(graph, model)
    onnx.shape_inference.infer_shapes(out, strict_mode=True)
    assert Verifier.for_input(out).strict_inference


def test_fix_shapes_keeps_output_shapes_inference_cannot_find():
    # a custom op: inference cannot type its output, so the declared shape must stay
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    g = helper.make_graph([helper.make_node("Frob", ["x"], ["y"], domain="acme")], "g", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("acme", 1)], ir_version=8)
    graph = to_graph(model)
    FixShapes(FixShapes.parse_options([("x", "2x3")])).run(graph, PassContext())
    assert graph.inputs[0].shape == [2, 3]
    assert graph.outputs[0].shape == ["N", 3]

