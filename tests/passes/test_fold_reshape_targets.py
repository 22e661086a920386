"""fold-reshape-targets: exact ops and targets after, numerics, checker, idempotence, reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_rewrites, assert_skips, parse
from onnx import numpy_helper

from graphfix.passes.fold_reshape_targets import FoldReshapeTargets


def header(opset: int = 17) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>'


def feeds(*shape: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def target_of(model: onnx.ModelProto, output: str) -> list[int]:
    node = next(n for n in model.graph.node if n.output[0] == output)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits[node.input[1]].tolist()


def test_paddle_flatten_with_dynamic_batch_becomes_a_copy_entry():
    # ch_ppocr_mobile_v2.0_cls: Shape -> Cast(INT32) -> Slice[0:1] -> Cast(INT64) -> Concat
    model = parse(header() + """
    g (float[N,200,1,1] x) => (float[N,200] y)
      <int64[1] b = {0}, int64[1] e = {1}, int64[1] c = {200}> {
        s = Shape(x)
        s32 = Cast<to=6>(s)
        n32 = Slice(s32, b, e, b, e)
        n = Cast<to=7>(n32)
        t = Concat<axis=0>(n, c)
        y = Reshape(x, t)
    }""")
    out = assert_rewrites(FoldReshapeTargets(), model, ["Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(3, 200, 1, 1), feeds(1, 200, 1, 1, seed=1)])
    assert target_of(out, "y") == [0, 200]


def test_pytorch_flatten_gather_unsqueeze_concat():
    model = parse(header() + """
    g (float[N,4,2] x) => (float[N,8] y) <int64 zero = {0}, int64[1] ax = {0},
                                          int64[1] rest = {-1}> {
        s = Shape(x)
        n = Gather<axis=0>(s, zero)
        nn = Unsqueeze(n, ax)
        t = Concat<axis=0>(nn, rest)
        y = Reshape(x, t)
    }""")
    out = assert_rewrites(FoldReshapeTargets(), model, ["Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(5, 4, 2)])
    assert target_of(out, "y") == [0, -1]


def test_dimension_of_another_tensor_becomes_the_one_minus_one():
    model = parse(header() + """
    g (float[N,8] x) => (float[N,2,4] y) <int64[1] b = {0}, int64[1] e = {1},
                                          int64[2] c = {2, 4}> {
        r = Relu(x)
        s = Shape(x)
        n = Slice(s, b, e)
        t = Concat<axis=0>(n, c)
        y = Reshape(r, t)
    }""")
    out = assert_rewrites(FoldReshapeTargets(), model, ["Relu", "Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(3, 8)])
    assert target_of(out, "y") == [-1, 2, 4]


def test_shape_with_start_reads_static_dims_as_numbers():
    model = parse(header() + """
    g (float[N,3,4] x) => (float[N,3,4] y) <int64[1] rest = {-1}> {
        r = Relu(x)
        s = Shape<start=1>(x)
        t = Concat<axis=0>(rest, s)
        y = Reshape(r, t)
    }""")
    out = assert_rewrites(FoldReshapeTargets(), model, ["Relu", "Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(2, 3, 4)])
    assert target_of(out, "y") == [-1, 3, 4]


def test_target_computed_by_an_op_it_does_not_evaluate_stays():
    model = parse(header(17) + """
    g (float[N,3,4] x) => (float[N,12] y) <int64[1] one = {1}> {
        s = Shape<start=1>(x)
        p = ReduceProd<keepdims=1>(s)
        t = Concat<axis=0>(one, p)
        y = Reshape(x, t)
    }""")
    assert_skips(FoldReshapeTargets(), model, "Reshape 'y'",
                 "its target is not static: 'p' is computed by ReduceProd, "
                 "which this pass does not evaluate")


def test_reshape_inside_an_if_branch():
    model = parse(header() + """
    g (bool c, float[N,2,2] x) => (float[N,4] y) <int64 zero = {0}, int64[1] ax = {0},
                                                  int64[1] four = {4}> {
        y = If(c) <
            then_branch = t () => (float[N,4] ty) {
                s = Shape(x)
                n = Gather(s, zero)
                nn = Unsqueeze(n, ax)
                tt = Concat<axis=0>(nn, four)
                ty = Reshape(x, tt)
            },
            else_branch = e () => (float[N,4] ey) {
                s2 = Shape(x)
                n2 = Gather(s2, zero)
                nn2 = Unsqueeze(n2, ax)
                t2 = Concat<axis=0>(nn2, four)
                r2 = Reshape(x, t2)
                ey = Neg(r2)
            }
        >
    }""")
    out, result = apply(FoldReshapeTargets(), model)
    assert dict(result.counts) == {"made Reshape targets computed from Shape constant": 2}
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Reshape"], "else_branch": ["Reshape", "Neg"]}


@pytest.mark.parametrize(("body", "reason"), [
    ("s = Shape(x) t = Concat<axis=0>(s, one) y = Reshape(r, t)",
     "its target has entries not known statically (dim 0 of 'x', dim 1 of 'x') "
     "that neither 0 nor a single -1 can express"),
    ("s = Shape(x) t = Concat<axis=0>(s, zero) y = Reshape<allowzero=1>(x, t)",
     "its target has entries not known statically (dim 0 of 'x', dim 1 of 'x') "
     "that neither 0 nor a single -1 can express"),
    ("s = Shape(x) f = Cast<to=1>(s) c = Cast<to=7>(f) t = Concat<axis=0>(c, one) "
     "y = Reshape(x, t)",
     "its target is not static: Cast 'f' casts to a type other than INT32/INT64"),
])
def test_targets_that_cannot_be_expressed_stay(body, reason):
    model = parse(header() + f"""
    g (float[N,M] x) => (float[?,?,?] y) <int64[1] one = {{1}}, int64[1] zero = {{0}}> {{
        r = Relu(x) {body} }}""")
    assert_skips(FoldReshapeTargets(), model, "Reshape 'y'", reason)


def test_allowzero_targets_copy_dims_under_allowzero_0():
    # torch's default exporter: Reshape<allowzero=1>(ids, Concat([-1], Shape(ids)[1:2]))
    model = parse(header() + """
    g (float[N,M,4] x) => (float[?,?,?] y) <int64[1] m1 = {-1}, int64[1] four = {4}> {
        s = Shape<start=1, end=2>(x)
        t = Concat<axis=0>(m1, s, four)
        y = Reshape<allowzero=1>(x, t)
    }""")
    out = assert_rewrites(FoldReshapeTargets(), model, ["Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(2, 3, 4), feeds(1, 5, 4, seed=1)])
    assert target_of(out, "y") == [-1, 0, 4]
    assert not out.graph.node[0].attribute  # allowzero 0, the default: 0 copies the dim


def _heads(order: str = "u, four, m1", x: str = "float[N,8,4,4] x") -> onnx.ModelProto:
    """timm's BottleneckAttn: x.reshape(B * heads, dim_head, -1) with a dynamic batch."""
    return parse(header() + f"""
    g ({x}) => (float[?,?,?] y)
      <int64 zero = {{0}}, int64 two = {{2}}, int64[1] ax = {{0}}, int64[1] four = {{4}},
       int64[1] m1 = {{-1}}> {{
        r = Relu(x)
        s = Shape(r)
        n = Gather<axis=0>(s, zero)
        h = Mul(n, two)
        u = Unsqueeze(h, ax)
        t = Concat<axis=0>({order})
        y = Reshape(r, t)
    }}""")


