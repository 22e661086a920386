"""eliminate-noops: exact ops after, onnxruntime numerics, checker, idempotence, skip reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse
from onnx import numpy_helper

from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import Note, PassContext
from graphfix.passes.eliminate_noops import EliminateNoops
from graphfix.runtime.session import run_model

INT64_MAX = 2**63 - 1
CONV_W = "float[4,4,1,1] w = {" + ", ".join(str(v / 16) for v in range(16)) + "}"


def header(opset: int = 17) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>'


def _out_types(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]


def assert_removes(model, expected_ops, counts, feed_sets=None) -> onnx.ModelProto:
    """Run the pass; check ops, counts, checker (apply), numerics, outputs, idempotence."""
    out, result = apply(EliminateNoops(), model)
    assert ops(out) == expected_ops
    assert dict(result.counts) == counts
    assert result.changed
    assert _out_types(out) == _out_types(model)
    for feeds in feed_sets or [feeds_for(model)]:
        assert_same_outputs(model, out, feeds)
    assert_idempotent(EliminateNoops(), out)
    return out


def assert_kept(model, node: str, reason: str) -> None:
    """The pass changes nothing and says why about `node` (its label)."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed, result.counts
    assert fingerprint(graph) == before
    assert Note(node, reason) in result.notes, result.notes
    assert Note("graph", "none of its candidates is a removable no-op") in result.notes


# ----------------------------------------------------------------------------- single nodes


def test_identity_and_inference_dropout_between_conv_and_relu():
    model = parse(header() + f"""
    g (float[1,4,3,3] x) => (float[1,4,3,3] y) <{CONV_W}> {{
        c = Conv(x, w)
        i = Identity(c)
        d = Dropout(i)
        y = Relu(d)
    }}""")
    assert_removes(model, ["Conv", "Relu"],
                   {"removed Identity": 1, "removed inference Dropout": 1})


def test_dropout_with_constant_false_training_mode_goes():
    model = parse(header() + """
    g (float[3] x) => (float[3] y) <bool t = {0}, float r = {0.5}> {
        d = Dropout(x, r, t)
        y = Neg(d)
    }""")
    assert_removes(model, ["Neg"], {"removed inference Dropout": 1})


def test_dropout_with_is_test_before_opset_7_goes():
    model = parse(header(6) + """
    g (float[3] x) => (float[3] y) { d = Dropout<is_test=1>(x) y = Neg(d) }""")
    out, result = apply(EliminateNoops(), model)  # onnxruntime has no Dropout-6 to compare with
    assert ops(out) == ["Neg"]
    assert dict(result.counts) == {"removed inference Dropout": 1}
    assert_idempotent(EliminateNoops(), out)


@pytest.mark.parametrize(("body", "inputs", "reason"), [
    ("d = Dropout(x, r, t) y = Neg(d)", "", "it is in training mode (training_mode is true)"),
    ("d = Dropout(x, , m) y = Neg(d)", ", bool m", "its training_mode input is not a constant"),
])
def test_dropout_in_training_mode_stays(body, inputs, reason):
    model = parse(header() + f"""
    g (float[3] x{inputs}) => (float[3] y) <bool t = {{1}}, float r = {{0.5}}> {{ {body} }}""")
    assert_kept(model, "Dropout 'd'", reason)


def test_dropout_whose_mask_is_used_stays():
    model = parse(header() + """
    g (float[3] x) => (float[3] y, bool[3] m) { d, m = Dropout(x) y = Neg(d) }""")
    assert_kept(model, "Dropout 'd'",
                "it computes nothing but cannot be removed: a secondary output is used")


def test_cast_to_the_same_type_goes_for_inputs_initializers_and_constant_nodes():
    model = parse(header() + """
    g (float[3] x) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> {
        a = Cast<to=1>(x)
        b = Cast<to=1>(w)
        k = Constant<value = float[3] {0.5, 0.25, 2.0}>()
        c = Cast<to=1>(k)
        s = Add(a, b)
        y = Mul(s, c)
    }""")
    assert_removes(model, ["Constant", "Add", "Mul"], {"removed Cast to the same type": 3})


