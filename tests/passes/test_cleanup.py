import numpy as np
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse

from graphfix.passes.cleanup import Cleanup, CleanupOptions

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def test_removes_identity_dropout_and_dead_nodes():
    model = parse(HEADER + """
    g (float[2,4] x) => (float[2,4] y) <float[4] unused_w = {1.0, 2.0, 3.0, 4.0}> {
        a = Identity(x)
        b = Relu(a)
        c = Dropout(b)
        dead = Sigmoid(x)
        y = Abs(c)
    }""")
    out, result = apply(Cleanup(), model)
    assert ops(out) == ["Relu", "Abs"]
    assert [t.name for t in out.graph.initializer] == []
    assert result.changed
    assert result.counts["removed Identity"] == 1
    assert result.counts["removed Dropout"] == 1
    assert result.counts["removed dead nodes"] == 1
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(Cleanup(), out)


def test_identity_writing_a_graph_output_keeps_the_output_name():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) {
        r = Relu(x)
        y = Identity(r)
    }""")
    out, _ = apply(Cleanup(), model)
    assert ops(out) == ["Relu"]
    assert out.graph.node[0].output[0] == "y"
    assert [o.name for o in out.graph.output] == ["y"]
    assert_same_outputs(model, out, feeds_for(model))


def test_identity_that_also_feeds_other_nodes_before_a_graph_output():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y, float[3] z) {
        r = Relu(x)
        y = Identity(r)
        z = Neg(r)
    }""")
    out, _ = apply(Cleanup(), model)
    assert ops(out) == ["Relu", "Neg"]
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert_same_outputs(model, out, feeds_for(model))


def test_identity_from_input_to_output_stays_with_reason():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) {
        y = Identity(x)
    }""")
    out, result = apply(Cleanup(), model)
    assert ops(out) == ["Identity"]
    assert not result.changed
    assert any("graph input" in n.reason for n in result.notes)


def test_dropout_in_training_mode_stays():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) <bool t = {1}, float r = {0.5}> {
        y = Dropout(x, r, t)
    }""")
    out, result = apply(Cleanup(), model)
    assert ops(out) == ["Dropout"]
    assert any("training mode" in n.reason for n in result.notes)


def test_dropout_with_constant_false_training_mode_goes():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) <bool t = {0}, float r = {0.5}> {
        d = Dropout(x, r, t)
        y = Neg(d)
    }""")
    out, _ = apply(Cleanup(), model)
    assert ops(out) == ["Neg"]
    assert_same_outputs(model, out, feeds_for(model))


def test_dropout_whose_mask_is_used_stays():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y, bool[3] m) {
        y, m = Dropout(x)
    }""")
    out, result = apply(Cleanup(), model)
    assert ops(out) == ["Dropout"]
    assert any("output is used" in n.reason for n in result.notes)


def test_dropout_with_non_constant_training_mode_stays():
    model = parse(HEADER + """
    g (float[3] x, bool t) => (float[3] y) {
        y = Dropout(x, , t)
    }""")
    out, result = apply(Cleanup(), model)
    assert ops(out) == ["Dropout"]
    assert any("not a constant" in n.reason for n in result.notes)


def test_options_turn_identity_removal_off():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y) {
        a = Identity(x)
        y = Relu(a)
    }""")
    out, _ = apply(Cleanup(CleanupOptions(identity=False)), model)
    assert ops(out) == ["Identity", "Relu"]


def test_recurses_into_if_branches():
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) {
        y = If(c) <
            then_branch = t () => (float[3] ty) { a = Identity(x) ty = Relu(a) },
            else_branch = e () => (float[3] ey) { b = Identity(x) ey = Neg(b) }
        >
    }""")
    out, result = apply(Cleanup(), model)
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Relu"], "else_branch": ["Neg"]}
    assert result.counts["removed Identity"] == 2
    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x})


@pytest.mark.parametrize("opset", [11, 17])
def test_nothing_to_do_says_why(opset):
    model = parse(f'<ir_version: 8, opset_import: ["" : {opset}]>' + """
    g (float[3] x) => (float[3] y) { y = Relu(x) }""")
    assert_idempotent(Cleanup(), model)


def test_dropout_before_opset_7_is_training_unless_is_test():
    from onnx import TensorProto, helper

    def model(**attrs):
        g = helper.make_graph(
            [helper.make_node("Dropout", ["x"], ["d"], **attrs),
             helper.make_node("Neg", ["d"], ["y"])],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)

    out, result = apply(Cleanup(), model())
    assert ops(out) == ["Dropout", "Neg"]
    assert any("default before opset 7" in n.reason for n in result.notes)
    out, _ = apply(Cleanup(), model(is_test=1))
    assert ops(out) == ["Neg"]
