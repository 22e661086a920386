"""If branches that name their tensors alike (optimum's merged decoders: both branches are
the decoder): ONNX's data propagation mixes them up, and a branch's own constant named
like a graph output must stay the branch's."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import assert_same_outputs
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import to_graph, to_model
from graphfix.graph.protos import data_propagation_safe, graph_protos
from graphfix.passes.manager import Verifier

F = TensorProto.FLOAT


def _const(name, value):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(value, np.int64)))


def _if_model(then, other, x_shape=("N", 3), y_shape=("N", 3)):
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    inputs = [helper.make_tensor_value_info("x", F, x_shape),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info("y", F, y_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _reshapes(same_names: bool):
    """then: x [N, 3] reshaped to [3, N] and transposed; else: reshaped to [1, N, 3] and
    squeezed. With `same_names`, both name their target `t` and reshape `r`."""
    suffix = "" if same_names else "_e"
    then = helper.make_graph([
        helper.make_node("Shape", ["x"], ["s"]), _const("a", [1]), _const("b", [2]),
        _const("z", [0]), helper.make_node("Slice", ["s", "a", "b"], ["s1"]),
        helper.make_node("Slice", ["s", "z", "a"], ["s0"]),
        helper.make_node("Concat", ["s1", "s0"], ["t"], axis=0),
        helper.make_node("Reshape", ["x", "t"], ["r"]),
        helper.make_node("Transpose", ["r"], ["o"], perm=[1, 0])],
        "then", [], [helper.make_tensor_value_info("o", F, None)])
    other = helper.make_graph([
        helper.make_node("Shape", ["x"], [f"s{suffix}"]), _const(f"a{suffix}", [1]),
        helper.make_node("Concat", [f"a{suffix}", f"s{suffix}"], [f"t{suffix}"], axis=0),
        helper.make_node("Reshape", ["x", f"t{suffix}"], [f"r{suffix}"]),
        _const(f"z{suffix}", [0]), helper.make_node("Squeeze", [f"r{suffix}", f"z{suffix}"],
                                                     [f"o{suffix}"])],
        "else", [], [helper.make_tensor_value_info(f"o{suffix}", F, None)])
    return _if_model(then, other)


def _ranks(inferred: onnx.ModelProto, name: str) -> dict[str, int]:
    return {g.name: len(vi.type.tensor_type.shape.dim) for g in graph_protos(inferred.graph)
            for vi in g.value_info if vi.name == name}


def test_data_propagation_is_off_where_two_branches_make_the_same_name():
    assert not data_propagation_safe(_reshapes(same_names=True).graph)
    assert data_propagation_safe(_reshapes(same_names=False).graph)
    flat = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                             [helper.make_tensor_value_info("x", F, [2])],
                             [helper.make_tensor_value_info("y", F, [2])])
    assert data_propagation_safe(flat)


@pytest.mark.parametrize("same_names", [True, False])
def test_each_branch_gets_its_own_shapes(same_names):
    # with data propagation, ONNX's lenient inference gave the else branch's Reshape the
    # then branch's rank (2 for 3), and strict inference stopped: "Data for input 0
    # already exists"; passes then saw, and the export wrote, the wrong shapes
    verifier = Verifier.for_input(_reshapes(same_names))
    assert verifier.strict_inference and not verifier.notes
    ranks = _ranks(verifier.inferred, "r")
    if same_names:
        assert ranks == {"then": 2, "else": 3}
    else:
        assert ranks == {"then": 2} and _ranks(verifier.inferred, "r_e") == {"else": 3}


def test_a_branch_constant_named_like_the_graph_output_stays_the_branchs():
    # optimum's merged decoder, once its Constant nodes are initializers: the with-past
    # branch returns an empty `present.*` constant under the If's own output name; gs's
    # import resolved it to the outer graph's output, and the export lost the constant
    then = helper.make_graph([], "then", [], [helper.make_tensor_value_info("y", F, [2, 3])],
                             [numpy_helper.from_array(np.full((2, 3), 7, np.float32), "y")])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "else", [],
                              [helper.make_tensor_value_info("y", F, None)])
    model = _if_model(then, other, x_shape=(2, 3), y_shape=(2, 3))
    graph = to_graph(model)
    assert isinstance(graph.nodes[0].attrs["then_branch"].outputs[0], gs.Constant)
    out = to_model(graph, model)
    onnx.checker.check_model(out, full_check=True)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    for flag in (True, False):
        assert_same_outputs(model, out, {"x": x, "flag": np.array(flag)}, rtol=0, atol=0)