@pytest.mark.parametrize(("x", "chain"), [
    ("float", "a = Cast<to=7>(x) b = Cast<to=7>(a) y = Cast<to=1>(b)"),
    ("float16", "c = Cast<to=10>(x) y = Neg(c)"),
    ("float", "s = Shape(x) c = Cast<to=7>(s) f = Cast<to=1>(c) y = Mul(x, f)"),
])
def test_cast_after_an_op_that_fixes_the_dtype_goes(x, chain):
    model = parse(header() + f"g ({x}[3] x) => ({x}[3] y) {{ {chain} }}")
    out, result = apply(EliminateNoops(), model)
    assert result.counts["removed Cast to the same type"] == 1
    assert ops(out).count("Cast") == ops(model).count("Cast") - 1
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(EliminateNoops(), out)


def test_cast_to_another_type_stays():
    model = parse(header() + """
    g (float[3] x) => (float16[3] y) { y = Cast<to=10>(x) }""")
    assert_kept(model, "Cast 'y'", "it casts float to float16")


def test_cast_of_unknown_dtype_stays():
    model = parse(header() + """
    g (float[3] x) => (float[3] y) { r = Relu(x) c = Cast<to=1>(r) y = Neg(c) }""")
    assert_kept(model, "Cast 'c'", "its input dtype is unknown")


def test_cast_writing_a_graph_output_keeps_the_output_name():
    model = parse(header() + """
    g (float[3] x) => (float[3] y) <float[3] r> { r = Relu(x) y = Cast<to=1>(r) }""")
    out = assert_removes(model, ["Relu"], {"removed Cast to the same type": 1})
    assert list(out.graph.node[0].output) == ["y"]


def test_identity_from_graph_input_to_graph_output_stays():
    model = parse(header() + "g (float[3] x) => (float[3] y) { y = Identity(x) }")
    assert_kept(model, "Identity 'y'", "it computes nothing but cannot be removed: "
                "it connects a graph input or output directly to a graph output")


# ----------------------------------------------------------------------------- Reshape, Expand


def test_reshape_and_expand_to_the_same_static_shape_go():
    model = parse(header() + """
    g (float[3,4] x) => (float[3,4] y)
      <int64[2] s = {3, 4}, int64[2] e = {1, 4}, float[3,4] r, float[3,4] a> {
        r = Relu(x)
        a = Reshape(r, s)
        b = Expand(a, e)
        y = Neg(b)
    }""")
    assert_removes(model, ["Relu", "Neg"],
                   {"removed Reshape to the same shape": 1, "removed Expand to the same shape": 1})


def test_reshape_decided_from_declared_shapes_when_the_target_is_computed():
    model = parse(header() + """
    g (float[3,4] x) => (float[3,4] y) <float[3,4] a> {
        s = Shape(x)
        a = Reshape(x, s)
        y = Neg(a)
    }""")
    assert_removes(model, ["Neg"], {"removed Reshape to the same shape": 1})  # Shape is dead


def test_reshape_keeping_a_dynamic_batch_goes():
    model = parse(header() + """
    g (float[N,3] x) => (float[N,3] y) <int64[2] s = {0, 3}, int64[2] t = {-1, 3}> {
        a = Reshape(x, s)
        b = Reshape(a, t)
        y = Neg(b)
    }""")
    assert_removes(model, ["Neg"], {"removed Reshape to the same shape": 2},
                   [feeds_for(model, x=(5, 3))])


def test_reshape_to_another_shape_stays():
    model = parse(header() + """
    g (float[3,4] x) => (float[2,6] y) <int64[2] s = {2, 6}> { y = Reshape(x, s) }""")
    assert_kept(model, "Reshape 'y'", "its target shape (2, 6) changes the input shape (3, 4)")


def test_reshape_with_unknown_input_shape_stays():
    model = parse(header() + """
    g (float[3,4] x) => (float[3,4] y) <int64[2] s = {3, 4}> { r = Relu(x) y = Reshape(r, s) }""")
    assert_kept(model, "Reshape 'y'",
                "shape unknown: its input or output shape is not fully static")


def test_expand_that_broadcasts_stays():
    model = parse(header() + """
    g (float[1,4] x) => (float[3,4] y) <int64[2] e = {3, 4}> { y = Expand(x, e) }""")
    assert_kept(model, "Expand 'y'", "its target shape (3, 4) changes the input shape (1, 4)")


def test_expand_on_a_symbolic_dim_stays_as_unknown():
    model = parse(header() + """
    g (float[N,4] x) => (float[M,4] y) <int64[2] e = {3, 4}> { y = Expand(x, e) }""")
    assert_kept(model, "Expand 'y'",
                "shape unknown: its input or output shape is not fully static")


# ----------------------------------------------------------------------------- Reshape pairs


