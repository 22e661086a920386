import numpy as np
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse

from graphfix.passes.fold_constants import FoldConstants, FoldConstantsOptions

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def test_folds_constant_subexpression_and_static_shape():
    model = parse(HEADER + """
    g (float[2,3,4] x) => (float[2,12] y) <int64[1] a = {2}, int64[1] b = {12}> {
        shape = Concat <axis = 0> (a, b)
        zero = Constant <value = int64 {0}> ()
        s = Shape(x)
        n = Gather <axis = 0> (s, zero)
        y = Reshape(x, shape)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Reshape"]
    assert result.changed and result.counts["folded nodes into constants"] >= 1
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_size_threshold_keeps_large_results_unfolded():
    model = parse(HEADER + """
    g (float[256,256] x) => (float[256,256] y) <float[1] one = {1.0}, int64[2] s = {256, 256}> {
        big = Expand(one, s)
        y = Add(x, big)
    }""")
    out, result = apply(FoldConstants(FoldConstantsOptions(size_threshold=1024)), model)
    assert ops(out) == ["Expand", "Add"]
    assert not result.changed
    assert result.notes
    out, _ = apply(FoldConstants(), model)
    assert ops(out) == ["Add"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)


def test_folds_inside_if_branches():
    model = parse(HEADER + """
    g (bool c, float[3] x) => (float[3] y) <float[3] k = {1.0, 2.0, 3.0}> {
        y = If(c) <
            then_branch = t () => (float[3] ty) { n = Neg(k) ty = Add(x, n) },
            else_branch = e () => (float[3] ey) { ey = Mul(x, k) }
        >
    }""")
    out, result = apply(FoldConstants(), model)
    then = [a for a in out.graph.node[0].attribute if a.name == "then_branch"][0]
    assert [n.op_type for n in then.g.node] == ["Add"]
    x = np.random.default_rng(1).standard_normal(3).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x}, rtol=0, atol=0)


def test_shape_of_an_intermediate_without_value_info_is_folded():
    model = parse(HEADER + """
    g (float[2,3,4] x) => (float[2,12] y) {
        r = Relu(x)
        s = Shape(r)
        zero = Constant <value = int64[1] {0}> ()
        n = Gather <axis = 0> (s, zero)
        twelve = Constant <value = int64[1] {12}> ()
        shape = Concat <axis = 0> (n, twelve)
        y = Reshape(r, shape)
    }""")
    assert not model.graph.value_info
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Relu", "Reshape"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    out, _ = apply(FoldConstants(FoldConstantsOptions(shapes=False)), model)
    assert "Shape" in ops(out)
