"""fold-constants' own evaluation (`passes._fold_closure`): the whole constant part of
a graph in one session, with what onnx-graphsurgeon's folding got wrong put right."""

import numpy as np
import onnx
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse, spy

from graphfix.passes import _fold_closure
from graphfix.passes.fold_constants import FoldConstants, FoldConstantsOptions

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def _count_sessions(monkeypatch) -> list[list[str]]:
    """Records the outputs each evaluation session was asked for."""
    return spy(monkeypatch, _fold_closure, "run_closure", lambda model, names: list(names))


def test_the_whole_constant_part_is_one_session_and_only_its_frontier_is_asked(monkeypatch):
    chains = "\n".join(
        f"n{i} = Sin(k)\n a{i} = Add(n{i}, k)\n m{i} = Mul(a{i}, a{i})\n y{i} = Add(x, m{i})"
        for i in range(20))
    outputs = ", ".join(f"float[3] y{i}" for i in range(20))
    model = parse(HEADER + f"""
    g (float[3] x) => ({outputs}) <float[3] k = {{1.0, -2.0, 3.0}}> {{
        {chains}
    }}""")
    asked = _count_sessions(monkeypatch)
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Add"] * 20
    assert result.counts["folded nodes into constants"] == 60
    assert asked == [[f"m{i}" for i in range(20)]]  # not the n/a intermediates
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_value_float_constants_fold_as_float32():
    """gs lowered `value_float(s)` as float64 arrays: Mul(float, double) is invalid, and
    the manager rolled the pass back."""
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y) {
        c = Constant <value_float = 2.5> ()
        cs = Constant <value_floats = [1.0, -1.0]> ()
        i = Constant <value_ints = [2]> ()
        p = Mul(c, cs)
        s = Reshape(p, i)
        y = Add(x, s)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Add"]
    [init] = out.graph.initializer
    assert init.data_type == onnx.TensorProto.FLOAT
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), [2.5, -2.5])
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(out, strict_mode=True))
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)


def test_ops_that_must_not_fold_stay_in_bodies_too():
    """A random draw of constant shape inside an If branch: folding would freeze one
    draw (gs's subgraph folding ignored the exclusion)."""
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) <float[3] k = {1.0, 2.0, 3.0}> {
        y = If(c) <
            then_branch = t () => (float[3] ty) {
                r = RandomUniformLike(k)
                n = Neg(k)
                s = Add(r, n)
                ty = Add(x, s)
            },
            else_branch = e () => (float[3] ey) { ey = Mul(x, k) }
        >
    }""")
    out, _ = apply(FoldConstants(), model)
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert sorted(n.op_type for n in then.node) == ["Add", "Add", "RandomUniformLike"]
    x = np.random.default_rng(3).standard_normal(3).astype(np.float32)
    assert_same_outputs(model, out, {"c": np.array(False), "x": x}, rtol=0, atol=0)


def test_an_outer_value_read_only_inside_a_body_folds():
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) <float[3] k = {1.0, 2.0, 3.0}> {
        n = Neg(k)
        y = If(c) <
            then_branch = t () => (float[3] ty) { ty = Add(x, n) },
            else_branch = e () => (float[3] ey) { ey = Mul(x, n) }
        >
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["If"]
    assert result.changed
    x = np.random.default_rng(4).standard_normal(3).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x}, rtol=0, atol=0)


def test_a_plugin_with_constant_inputs_is_left_without_failing_the_session(monkeypatch):
    """A TensorRT plugin written in ONNX's domain reads only constants: onnxruntime has
    no such op, so it is not asked to evaluate it (which would fail the one session and
    send the whole graph node by node); everything else folds in that one session."""
    text = HEADER + """
    g (float[3] x) => (float[3] y, float[3] z) <float[3] k = {1.0, 2.0, 3.0}> {
        p = ScatterElementsPlugin(k, k)
        n = Sin(k)
        y = Add(x, n)
        z = Add(x, p)
    }"""
    model = onnx.parser.parse_model(text)  # no schema for the plugin: checker skipped
    asked = _count_sessions(monkeypatch)
    by_node = []
    monkeypatch.setattr("graphfix.passes.fold_constants.fold_node_by_node",
                        lambda *a: by_node.append(a) or 0)
    from graphfix.graph import to_graph
    from graphfix.passes.base import PassContext

    graph = to_graph(model)
    result = FoldConstants().run(graph, PassContext())
    graph.cleanup().toposort()
    assert [n.op for n in graph.nodes] == ["ScatterElementsPlugin", "Add", "Add"]
    assert result.counts["folded nodes into constants"] == 1
    assert asked == [["n"]] and not by_node


def test_a_value_over_the_threshold_stays_a_node_and_what_it_reads_folds(monkeypatch):
    """The Expand's output shape is not known before it runs (its target is computed),
    so the size check happens on the value; the Expand then stays, and its target,
    computed from constants too, folds in a second session (an edge Pad: not one numpy
    computes, `_fold_numpy`)."""
    model = parse(HEADER + """
    g (float[64,64] x) => (float[64,64] y) <float[1] one = {1.0}, int64[1] s = {64},
                                            int64[2] r = {0, 1}> {
        two = Pad <mode = "edge"> (s, r)
        big = Expand(one, two)
        y = Add(x, big)
    }""")
    asked = _count_sessions(monkeypatch)
    out, _ = apply(FoldConstants(FoldConstantsOptions(size_threshold=1024)), model)
    assert ops(out) == ["Expand", "Add"]
    assert asked == [["big"], ["two"]]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(FoldConstantsOptions(size_threshold=1024)), out)


def test_shape_arithmetic_folds_in_numpy_without_a_session(monkeypatch):
    """Integer shape arithmetic, and the float mask it sizes, are computed exactly in
    numpy (`_fold_numpy`); onnxruntime is asked only for what reads the Exp, which numpy
    leaves to it."""
    model = parse(HEADER + """
    g (float[2,6] x) => (float[3,4] y, float[2,6] z)
        <int64[2] s = {2, 6}, int64[1] i = {1}, int64[1] o = {0}, int64[1] two = {2},
         float[1] one = {1.0}> {
        d = Gather(s, i)
        a = Div(d, two)
        b = Gather(s, o)
        c = Mul(b, two)
        k = Concat <axis = 0> (a, c)
        y = Reshape(x, k)
        m = ConstantOfShape(s)
        e = Exp(one)
        me = Add(m, e)
        z = Mul(x, me)
    }""")
    asked = _count_sessions(monkeypatch)
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Reshape", "Mul"]
    assert asked == [["me"]]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)
