"""graph.wellformed: what no command can work on is refused at load, with its reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix import io
from graphfix.errors import GraphfixError
from graphfix.graph.wellformed import check_wellformed, tensor_data_problem


def _if_model(depth: int, outer_name: str = "h") -> onnx.ModelProto:
    """x -> Relu -> h; If bodies nested `depth` deep, the innermost reads `outer_name`."""
    body = helper.make_graph([helper.make_node("Neg", [outer_name], ["b0"])], "b0", [],
                             [helper.make_tensor_value_info("b0", 1, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "e", [],
                              [helper.make_tensor_value_info("e", 1, [2])])
    for level in range(1, depth):  # one branch nests, so the model grows linearly
        node = helper.make_node("If", ["c"], [f"b{level}"], then_branch=body,
                                else_branch=other)
        body = helper.make_graph([node], f"b{level}", [],
                                 [helper.make_tensor_value_info(f"b{level}", 1, [2])])
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, [2])],
                              [numpy_helper.from_array(np.array(True), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraphs_see_the_names_of_every_graph_around_them():
    check_wellformed(_if_model(3), "m.onnx")
    with pytest.raises(GraphfixError, match=r"Neg .*\(in If .*> If .*\) reads 'nowhere', "
                       "which no node, graph input or initializer defines"):
        check_wellformed(_if_model(3, "nowhere"), "m.onnx")


def test_deep_nesting_is_walked_without_recursion():
    import inspect
    import sys

    model = _if_model(30)  # protobuf itself parses no more than about 30 If levels
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 25)  # a recursive walk needs 30+ frames
    try:
        check_wellformed(model, "deep.onnx")
    finally:
        sys.setrecursionlimit(limit)


def test_a_cycle_names_its_nodes_and_an_unsorted_graph_passes():
    nodes = [helper.make_node("Neg", ["h"], ["y"], name="neg"),
             helper.make_node("Relu", ["x"], ["h"], name="relu")]  # unsorted, acyclic
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_wellformed(model, "m.onnx")
    model.graph.node[1].input[0] = "y"
    with pytest.raises(GraphfixError, match="nodes form a cycle: Neg 'neg', Relu 'relu' "
                       "wait on each other"):
        check_wellformed(model, "m.onnx")


def test_a_node_reading_its_own_output_or_a_later_one_in_a_body_is_a_cycle():
    relu = helper.make_node("Relu", ["x"], ["h"], name="relu")
    loop = helper.make_node("Add", ["h", "s"], ["s"], name="self")  # reads what it writes
    graph = helper.make_graph([relu, loop], "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("s", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphfixError, match="nodes form a cycle: Add 'self' wait"):
        check_wellformed(model, "m.onnx")
    # in a body: the sorted main graph passes the quick look, the body does not
    body = helper.make_graph([helper.make_node("Neg", ["b"], ["a"], name="n1"),
                              helper.make_node("Neg", ["a"], ["b"], name="n2")], "body", [],
                             [helper.make_tensor_value_info("a", 1, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "e", [],
                              [helper.make_tensor_value_info("e", 1, [2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="if",
                                                then_branch=body, else_branch=other)], "g",
                              [helper.make_tensor_value_info("x", 1, [2]),
                               helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", 1, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(GraphfixError, match=r"cycle \(in If 'if'.then_branch\): Neg 'n1', "
                       "Neg 'n2'"):
        check_wellformed(model, "m.onnx")


def test_a_name_that_is_not_utf8_is_found_wherever_the_nodes_hold_it():
    for field in (b"relu", b"Relu", b"alpha", b"x"):  # node name, op, attribute, input
        node = helper.make_node("LeakyRelu", ["x"], ["y"], name="relu", alpha=0.1)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [2])],
                                  [helper.make_tensor_value_info("y", 1, [2])])
        data = helper.make_model(graph).SerializeToString()
        bad = b"\xff" + field[1:]  # the same length: the wire format holds
        model = onnx.ModelProto.FromString(data.replace(field, bad))
        with pytest.raises(GraphfixError, match="is not UTF-8 text"):
            check_wellformed(model, "m.onnx")


@pytest.mark.parametrize(("edit", "why"), [
    (lambda t: setattr(t, "raw_data", t.raw_data[:-4]), r"\(6 elements, 24 bytes\) but "
                                                        "holds 20 bytes"),
    (lambda t: t.dims.__setitem__(0, 1 << 40), "3298534883328 elements, 13194139533312 bytes"),
    (lambda t: t.dims.__setitem__(0, -2), r"negative dims \[-2, 3\]"),
    (lambda t: setattr(t, "data_type", 0), "no valid data type"),
    (lambda t: setattr(t, "data_type", 99), r"no valid data type \(data_type 99\)"),
])
def test_initializer_data_must_match_its_type_and_dims(edit, why):
    tensor = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    assert tensor_data_problem(tensor) == ""
    edit(tensor)
    assert tensor_data_problem(tensor)
    import re

    assert re.search(why, tensor_data_problem(tensor)), tensor_data_problem(tensor)


@pytest.mark.parametrize(("array", "dtype"), [
    (np.ones(5, np.float32), None), (np.arange(5, dtype=np.int64), None),
    (np.ones(5, np.float16), None), (np.array([True, False]), None),
    (np.array([1, 2, 3], np.uint32), None), (np.ones(3, np.complex64), None),
    (np.array([1, -2, 3], np.int8), TensorProto.INT4),
])
def test_typed_fields_are_counted_per_data_type(array, dtype):
    if dtype is None:
        tensor = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(array.dtype),
                                    array.shape, array.ravel().tolist())
    else:
        tensor = helper.make_tensor("t", dtype, array.shape, array.tolist())
    assert not tensor.HasField("raw_data")
    assert tensor_data_problem(tensor) == ""
    del tensor.dims[:]
    tensor.dims.append(array.size + 2)
    assert "values in" in tensor_data_problem(tensor)


def test_two_writers_shadowing_and_recursive_functions_are_refused():
    model = _if_model(1)
    model.graph.node.append(helper.make_node("Relu", ["x"], ["h"], name="again"))
    with pytest.raises(GraphfixError, match="Tensor 'h' is written by two nodes"):
        check_wellformed(model, "m.onnx")
    model = _if_model(1)
    model.graph.node[0].output[0] = "c"  # the initializer's name
    with pytest.raises(GraphfixError, match="writes 'c', which is also a graph input or "
                       "initializer"):
        check_wellformed(model, "m.onnx")
    model = _if_model(1)
    a = helper.make_function("f", "A", ["i"], ["o"], [helper.make_node("B", ["i"], ["o"],
                                                                       domain="f")],
                             [helper.make_opsetid("", 17)])
    b = helper.make_function("f", "B", ["i"], ["o"], [helper.make_node("A", ["i"], ["o"],
                                                                       domain="f")],
                             [helper.make_opsetid("", 17)])
    model.functions.extend([a, b])
    with pytest.raises(GraphfixError, match="local function '(A|B)' .* calls itself"):
        check_wellformed(model, "m.onnx")


def test_load_refuses_an_opset_no_onnx_release_defines(tmp_path):
    model = _if_model(1)
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(GraphfixError, match=f"Cannot use '{path}': the model is malformed. "
                       f"It imports ONNX opset {onnx.defs.onnx_opset_version() + 1}"):
        io.load(path)


def test_float6_raw_data_is_packed_six_bits_per_element():
    """onnx packs FLOAT6 raw data (8 elements -> 6 bytes); the check counted 8 bits each
    before it shared io's size function, and refused valid float6 initializers."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(TensorProto, "FLOAT6E2M3"):
        pytest.skip("this onnx has no FLOAT6")
    values = np.array([0.5, 1, 1.5, 2, 3, 0.25, 0.75, 1], dtype=ml_dtypes.float6_e2m3fn)
    tensor = numpy_helper.from_array(values, "t")
    assert len(tensor.raw_data) == 6 and tensor_data_problem(tensor) == ""
    tensor.raw_data += b"\0"
    assert "(8 elements, 6 bytes) but holds 7 bytes" in tensor_data_problem(tensor)
