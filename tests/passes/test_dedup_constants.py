"""dedup-constants: exact ops and initializers after, onnxruntime numerics, checker,
idempotence, every skip reason, and no weight read when no duplicate is possible."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse
from onnx import TensorProto, helper, numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues

from graphfix.graph import fingerprint, to_graph, to_model
from graphfix.passes.base import PassContext
from graphfix.passes.dedup_constants import (
    SHARED_CONSTANT_NODES,
    SHARED_INITIALIZERS,
    DedupConstants,
    DedupConstantsOptions,
)

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
NOTHING = (
    "no two constants with at least 1 element(s) in the same graph "
    "have the same dtype, shape and bytes"
)


# ----------------------------------------------------------------------------- helpers


def _model(nodes, inputs, outputs, inits, sparse=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits, sparse_initializer=sparse)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    # Shape inference rejects a sparse initializer read by a standard op; check the rest.
    onnx.checker.check_model(model, full_check=not sparse)
    return model


def _value(name: str, shape, elem=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _two_adds(a: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    """y = (x + a) + b, with a and b initializers; x has a's shape."""
    elem = helper.np_dtype_to_tensor_dtype(a.dtype)
    nodes = [
        helper.make_node("Add", ["x", "a"], ["s"], name="add_a"),
        helper.make_node("Add", ["s", "b"], ["y"], name="add_b"),
    ]
    inits = [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")]
    shape = list(a.shape)
    return _model(nodes, [_value("x", shape, elem)], [_value("y", shape, elem)], inits)


def _initializers(model: onnx.ModelProto) -> list[str]:
    return [t.name for t in model.graph.initializer]


def _node_inputs(model: onnx.ModelProto) -> list[list[str]]:
    return [list(n.input) for n in model.graph.node]


def _inputs_by_output(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Each node's inputs keyed by its first output (toposort may reorder nodes)."""
    return {n.output[0]: list(n.input) for n in model.graph.node}


def _assert_unchanged(model: onnx.ModelProto, *reasons: str, options=None) -> None:
    """The pass leaves the graph as it was (fingerprint) and gives exactly these notes."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result = DedupConstants(options).run(graph, PassContext())
    assert not result.changed
    assert dict(result.counts) == {}
    assert fingerprint(graph) == before
    assert [n.reason for n in result.notes] == list(reasons)


def _branch(model: onnx.ModelProto, name: str) -> onnx.GraphProto:
    return next(a.g for n in model.graph.node for a in n.attribute if a.name == name)


# ----------------------------------------------------------------------------- initializers


def test_identical_initializers_are_shared():
    w = np.random.default_rng(0).standard_normal([2, 3]).astype(np.float32)
    model = _two_adds(w, w.copy())
    out, result = apply(DedupConstants(), model)
    assert result.changed
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert result.notes == []
    assert ops(out) == ["Add", "Add"]
    assert _initializers(out) == ["a"]
    assert _node_inputs(out) == [["x", "a"], ["s", "a"]]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_fp16_duplicates_stay_fp16_and_first_in_node_order_wins():
    w = np.random.default_rng(1).standard_normal([4]).astype(np.float16)
    model = _two_adds(w, w.copy())
    # Read b first: it must be the one kept.
    model.graph.node[0].input[1], model.graph.node[1].input[1] = "b", "a"
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert _initializers(out) == ["b"]
    assert out.graph.initializer[0].data_type == TensorProto.FLOAT16
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_one_node_reading_two_duplicates_reads_one():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) <float[3] a = {1.0, 2.0, 3.0}, float[3] b = {1.0, 2.0, 3.0}> {
        s = Mul(a, b)
        y = Add(x, s)
    }""")
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert ops(out) == ["Mul", "Add"]
    assert _node_inputs(out)[0] == ["a", "a"]
    assert _initializers(out) == ["a"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_same_values_in_another_dtype_are_not_shared():
    inits = [numpy_helper.from_array(np.array([1.0, 2.0], dtype), name)
             for dtype, name in ((np.float32, "a"), (np.float16, "b"))]
    nodes = [
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "a"], ["s"]),
        helper.make_node("Add", ["s", "c"], ["y"]),
    ]
    _assert_unchanged(_model(nodes, [_value("x", [2])], [_value("y", [2])], inits), NOTHING)


def test_same_bytes_in_another_shape_are_not_shared():
    model = parse(HEADER + """
    g (float[2,2] x) => (float[2,2] y) <float[4] a = {1.0, 2.0, 3.0, 4.0},
                                        float[2,2] b = {1.0, 2.0, 3.0, 4.0},
                                        int64[2] shape = {2, 2}> {
        r = Reshape(a, shape)
        s = Add(x, r)
        y = Add(s, b)
    }""")
    _assert_unchanged(model, NOTHING)


