"""eliminate-noops, the rules for neutral arithmetic, single-output Split, Unsqueeze
pairs and Transposes of size-1 axes: exact ops, numerics, checker, idempotence, reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse
from onnx import numpy_helper
from test_eliminate_noops import assert_kept, assert_removes, header

from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.eliminate_noops import EliminateNoops


def inferred(text: str) -> onnx.ModelProto:
    """A model from ONNX text with the shapes of its inner tensors (as the manager gives)."""
    return onnx.shape_inference.infer_shapes(parse(text), strict_mode=True)


# ----------------------------------------------------------------------------- x + 0, x * 1


@pytest.mark.parametrize(("body", "count"), [
    ("a = Add(x, zero)", "removed Add of the neutral constant 0"),
    ("a = Add(zero, x)", "removed Add of the neutral constant 0"),
    ("a = Sub(x, zero)", "removed Sub of the neutral constant 0"),
    ("a = Mul(one, x)", "removed Mul of the neutral constant 1"),
    ("a = Div(x, one)", "removed Div of the neutral constant 1"),
    ("a = Mul(x, one4)", "removed Mul of the neutral constant 1"),
])
def test_neutral_arithmetic_goes(body, count):
    model = parse(header() + f"""
    g (float[2,3,4] x) => (float[2,3,4] y)
      <float zero = {{0}}, float one = {{1}}, float[1,1,1] one4 = {{1}}> {{
        {body}
        y = Relu(a)
    }}""")
    assert_removes(model, ["Relu"], {count: 1})


def test_neutral_constant_from_a_constant_node_on_int64_goes():
    model = parse(header() + """
    g (int64[5] x) => (int64[5] y) {
        one = Constant<value = int64 {1}>()
        m = Mul(x, one)
        y = Neg(m)
    }""")
    feeds = {"x": np.arange(-2, 3, dtype=np.int64)}
    assert_removes(model, ["Neg"], {"removed Mul of the neutral constant 1": 1}, [feeds])


def test_neutral_constant_writing_a_graph_output_keeps_the_name():
    model = parse(header() + """
    g (float[3] x) => (float[3] y) <float one = {1}> { r = Relu(x) y = Mul(r, one) }""")
    out = assert_removes(model, ["Relu"], {"removed Mul of the neutral constant 1": 1})
    assert out.graph.node[0].output == ["y"]


@pytest.mark.parametrize("body", [
    "a = Sub(zero, x)",        # 0 - x is -x
    "a = Div(one, x)",         # 1 / x
    "a = Mul(x, two)",         # not neutral
    "a = Add(x, halves3)",     # not neutral in every element
])
def test_non_neutral_arithmetic_is_not_a_candidate(body):
    model = parse(header() + f"""
    g (float[3] x) => (float[3] y)
      <float zero = {{0}}, float one = {{1}}, float two = {{2}},
       float[3] halves3 = {{0, 0.5, 0}}> {{
        {body}
        y = Relu(a)
    }}""")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert [n.reason for n in result.notes] == [
        "no Identity, inference Dropout, Cast, Reshape, Expand, Transpose, Unsqueeze or "
        "Squeeze pair, Concat, Split, Slice, Pad, Add/Sub/Mul/Div of a constant or Where on "
        "a shape comparison"
    ]


def test_zero_bias_vector_goes():
    # a Linear layer's bias initialized to zeros (torchvision's ConvNeXt, ViT heads)
    model = parse(header() + """
    g (float[N,4,3] x) => (float[N,4,3] y) <float[3] zeros = {0, 0, 0},
                                            float[4,1] ones = {1, 1, 1, 1}> {
        a = Add(x, zeros)
        m = Mul(ones, a)
        y = Relu(m)
    }""")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4, 3)).astype(np.float32)}
    assert_removes(model, ["Relu"], {"removed Add of the neutral constant 0": 1,
                                     "removed Mul of the neutral constant 1": 1}, [feeds])


@pytest.mark.parametrize(("x", "reason"), [
    ("float[N,1] x", "its constant broadcasts axis 1 from 1 to 3"),
    ("float[N,M] x", "shape unknown: its constant has 3 on axis 1, which may broadcast "
                     "the input's M"),
])
def test_neutral_vector_that_may_broadcast_the_input_stays(x, reason):
    model = parse(header() + f"""
    g ({x}) => (float[N,3] y) <float[3] zeros = {{0, 0, 0}}> {{
        a = Add(x, zeros)
        y = Relu(a)
    }}""")
    assert_kept(model, "Add 'a'", reason)


def test_neutral_constant_that_adds_dimensions_stays():
    model = parse(header() + """
    g (float[3] x) => (float[1,3] y) <float[1,1] one = {1}> { m = Mul(x, one) y = Relu(m) }""")
    assert_kept(model, "Mul 'm'", "its constant of rank 2 adds dimensions to an input of rank 1")


def test_neutral_constant_with_unknown_input_rank_stays():
    model = parse(header() + """
    g (float[3] x, int64[2] s) => (float[?,?] y) <float[1] one = {1}> {
        r = Reshape(x, s)
        m = Mul(r, one)
        y = Relu(m)
    }""")
    graph = to_graph(model)
    graph.tensors()["r"].shape = None
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert any(n.reason.startswith("shape unknown: its constant of rank 1") for n in result.notes)


# ----------------------------------------------------------------------------- Split


@pytest.mark.parametrize(("opset", "body"), [
    (11, "s = Split<axis=1>(x)"),
    (17, "s = Split<axis=1>(x, sizes)"),
    (18, "s = Split<axis=1, num_outputs=1>(x)"),
])
def test_single_output_split_goes(opset, body):
    model = parse(header(opset) + f"""
    g (float[2,3] x) => (float[2,3] y) <int64[1] sizes = {{3}}> {{ {body} y = Neg(s) }}""")
    assert_removes(model, ["Neg"], {"removed single-output Split": 1})


def test_split_with_two_outputs_is_not_a_candidate():
    model = parse(header() + """
    g (float[2,4] x) => (float[2,2] y, float[2,2] z) { y, z = Split<axis=1>(x) }""")
    graph = to_graph(model)
    before = fingerprint(graph)
    assert not EliminateNoops().run(graph, PassContext()).changed
    assert fingerprint(graph) == before


# ----------------------------------------------------------------------------- Unsqueeze pairs


@pytest.mark.parametrize(("opset", "body", "axes"), [
    (11, "u = Unsqueeze<axes=[0]>(x) v = Unsqueeze<axes=[2]>(u)", [0, 2]),
    (11, "u = Unsqueeze<axes=[1]>(x) v = Unsqueeze<axes=[0]>(u)", [0, 2]),
    (17, "u = Unsqueeze(x, a) v = Unsqueeze(u, b)", [0, 1, 3]),
    (17, "u = Unsqueeze(x, neg) v = Unsqueeze(u, b)", [1, 3, 4]),  # [2,3,1] -> [2,1,3,1,1]
])
def test_unsqueeze_pairs_merge(opset, body, axes):
    rank = 2 + len(axes)
    model = parse(header(opset) + f"""
    g (float[2,3] x) => (float[{",".join("?" * rank)}] y)
      <int64[1] a = {{0}}, int64[2] b = {{1, 3}}, int64[1] neg = {{-1}}> {{
        {body}
        y = Neg(v)
    }}""")
    out, result = apply(EliminateNoops(), model)
    assert ops(out) == ["Unsqueeze", "Neg"]
    assert dict(result.counts) == {"merged Unsqueeze pairs into one": 1}
    node = out.graph.node[0]
    if opset < 13:
        assert list(node.attribute[0].ints) == axes
    else:
        inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
        assert inits[node.input[1]].tolist() == axes
    feeds = feeds_for(model)
    assert_same_outputs(model, out, feeds)
    assert_idempotent(EliminateNoops(), out)


def test_unsqueeze_pair_whose_first_feeds_another_node_stays():
    model = parse(header() + """
    g (float[2] x) => (float[1,1,2] y, float[1,2] z) <int64[1] a = {0}> {
        u = Unsqueeze(x, a)
        y = Unsqueeze(u, a)
        z = Neg(u)
    }""")
    assert_kept(model, "Unsqueeze 'y'", "the Unsqueeze before it also feeds another node")


@pytest.mark.parametrize(("opset", "body", "target"), [
    (17, "u = Reshape(x, t) v = Unsqueeze(u, a)", [1, 4, -1, 3]),  # ViT: view then [None]
    (11, "u = Reshape(x, t) v = Unsqueeze<axes=[-1]>(u)", [4, -1, 3, 1]),
    (17, "u = Reshape(x, t1) v = Squeeze(u, one)", [4, 6]),
    (11, "u = Reshape(x, t1) v = Squeeze<axes=[1]>(u)", [4, 6]),
])
def test_an_unsqueeze_or_squeeze_after_a_reshape_joins_it(opset, body, target):
    model = parse(header(opset) + f"""
    g (float[2,3,4] x) => (float[{",".join("?" * len(target))}] y)
      <int64[3] t = {{4, -1, 3}}, int64[3] t1 = {{4, 1, 6}}, int64[1] a = {{0}},
       int64[1] one = {{1}}> {{
        {body}
        y = Neg(v)
    }}""")
    out, result = apply(EliminateNoops(), model)
    assert ops(out) == ["Reshape", "Neg"]
    op = "Unsqueeze" if "Unsqueeze" in body else "Squeeze"
    assert dict(result.counts) == {f"merged {op} into the Reshape before it": 1}
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    assert inits[out.graph.node[0].input[1]].tolist() == target
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(EliminateNoops(), out)


@pytest.mark.parametrize(("body", "out", "node", "reason"), [
    ("u = Reshape(x, z) v = Unsqueeze(u, a)", "?,?,?,?", "Unsqueeze 'v'",
     "the Reshape before it copies dims (0 entries)"),
    ("u = Reshape(x, flat) v = Squeeze(u, one)", "?", "Squeeze 'v'",  # -1, not a literal 1
     "it squeezes an entry of the Reshape's target that is not 1"),
])
def test_a_reshape_whose_merge_would_move_a_dim_stays(body, out, node, reason):
    model = parse(header() + f"""
    g (float[2,3,4] x) => (float[{out}] y) <int64[3] z = {{0, 4, 3}},
      int64[2] flat = {{24, -1}}, int64[1] a = {{0}}, int64[1] one = {{1}}> {{
        {body}
        y = Neg(v)
    }}""")
    assert_kept(model, node, reason)


# ----------------------------------------------------------------- Transpose of size-1 axes


def test_transpose_of_size_one_axes_between_reshapes_collapses():
    # torchvision's SSD head: Reshape(conv, [1,-1,4,1,1]) -> Transpose(0,3,4,1,2) -> Reshape
    model = inferred(header() + """
    g (float[1,24,1,1] x) => (float[1,6,4] y)
      <int64[5] s1 = {1, -1, 4, 1, 1}, int64[3] s2 = {1, -1, 4}> {
        r = Reshape(x, s1)
        t = Transpose<perm=[0, 3, 4, 1, 2]>(r)
        y = Reshape(t, s2)
    }""")
    out = assert_removes(model, ["Reshape"], {
        "turned Transposes of size-1 axes into Reshapes": 1,
        "collapsed Reshape pairs into one": 2,
    })
    assert out.graph.node[0].output == ["y"]


def test_transpose_of_size_one_axes_with_a_dynamic_dim_uses_minus_one():
    model = inferred(header() + """
    g (float[N,8] x) => (float[1,N,8] y) <int64[3] s = {-1, 8, 1}> {
        r = Reshape(x, s)
        y = Transpose<perm=[2, 0, 1]>(r)
    }""")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert result.counts["turned Transposes of size-1 axes into Reshapes"] == 1
    assert [n.op for n in graph.nodes if n.outputs] == ["Reshape"]
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    out, _ = apply(EliminateNoops(), model)
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize(("perm", "shape"), [
    ("[0, 2, 1]", "float[2,3,4]"),      # moves axes of size 3 and 4: data order changes
])
def test_transpose_that_moves_data_stays(perm, shape):
    model = parse(header() + f"""
    g (float[2,12] x) => ({shape.replace('[2,3,4]', '[2,4,3]')} y) <int64[3] s = {{2, 3, 4}}> {{
        r = Reshape(x, s)
        y = Transpose<perm={perm}>(r)
    }}""")
    assert_kept(model, "Transpose 'y'", "its permutation (0, 2, 1) is not the identity")


def test_transpose_of_size_one_axes_without_a_reshape_stays():
    model = parse(header() + """
    g (float[1,4,1] x) => (float[4,1,1] y) { y = Transpose<perm=[1, 0, 2]>(x) }""")
    assert_kept(model, "Transpose 'y'", "its permutation (1, 0, 2) is not the identity")


def _zero_bias(shape: tuple[int, ...]) -> onnx.ModelProto:
    from gfhelpers import build_model, init, value

    nodes = [onnx.helper.make_node("Add", ["x", "bias"], ["a"]),
             onnx.helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
    return build_model(nodes, [value("x", ["N", *shape])], [value("y", ["N", *shape])],
                       [init("bias", np.zeros(shape, np.float32))])


def test_a_zero_attention_bias_table_goes():
    """EfficientFormerV2's attention bias, zero in a random-weight export: 8 x 49 x 196
    elements, more than a bias vector, within `MAX_NEUTRAL_ELEMENTS`."""
    x = np.random.default_rng(0).standard_normal((2, 8, 49, 196), np.float32)
    assert_removes(_zero_bias((8, 49, 196)), ["Softmax"],
                   {"removed Add of the neutral constant 0": 1}, [{"x": x}])


def test_a_constant_over_the_read_limit_is_not_read():
    from graphfix.passes._noop_single import MAX_NEUTRAL_ELEMENTS

    model = _zero_bias((MAX_NEUTRAL_ELEMENTS + 1,))
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert [n.op for n in graph.nodes] == ["Add", "Softmax"]
