import numpy as np
from gfhelpers import (
    apply,
    assert_idempotent,
    assert_same_outputs,
    feeds_for,
    ops,
    parse,
    reshape_chain,
)

from graphfix.passes.fold_constants import FoldConstants, FoldConstantsOptions

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
CONCAT_AND_DEAD_GATHER = HEADER + """
g (float[2,3,4] x) => (float[2,12] y) <int64[1] a = {2}, int64[1] b = {12}> {
    shape = Concat <axis = 0> (a, b)
    zero = Constant <value = int64 {0}> ()
    s = Shape(x)
    n = Gather <axis = 0> (s, zero)
    y = Reshape(x, shape)
}"""


def test_folds_constant_subexpression_and_static_shape():
    model = parse(CONCAT_AND_DEAD_GATHER)
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


SHAPE_15 = '<ir_version: 8, opset_import: ["" : 15]>'


def test_shape_start_end_fold_only_the_dims_they_read():
    """Issue 15: gs folded Shape(x, start=-2) into the whole shape of x."""
    model = parse(SHAPE_15 + """
    g (float[2,3,4] x) => (float[2,3,4] y, int64[2] t, int64[1] m) {
        t = Shape <start = -2> (x)
        m = Shape <start = 1, end = 2> (x)
        y = Identity(x)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Identity"]
    assert result.changed
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_gather_of_a_partly_static_shape_with_start_reads_the_right_dim():
    model = parse(SHAPE_15 + """
    g (float[N,3,4] x) => (int64 d) <int64 zero = {0}> {
        s = Shape <start = 1> (x)
        d = Gather <axis = 0> (s, zero)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == []
    assert_same_outputs(model, out, feeds_for(model, x=(2, 3, 4)), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_if_with_constant_condition_keeps_every_output():
    """gs's flattening dropped every other output of a multi-output If (the tensors
    were left without a producer: onnx.checker rejected the graph)."""
    model = parse(HEADER + """
    g (float[4] x) => (float[1] a, float[1] b, float[1] c, float[1] d) <bool k = {1}> {
        a, b, c, d = If(k) <
            then_branch = t () => (float[1] p, float[1] q, float[1] r, float[1] s) {
                p, q, r, s = Split <num_outputs = 4> (x)
            },
            else_branch = e () => (float[1] p2, float[1] q2, float[1] r2, float[1] s2) {
                p2, q2, r2, s2 = Split <num_outputs = 4> (x)
            }
        >
    }""".replace("Split <num_outputs = 4> (x)", "Split(x, four)").replace(
        "<bool k = {1}>", "<bool k = {1}, int64[4] four = {1, 1, 1, 1}>"))
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Split"]
    assert [o.name for o in out.graph.output] == ["a", "b", "c", "d"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_a_sequence_of_constants_is_left_and_the_rest_folds():
    """gs's "basic" partitioning retried a part it could not evaluate (here the
    SequenceConstruct: a sequence is no constant) by calling itself on the same part
    until Python's recursion limit, one onnxruntime session per level (test_if_seq:
    114 s, then rolled back). It is not a fold candidate now; the Neg still folds."""
    model = parse(HEADER + """
    g (float[3] x) => (float[3] y, seq(float[3]) s) <float[3] k = {1.0, 2.0, 3.0}> {
        n = Neg(k)
        y = Add(x, n)
        s = SequenceConstruct(k)
    }""")
    out, result = apply(FoldConstants(), model)
    assert sorted(ops(out)) == ["Add", "SequenceConstruct"]
    assert result.counts["folded nodes into constants"] == 1
    feeds = feeds_for(model)
    a, b = run_model_outputs(model, feeds), run_model_outputs(out, feeds)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1][0], b[1][0])
    assert_idempotent(FoldConstants(), out)


def run_model_outputs(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, ["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_a_shape_known_only_after_a_folded_reshape_folds_in_the_same_run():
    """Found by tests/fuzz: the second Reshape's target reads the shape of q, known only
    once the first target is folded; one run must fold both (a second changes nothing)."""
    model = reshape_chain("q1 = Relu (r)", "m = Relu (q1)")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Reshape", "Relu", "Relu", "Reshape"]
    assert result.counts == {"folded nodes into constants": 6}
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_an_inlined_if_that_feeds_range_a_1_element_tensor_gets_a_scalar():
    """Corpus (affine_grid expanded): the If hid that its branch gives Range a [1]
    tensor; once inlined, shape inference refused the Range and the pass was rolled back."""
    model = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        f (float[2,N] x) => (int64[M] y) {
          s = Shape (x)
          c = Constant <value = bool {1}> ()
          w = If (c) <
            then_branch = t () => (int64[1] a) {
              one = Constant <value = int64[1] {1}> ()
              two = Constant <value = int64[1] {2}> ()
              a = Slice (s, one, two)
            },
            else_branch = e () => (int64[1] b) {
              b = Constant <value = int64[1] {3}> ()
            }
          >
          zero = Constant <value = int64 {0}> ()
          step = Constant <value = int64 {1}> ()
          y = Range (zero, w, step)
        }
    """)
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Shape", "Slice", "Reshape", "Range"]
    assert any("Range read a 1-element tensor" in str(n) for n in result.notes)
    import onnx

    onnx.checker.check_model(onnx.shape_inference.infer_shapes(out, strict_mode=True),
                             full_check=True)
    for n in (1, 4):
        feeds = {"x": np.zeros((2, n), np.float32)}
        assert_same_outputs(model, out, feeds, rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_constant_nodes_alone_become_initializers():
    # mobilenet_v2 after fold-bn: the Clip bounds are the only constants left, as
    # Constant nodes; nothing else to fold must not keep them as nodes
    model = parse(HEADER + """
    g (float[2,3] x) => (float[2,3] y) {
        lo = Constant <value = float {0}> ()
        hi = Constant <value = float {6}> ()
        y = Clip(x, lo, hi)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Clip"]
    assert dict(result.counts) == {"folded nodes into constants": 2}
    assert sorted(i.name for i in out.graph.initializer) == ["hi", "lo"]
    assert_same_outputs(model, out, feeds_for(model), rtol=0, atol=0)
    assert_idempotent(FoldConstants(), out)


def test_a_constant_node_writing_a_graph_output_stays():
    model = parse(HEADER + """
    g (float[2] x) => (float[2] y, float c) {
        c = Constant <value = float {6}> ()
        y = Relu(x)
    }""")
    out, result = apply(FoldConstants(), model)
    assert ops(out) == ["Constant", "Relu"] and not result.changed


def test_in_a_preset_round_the_fixed_point_inference_is_left_to_the_round(monkeypatch):
    """`PassContext.rounds_follow`: the manager infers the whole graph at a round's end and
    runs another round when anything changed, so fold-constants does not repeat that
    inference itself; what it folds is the same."""
    import graphfix.passes.fold_constants as fold_constants
    from graphfix.passes.base import PassContext

    model = parse(CONCAT_AND_DEAD_GATHER)
    calls = []
    real = fold_constants.infer_shapes
    monkeypatch.setattr(fold_constants, "infer_shapes",
                        lambda graph, **kw: calls.append(1) or real(graph, **kw))
    alone, _ = apply(FoldConstants(), model)
    inferred_alone = len(calls)
    calls.clear()
    ctx = PassContext()
    ctx.rounds_follow = True
    in_round, _ = apply(FoldConstants(), model, ctx)
    assert inferred_alone >= 1 and len(calls) == inferred_alone - 1
    assert in_round.SerializeToString() == alone.SerializeToString()


def test_the_manager_tells_fold_constants_when_a_round_follows(monkeypatch):
    import graphfix
    import graphfix.passes.fold_constants as fold_constants

    seen = []
    real = fold_constants.FoldConstants.run

    def run(self, graph, ctx):
        seen.append(ctx.rounds_follow)
        return real(self, graph, ctx)

    monkeypatch.setattr(fold_constants.FoldConstants, "run", run)
    model = parse(HEADER + """
    g (float[2,3,4] x) => (float[2,12] y) <int64[2] shape = {2, 12}> {
        y = Reshape(x, shape)
    }""")
    graphfix.run(model, passes="fold-constants", check=False)
    assert seen == [False]  # run alone: it decides its own fixed point
    seen.clear()
    graphfix.run(model, passes="trt-prep", check=False)
    assert seen and all(seen)  # in the preset's rounds
