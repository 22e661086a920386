"""A value_info that contradicts its node (D9): eliminate-noops keeps a Cast whose input
is declared the Cast's type but computed in another; `computed_dtype` reads types from
the nodes, never from a declared type of a node's output."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import build_model, init, value
from onnx import TensorProto, helper

from graphfix.api import run
from graphfix.graph import fingerprint, to_graph
from graphfix.graph.dtypes import computed_dtype
from graphfix.passes.base import Note, PassContext
from graphfix.passes.eliminate_noops import EliminateNoops

F16 = TensorProto.FLOAT16


def stale(declared: str) -> onnx.ModelProto:
    """x -> Cast(float16) x16 -> Identity y16 -> Relu r16 -> Cast(float) out, with
    `declared` (y16 or r16) recorded as float in value_info: it is float16."""
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=F16),
             helper.make_node("Identity", ["x16"], ["y16"]),
             helper.make_node("Relu", ["y16"], ["r16"]),
             helper.make_node("Cast", ["r16"], ["out"], to=TensorProto.FLOAT)]
    return build_model(nodes, [value("x", [1, 4])], [value("out", [1, 4])], [],
                       checked=False, value_info=[value(declared, [1, 4])])


def test_cast_whose_input_is_declared_float_but_computed_float16_stays():
    graph = to_graph(stale("r16"))
    before = fingerprint(graph)
    result = EliminateNoops().run(graph, PassContext())
    assert Note("Cast 'out'", "its input is declared float, but the nodes computing it make "
                "float16: the model's value_info contradicts its nodes (onnxruntime cannot "
                "load it)") in result.notes, result.notes
    assert result.counts.get("removed Cast to the same type", 0) == 0
    assert [n.op for n in graph.nodes].count("Cast") == 2
    assert fingerprint(graph) != before  # the Identity alone went


def test_run_keeps_the_real_cast_of_the_repro():
    """graphfix run on the D9 repro (Identity's output declared float): cleanup removes the
    Identity, the lenient inference makes r16 float, and the final Cast must stay."""
    out = run(stale("y16"), check=False).model
    assert [n.op_type for n in out.graph.node] == ["Cast", "Relu", "Cast"]
    assert [a.i for a in out.graph.node[-1].attribute if a.name == "to"] == [TensorProto.FLOAT]


def test_run_drops_the_contradicted_declaration_so_the_output_loads():
    """The input cannot be loaded by onnxruntime; the output can, with the types the nodes
    compute, and the run says what it dropped. A second run changes nothing."""
    import onnxruntime as ort

    result = run(stale("y16"), check=True)
    assert any("declares types its nodes contradict for 'y16'" in n
               for n in result.report.verify_notes), result.report.verify_notes
    out = result.model
    assert "y16" not in {vi.name for vi in out.graph.value_info
                         if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[-1.0, 0.5, 2.0, -3.0]], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
    again = run(out, check=True)
    assert onnx.printer.to_text(again.model.graph) == onnx.printer.to_text(out.graph)
    assert not any("contradict" in n for n in again.report.verify_notes)


def test_contradicted_types_names_only_declarations_the_nodes_contradict():
    from graphfix.graph.shapes import contradicted_types

    assert contradicted_types(stale("y16")) == ("y16",)
    assert contradicted_types(stale("r16")) == ("r16",)
    consistent = stale("y16")
    consistent.graph.value_info[0].type.tensor_type.elem_type = F16
    assert contradicted_types(consistent) == ()


def test_a_consistent_same_type_cast_still_goes():
    graph = to_graph(build_model(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Cast", ["r"], ["c"], to=TensorProto.FLOAT),
         helper.make_node("Neg", ["c"], ["y"])],
        [value("x", [3])], [value("y", [3])], [], checked=False, value_info=[value("r", [3])]))
    result = EliminateNoops().run(graph, PassContext())
    assert dict(result.counts) == {"removed Cast to the same type": 1}


def test_computed_dtype_ignores_declared_types_of_node_outputs():
    model = stale("y16")
    graph = to_graph(model)
    tensors = graph.tensors()
    assert tensors["y16"].dtype == np.float32  # the stale declaration gs reads
    assert computed_dtype(tensors["y16"]) == np.float16
    assert computed_dtype(tensors["r16"]) == np.float16
    assert computed_dtype(tensors["out"]) == np.float32
    assert computed_dtype(tensors["x"]) == np.float32  # a graph input: its declared type


def test_computed_dtype_through_schemas_and_where_it_cannot_tell():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Concat", ["s", "k"], ["t"], axis=0),
             helper.make_node("Split", ["x"], ["a", "b"], axis=0, num_outputs=2),
             helper.make_node("Less", ["a", "b"], ["m"]),
             helper.make_node("Where", ["m", "a", "b"], ["w"]),
             helper.make_node("Frob", ["w"], ["f"], domain="acme")]
    model = build_model(nodes, [value("x", [4], F16)], [value("f", None)],
                        [init("k", np.array([2], np.int64))], checked=False)
    tensors = to_graph(model).tensors()
    assert computed_dtype(tensors["t"]) == np.int64
    assert computed_dtype(tensors["b"]) == np.float16
    assert computed_dtype(tensors["m"]) == np.bool_
    assert computed_dtype(tensors["w"]) == np.float16
    assert computed_dtype(tensors["f"]) is None  # a custom op
