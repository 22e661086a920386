"""graph.prune: onnx-graphsurgeon's cleanup in linear time, leaving the same state (nodes,
their order, every tensor's producer and consumer lists, bodies and local functions)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import parse
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import io
from graphfix.graph import to_graph
from graphfix.graph.convert import export
from graphfix.graph.prune import prune
from graphfix.graph.walk import all_graphs, tensor_map

DEAD = '<ir_version: 8, opset_import: ["" : 17, "local" : 1]>' + """
g (bool c, float[2] x, float[2] fed) => (float[2] y, float[2] z)
  <float[2] k = {1.0, 2.0}, int64[2] two = {1, 1}> {
    outer = Neg(x)
    unused_outer = Abs(x)
    dead = Mul(x, x)
    dead2 = Add(dead, k)
    q, omitted = Split <axis = 0> (dead2, two)
    y = If(c) <
        then_branch = t () => (float[2] ty) { n = Neg(k) ty = Add(outer, n) d = Relu(n) },
        else_branch = e () => (float[2] ey) { ey = Mul(x, x) }
    >
    z = local.scaled <alpha = 2.0> (fed)
}
<domain: "local", opset_import: ["" : 17]>
scaled <alpha> (a) => (b) {
    s = Constant <value_float: float = @alpha> ()
    waste = Sin(a)
    b = Mul(a, s)
}"""


def _state(graph: gs.Graph) -> list:
    """Everything cleanup may change, by name: nodes per graph (bodies and functions too)
    in order, and each tensor's producers and consumers in order."""
    out = []
    for g in [*all_graphs(graph), *graph.functions]:
        out.append([n.name or n.op for n in g.nodes])
        for name, t in tensor_map(g).items():
            out.append((name, [n.name or n.op for n in t.inputs],
                        [n.name or n.op for n in t.outputs]))
    return out


def _both(make) -> tuple[gs.Graph, gs.Graph]:
    ours, theirs = make(), make()
    prune(ours)
    with G_LOGGER.suppress():
        theirs.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True)
    return ours, theirs


def test_dead_nodes_bodies_functions_and_graph_input_producers_as_gs_does():
    def make():
        graph = to_graph(parse(DEAD))
        fed = graph.inputs[2]
        gs.Node("Identity", "feeds_an_input", inputs=[graph.inputs[1]], outputs=[fed])
        return graph

    ours, theirs = _both(make)
    assert _state(ours) == _state(theirs)
    assert export(ours) == export(theirs)
    assert [n.op for n in ours.nodes] == ["Neg", "If", "scaled"]
    assert [n.op for n in ours.functions[0].nodes] == ["Constant", "Mul"]
    assert ours.inputs[2].inputs == []  # the input's producer is cut off, as gs does
    x = ours.inputs[1]
    # Abs and the dead Mul(x, x) are detached (the Mul twice); the else branch's Mul(x, x)
    # and the cut-off producer of `fed` still read x, in gs too
    assert [n.op for n in x.outputs] == ["Neg", "Mul", "Mul", "Identity"]


def test_a_clean_graph_is_left_alone():
    graph = to_graph(parse(DEAD))
    prune(graph)
    before = _state(graph)
    assert prune(graph) == 0
    assert _state(graph) == before


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large.onnx"])
def test_after_a_fold_on_real_models_as_gs_does(name, shared_model):
    """Folded Shape nodes leave chains that only fed them: the cleanup fold-constants
    makes after each round."""
    from graphfix.graph.shapes import infer_shapes
    from graphfix.passes._fold_eval import fold_static_shapes

    path = shared_model(name)

    def make():
        graph = to_graph(io.load(str(path)))
        infer_shapes(graph)
        fold_static_shapes(graph)
        return graph

    ours, theirs = _both(make)
    assert len(ours.nodes) < len(make().nodes)
    assert _state(ours) == _state(theirs)
    assert export(ours).SerializeToString() == export(theirs).SerializeToString()


CHAIN = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2] x) => (float[2] y) {
    a = Neg(x)
    b = Abs(a)
    c = Relu(b)
    y = Sin(x)
}"""


def test_a_graph_where_every_node_is_read_is_not_searched(monkeypatch):
    """Every node's output read by a node of the graph or a graph output: nothing can be
    unused (the last unused node would have no reader), so no search is made."""
    import graphfix.graph.prune as module

    graph = to_graph(parse(CHAIN.replace("Sin(x)", "Sin(c)")))
    monkeypatch.setattr(module, "_used_nodes", lambda g: pytest.fail("searched"))
    before = _state(graph)
    assert prune(graph) == 0
    assert _state(graph) == before



@pytest.mark.parametrize("cut", ["dropped from the list", "reading from a body"])
def test_a_reader_outside_the_graphs_nodes_keeps_the_search(cut):
    """Neg and Abs are read, but only by nodes that are not the graph's own: Relu once a
    pass dropped it from the node list without detaching it (unused: all three go, as in
    gs), or a node in an If's body (used: the search follows the body's outer reads)."""
    def make():
        graph = to_graph(parse(CHAIN))
        relu = graph.nodes[2]
        graph.nodes.remove(relu)
        if cut == "reading from a body":
            inner = gs.Graph(nodes=[relu], outputs=[relu.outputs[0]], name="then")
            cond = gs.Constant("cond", np.array(True))
            out = gs.Variable("z", dtype=np.float32, shape=[2])
            graph.nodes.append(gs.Node("If", "if", inputs=[cond], outputs=[out],
                                       attrs={"then_branch": inner, "else_branch": inner}))
            graph.outputs.append(out)
        return graph

    ours, theirs = _both(make)
    assert _state(ours) == _state(theirs)
    kept = [n.op for n in ours.nodes]
    assert kept == (["Sin"] if cut == "dropped from the list" else ["Neg", "Abs", "Sin", "If"])