def test_zero_and_negative_zero_are_not_shared():
    a = np.array([1.0, 0.0], np.float32)
    b = np.array([1.0, -0.0], np.float32)
    assert np.array_equal(a, b)  # numerically equal, bitwise different
    _assert_unchanged(_two_adds(a, b), NOTHING)


def _nan(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


def test_nan_arrays_with_identical_bits_are_shared():
    a = np.array([1.0, _nan(0x7FC00001), 2.0], np.float32)
    model = _two_adds(a, a.copy())
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert _initializers(out) == ["a"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_nan_arrays_with_other_payload_bits_are_not_shared():
    a = np.array([1.0, _nan(0x7FC00001)], np.float32)
    b = np.array([1.0, _nan(0x7FC00002)], np.float32)
    _assert_unchanged(_two_adds(a, b), NOTHING)


def test_bfloat16_duplicates_are_shared():
    value = helper.make_tensor("a", TensorProto.BFLOAT16, [3], [1.0, -2.5, 3.0])
    twin = helper.make_tensor("b", TensorProto.BFLOAT16, [3], [1.0, -2.5, 3.0])
    other = helper.make_tensor("c", TensorProto.BFLOAT16, [3], [1.0, -2.5, 4.0])
    nodes = [
        helper.make_node("Cast", ["a"], ["fa"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["b"], ["fb"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["c"], ["fc"], to=TensorProto.FLOAT),
        helper.make_node("Sum", ["x", "fa", "fb", "fc"], ["y"]),
    ]
    model = _model(nodes, [_value("x", [3])], [_value("y", [3])], [value, twin, other])
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert ops(out) == ["Cast", "Cast", "Cast", "Sum"]
    assert sorted(_initializers(out)) == ["a", "c"]
    assert [t.data_type for t in out.graph.initializer] == [TensorProto.BFLOAT16] * 2
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_initializer_that_is_a_graph_output_keeps_its_name():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y, float[2] a) <float[2] a = {1.0, 2.0}, float[2] b = {1.0, 2.0}> {
        s = Add(x, a)
        y = Mul(s, b)
    }""")
    _assert_unchanged(model, "it is a graph output, so it keeps its own name", NOTHING)
    out, _ = apply(DedupConstants(), model)
    assert [o.name for o in out.graph.output] == ["y", "a"]
    assert sorted(_initializers(out)) == ["a", "b"]


def test_min_elements_leaves_small_constants_alone():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) <float a = {2.0}, float b = {2.0}> {
        s = Mul(x, a)
        y = Mul(s, b)
    }""")
    reason = NOTHING.replace("at least 1 element(s)", "at least 2 element(s)")
    _assert_unchanged(model, reason, options=DedupConstantsOptions(min_elements=2))
    out, result = apply(DedupConstants(), model)  # the default shares scalars
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert _initializers(out) == ["a"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)


def test_min_elements_parses_from_pipeline_text():
    options = DedupConstants.parse_options([("min-elements", "16")])
    assert options == DedupConstantsOptions(min_elements=16)


def test_string_initializers_are_skipped_with_a_reason():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y, string[2] t) <string[2] s = {"a", "b"}> {
        y = Relu(x)
        t = Identity(s)
    }""")
    _assert_unchanged(model, "it holds strings, which this pass does not compare", NOTHING)


def test_sparse_initializers_are_skipped_with_a_reason():
    values = helper.make_tensor("sp_values", TensorProto.FLOAT, [1], [5.0])
    indices = helper.make_tensor("sp_indices", TensorProto.INT64, [1], [2])
    sparse = helper.make_sparse_tensor(values, indices, [4])
    nodes = [helper.make_node("Add", ["x", "sp_values"], ["y"], name="add")]
    model = _model(nodes, [_value("x", [4])], [_value("y", [4])], [], sparse=[sparse])
    _assert_unchanged(
        model, "it is a sparse initializer, which this pass does not compare", NOTHING
    )


# ----------------------------------------------------------------------------- Constant nodes


def test_identical_constant_nodes_are_shared_in_every_form():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y, int64[2] z) {
        k1 = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
        k2 = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
        f1 = Constant <value_float = 2.0> ()
        f2 = Constant <value = float {2.0}> ()
        i1 = Constant <value_ints = [4, 5]> ()
        i2 = Constant <value = int64[2] {4, 5}> ()
        a = Add(x, k1)
        b = Mul(a, k2)
        c = Mul(b, f1)
        y = Div(c, f2)
        z = Add(i1, i2)
    }""")
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_CONSTANT_NODES: 3}
    assert result.notes == []
    assert ops(out) == ["Constant"] * 3 + ["Add", "Add", "Mul", "Mul", "Div"]
    assert _inputs_by_output(out) == {
        "k1": [], "f1": [], "i1": [],
        "a": ["x", "k1"], "b": ["a", "k1"], "c": ["b", "f1"], "y": ["c", "f1"], "z": ["i1", "i1"],
    }
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_constant_nodes_and_initializers_are_pooled_separately():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
        k = Constant <value = float[2] {1.0, 2.0}> ()
        s = Add(x, w)
        y = Add(s, k)
    }""")
    _assert_unchanged(model, NOTHING)


def test_constant_node_writing_a_graph_output_keeps_it():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y, float[2] k2) {
        k1 = Constant <value = float[2] {1.0, 2.0}> ()
        k2 = Constant <value = float[2] {1.0, 2.0}> ()
        s = Add(x, k1)
        y = Add(s, k2)
    }""")
    _assert_unchanged(model, "its output is a graph output, so it keeps it", NOTHING)