def test_reshape_pair_collapses_into_one():
    model = parse(header() + """
    g (float[2,3,4] x) => (float[4,6] y) <int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}> {
        a = Reshape(x, s1)
        y = Reshape(a, s2)
    }""")
    out = assert_removes(model, ["Reshape"], {"collapsed Reshape pairs into one": 1})
    assert list(out.graph.node[0].input) == ["x", "s2"]


def test_reshape_pair_resolves_zero_from_the_first_target():
    model = parse(header() + """
    g (float[2,3,4] x) => (float[6,2,2] y) <int64[2] s1 = {6, 4}, int64[3] s2 = {0, 2, 2}> {
        a = Reshape(x, s1)
        y = Reshape(a, s2)
    }""")
    out = assert_removes(model, ["Reshape"], {"collapsed Reshape pairs into one": 1})
    shape = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert shape[out.graph.node[0].input[1]].tolist() == [6, 2, 2]


def test_reshape_pair_whose_zeros_copy_x_collapses_then_vanishes():
    model = parse(header() + """
    g (float[N,3,4] x) => (float[N,3,4] y) <int64[2] s1 = {0, 12}, int64[3] s2 = {0, 3, 4}> {
        a = Reshape(x, s1)
        b = Reshape(a, s2)
        y = Neg(b)
    }""")
    assert_removes(model, ["Neg"], {"collapsed Reshape pairs into one": 1,
                                    "removed Reshape to the same shape": 1},
                   [feeds_for(model, x=(2, 3, 4))])


def test_reshape_pair_with_an_unknown_middle_dim_stays():
    model = parse(header() + """
    g (float[2,3,4] x, int64[2] s1) => (float[6,4] y) <int64[2] s2 = {0, -1}> {
        a = Reshape(x, s1)
        y = Reshape(a, s2)
    }""")
    assert_kept(model, "Reshape 'y'",
                "shape unknown: its input or output shape is not fully static; its target "
                "copies dimension 0 of the tensor between the Reshapes, which is not known")


def test_reshape_pair_whose_first_has_another_consumer_stays():
    model = parse(header() + """
    g (float[2,3,4] x) => (float[4,6] y, float[6,4] z)
      <int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}, float[6,4] a> {
        a = Reshape(x, s1)
        y = Reshape(a, s2)
        z = Neg(a)
    }""")
    assert_kept(model, "Reshape 'y'", "its target shape (4, 6) changes the input shape (6, 4); "
                "the Reshape before it also feeds another node")


def _gelu_between_reshapes(back: str = "{-1, 8}", tail: str = "y = MatMul(b, w)",
                           outputs: str = "float[N,3] y") -> onnx.ModelProto:
    """GPT-2's MLP as torch's default exporter writes it: [B*S, 8] -> Reshape [B, S, 8] ->
    GELU (tanh form, one-element constants) -> Reshape [-1, 8] -> MatMul."""
    return parse(header() + f"""
    g (float[N,8] x) => ({outputs})
      <int64[3] mid = {{-1, 2, 8}}, int64[2] back = {back}, float half = {{0.5}},
       float three = {{3.0}}, float k = {{0.044715}}, float c = {{0.7978846}},
       float one = {{1.0}}, float[8,3] w = {{{", ".join(str(v / 10) for v in range(24))}}}> {{
        m = Reshape(x, mid)
        h = Mul(m, half)
        p = Pow(m, three)
        q = Mul(p, k)
        r = Add(m, q)
        u = Mul(r, c)
        t = Tanh(u)
        v = Add(t, one)
        g = Mul(h, v)
        b = Reshape(g, back)
        {tail}
    }}""")


def test_reshape_pair_around_elementwise_ops_goes():
    model = _gelu_between_reshapes()
    out = assert_removes(model, ["Mul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul",
                                 "MatMul"],
                         {"removed Reshape pairs around elementwise ops": 1},
                         [feeds_for(model, x=(4, 8)), feeds_for(model, x=(6, 8))])
    feeds = feeds_for(model, x=(8, 8))  # exact: the same elements through the same ops
    np.testing.assert_array_equal(run_model(out, feeds)["y"], run_model(model, feeds)["y"])
    from graphfix.graph.shapes import infer_shapes

    graph = to_graph(model)
    infer_shapes(graph)
    assert len(graph.tensors()["g"].shape) == 3
    EliminateNoops().run(graph, PassContext())
    assert graph.tensors()["g"].shape == ["N", 8]  # x's shape now, not the middle one


