import numpy as np
import onnx
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


def _dims_model(second: str = "b") -> onnx.ModelProto:
    """Two reads of dimension 0 (the batch) of two tensors computed from x, each made
    into a Reshape target; `second` names the tensor the second read comes from."""
    return onnx.shape_inference.infer_shapes(parse(HEADER + f"""
    g (float[N,8] x, float[N,8] z) => (float[N,8] y, float[N,8] w)
        <int64 zero = {{0}}, int64[1] eight = {{8}}, int64[1] ax = {{0}}> {{
        a = Relu(x)
        b = Sigmoid(x)
        c = Add(a, b)
        sa = Shape(a)
        na = Gather(sa, zero)
        ua = Unsqueeze(na, ax)
        ta = Concat <axis = 0> (ua, eight)
        ra = Reshape(c, ta)
        sb = Shape({second})
        nb = Gather(sb, zero)
        ub = Unsqueeze(nb, ax)
        tb = Concat <axis = 0> (ub, eight)
        y = Reshape(ra, tb)
        w = Relu(z)
    }}"""))


def test_reads_of_a_dimension_with_one_origin_are_computed_once():
    """Shape(a)[0] and Shape(b)[0] are both x's batch (`graph.dimorigin`): one read,
    and the Unsqueeze and Concat after it merge too (RAFT: 1132 -> 1085 nodes)."""
    model = _dims_model()
    out, result = apply(MergeDuplicates(), model)
    assert ops(out) == ["Relu", "Sigmoid", "Relu", "Add", "Shape", "Gather", "Unsqueeze",
                        "Concat", "Reshape", "Reshape"]
    assert [n.input[0] for n in out.graph.node if n.op_type == "Shape"] == ["a"]
    assert result.counts["merged duplicate nodes"] == 3
    for batch in (1, 3):
        assert_same_outputs(model, out, feeds_for(model, x=(batch, 8), z=(batch, 8)),
                            rtol=0, atol=0)
    assert_idempotent(MergeDuplicates(), out)


def test_dimensions_equal_only_by_name_or_by_value_stay_apart():
    """Two inputs' batch dims are two origins even when both are named N (onnxruntime
    runs them with different sizes); a dimension an op makes anew (a Concat along it)
    is its own origin."""
    for second in ("z", "c"):
        model = _dims_model(second)
        if second == "c":  # c along its batch: a new dimension
            model = onnx.shape_inference.infer_shapes(parse(HEADER + """
    g (float[N,8] x) => (float[N,8] y) <int64 zero = {0}, int64[1] eight = {8}> {
        a = Relu(x)
        c = Concat <axis = 0> (a, a)
        sa = Shape(a)
        na = Gather(sa, zero)
        sc = Shape(c)
        nc = Gather(sc, zero)
        s = Add(na, nc)
        u = Unsqueeze(s, zero)
        t = Concat <axis = 0> (u, eight)
        r = Reshape(c, t)
        y = Slice(r, zero, u)
    }"""))
        out, result = apply(MergeDuplicates(), model)
        assert "merged duplicate nodes" not in result.counts, second
        assert ops(out).count("Gather") == 2, second


def test_a_dimension_read_with_a_negative_index_or_a_shape_start():
    """Shape(x, start=1)[0] and Shape(a)[-1] read the same dimension of x's shape."""
    model = onnx.shape_inference.infer_shapes(parse(HEADER + """
    g (float[2,N] x) => (int64[1] y) <int64 zero = {0}, int64 last = {-1}> {
        a = Relu(x)
        s1 = Shape <start = 1> (x)
        d1 = Gather(s1, zero)
        s2 = Shape(a)
        d2 = Gather(s2, last)
        d = Add(d1, d2)
        y = Unsqueeze(d, zero)
    }"""))
    out, result = apply(MergeDuplicates(), model)
    assert result.counts["merged duplicate nodes"] == 1
    assert ops(out) == ["Shape", "Gather", "Add", "Unsqueeze"]
    for n in (1, 5):
        assert_same_outputs(model, out, feeds_for(model, x=(2, n)), rtol=0, atol=0)
    assert_idempotent(MergeDuplicates(), out)
