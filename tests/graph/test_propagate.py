"""graph.propagate.propagate_shapes: ONNX's per-node inference forward from the tensors
that became constant, as whole-graph inference would give the same nodes."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse

import graphfix.passes.fold_constants as fold_constants
from graphfix.graph import to_graph
from graphfix.graph.propagate import propagate_shapes
from graphfix.graph.shapes import infer_shapes
from graphfix.passes.fold_constants import FoldConstants

# t is what fold-constants computes from Shape(x) in its first round: constant once
# folded; ONNX's data propagation does not compute a Div, so r's shape waits for that
MODEL = '<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>' + """
g (float[N,4,6] x) => (float[?,?] y, float[?,?,?] c, float[?,?] w)
  <int64[1] b = {1}, int64[1] e = {3}, int64[2] ones = {1, 1}, int64[2] perm_target = {6, 4}> {
    s = Shape(x)
    dims = Slice(s, b, e)
    t = Div(dims, ones)
    r = Reshape(x, t)
    a = Relu(r)
    y = Transpose<perm = [1, 0]>(a)
    c = custom.Relu(x)
    w = Reshape(c, perm_target)
}"""


def _fold_target(graph: gs.Graph) -> gs.Tensor:
    """Make `t` the constant fold-constants would make it, as its round does."""
    t = graph.tensors()["t"]
    t.to_constant(np.array([4, 6], dtype=np.int64))
    t.inputs.clear()
    graph.cleanup()
    return t


def test_shapes_follow_from_a_new_constant_as_whole_graph_inference_gives_them():
    graph = to_graph(parse(MODEL))
    infer_shapes(graph)
    assert not any(isinstance(d, int) for d in graph.tensors()["r"].shape)
    t = _fold_target(graph)
    # Reshape -> Relu -> Transpose refine; custom.Op and what reads it are not reached
    assert propagate_shapes(graph, [t]) == 3
    tensors = graph.tensors()
    assert [tensors[n].shape for n in ("r", "a", "y")] == [[4, 6], [4, 6], [6, 4]]

    whole = to_graph(parse(MODEL))
    infer_shapes(whole)
    _fold_target(whole)
    infer_shapes(whole)
    assert [whole.tensors()[n].shape for n in ("r", "a", "y")] == [[4, 6], [4, 6], [6, 4]]


def test_a_shape_that_disagrees_with_the_inferred_one_is_kept():
    graph = to_graph(parse(MODEL))
    infer_shapes(graph)
    graph.tensors()["r"].shape = [5, None]  # whatever made it, inference here would say 4
    t = _fold_target(graph)
    assert propagate_shapes(graph, [t]) == 0
    assert graph.tensors()["r"].shape == [5, None]


def test_an_op_outside_onnx_domain_stops_it_even_under_an_onnx_name():
    graph = to_graph(parse(MODEL))
    infer_shapes(graph)
    x = graph.tensors()["x"]
    assert propagate_shapes(graph, [x]) == 0  # s is a Shape (already known); c is
    # custom.Relu, which ONNX's Relu would have given x's shape
    assert graph.tensors()["c"].shape == [None, None, None]  # as declared


def _three_levels():
    """Each Reshape's target reads the shape of the one before: known only once that
    target is folded, so fold-constants needs three rounds."""
    return parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[2,3,4] x) => (float[?,?] y) <int64[1] zero = {0}, int64[1] one = {1},
                                          int64[1] two = {2}, int64[1] rest = {-1}> {
        s1 = Shape(x)
        l1 = Slice(s1, zero, one)
        t1 = Concat<axis = 0>(l1, rest)
        r1 = Reshape(x, t1)
        q1 = Relu(r1)
        s2 = Shape(q1)
        l2 = Slice(s2, one, two)
        t2 = Concat<axis = 0>(rest, l2, one)
        r2 = Reshape(q1, t2)
        q2 = Relu(r2)
        s3 = Shape(q2)
        l3 = Slice(s3, zero, one)
        t3 = Concat<axis = 0>(l3, rest)
        y = Reshape(q2, t3)
    }""")


def test_fold_constants_infers_the_whole_graph_once_when_rounds_follow_node_by_node(
        monkeypatch):
    whole = []

    def counted(graph, *args, **kwargs):
        whole.append(len(graph.nodes))
        return infer_shapes(graph, *args, **kwargs)

    monkeypatch.setattr(fold_constants, "infer_shapes", counted)
    model = _three_levels()
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Reshape", "Relu", "Reshape", "Relu", "Reshape"]
    # the pass's first inference (the graph had no shapes), then only the fixed point's
    # confirmation: the rounds between got theirs node by node
    assert whole == [14, 5]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)