@pytest.mark.parametrize(("model", "why"), [
    (_gelu_between_reshapes(tail="y = MatMul(b, w)\n        z = Neg(t)",
                            outputs="float[N,3] y, float[?,2,8] z"),
     "a tensor between them is read elsewhere, in the middle shape"),
    (_gelu_between_reshapes(back="{-1, 16}", tail="y = Neg(b)", outputs="float[?,16] y"),
     "the second Reshape does not give x's shape back"),
])
def test_reshape_pairs_around_elementwise_ops_that_must_stay(model, why):
    out, result = apply(EliminateNoops(), model)
    assert ops(out).count("Reshape") == 2, why
    assert "removed Reshape pairs around elementwise ops" not in result.counts


def test_reshape_pair_around_a_per_channel_constant_stays():
    model = parse(header() + """
    g (float[N,8] x) => (float[N,8] y)
      <int64[3] mid = {-1, 2, 4}, int64[2] back = {-1, 8}, float[4] bias = {1, 2, 3, 4}> {
        m = Reshape(x, mid)
        a = Add(m, bias)
        y = Reshape(a, back)
    }""")
    out, _ = apply(EliminateNoops(), model)
    assert ops(out) == ["Reshape", "Add", "Reshape"]  # [4] broadcasts by the middle shape


# ----------------------------------------------------------------------------- Transpose


def test_identity_transpose_goes():
    model = parse(header() + """
    g (float[2,3] x) => (float[2,3] y) { t = Transpose<perm=[0, 1]>(x) y = Neg(t) }""")
    assert_removes(model, ["Neg"], {"removed identity Transpose": 1})


def test_non_identity_transpose_stays():
    model = parse(header() + """
    g (float[2,3] x) => (float[3,2] y) { y = Transpose<perm=[1, 0]>(x) }""")
    assert_kept(model, "Transpose 'y'", "its permutation (1, 0) is not the identity")


def test_nhwc_transposes_around_a_conv_cancel():
    model = parse(header() + f"""
    g (float[1,4,3,5] x) => (float[1,4,3,5] y) <{CONV_W}> {{
        a = Transpose<perm=[0, 2, 3, 1]>(x)
        b = Transpose<perm=[0, 3, 1, 2]>(a)
        c = Conv(b, w)
        d = Transpose<perm=[0, 2, 3, 1]>(c)
        e = Transpose<perm=[0, 3, 1, 2]>(d)
        y = Relu(e)
    }}""")
    out = assert_removes(model, ["Conv", "Relu"], {"removed Transpose pairs that cancel": 2})
    assert list(out.graph.node[0].input)[0] == "x"


def test_transpose_pair_writing_a_graph_output_hands_it_to_the_conv():
    model = parse(header() + f"""
    g (float[1,4,3,5] x) => (float[1,4,3,5] y) <{CONV_W}> {{
        c = Conv(x, w)
        d = Transpose<perm=[0, 2, 3, 1]>(c)
        y = Transpose<perm=[0, 3, 1, 2]>(d)
    }}""")
    out = assert_removes(model, ["Conv"], {"removed Transpose pairs that cancel": 1})
    assert list(out.graph.node[0].output) == ["y"]


def test_transpose_pair_composes_into_one():
    model = parse(header() + """
    g (float[2,3,4] x) => (float[4,2,3] y) {
        a = Transpose<perm=[1, 2, 0]>(x)
        y = Transpose<perm=[1, 2, 0]>(a)
    }""")
    out = assert_removes(model, ["Transpose"], {"composed Transpose pairs into one": 1})
    assert list(out.graph.node[0].attribute[0].ints) == [2, 0, 1]
    assert list(out.graph.node[0].input) == ["x"]


def test_three_transposes_without_perm_reduce_to_one():
    model = parse(header() + """
    g (float[2,3,4] x) => (float[4,3,2] y) {
        a = Transpose(x)
        b = Transpose(a)
        y = Transpose(b)
    }""")
    assert_removes(model, ["Transpose"], {"removed Transpose pairs that cancel": 1})


def test_transpose_pair_whose_first_has_another_consumer_stays():
    model = parse(header() + """
    g (float[1,4,3,5] x) => (float[1,4,3,5] y, float[1,3,5,4] z) {
        a = Transpose<perm=[0, 2, 3, 1]>(x)
        y = Transpose<perm=[0, 3, 1, 2]>(a)
        z = Neg(a)
    }""")
    assert_kept(model, "Transpose 'y'", "its permutation (0, 3, 1, 2) is not the identity; "
                "the Transpose before it also feeds another node")


