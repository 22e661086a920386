"""eliminate-noops on exporter shape code: Where(Equal(shape, -1), 1, shape) with a known
condition, nested Concats on one axis, Dropout with ratio 0. Exact ops after, onnxruntime
numerics on several input shapes, checker, idempotence, and the reasons for what stays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, ops, parse
from onnx import helper
from test_eliminate_noops import assert_kept

from graphfix.graph import to_graph
from graphfix.passes.base import LIMIT_REACHED, Note, PassContext, RewriteBudget
from graphfix.passes.eliminate_noops import EliminateNoops

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'

# PyTorch's x.expand(n, -1, past + seq) on x[1, 1, T]: z[N, S] gives n and seq, p[P] past.
EXPAND = HEADER + """
g (float[1,1,T] x, float[N,S] z, float[P] p) => (float[Y0,Y1,Y2] y)
  <int64 i0 = {0}, int64 i1 = {1}, int64[1] ax = {0}, int64[1] m1 = {-1},
   int64[3] neg = {-1, -1, -1}, int64[3] ones = {1, 1, 1}> {
    sz = Shape(z)
    n = Gather<axis=0>(sz, i0)
    nn = Unsqueeze(n, ax)
    s = Gather<axis=0>(sz, i1)
    sp = Shape(p)
    past = Gather<axis=0>(sp, i0)
    total = %(total)s
    tt = Unsqueeze(total, ax)
    shape = Concat<axis=0>(%(entries)s)
    eq = Equal(shape, neg)
    w = Where(eq, ones, shape)
    y = Expand(x, w)
}"""


EXPAND_SHAPE_OPS = ["Shape", "Shape", "Gather", "Gather", "Gather", "Unsqueeze", "Add",
                    "Unsqueeze"]  # n, past + seq (toposorted)


def expand_model(entries: str = "nn, m1, tt", total: str = "Add(past, s)") -> onnx.ModelProto:
    """With the shapes of its intermediate tensors recorded, as exporters and the pipeline's
    shape inference leave them (an Add of sizes is only read with a known shape)."""
    return onnx.shape_inference.infer_shapes(parse(EXPAND % {"entries": entries, "total": total}))


def expand_feeds() -> list[dict[str, np.ndarray]]:
    """(N, S, P) of (2, 3, 4), (1, 1, 0), (3, 5, 2), each seeded."""
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 1, s + p)).astype(np.float32),
             "z": rng.standard_normal((n, s)).astype(np.float32),
             "p": rng.standard_normal(p).astype(np.float32)}
            for n, s, p in ((2, 3, 4), (1, 1, 0), (3, 5, 2))]


def assert_removes(model, expected_ops, counts, feed_sets) -> onnx.ModelProto:
    """Run the pass; exact ops and counts, checker (apply), numerics, idempotence."""
    out, result = apply(EliminateNoops(), model)
    assert ops(out) == expected_ops
    assert dict(result.counts) == counts
    for feeds in feed_sets:
        assert_same_outputs(model, out, feeds, rtol=0, atol=0)
    assert_idempotent(EliminateNoops(), out)
    return out


# ----------------------------------------------------------------------------- Where


def test_pytorch_expand_with_minus_one_becomes_a_concat_of_the_shape_parts():
    out = assert_removes(expand_model(), [*EXPAND_SHAPE_OPS, "Concat", "Expand"],
                         {"turned Where with a known condition into a Concat": 1}, expand_feeds())
    concat = next(n for n in out.graph.node if n.op_type == "Concat")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer}
    assert [inits[t].tolist() if t in inits else t for t in concat.input] == ["nn", [1], "tt"]


def test_expand_without_minus_one_reads_the_shape():
    # every entry is a size (or a sum of sizes): the condition is all false
    out = assert_removes(expand_model("nn, tt, tt"), [*EXPAND_SHAPE_OPS, "Concat", "Expand"],
                         {"removed Where with a known condition": 1}, expand_feeds())
    assert next(n for n in out.graph.node if n.op_type == "Expand").input[1] == "shape"


def test_condition_true_everywhere_gives_the_constant():
    model = parse(HEADER + """
    g (float[1,1,T] x, float[N,S] z) => (float[1,1,T] y)
      <int64 i0 = {0}, int64[1] ax = {0}, int64[1] one = {1}> {
        sz = Shape(z)
        n = Gather<axis=0>(sz, i0)
        nn = Unsqueeze(n, ax)
        shape = Concat<axis=0>(nn, nn, one)
        eq = Equal(shape, shape)
        w = Where(eq, one, shape)
        y = Expand(x, w)
    }""")
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 1, t)).astype(np.float32),
              "z": rng.standard_normal((n, 2)).astype(np.float32)} for n, t in ((2, 3), (4, 1))]
    out = assert_removes(model, ["Expand"], {"removed Where with a known condition": 1}, feeds)
    target = onnx.numpy_helper.to_array(
        next(i for i in out.graph.initializer if i.name == out.graph.node[0].input[1]))
    assert target.tolist() == [1, 1, 1] and target.dtype == np.int64


def test_where_in_an_if_branch():
    model = parse(HEADER + """
    g (bool c, float[1,3] x, float[N,3] z) => (float[N,3] y) {
        y = If(c) <
            then_branch = t () => (float[N,3] ty) {
                i0 = Constant<value = int64 {0}>()
                ax = Constant<value = int64[1] {0}>()
                m1 = Constant<value = int64[1] {-1}>()
                one = Constant<value = int64[1] {1}>()
                sz = Shape(z)
                n = Gather<axis=0>(sz, i0)
                nn = Unsqueeze(n, ax)
                shape = Concat<axis=0>(nn, m1)
                eq = Equal(shape, m1)
                w = Where(eq, one, shape)
                ty = Expand(x, w)
            },
            else_branch = e () => (float[N,3] ey) { ey = Add(z, x) }
        >
    }""")
    rng = np.random.default_rng(2)
    feeds = [{"c": np.array(flag), "x": rng.standard_normal((1, 3)).astype(np.float32),
              "z": rng.standard_normal((n, 3)).astype(np.float32)}
             for flag, n in ((True, 2), (False, 2), (True, 5))]
    out = assert_removes(model, ["If"], {"turned Where with a known condition into a Concat": 1},
                         feeds)
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == [
        "Constant", "Constant", "Shape", "Gather", "Unsqueeze", "Concat", "Expand"]


@pytest.mark.parametrize("total", ["Sub(past, s)", "Neg(s)"])  # either may be -1
def test_equal_with_a_value_that_may_be_negative_stays(total):
    assert_kept(expand_model(total=total), "Where 'w'",
                "its condition is not known statically at entries [2] (values not evaluated, "
                "or that may be negative)")


def test_where_without_an_equal_condition_is_no_candidate():
    model = parse(HEADER + """
    g (bool[3] c, int64[3] a, int64[3] b) => (int64[3] y) { y = Where(c, a, b) }""")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert result.notes == [Note("graph", "no Identity, inference Dropout, Cast, Reshape, "
                                 "Expand, Transpose, Unsqueeze or Squeeze pair, Concat, Split, "
                                 "Slice, Pad, Add/Sub/Mul/Div of a constant or Where on a "
                                 "shape comparison")]


# ----------------------------------------------------------------------------- nested Concat


def concat_model(inner_axis: int, outer_axis: int, extra: str = "", outputs: str = "",
                 inner: str = "[2,N]") -> onnx.ModelProto:
    return parse(HEADER + f"""
    g (float[2,N] a, float{inner} b, float{inner} c, float[2,N] d) => (float[Y0,Y1] y{outputs}) {{
        i = Concat<axis={inner_axis}>(b, c)
        y = Concat<axis={outer_axis}>(a, i, d)
        {extra}
    }}""")


def concat_feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{k: rng.standard_normal((2, n)).astype(np.float32) for k in "abcd"}
            for n in (1, 4)]


@pytest.mark.parametrize(("inner", "outer"), [(1, 1), (-1, 1), (1, -1), (0, -2), (-2, -2)])
def test_nested_concat_on_the_same_axis_is_flattened(inner, outer):
    out = assert_removes(concat_model(inner, outer), ["Concat"],
                         {"flattened nested Concats": 1}, concat_feeds())
    assert list(out.graph.node[0].input) == ["a", "b", "c", "d"]


def test_concat_read_twice_by_one_node_is_flattened_in_both_places():
    model = parse(HEADER + """
    g (float[2,N] a, float[2,N] b, float[2,N] c, float[2,N] d) => (float[Y0,Y1] y) {
        i = Concat<axis=1>(c, d)
        j = Concat<axis=-1>(b, i)
        y = Concat<axis=1>(a, j, j)
    }""")
    out = assert_removes(model, ["Concat"], {"flattened nested Concats": 2},
                         concat_feeds())
    assert [list(n.input) for n in out.graph.node] == [["a", "b", "c", "d", "b", "c", "d"]]


def test_concat_read_by_concats_only_is_flattened_into_each():
    """RAFT's refinement loop: an inner Concat read by two Concats on its axis goes
    into both, and then goes (twelve of them: RAFT 1085 -> 1073 nodes)."""
    model = parse(HEADER + """
    g (float[2,N] a, float[2,N] b, float[2,N] c, float[2,N] d)
        => (float[Y0,Y1] y, float[Z0,Z1] z) {
        i = Concat<axis=1>(b, c)
        y = Concat<axis=1>(a, i)
        z = Concat<axis=-1>(i, d)
    }""")
    out = assert_removes(model, ["Concat", "Concat"], {"flattened nested Concats": 2},
                         concat_feeds())
    assert [list(n.input) for n in out.graph.node] == [["a", "b", "c"], ["b", "c", "d"]]


def test_concat_read_by_a_concat_on_another_axis_stays_for_all_its_readers():
    model = parse(HEADER + """
    g (float[2,N] a, float[2,N] b, float[2,N] c, float[2,N] d)
        => (float[Y0,Y1] y, float[Z0,Z1] z) {
        i = Concat<axis=1>(b, c)
        y = Concat<axis=1>(a, i)
        z = Concat<axis=0>(i, i)
    }""")
    assert_kept(model, "Concat 'y'", "the Concat before it also feeds another node")


@pytest.mark.parametrize(("model", "reason"), [
    (concat_model(0, 1, inner="[1,N]"), "the Concat before it joins on axis 0, this one on 1"),
    (concat_model(1, 1, "r = Relu(i)", ", float[R0,R1] r"),
     "the Concat before it also feeds another node"),
    (concat_model(1, 1, "", ", float[I0,I1] i"), "the Concat before it writes a graph output"),
])
def test_nested_concat_that_cannot_be_flattened_stays(model, reason):
    assert_kept(model, "Concat 'y'", reason)


def test_nested_concat_axes_of_different_sign_and_unknown_rank_stay():
    nodes = [helper.make_node("Concat", ["b", "c"], ["i"], name="i", axis=1),
             helper.make_node("Concat", ["a", "i"], ["y"], name="y", axis=-1)]
    inputs = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in "abc"]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert_kept(model, "Concat 'y'",
                "rank unknown: the Concat before it joins on axis 1, this one on -1")


def test_nested_concat_in_a_loop_body():
    model = parse(HEADER + """
    g (int64 trips, bool cond, float[2,3] a) => (float[2,3] y) {
        y = Loop(trips, cond, a) <body = b (int64 it, bool ci, float[2,3] v)
                                          => (bool co, float[2,3] vo) {
            co = Identity(ci)
            i = Concat<axis=1>(v, a)
            j = Concat<axis=1>(i, a)
            s0 = Constant<value = int64[1] {2}>()
            s3 = Constant<value = int64[1] {5}>()
            s1 = Constant<value = int64[1] {1}>()
            vo = Slice(j, s0, s3, s1)
        }>
    }""")
    rng = np.random.default_rng(4)
    feeds = [{"trips": np.array(k, np.int64), "cond": np.array(True),
              "a": rng.standard_normal((2, 3)).astype(np.float32)} for k in (0, 1, 3)]
    out = assert_removes(model, ["Loop"], {"flattened nested Concats": 1}, feeds)
    body = out.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node].count("Concat") == 1


# ----------------------------------------------------------------------------- Dropout


def dropout_model(ratio: float, outputs: str = "", body: str = "d = Dropout(x, r, t)"):
    return parse(HEADER + f"""
    g (float[N,3] x) => (float[N,3] y{outputs}) <bool t = {{1}}, float r = {{{ratio}}}> {{
        {body}
        y = Neg(d)
    }}""")


def test_training_dropout_with_ratio_0_goes():
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 4)]
    assert_removes(dropout_model(0.0), ["Neg"], {"removed Dropout with ratio 0": 1}, feeds)


def test_dropout_with_ratio_0_and_a_training_mode_not_constant_goes():
    model = parse(HEADER + """
    g (float[N,3] x, bool t) => (float[N,3] y) <float r = {0}> {
        d = Dropout(x, r, t)
        y = Neg(d)
    }""")
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.standard_normal((n, 3)).astype(np.float32), "t": np.array(flag)}
             for n, flag in ((2, True), (3, False))]
    assert_removes(model, ["Neg"], {"removed Dropout with ratio 0": 1}, feeds)


def test_training_dropout_with_ratio_0_before_opset_7_goes():
    model = parse(HEADER.replace("17", "6") + """
    g (float[3] x) => (float[3] y) { d = Dropout<ratio=0.0>(x) y = Neg(d) }""")
    out, result = apply(EliminateNoops(), model)  # onnxruntime has no Dropout-6
    assert ops(out) == ["Neg"]
    assert dict(result.counts) == {"removed Dropout with ratio 0": 1}
    assert_idempotent(EliminateNoops(), out)


@pytest.mark.parametrize(("model", "reason"), [
    (dropout_model(0.5), "it is in training mode (training_mode is true)"),
    (dropout_model(0.0, ", bool[N,3] m", "d, m = Dropout(x, r, t)"),
     "it computes nothing but cannot be removed: a secondary output is used"),
    (parse(HEADER + """
     g (float[N,3] x, float r) => (float[N,3] y) <bool t = {1}> {
        d = Dropout(x, r, t)
        y = Neg(d)
     }"""), "it is in training mode (training_mode is true); its ratio input is not a constant"),
    (parse(HEADER.replace("17", "6") + """
     g (float[3] x) => (float[3] y) { d = Dropout<ratio=0.1>(x) y = Neg(d) }"""),
     "it is in training mode (is_test=0, the default before opset 7)"),
])
def test_dropout_that_drops_stays(model, reason):
    assert_kept(model, "Dropout 'd'", reason)


# ----------------------------------------------------------------------------- budget


def test_each_new_rule_is_one_rewrite_of_a_budget():
    model = parse(HEADER + """
    g (float[2,N] a, float[2,N] b, float[2,N] c) => (float[Y0,Y1] y)
      <bool t = {1}, float r = {0}> {
        d = Dropout(a, r, t)
        i = Concat<axis=1>(b, c)
        y = Concat<axis=1>(d, i)
    }""")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext(rewrites=RewriteBudget(1)))
    assert dict(result.counts) == {"removed Dropout with ratio 0": 1}
    assert Note("Concat 'y'", LIMIT_REACHED) in result.notes
    out, result = apply(EliminateNoops(), expand_model(), PassContext(rewrites=RewriteBudget(0)))
    assert "Where" in ops(out) and not result.changed
    assert Note("Where 'w'", LIMIT_REACHED) in result.notes