def test_batch_times_heads_beside_a_minus_one_becomes_minus_one_and_a_size():
    out = assert_rewrites(FoldReshapeTargets(), _heads(), ["Relu", "Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(3, 8, 4, 4), feeds(1, 8, 4, 4, seed=1)])
    assert target_of(out, "y") == [-1, 4, 16]  # 128 elements a batch row / (2 * 4)


@pytest.mark.parametrize(("model", "entry"), [
    (_heads(order="four, u, m1"), "element 0 of 'h'"),  # k * N where x has 8: not N's place
    (_heads(x="float[N,8,M,4] x"), "element 0 of 'h'"),  # two dynamic dims: no fixed size
])
def test_batch_times_heads_elsewhere_stays(model, entry):
    from graphfix.graph import to_graph
    from graphfix.passes.base import PassContext

    graph = to_graph(model)  # inferred on the way (a Shape reads an unshaped tensor)
    result = FoldReshapeTargets().run(graph, PassContext())
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == [(
        "Reshape 'y'", f"its target has entries not known statically ({entry}) that "
        "neither 0 nor a single -1 can express")]


def test_constant_targets_are_not_candidates():
    model = parse(header() + """
    g (float[2,3] x) => (float[6] y) <int64[1] t = {6}> { y = Reshape(x, t) }""")
    assert_skips(FoldReshapeTargets(), model, "graph", "no Reshape with a computed target")


def test_target_rebuilt_from_every_dim_of_another_tensor_becomes_its_shape():
    # torch `x.reshape(t.shape)` with dynamic axes: a Gather + Unsqueeze per dimension
    model = parse(header() + """
    g (float[N,M,4] x, float[A,B,C] t) => (float[A,B,C] y)
      <int64 i0 = {0}, int64 i1 = {1}, int64 i2 = {2}, int64[1] ax = {0}> {
        s = Shape(t)
        d0 = Gather<axis=0>(s, i0)
        d1 = Gather<axis=0>(s, i1)
        d2 = Gather<axis=0>(s, i2)
        u0 = Unsqueeze(d0, ax)
        u1 = Unsqueeze(d1, ax)
        u2 = Unsqueeze(d2, ax)
        target = Concat<axis=0>(u0, u1, u2)
        y = Reshape(x, target)
    }""")
    rng = np.random.default_rng(0)
    feed = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
            "t": rng.standard_normal((4, 3, 2)).astype(np.float32)}
    out = assert_rewrites(FoldReshapeTargets(), model, ["Shape", "Reshape"],
                          {"made Reshape targets the Shape of a tensor": 1}, [feed])
    shape_node, reshape = out.graph.node
    assert list(shape_node.input) == ["t"] and reshape.input[1] == shape_node.output[0]


def test_a_partial_or_reordered_shape_of_another_tensor_stays():
    model = parse(header() + """
    g (float[N,M] x, float[A,B] t) => (float[?,?] y)
      <int64 i0 = {0}, int64 i1 = {1}, int64[1] ax = {0}> {
        s = Shape(t)
        d0 = Gather<axis=0>(s, i0)
        d1 = Gather<axis=0>(s, i1)
        u0 = Unsqueeze(d0, ax)
        u1 = Unsqueeze(d1, ax)
        target = Concat<axis=0>(u1, u0)
        y = Reshape(x, target)
    }""")
    assert_skips(FoldReshapeTargets(), model, "Reshape 'y'",
                 "its target has entries not known statically (dim 1 of 't', "
                 "dim 0 of 't') that neither 0 nor a single -1 can express")


def test_one_entry_computed_by_arithmetic_becomes_the_minus_one():
    # Swin's window attention: x.view(B * nW, 49, 32) with B read from a Shape
    model = parse(header() + """
    g (float[N,4,49,32] x) => (float[?,49,32] y)
      <int64 zero = {0}, int64 four = {4}, int64[1] ax = {0}, int64[2] rest = {49, 32}> {
        s = Shape(x)
        b = Gather<axis=0>(s, zero)
        bw = Mul(b, four)
        u = Unsqueeze(bw, ax)
        t = Concat<axis=0>(u, rest)
        y = Reshape(x, t)
    }""")
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = assert_rewrites(FoldReshapeTargets(), model, ["Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [feeds(2, 4, 49, 32)])
    assert target_of(out, "y") == [-1, 49, 32]


def test_two_entries_computed_by_arithmetic_stay():
    model = parse(header() + """
    g (float[N,M] x) => (float[?,?] y) <int64 zero = {0}, int64 one = {1},
                                        int64 two = {2}, int64[1] ax = {0}> {
        s = Shape(x)
        a = Gather<axis=0>(s, zero)
        b = Gather<axis=0>(s, one)
        a2 = Mul(a, two)
        b2 = Div(b, two)
        ua = Unsqueeze(a2, ax)
        ub = Unsqueeze(b2, ax)
        t = Concat<axis=0>(ua, ub)
        y = Reshape(x, t)
    }""")
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert_skips(FoldReshapeTargets(), model, "Reshape 'y'",
                 "its target has entries not known statically (element 0 of 'a2', "
                 "element 0 of 'b2') that neither 0 nor a single -1 can express")


def _head(second_input: bool = False) -> onnx.ModelProto:
    """YOLOv8's dynamic-batch head: each level is reshaped by the batch of the first
    level, a Conv of the same input (`x[i].view(shape[0], no, -1)`, shape = x[0].shape).
    With `second_input`, the batch comes from another graph input declared `N` too."""
    from gfhelpers import build_model, init, seeded, value

    source = "a" if second_input else "y"
    nodes = [onnx.helper.make_node("Conv", ["x", "w1"], ["y"], pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Conv", ["x", "w2"], ["z"]),
             onnx.helper.make_node("Sigmoid", ["z"], ["zs"]),
             onnx.helper.make_node("Mul", ["z", "zs"], ["act"]),
             onnx.helper.make_node("Shape", [source], ["s"]),
             onnx.helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             onnx.helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             onnx.helper.make_node("Concat", ["b1", "c6", "m1"], ["t"], axis=0),
             onnx.helper.make_node("Reshape", ["act", "t"], ["out"])]
    inputs = [value("x", ["N", 4, 8, 8])] + ([value("a", ["N", 8, 8, 8])] if second_input
                                             else [])
    inits = [init("w1", seeded((8, 4, 3, 3))), init("w2", seeded((6, 4, 1, 1), seed=1)),
             init("i0", np.array(0, np.int64)), init("ax0", np.array([0], np.int64)),
             init("c6", np.array([6], np.int64)), init("m1", np.array([-1], np.int64))]
    return build_model(nodes, inputs, [value("out", ["N", 6, 64])], inits)


def test_the_batch_of_a_conv_of_the_same_input_becomes_a_copy_entry():
    """y and act both have x's batch by construction (a Conv keeps dim 0, x * sigmoid(x)
    keeps it): the target is [0, 6, -1], whatever N is."""
    out = assert_rewrites(FoldReshapeTargets(), _head(), ["Conv", "Sigmoid", "Mul", "Reshape"],
                          {"made Reshape targets computed from Shape constant": 1},
                          [{"x": np.random.default_rng(s).standard_normal((n, 4, 8, 8),
                                                                        np.float32)}
                           for s, n in ((0, 3), (1, 1))])
    assert target_of(out, "out") == [0, 6, -1]


def test_the_batch_of_another_input_declared_with_the_same_name_stays():
    """Two graph inputs both declared N are two sizes to onnxruntime: no 0 for it."""
    assert_skips(FoldReshapeTargets(), _head(second_input=True), "Reshape 'out'",
                 "its target has entries not known statically (dim 0 of 'a') that neither 0 "
                 "nor a single -1 can express")


def _attention() -> onnx.ModelProto:
    """A decoder layer as LLaMA's TorchScript export writes it: heads split with a
    constant target, scores plus a causal mask built from Range(0, S, 1) and expanded
    with PyTorch's `Where(Equal(t, -1), 1, t)`, and the heads merged back with a target
    read from the Shape of the layer's input and of the attention output."""
    return parse(header() + """
    g (float[N,S,8] x) => (float[N,S,8] y)
      <int64 i0 = {0}, int64 i1 = {1}, int64 i2 = {2}, int64[1] a0 = {0},
       int64[1] m1 = {-1}, int64[4] heads = {0, 0, 2, 4}, int64[4] neg = {-1, -1, -1, -1},
       int64[4] ones = {1, 1, 1, 1}, int64[1] a1 = {1}, float big = {-1e4},
       float zero = {0.0}, int64[1] four = {4}> {
        s = Shape(x)
        n = Gather(s, i0)
        sq = Gather(s, i1)
        pos = Range(i0, sq, i1)
        row = Unsqueeze(pos, a0)
        col = Unsqueeze(pos, a1)
        causal = LessOrEqual(row, col)
        n1 = Unsqueeze(n, a0)
        s1 = Unsqueeze(sq, a0)
        shape4 = Concat<axis=0>(n1, m1, s1, s1)
        undef = Equal(shape4, neg)
        wanted = Where(undef, ones, shape4)
        mask = Expand(causal, wanted)
        q = Reshape(x, heads)
        qt = Transpose<perm=[0, 2, 1, 3]>(q)
        kt = Transpose<perm=[0, 2, 3, 1]>(q)
        scores = MatMul(qt, kt)
        masked = Where(mask, scores, big)
        probs = Softmax<axis=-1>(masked)
        ctx = MatMul(probs, qt)
        cs = Shape(ctx)
        cn = Gather(cs, i0)
        cseq = Gather(cs, i2)
        cn1 = Unsqueeze(cn, a0)
        cseq1 = Unsqueeze(cseq, a0)
        t1 = Concat<axis=0>(cn1, m1, cseq1, four)
        back = Reshape(ctx, t1)
        bt = Transpose<perm=[0, 2, 1, 3]>(back)
        n2 = Unsqueeze(n, a0)
        t2 = Concat<axis=0>(n2, s1, m1)
        y = Reshape(bt, t2)
    }""")


def test_attention_targets_copy_dims_that_masks_and_matmuls_carry():
    """Every dim the two computed targets read is, by construction, the one at the same
    place of the tensor reshaped (through the batched MatMuls, the Range-built mask and
    PyTorch's expand): [0, -1, 0, 4] and [0, 0, -1], right for every N and S."""
    model = _attention()
    sets = [{"x": np.random.default_rng(s).standard_normal((n, q, 8), np.float32)}
            for s, (n, q) in enumerate(((2, 5), (1, 1), (3, 7)))]
    out, result = apply(FoldReshapeTargets(), model)
    assert dict(result.counts) == {"made Reshape targets computed from Shape constant": 2}
    assert target_of(out, "back") == [0, -1, 0, 4]
    assert target_of(out, "y") == [0, 0, -1]
    from gfhelpers import assert_idempotent, assert_same_outputs

    for feeds_ in sets:
        assert_same_outputs(model, out, feeds_)
    assert_idempotent(FoldReshapeTargets(), out)