def test_string_constant_nodes_are_skipped_with_a_reason():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y, string t) {
        s = Constant <value_string = "a"> ()
        y = Relu(x)
        t = Identity(s)
    }""")
    _assert_unchanged(
        model, "its value is sparse or holds strings, which this pass does not compare", NOTHING
    )


# ----------------------------------------------------------------------------- subgraphs


IF_MODEL = HEADER + """
g (bool c, float[3] x) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> {
    y = If(c) <
        then_branch = t () => (float[3] ty) <float[3] p = {4.0, 5.0, 6.0},
                                             float[3] q = {4.0, 5.0, 6.0},
                                             float[3] r = {1.0, 2.0, 3.0}> {
            a = Add(x, p)
            b = Mul(a, q)
            d = Sub(b, w)
            ty = Div(d, r)
        },
        else_branch = e () => (float[3] ey) {
            k1 = Constant <value = float[3] {7.0, 8.0, 9.0}> ()
            k2 = Constant <value = float[3] {7.0, 8.0, 9.0}> ()
            m = Add(x, k1)
            ey = Mul(m, k2)
        }
    >
}"""


def test_duplicates_inside_if_branches_are_shared():
    model = parse(IF_MODEL)
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 2, SHARED_CONSTANT_NODES: 1}
    assert result.notes == []
    then, other = _branch(out, "then_branch"), _branch(out, "else_branch")
    assert [n.op_type for n in then.node] == ["Add", "Mul", "Sub", "Div"]
    # q reads p; r reads the outer w, which is in scope (gs exports it into the branch).
    assert [list(n.input) for n in then.node] == [["x", "p"], ["a", "p"], ["b", "w"], ["d", "w"]]
    assert sorted(t.name for t in then.initializer) == ["p", "w"]
    assert [n.op_type for n in other.node] == ["Constant", "Add", "Mul"]
    assert [list(n.input) for n in other.node[1:]] == [["x", "k1"], ["m", "k1"]]
    x = np.random.default_rng(2).standard_normal(3).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x}, rtol=0, atol=0)
    assert_idempotent(DedupConstants(), out)


def test_constants_in_sibling_branches_are_not_shared():
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) {
        y = If(c) <
            then_branch = t () => (float[3] ty) <float[3] p = {4.0, 5.0, 6.0}> {
                ty = Add(x, p)
            },
            else_branch = e () => (float[3] ey) <float[3] q = {4.0, 5.0, 6.0}> {
                ey = Mul(x, q)
            }
        >
    }""")
    _assert_unchanged(model, NOTHING)


# ----------------------------------------------------------------------------- cost


def _unique_weights_model(count: int, duplicate: bool = False) -> onnx.ModelProto:
    """A MatMul chain whose weights all differ in shape ([64+i, 65+i]), plus, with
    `duplicate`, two identical [8] biases and a third [8] bias that differs."""
    rng = np.random.default_rng(3)
    nodes, inits, prev = [], [], "x"
    for i in range(count):
        w = rng.standard_normal([64 + i, 65 + i]).astype(np.float32) * 0.1
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(helper.make_node("ReduceSum", [prev], ["y"], keepdims=0))
    outputs = [_value("y", [])]
    if duplicate:
        bias = rng.standard_normal([8]).astype(np.float32)
        inits += [numpy_helper.from_array(b, n)
                  for b, n in ((bias, "b0"), (bias.copy(), "b1"), (bias + 1, "b2"))]
        nodes += [helper.make_node("Sum", ["z", "b0", "b1", "b2"], ["v"])]
        outputs.append(_value("v", [8]))
    inputs = [_value("x", [2, 64])] + ([_value("z", [8])] if duplicate else [])
    return _model(nodes, inputs, outputs, inits)


