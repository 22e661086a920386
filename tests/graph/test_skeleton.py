import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph.skeleton import skeleton


def conv_model(cin_of_weight: int) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((64, cin_of_weight, 3, 3), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Reshape", ["c", "shape"],
                                                                       ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])], [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_large_weights_become_inputs_small_ones_stay():
    sk = skeleton(conv_model(3))
    assert [t.name for t in sk.graph.initializer] == ["shape"]
    assert [i.name for i in sk.graph.input] == ["x", "w"]
    dims = [d.dim_value for d in sk.graph.input[1].type.tensor_type.shape.dim]
    assert dims == [64, 3, 3, 3]
    assert sk.ByteSize() < 1000
    onnx.checker.check_model(sk)
    inferred = onnx.shape_inference.infer_shapes(sk, strict_mode=True, data_prop=True)
    out = inferred.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in out] == [1, 64 * 6 * 6], "small shape tensors still propagate"


def test_shape_errors_are_still_found():
    w = numpy_helper.from_array(np.ones((9, 300), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for m in (model, skeleton(model)):
        with pytest.raises(onnx.shape_inference.InferenceError, match="ncompatible"):
            onnx.shape_inference.infer_shapes(m, strict_mode=True)


def test_checker_errors_are_still_found():
    model = conv_model(3)
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(skeleton(model))


def test_the_model_is_not_modified():
    model = conv_model(3)
    before = model.SerializeToString()
    skeleton(model)
    assert model.SerializeToString() == before


def _branch_weights_model() -> onnx.ModelProto:
    """An If whose branches each hold a large weight (a torch.cond export's, once
    exported per body)."""
    def branch(name):
        w = numpy_helper.from_array(np.ones((64, 64), np.float32), f"w{name}")
        return helper.make_graph([helper.make_node("MatMul", ["x", f"w{name}"], [f"y{name}"])],
                                 name, [], [helper.make_tensor_value_info(
                                     f"y{name}", TensorProto.FLOAT, [1, 64])], [w])
    g = helper.make_graph(
        [helper.make_node("If", ["p"], ["y"], then_branch=branch("t"),
                          else_branch=branch("e"))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("p", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_large_weights_of_bodies_become_main_graph_inputs():
    """onnx.checker reads a body's external-data weight relative to the working directory;
    the skeleton has none left for it to read."""
    model = _branch_weights_model()
    sk = skeleton(model)
    assert sorted(i.name for i in sk.graph.input) == ["p", "we", "wt", "x"]
    assert [len(a.g.initializer) for a in sk.graph.node[0].attribute] == [0, 0]
    assert sk.ByteSize() < 1000
    onnx.checker.check_model(sk)
    inferred = onnx.shape_inference.infer_shapes(sk, strict_mode=True, data_prop=True)
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [1, 64]
    assert [len(a.g.initializer) for a in model.graph.node[0].attribute] == [1, 1]  # untouched
