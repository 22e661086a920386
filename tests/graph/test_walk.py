"""graph.walk.fingerprint: what counts as an edit (the manager verifies only passes whose
fingerprint changed, so a missed edit would skip a numeric check)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from graphfix.graph.walk import all_graphs, count_nodes, fingerprint, names_in_use, tensor_map


def _graph() -> gs.Graph:
    x = gs.Variable("x", np.float32, (1, 4))
    w = gs.Constant("w", np.ones((4, 4), np.float32))
    y = gs.Variable("y", np.float32, (1, 4))
    node = gs.Node("MatMul", "mm", inputs=[x, w], outputs=[y])
    then = gs.Graph(nodes=[gs.Node("Identity", "inner", inputs=[y],
                                   outputs=[gs.Variable("t", np.float32, (1, 4))])],
                    outputs=[], name="then")
    branch = gs.Node("If", "sel", attrs={"then_branch": then, "else_branch": then},
                     inputs=[gs.Variable("c", np.bool_, ())],
                     outputs=[gs.Variable("o", np.float32, (1, 4))])
    return gs.Graph(nodes=[node, branch], inputs=[x], outputs=[y], opset=17)


EDITS = {
    "dtype": lambda g: setattr(g.nodes[0].outputs[0], "dtype", np.float16),
    "shape": lambda g: setattr(g.nodes[0].outputs[0], "shape", (2, 4)),
    "name": lambda g: setattr(g.nodes[0].outputs[0], "name", "z"),
    "values": lambda g: setattr(g.nodes[0].inputs[1], "values", np.zeros((4, 4), np.float32)),
    "attr": lambda g: g.nodes[0].attrs.update(alpha=1.0),
    "op": lambda g: setattr(g.nodes[0], "op", "Gemm"),
    "subgraph node": lambda g: setattr(g.nodes[1].attrs["then_branch"].nodes[0], "op", "Neg"),
    "opset": lambda g: setattr(g, "opset", 18),
    "graph output": lambda g: g.outputs.append(g.nodes[1].outputs[0]),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_every_kind_of_edit_changes_the_fingerprint(edit):
    graph = _graph()
    before = fingerprint(graph)
    EDITS[edit](graph)
    assert fingerprint(graph) != before


def test_no_edit_and_an_equal_dtype_spelling_keep_it():
    graph = _graph()
    before = fingerprint(graph)
    assert fingerprint(graph) == before
    graph.nodes[0].outputs[0].dtype = np.dtype("float32")  # np.float32 spelled as a dtype
    assert fingerprint(graph) == before


def test_all_graphs_and_count_nodes_include_if_branches():
    graph = _graph()
    assert [g.name for g in all_graphs(graph)] == [graph.name, "then", "then"]
    assert count_nodes(graph) == 4


def test_all_graphs_includes_bodies_of_a_custom_domain_node():
    """onnxruntime's BeamSearch (com.microsoft) carries its decoder as a graph attribute;
    of ONNX's own ops only If, Loop, Scan and SequenceMap can."""
    graph = _graph()
    decoder = gs.Graph(nodes=[], outputs=[], name="decoder")
    graph.nodes.append(gs.Node("BeamSearch", "beam", domain="com.microsoft",
                               attrs={"decoder": decoder}, inputs=[graph.inputs[0]],
                               outputs=[gs.Variable("seq", np.int32, (1, 4))]))
    assert [g.name for g in all_graphs(graph)] == [graph.name, "then", "then", "decoder"]


def test_tensor_map_is_gs_tensors_without_its_checks():
    graph = _graph()
    # an omitted optional input, a graph output no node writes, and two distinct
    # tensors sharing a name (gs keeps the last, and warns)
    empty = gs.Variable.empty()
    twin = gs.Variable("y", np.float32, (1, 4))
    graph.nodes.append(gs.Node("Clip", "clip", inputs=[graph.inputs[0], empty, empty],
                               outputs=[twin]))
    graph.outputs.append(gs.Variable("dangling", np.float32, (1,)))
    expected = graph.tensors()
    got = tensor_map(graph)
    assert list(got) == list(expected) and all(got[k] is v for k, v in expected.items())
    assert got["y"] is graph.outputs[0] and "" not in got  # the graph output came last
    assert names_in_use(graph) == {"x", "w", "y", "c", "o", "t", "dangling"}


def _chain(order: str) -> gs.Graph:
    """x -> a = Relu(x), b = Neg(a), c = Abs(x); nodes listed in `order` ("abc")."""
    x = gs.Variable("x", np.float32, (2,))
    a, b, c = (gs.Variable(n, np.float32, (2,)) for n in "abc")
    nodes = {"a": gs.Node("Relu", "a", inputs=[x], outputs=[a]),
             "b": gs.Node("Neg", "b", inputs=[a], outputs=[b]),
             "c": gs.Node("Abs", "c", inputs=[x], outputs=[c])}
    return gs.Graph(nodes=[nodes[k] for k in order], inputs=[x], outputs=[b, c], opset=17)


def test_toposort_keeps_a_sorted_order_and_sorts_an_unsorted_one():
    from graphfix.graph.walk import toposort

    graph = _chain("abc")  # sorted; onnx-graphsurgeon's own sort gives a, c, b (by depth)
    assert toposort(graph) == 0
    assert [n.name for n in graph.nodes] == ["a", "b", "c"]
    graph = _chain("bca")
    assert toposort(graph) == 1
    names = [n.name for n in graph.nodes]
    assert names.index("a") < names.index("b")


def test_toposort_counts_what_a_body_reads_from_outside():
    from graphfix.graph.walk import toposort

    graph = _graph()
    graph.nodes.reverse()  # the If's branch reads y, which the MatMul now writes after it
    assert toposort(graph) == 1
    assert [n.name for n in graph.nodes] == ["mm", "sel"]
    assert toposort(graph) == 0