@pytest.fixture
def loads(monkeypatch):
    """Names of the lazily loaded weights read during the test (by gs, or directly:
    `weights.inline_array`)."""
    from graphfix import weights

    names: list[str] = []
    original, inline = LazyValues.load, weights.inline_array

    def counting(self):
        names.append(self.tensor.name)
        return original(self)

    def counting_inline(tensor):
        values = inline(tensor)
        if values is not None:
            names.append(tensor.name)
        return values

    monkeypatch.setattr(LazyValues, "load", counting)
    monkeypatch.setattr(weights, "inline_array", counting_inline)
    return names


def test_no_weight_is_read_when_every_dtype_and_shape_is_unique(loads):
    model = _unique_weights_model(40)
    graph = to_graph(model)
    before = fingerprint(graph)
    result = DedupConstants().run(graph, PassContext())
    assert loads == []
    assert not result.changed
    assert fingerprint(graph) == before
    assert [n.reason for n in result.notes] == [NOTHING]


def test_only_groups_that_can_hold_duplicates_are_read(loads):
    model = _unique_weights_model(10, duplicate=True)
    out, result = apply(DedupConstants(), model)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    # b0 is read twice: once to hash, once (held) to confirm b1 byte for byte; b2's
    # sampled bytes differ from theirs, so it is never read whole.
    assert sorted(loads) == ["b0", "b0", "b1"]
    assert sorted(ops(out)) == ["MatMul"] * 10 + ["ReduceSum", "Sum"]
    assert _inputs_by_output(out)["v"] == ["z", "b0", "b0", "b2"]
    assert_same_outputs(model, out, feeds_for(model))


