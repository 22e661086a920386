import numpy as np
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse

from graphfix.passes.merge_duplicates import MergeDuplicates

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def test_repeated_chain_is_computed_once():
    model = parse(HEADER + """
    g (float[2,8] x) => (float[2,8] y) <float t = {0.5}> {
        g1 = Greater(x, t)
        g2 = Greater(x, t)
        c1 = Cast <to = 1> (g1)
        c2 = Cast <to = 1> (g2)
        y = Add(c1, c2)
    }""")
    out, result = apply(MergeDuplicates(), model)
    assert ops(out) == ["Greater", "Cast", "Add"]
    assert result.counts["merged duplicate nodes"] == 2
    assert list(out.graph.node[2].input) == ["c1", "c1"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(MergeDuplicates(), out)


def test_different_attributes_or_inputs_stay():
    model = parse(HEADER + """
    g (float[2,8] x, float[2,8] z) => (float[2,8] y) {
        a = Cast <to = 1> (x)
        b = LeakyRelu <alpha = 0.1> (x)
        c = LeakyRelu <alpha = 0.2> (x)
        d = LeakyRelu <alpha = 0.1> (z)
        s = Sum(a, b, c, d)
        y = Identity(s)
    }""")
    out, result = apply(MergeDuplicates(), model)
    assert not result.changed
    assert ops(out) == ops(model)
    assert result.notes[0].reason == "no two nodes compute the same op on the same inputs"


def test_random_ops_are_never_merged():
    model = parse(HEADER + """
    g (float[2,8] x) => (float[2,8] y) {
        r1 = RandomUniformLike <seed = 1.0> (x)
        r2 = RandomUniformLike <seed = 1.0> (x)
        y = Add(r1, r2)
    }""")
    out, result = apply(MergeDuplicates(), model)
    assert ops(out) == ["RandomUniformLike", "RandomUniformLike", "Add"]
    assert not result.changed


def test_duplicate_writing_a_graph_output_stays_with_reason():
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y, float[3] z) {
        y = Relu(x)
        z = Relu(x)
    }""")
    out, result = apply(MergeDuplicates(), model)
    assert ops(out) == ["Relu", "Relu"]
    assert "writes a graph output" in result.notes[0].reason


def test_inside_if_branches():
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) {
        y = If(c) <
            then_branch = t () => (float[3] ty) { a = Neg(x) b = Neg(x) ty = Mul(a, b) },
            else_branch = e () => (float[3] ey) { ey = Relu(x) }
        >
    }""")
    out, result = apply(MergeDuplicates(), model)
    then = [a for a in out.graph.node[0].attribute if a.name == "then_branch"][0]
    assert [n.op_type for n in then.g.node] == ["Neg", "Mul"]
    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x}, rtol=0, atol=0)


def test_constants_equal_in_value_but_not_rank_stay_apart():
    # silero_vad: Constant {1} as a scalar and as [1] feed Gathers whose outputs differ in
    # rank; merging them left a graph whose shape inference fails
    model = parse(HEADER + """
    g (float[4,3] x) => (float[3] y, float[1,3] z) {
        i0 = Constant <value = int64 {1}> ()
        i1 = Constant <value = int64[1] {1}> ()
        y = Gather <axis = 0> (x, i0)
        z = Gather <axis = 0> (x, i1)
    }""")
    out, result = apply(MergeDuplicates(), model)
    assert not result.changed
    assert ops(out) == ["Constant", "Constant", "Gather", "Gather"]
