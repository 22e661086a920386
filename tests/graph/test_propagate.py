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


def _three_levels_with_div():
    """`_three_levels` with each target divided by ones: ONNX's data propagation does not
    compute a Div, so each level's shape is known only once its target is folded."""
    return parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[2,3,4] x) => (float[?,?] y) <int64[1] zero = {0}, int64[1] one = {1},
                                          int64[1] two = {2}, int64[1] rest = {-1},
                                          int64[2] ones = {1, 1}, int64[3] ones3 = {1, 1, 1}> {
        s1 = Shape(x)
        l1 = Slice(s1, zero, one)
        c1 = Concat<axis = 0>(l1, rest)
        t1 = Div(c1, ones)
        r1 = Reshape(x, t1)
        q1 = Relu(r1)
        s2 = Shape(q1)
        l2 = Slice(s2, one, two)
        c2 = Concat<axis = 0>(rest, l2, one)
        t2 = Div(c2, ones3)
        r2 = Reshape(q1, t2)
        q2 = Relu(r2)
        s3 = Shape(q2)
        l3 = Slice(s3, zero, one)
        c3 = Concat<axis = 0>(l3, rest)
        t3 = Div(c3, ones)
        y = Reshape(q2, t3)
    }""")


def test_fold_constants_folds_on_the_way_in_one_round_not_one_a_level(monkeypatch):
    """With `fold`, propagation folds each Shape as soon as its input's dims are static,
    and the Slice/Concat/Div after it (numpy computes them exactly): the three levels
    fold in the first round's propagation, without an onnxruntime session. Rounds:
    that one, one that finds nothing and infers the whole graph, one that confirms
    (five before: a round a level)."""
    rounds, sessions = [], []
    real = fold_constants.fold_static_shapes
    monkeypatch.setattr(fold_constants, "fold_static_shapes",
                        lambda graph: rounds.append(1) or real(graph))
    monkeypatch.setattr("graphfix.passes._fold_closure.run_closure",
                        lambda model, names: sessions.append(names))
    model = _three_levels_with_div()
    out, _ = apply(FoldConstants(), model)
    assert ops(out) == ["Reshape", "Relu", "Reshape", "Relu", "Reshape"]
    assert len(rounds) == 3 and sessions == []
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_propagation_asks_fold_first_and_goes_on_from_what_it_made():
    graph = to_graph(parse(MODEL))
    infer_shapes(graph)
    t = _fold_target(graph)
    asked = []

    def fold(node):
        asked.append(node.op)
        if node.op != "Relu":
            return []
        out = node.outputs[0]  # stand-in value: only the walk is under test
        out.to_constant(np.zeros((4, 6), np.float32))
        out.inputs.clear()
        return [out]

    # Reshape is inferred, Relu folded (not inferred), Transpose reached from its output
    assert propagate_shapes(graph, [t], fold) == 3
    assert asked == ["Reshape", "Relu", "Transpose"]
    assert graph.tensors()["y"].shape == [6, 4]


def _dynamic_batch_levels():
    """Like `_three_levels_with_div` at a dynamic batch N: each Reshape target is the
    batch (Shape(x)[0]) and entries computed from static dims, so it never folds; its
    output dims follow from its entries, as whole-graph inference's data propagation
    finds them."""
    return parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[N,4,6] x) => (float[N,?,?] y) <int64[1] zero = {0}, int64[1] one = {1},
                                            int64[1] two = {2}, int64[1] three = {3}> {
        s = Shape(x)
        b = Gather(s, zero)
        l = Slice(s, one, three)
        h = Gather(l, zero)
        w = Gather(l, one)
        p = Mul(h, w)
        t1 = Concat<axis = 0>(b, p, one)
        r1 = Reshape(x, t1)
        q1 = Relu(r1)
        s2 = Shape(q1)
        l2 = Slice(s2, one, two)
        c2 = Div(l2, one)
        t2 = Concat<axis = 0>(b, c2, one)
        r2 = Reshape(q1, t2)
        q2 = Relu(r2)
        s3 = Shape(q2)
        l3 = Slice(s3, one, two)
        c3 = Concat<axis = 0>(b, l3, one)
        y = Reshape(q2, c3)
    }""")


def test_a_target_of_dims_and_constants_gives_its_reshape_dims_on_the_way(monkeypatch):
    """The Reshapes' dims follow from their targets' entries (the batch's name, folded
    constants), so the Shapes after them fold in the first round's propagation; the one
    whole-graph inference that ends the pass finds nothing more."""
    whole = []

    def counted(graph, *args, **kwargs):
        before = {n: t.shape for n, t in graph.tensors().items()}
        updated = infer_shapes(graph, *args, **kwargs)
        whole.append([n for n, t in graph.tensors().items() if t.shape != before.get(n)])
        return updated

    monkeypatch.setattr(fold_constants, "infer_shapes", counted)
    model = _dynamic_batch_levels()
    graph = to_graph(model)
    infer_shapes(graph)
    from graphfix.passes.base import PassContext

    FoldConstants().run(graph, PassContext(shapes_inferred=True))
    tensors = graph.tensors()
    assert [tensors[n].shape for n in ("r1", "r2", "y")] == [["N", 24, 1]] * 3
    # the fixed point's confirmation, which changed nothing (before: it found r2, q2 and
    # y, and another round followed)
    assert whole == [[]]
    out, _ = apply(FoldConstants(), model)
    # the batch stays computed: Shape -> Gather -> three targets
    assert ops(out) == ["Shape", "Gather", "Concat", "Concat", "Concat",
                        "Reshape", "Relu", "Reshape", "Relu", "Reshape"]
    assert_same_outputs(model, out, feeds_for(model, x=(3, 4, 6)), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)