def test_cancelling_transposes_from_input_to_output_stay():
    model = parse(header() + """
    g (float[2,3] x) => (float[2,3] y) {
        a = Transpose<perm=[1, 0]>(x)
        y = Transpose<perm=[1, 0]>(a)
    }""")
    assert_kept(model, "Transpose 'y'", "it computes nothing but cannot be removed: "
                "it connects a graph input or output directly to a graph output")


# ----------------------------------------------------------------------------- Unsqueeze/Squeeze


@pytest.mark.parametrize(("opset", "body"), [
    (11, "u = Unsqueeze<axes=[0, -1]>(x) s = Squeeze<axes=[3, 0]>(u)"),
    (17, "u = Unsqueeze(x, ax) s = Squeeze(u, bx)"),
    (17, "u = Unsqueeze(x, ax) s = Squeeze(u)"),
])
def test_unsqueeze_squeeze_pair_goes(opset, body):
    model = parse(header(opset) + f"""
    g (float[2,3] x) => (float[2,3] y) <int64[2] ax = {{0, -1}}, int64[2] bx = {{3, 0}}> {{
        {body}
        y = Neg(s)
    }}""")
    assert_removes(model, ["Neg"], {"removed Unsqueeze-Squeeze pairs": 1})


@pytest.mark.parametrize(("opset", "body"), [
    (11, "u = Unsqueeze<axes=[0]>(x) y = Squeeze<axes=[1]>(u)"),
    (17, "u = Unsqueeze(x, ax) y = Squeeze(u, bx)"),
])
def test_unsqueeze_squeeze_on_other_axes_stays(opset, body):
    model = parse(header(opset) + f"""
    g (float[1,3] x) => (float[1,3] y) <int64[1] ax = {{0}}, int64[1] bx = {{1}}> {{ {body} }}""")
    assert_kept(model, "Squeeze 'y'", "it squeezes axes [1] but the Unsqueeze inserted [0]")


def test_squeeze_without_axes_after_unsqueeze_of_a_size_one_dim_stays():
    model = parse(header() + """
    g (float[1,3] x) => (float[3] y) <int64[1] ax = {0}> {
        u = Unsqueeze(x, ax)
        y = Squeeze(u)
    }""")
    assert_kept(model, "Squeeze 'y'",
                "the Squeeze has no axes and may remove size-1 dimensions of x too")


@pytest.mark.parametrize(("opset", "body"), [
    (11, "s = Squeeze<axes=[0, -1]>(x) u = Unsqueeze<axes=[2, 0]>(s)"),
    (17, "s = Squeeze(x, ax) u = Unsqueeze(s, ax)"),
    (17, "s = Squeeze(x) u = Unsqueeze(s, bx)"),
])
def test_squeeze_unsqueeze_pair_goes(opset, body):
    # paddle2onnx: a one-element shape entry squeezed to a scalar, then unsqueezed back
    model = parse(header(opset) + f"""
    g (float[1,3,1] x) => (float[1,3,1] y) <int64[2] ax = {{0, -1}}, int64[2] bx = {{0, 2}}> {{
        {body}
        y = Neg(u)
    }}""")
    assert_removes(model, ["Neg"], {"removed Squeeze-Unsqueeze pairs": 1})


def test_squeeze_read_elsewhere_stays_and_the_unsqueeze_goes():
    model = parse(header() + """
    g (float[1,3] x) => (float[1,3] y, float[3] z) <int64[1] ax = {0}> {
        s = Squeeze(x, ax)
        u = Unsqueeze(s, ax)
        y = Neg(u)
        z = Abs(s)
    }""")
    assert_removes(model, ["Squeeze", "Neg", "Abs"], {"removed Squeeze-Unsqueeze pairs": 1})


def test_squeeze_unsqueeze_on_other_axes_stays():
    model = parse(header() + """
    g (float[1,3,1] x) => (float[3,1,1] y) <int64[1] ax = {0}, int64[1] bx = {2}> {
        s = Squeeze(x, ax)
        y = Unsqueeze(s, bx)
    }""")
    assert_kept(model, "Unsqueeze 'y'", "it inserts axes [2], the Squeeze before it removed [0]")


def test_unsqueeze_after_squeeze_without_axes_of_unknown_dims_stays():
    model = parse(header() + """
    g (float[1,N] x) => (float[1,N] y) <int64[1] ax = {0}> {
        s = Squeeze(x)
        y = Unsqueeze(s, ax)
    }""")
    assert_kept(model, "Unsqueeze 'y'",
                "the Squeeze before it has no axes and x's dims are not all known")