def test_nothing_to_do_says_why():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) { y = Relu(x) }""")
    assert_idempotent(DedupConstants(), model)
    _assert_unchanged(model, NOTHING)


def test_weights_left_in_their_file_are_compared_in_full_where_samples_agree(tmp_path):
    """Deferred weights (io.load(weights=False)) are first split by a few sampled windows;
    equal samples still need equal bytes: `c` differs from `a` only outside the windows."""
    from graphfix import io, weights

    a = np.random.default_rng(0).standard_normal(64 * 1024).astype(np.float32)
    c = a.copy()
    c[len(c) // 4] += 1.0  # not in the start, middle or end window
    nodes = [helper.make_node("Add", ["x", "a"], ["s1"], name="add_a"),
             helper.make_node("Add", ["s1", "b"], ["s2"], name="add_b"),
             helper.make_node("Add", ["s2", "c"], ["y"], name="add_c")]
    inits = [numpy_helper.from_array(v, n) for n, v in (("a", a), ("b", a.copy()), ("c", c))]
    shape = list(a.shape)
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_value("x", shape)], [_value("y", shape)], inits), path)
    lazy = io.load(path, weights=False)
    assert len(weights.deferred(lazy)) == 3
    by_name = {t.name: t for t in lazy.graph.initializer}
    assert weights.read_sample(by_name["a"]) == weights.read_sample(by_name["c"])
    graph = to_graph(lazy)
    result = DedupConstants().run(graph, PassContext())
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    out = weights.materialized(to_model(graph, lazy))
    onnx.checker.check_model(out, full_check=True)
    assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
    assert _node_inputs(out) == [["x", "a"], ["s1", "a"], ["s2", "c"]]
    assert_same_outputs(io.load(path), out, feeds_for(out), rtol=0, atol=0)


def test_a_sample_is_the_same_bytes_from_a_file_a_proto_and_an_array(tmp_path):
    """`weights.sample` reads the same windows of the raw bytes whichever form holds the
    weight, so deferred, inline and in-memory weights are split by sample together."""
    from graphfix import io, weights

    value = np.random.default_rng(1).standard_normal([300, 70]).astype(np.float16)
    proto = numpy_helper.from_array(value, "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_value("x", [300, 70], TensorProto.FLOAT16)],
                     [_value("y", [300, 70], TensorProto.FLOAT16)], [proto]), path)
    deferred = io.load(path, weights=False).graph.initializer[0]
    assert weights.is_deferred(deferred)
    whole = value.tobytes()
    expected = whole[:4096] + whole[(len(whole) - 4096) // 2:][:4096] + whole[-4096:]
    assert weights.sample(deferred) == weights.sample(proto) == expected
    assert weights.sample(value) == expected
    assert weights.sample(np.asfortranarray(value)) == expected  # C order, as exported
    assert weights.sample(value.astype(">f2")) == expected  # little-endian, as exported
    assert weights.sample(np.array(["a"])) is None
    assert weights.sample(numpy_helper.from_array(np.array(["a"]), "s")) is None
    typed = helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0])  # float_data
    assert weights.sample(typed) is None


def _adds_of(values: list[np.ndarray]) -> gs.Graph:
    """x -> Add -> Add -> ... -> y, one Add per value, the i-th adding constant k<i>."""
    names = [f"t{i}" for i in range(len(values) - 1)] + ["y"]
    lines = "\n".join(f"        {out} = Add({src}, {src})"
                      for src, out in zip(["x", *names[:-1]], names, strict=True))
    graph = to_graph(parse(HEADER + f"""
    g (float[64,64] x) => (float[64,64] y) {{
{lines}
    }}"""))
    for i, (node, value) in enumerate(zip(graph.nodes, values, strict=True)):
        node.inputs[1] = gs.Constant(f"k{i}", value)
    return graph


def test_weights_a_pass_made_are_split_by_sample_before_any_is_read_whole(loads):
    """fold-bn leaves new weights as arrays or as their inline protos (`settle_constants`);
    many of one dtype and shape are split by sampled windows, so only equal-looking ones
    are read: k0, k1 and k4 (k0 again, to confirm k1 byte for byte), never k2 or k3."""
    from graphfix.graph.convert import settle_constants

    rng = np.random.default_rng(2)
    base = rng.standard_normal([64, 64]).astype(np.float32)
    graph = _adds_of([base, base.copy(), rng.standard_normal([64, 64]).astype(np.float32),
                      rng.standard_normal([64, 64]).astype(np.float32), base.copy()])
    settle_constants(graph)  # k0..k4 become lazy over their protos (>= 1025 elements)
    result = DedupConstants().run(graph, PassContext())
    assert dict(result.counts) == {SHARED_INITIALIZERS: 2}
    assert sorted(loads) == ["k0", "k0", "k1", "k4"]
    assert [n.inputs[1].name for n in graph.nodes] == ["k0", "k0", "k2", "k3", "k0"]


def test_spilled_weights_carry_their_samples_so_none_is_read_back_for_one(monkeypatch):
    """A weight spilled as a pass made it (`graph.convert.spilled`) keeps the sample taken
    from its array, the same bytes as its file's windows: splitting by sample reads no
    file, and only equal-looking weights are read whole."""
    from graphfix import weights
    from graphfix.graph.convert import settle_constants
    from graphfix.spill import Spill

    rng = np.random.default_rng(4)
    base = rng.standard_normal([64, 64]).astype(np.float32)
    graph = _adds_of([base, rng.standard_normal([64, 64]).astype(np.float32), base.copy()])
    sampled, loads = [], []
    read_sample, to_array = weights.read_sample, weights.to_array
    monkeypatch.setattr(weights, "read_sample",
                        lambda t, *a: sampled.append(t.name) or read_sample(t, *a))
    monkeypatch.setattr(weights, "to_array", lambda t: loads.append(t.name) or to_array(t))
    with Spill() as spill:
        settle_constants(graph, spill)
        for node in graph.nodes:
            lazy = node.inputs[1]._values
            assert weights.is_deferred(lazy.tensor)
            assert lazy.sample == read_sample(lazy.tensor)
        sampled.clear()
        result = DedupConstants().run(graph, PassContext())
        assert sampled == []
        assert dict(result.counts) == {SHARED_INITIALIZERS: 1}
        assert sorted(loads) == ["k0", "k0", "k2"]
        assert [n.inputs[1].name for n in graph.nodes] == ["k0", "k1", "k0"]


def test_a_file_sample_is_the_same_without_pread(tmp_path, monkeypatch):
    from graphfix import io, weights

    value = np.random.default_rng(3).standard_normal([100, 70]).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    path = tmp_path / "m.onnx"
    onnx.save(_model(nodes, [_value("x", [100, 70])], [_value("y", [100, 70])],
                     [numpy_helper.from_array(value, "w")]), path)
    deferred = io.load(path, weights=False).graph.initializer[0]
    with_pread = weights.read_sample(deferred)
    monkeypatch.delattr(os, "pread")
    assert weights.read_sample(deferred) == with_pread == weights.sample(value)