# ----------------------------------------------------------------------------- Concat, Slice, Pad


def test_single_input_concat_goes():
    model = parse(header() + """
    g (float[2,3] x) => (float[2,3] y) { c = Concat<axis=1>(x) y = Neg(c) }""")
    assert_removes(model, ["Neg"], {"removed single-input Concat": 1})


def _with_empty(body: str) -> onnx.ModelProto:
    """YOLOv8's NMS export: the mask-coefficient part of each box row is a slice
    84:84, empty, concatenated with the box, score and class."""
    return onnx.shape_inference.infer_shapes(parse(header() + f"""
    g (float[N,6] x) => (float[N,K] y)
      <int64[1] s84 = {{4}}, int64[1] one = {{1}}, float[0] none = {{}}> {{
        e = Slice(x, s84, s84, one)
        {body}
        y = Neg(c)
    }}"""), strict_mode=True)


def test_empty_concat_inputs_go():
    model = _with_empty("b = Relu(x) c = Concat<axis=1>(x, e, b)")
    x = np.random.default_rng(0).standard_normal((3, 6), np.float32)
    out = assert_removes(model, ["Relu", "Concat", "Neg"],
                         {"dropped empty Concat inputs": 1}, [{"x": x}])
    assert list(out.graph.node[1].input) == ["x", "b"]


@pytest.mark.parametrize("body", [
    "c = Concat<axis=-1>(x, e)",
    "c = Concat<axis=1>(e, x)",
])
def test_a_concat_with_one_non_empty_input_goes(body):
    x = np.random.default_rng(0).standard_normal((3, 6), np.float32)
    assert_removes(_with_empty(body), ["Neg"],
                   {"removed Concat whose other inputs are empty": 1}, [{"x": x}])


def test_an_empty_constant_concatenated_to_a_shape_goes():
    model = parse(header() + """
    g (float[N,6] x) => (float[2] y) <int64[0] none = {}> {
        s = Shape(x)
        c = Concat<axis=0>(s, none)
        y = Cast<to=1>(c)
    }""")
    assert_removes(model, ["Shape", "Cast"],
                   {"removed Concat whose other inputs are empty": 1})


def test_a_concat_of_only_empty_inputs_is_not_a_candidate():
    model = _with_empty("c = Concat<axis=1>(e, e)")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert [n.op for n in graph.nodes] == ["Slice", "Concat", "Neg"]


@pytest.mark.parametrize("bounds", [
    f"st = {{0}}, en = {{{INT64_MAX}}}, ax = {{1}}",
    "st = {-3}, en = {100}, ax = {1}",
    "st = {0}, en = {3}, ax = {-1}",
])
def test_slice_of_the_whole_tensor_goes(bounds):
    model = parse(header() + f"""
    g (float[2,3] x) => (float[2,3] y) <int64[1] {bounds.replace(", ", ", int64[1] ")}> {{
        s = Slice(x, st, en, ax)
        y = Neg(s)
    }}""")
    assert_removes(model, ["Neg"], {"removed Slice of the whole tensor": 1})


def test_slice_with_attributes_before_opset_10_goes():
    model = parse(header(9) + """
    g (float[2,3] x) => (float[2,3] y) {
        s = Slice<starts=[0, 0], ends=[2, 9]>(x)
        y = Neg(s)
    }""")
    assert_removes(model, ["Neg"], {"removed Slice of the whole tensor": 1})


@pytest.mark.parametrize(("bounds", "reason"), [
    ("st = {1}, en = {9}, ax = {1}, sp = {1}", "it keeps [1, 3) of 3 on axis 1"),
    ("st = {0}, en = {9}, ax = {1}, sp = {2}", "it steps by 2 on axis 1"),
    ("st = {0}, en = {9}, ax = {0}, sp = {1}",
     "shape unknown: the size of sliced axis 0 is not static"),
])
def test_slice_that_slices_stays(bounds, reason):
    model = parse(header() + f"""
    g (float[N,3] x) => (float[N,M] y) <int64[1] {bounds.replace(", ", ", int64[1] ")}> {{
        y = Slice(x, st, en, ax, sp)
    }}""")
    assert_kept(model, "Slice 'y'", reason)


def _two_slices(second_axis: str = "-1", x: str = "float[N,5,6] x") -> onnx.ModelProto:
    """`x[:, 1:4, ::-2]` as TorchScript writes it: one Slice per axis."""
    return parse(header() + f"""
    g ({x}) => (float[?,?,?] y)
      <int64[1] s1 = {{1}}, int64[1] e1 = {{4}}, int64[1] a1 = {{1}}, int64[1] p1 = {{1}},
       int64[1] s2 = {{-1}}, int64[1] e2 = {{{-INT64_MAX}}}, int64[1] a2 = {{{second_axis}}},
       int64[1] p2 = {{-2}}> {{
        a = Slice(x, s1, e1, a1, p1)
        y = Slice(a, s2, e2, a2, p2)
    }}""")


def _unranked(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.input[0].type.tensor_type.ClearField("shape")
    return model


def test_slices_on_different_axes_merge_into_one():
    model = _two_slices()
    out = assert_removes(model, ["Slice"], {"merged Slices on different axes into one": 1},
                         [feeds_for(model, x=(2, 5, 6)), feeds_for(model, x=(1, 5, 6))])
    inits = {t.name: numpy_helper.to_array(t).tolist() for t in out.graph.initializer}
    assert [inits[i] for i in out.graph.node[0].input[1:]] == [
        [1, -1], [4, -INT64_MAX], [1, 2], [1, -2]]


@pytest.mark.parametrize(("model", "reason"), [
    (_two_slices(second_axis="1"), "it slices axes [1] the Slice before it slices too"),
    (_two_slices(second_axis="-2"), "it slices axes [1] the Slice before it slices too"),
    (_unranked(_two_slices()),
     "rank unknown: the Slices have negative axes and their input rank is unknown"),
])
def test_slices_that_do_not_merge_stay(model, reason):
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert [n.op for n in graph.nodes] == ["Slice", "Slice"] and not result.changed
    notes = [n.reason for n in result.notes if n.subject == "Slice 'y'"]
    assert len(notes) == 1 and notes[0].endswith(reason), notes


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_all_zero_pad_goes_in_any_mode(mode):
    model = parse(header() + f"""
    g (float[1,2,3,3] x) => (float[1,2,3,3] y) <int64[8] p = {{0, 0, 0, 0, 0, 0, 0, 0}}> {{
        a = Pad<mode="{mode}">(x, p)
        y = Neg(a)
    }}""")
    assert_removes(model, ["Neg"], {"removed all-zero Pad": 1})


def test_all_zero_pad_attribute_before_opset_11_goes():
    model = parse(header(10) + """
    g (float[2,3] x) => (float[2,3] y) { a = Pad<pads=[0, 0, 0, 0]>(x) y = Neg(a) }""")
    assert_removes(model, ["Neg"], {"removed all-zero Pad": 1})


def test_pad_with_non_zero_pads_stays():
    model = parse(header() + """
    g (float[2,3] x) => (float[2,5] y) <int64[4] p = {0, 1, 0, 1}> { y = Pad(x, p) }""")
    assert_kept(model, "Pad 'y'", "it pads by (0, 1, 0, 1)")


def test_pad_with_computed_pads_stays():
    model = parse(header() + """
    g (float[2,3] x, int64[4] p) => (float[M,N] y) { y = Pad(x, p) }""")
    assert_kept(model, "Pad 'y'", "its pads input is not a constant")


# ----------------------------------------------------------------------------- other skips


@pytest.mark.parametrize(("opset", "graph", "node", "reason"), [
    (6, "g (float[3] x) => (float[3] y) { d = Dropout(x) y = Neg(d) }",
     "Dropout 'd'", "it is in training mode (is_test=0, the default before opset 7)"),
    (17, "g (float[3] x) => (float[3] y) <float[3] c = {1.0, 2.0, 3.0}> { y = Identity(c) }",
     "Identity 'y'", "it computes nothing but cannot be removed: "
     "its input is a constant or is not produced by a node of this graph"),
    (17, "g (float[3,4] x, float[2,6] z) => (float[2,6] y) <float[3,4] a> "
     "{ s = Shape(z) a = Relu(x) y = Reshape(a, s) }",
     "Reshape 'y'", "its output shape (2, 6) differs from its input shape (3, 4)"),
    (17, "g (float[2,3,4] x, int64[2] s2) => (float[4,6] y) <int64[2] s1 = {6, 4}, float[6,4] a> "
     "{ a = Reshape(x, s1) y = Reshape(a, s2) }",
     "Reshape 'y'", "its output shape (4, 6) differs from its input shape (6, 4); "
     "its target shape is not a constant"),
    (17, "g (float[2,3,4] x) => (float[4,6] y, float[6,4] a) "
     "<int64[2] s1 = {6, 4}, int64[2] s2 = {4, 6}> { a = Reshape(x, s1) y = Reshape(a, s2) }",
     "Reshape 'y'", "its target shape (4, 6) changes the input shape (6, 4); "
     "the Reshape before it writes a graph output"),
    (17, "g (float[2,3] x) => (float[3,2] y) { y = Transpose(x) }",
     "Transpose 'y'", "it reverses the axes"),
    (17, "g (float[2,3] x, int64[1] a) => (float[2,3] y) <int64[1] b = {0}> "
     "{ u = Unsqueeze(x, a) y = Squeeze(u, b) }",
     "Squeeze 'y'", "the Unsqueeze axes are not a constant"),
    (17, "g (float[2,3] x) => (float[2,3] y) <int64[1] a = {-1}, int64[1] b = {2}> "
     "{ r = Relu(x) u = Unsqueeze(r, a) y = Squeeze(u, b) }",
     "Squeeze 'y'", "rank unknown: the Unsqueeze has negative axes and its input rank is unknown"),
    (17, "g (float[2,3] x) => (float[2,3] y) <int64[1] a = {2}, int64[1] b = {-1}> "
     "{ r = Relu(x) u = Unsqueeze(r, a) y = Squeeze(u, b) }",
     "Squeeze 'y'", "rank unknown: the Squeeze has negative axes and its input rank is unknown"),
    (17, "g (float[2,3] x, int64[1] e) => (float[2,N] y) <int64[1] s = {0}> "
     "{ y = Slice(x, s, e) }",
     "Slice 'y'", "its ends input is not a constant"),
])
def test_other_candidates_stay_with_a_reason(opset, graph, node, reason):
    assert_kept(parse(header(opset) + graph), node, reason)


def test_pair_whose_first_node_is_in_the_enclosing_graph_stays():
    model = parse(header() + """
    g (bool c, float[2,3] x) => (float[2,3] y) {
        a = Transpose<perm=[1, 0]>(x)
        y = If(c) <
            then_branch = t () => (float[2,3] ty) { b = Transpose<perm=[1, 0]>(a) ty = Relu(b) },
            else_branch = e () => (float[2,3] ey) { ey = Neg(x) }
        >
    }""")
    assert_kept(model, "Transpose 'b'", "its permutation (1, 0) is not the identity; "
                "the Transpose before it is in an enclosing graph")


# ----------------------------------------------------------------------------- subgraphs, nothing


def test_recurses_into_if_branches():
    model = parse(header() + """
    g (bool c, float[2,3] x) => (float[2,3] y) {
        y = If(c) <
            then_branch = t () => (float[2,3] ty) {
                a = Transpose<perm=[1, 0]>(x)
                b = Transpose<perm=[1, 0]>(a)
                ty = Relu(b)
            },
            else_branch = e () => (float[2,3] ey) { i = Identity(x) ey = Neg(i) }
        >
    }""")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    out = assert_removes(model, ["If"], {"removed Transpose pairs that cancel": 1,
                                         "removed Identity": 1},
                         [{"c": np.array(flag), "x": x} for flag in (True, False)])
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Relu"], "else_branch": ["Neg"]}


def test_identity_writing_a_branch_output_from_the_outer_graph_stays():
    model = parse(header() + """
    g (bool c, float[2] x) => (float[2] y) {
        r = Relu(x)
        y = If(c) <
            then_branch = t () => (float[2] ty) { ty = Identity(r) },
            else_branch = e () => (float[2] ey) { ey = Neg(r) }
        >
    }""")
    assert_kept(model, "Identity 'ty'", "it computes nothing but cannot be removed: "
                "its input comes from an enclosing graph")


@pytest.mark.parametrize("opset", [11, 17])
def test_nothing_to_do_says_why(opset):
    model = parse(header(opset) + "g (float[3] x) => (float[3] y) { y = Relu(x) }")
    graph = to_graph(model)
    result = EliminateNoops().run(graph, PassContext())
    assert not result.changed
    assert [n.reason for n in result.notes] == [
        "no Identity, inference Dropout, Cast, Reshape, Expand, Transpose, Unsqueeze or "
        "Squeeze pair, Concat, Split, Slice, Pad, Add/Sub/Mul/Div of a constant or Where on "
        "a shape comparison"
    ]
    assert_idempotent(EliminateNoops(), model)
