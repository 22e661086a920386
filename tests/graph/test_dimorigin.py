"""graph.dimorigin: dimensions equal by construction, never by a dim_param's name."""

from __future__ import annotations

import pytest
from gfhelpers import parse

from graphfix.graph import to_graph
from graphfix.graph.dimorigin import DimOrigins
from graphfix.graph.shapes import infer_shapes
from graphfix.graph.walk import tensor_map

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'


def tensors(body: str) -> dict:
    """The graph's tensors, with the shapes inference gives them (as the manager does)."""
    graph = to_graph(parse(HEADER + body))
    infer_shapes(graph)
    return tensor_map(graph)


MODEL = """
g (float[N,S,8] x, float[N,S,8] other, float[8,4] w, float[4] v) => (float[N,S,4] mm)
  <int64[1] ax = {1}, int64[1] b = {0}, int64[1] e = {2}, float[3] sc = {1.0, 2.0, 1.0}> {
    r = Relu(x)
    sig = Sigmoid(r)
    act = Mul(r, sig)
    both = Add(x, other)
    tr = Transpose<perm = [2, 0, 1]>(act)
    mm = MatMul(act, w)
    mv = MatMul(mm, v)
    cat = Concat<axis = 2>(act, x)
    un = Unsqueeze(act, ax)
    sq = Squeeze(un, ax)
    sl = Slice(act, b, e, e)
    rs = Resize(act, , sc)
}"""


@pytest.fixture(scope="module")
def t():
    return tensors(MODEL)


@pytest.mark.parametrize("a, axis_a, b, axis_b", [
    ("act", 0, "x", 0),  # x * sigmoid(x): both operands have x's batch
    ("act", 1, "x", 1),
    ("tr", 1, "x", 0),  # Transpose: output axis 1 is input axis perm[1] = 0
    ("tr", 2, "x", 1),
    ("mm", 0, "x", 0),  # MatMul by a matrix: A's leading axes
    ("mm", 1, "x", 1),
    ("mv", 1, "x", 1),  # MatMul by a vector: A's shape without its last axis
    ("cat", 0, "x", 0),  # Concat: every axis but its own
    ("un", 2, "x", 1),  # Unsqueeze at 1 moves axis 1 to 2
    ("sq", 1, "x", 1),
    ("sl", 0, "x", 0),  # Slice of axis 2 only keeps 0 and 1
    ("rs", 0, "x", 0),  # Resize by a scale of 1
])
def test_dimensions_copied_from_an_operand_have_its_origin(t, a, axis_a, b, axis_b):
    assert DimOrigins().same(t[a], axis_a, t[b], axis_b)


@pytest.mark.parametrize("a, axis_a, b, axis_b", [
    ("other", 0, "x", 0),  # two inputs declared N: two sizes to onnxruntime
    ("both", 0, "x", 0),  # broadcasting two different origins: its own
    ("act", 0, "x", 1),  # another axis
    ("tr", 0, "x", 0),  # Transpose: output axis 0 is input axis perm[0] = 2
    ("mm", 2, "x", 2),  # MatMul's last axis is w's, not A's
    ("cat", 2, "x", 2),  # the concatenated axis is a sum
    ("sl", 2, "x", 2),  # a sliced axis
    ("rs", 1, "x", 1),  # a scale of 2
])
def test_dimensions_made_anew_or_from_another_input_are_not_the_same(t, a, axis_a, b, axis_b):
    assert not DimOrigins().same(t[a], axis_a, t[b], axis_b)


def test_a_deep_residual_chain_is_walked_once():
    """Each Add reads the previous one twice over (Relu and itself): without the memo the
    walk would double with every block."""
    lines = ["y0 = Relu(x)"]
    for i in range(1, 200):
        lines += [f"r{i} = Relu(y{i - 1})", f"y{i} = Add(y{i - 1}, r{i})"]
    body = ("g (float[N,4] x) => (float[N,4] y199) {\n" + "\n".join(lines) + "\n}")
    t = tensors(body)
    assert DimOrigins().same(t["y199"], 0, t["x"], 0)


NEW_OPS = """
g (float[N,S,8] x, float[N,S,8] y, int64[N,S] ids, float[N,4,S,8] q, float[N,4,S,8] k,
   float[M,S,8] other, float[100,8] table) => (float[N,S,8] out)
  <int64[4] zero = {0, 0, 2, 4}, int64[6] pads = {0, 0, 0, 0, 0, 1},
   int64[3] reps = {1, 2, 1}, int64 zero0 = {0}, int64 one = {1},
   int64 two = {2}, int64[1] i1 = {1}, int64[1] i0 = {0}, int64[1] neg = {-1}> {
    emb = Gather(table, ids)
    rk = ReduceMean<axes = [-1], keepdims = 1>(x)
    rn = ReduceMean<axes = [1], keepdims = 0>(x)
    kt = Transpose<perm = [0, 1, 3, 2]>(q)
    att = MatMul(q, kt)
    kt2 = Transpose<perm = [0, 1, 3, 2]>(k)
    att2 = MatMul(q, kt2)
    rz = Reshape(x, zero)
    shape_x = Shape(x)
    ex = Expand(rk, shape_x)
    s1 = Gather(shape_x, one)
    rng = Range(zero0, s1, one)
    rng2 = Range(zero0, s1, two)
    fl = Flatten<axis = 1>(x)
    fl2w = Transpose(fl)
    gm = Gemm(fl, fl2w)
    tk_v, tk_i = TopK(x, i1)
    pd = Pad(x, pads)
    tl = Tile(x, reps)
    n_ = Gather(shape_x, zero0)
    n1 = Unsqueeze(n_, i0)
    s_ = Unsqueeze(s1, i0)
    tgt = Concat<axis = 0>(n1, s_, neg)
    xr = Relu(x)
    rc = Reshape(xr, tgt)
    rc3 = Reshape(y, tgt)
    oshape = Shape(other)
    on_ = Gather(oshape, zero0)
    on1 = Unsqueeze(on_, i0)
    tgt2 = Concat<axis = 0>(on1, s_, neg)
    rc2 = Reshape(x, tgt2)
    eq = Equal(tgt, neg)
    wh = Where(eq, i1, tgt)
    ex2 = Expand(rk, wh)
    grid = ReduceMean<axes = [0], keepdims = 1>(x)
    reps2 = Concat<axis = 0>(n1, i1, i1)
    tn = Tile(grid, reps2)
    tx = Tile(x, reps2)
    out = Identity(x)
}"""


@pytest.fixture(scope="module")
def t2():
    return tensors(NEW_OPS)


def _values():
    from graphfix.passes._shape_values import entries_reader

    return DimOrigins(values=entries_reader(17))


@pytest.mark.parametrize("a, axis_a, b, axis_b", [
    ("emb", 0, "ids", 0),  # Gather: the indices' axes in place of the data's axis
    ("emb", 1, "ids", 1),
    ("rk", 1, "x", 1),  # a Reduce keeps the axes it does not reduce, in place
    ("rn", 1, "x", 2),  # ... or moved down without keepdims
    ("att", 0, "q", 0),  # a batched MatMul: batch axes broadcast (both q's here)
    ("att", 2, "q", 2),
    ("rz", 0, "x", 0),  # Reshape: a constant 0 copies the input's
    ("ex", 1, "x", 1),  # Expand to Shape(x): broadcast of rk's S and x's S
    ("ex", 0, "x", 0),
    ("rng", 0, "x", 1),  # Range(0, d, 1) has d elements
    ("fl", 0, "x", 0),  # Flatten at 1: axis 0 is the input's
    ("gm", 0, "x", 0),  # Gemm: A's rows
    ("tk_v", 0, "x", 0),  # TopK: every axis but its own
    ("tk_i", 1, "x", 1),
    ("pd", 1, "x", 1),  # Pad: axes it does not pad
    ("tl", 0, "x", 0),  # Tile by 1
    ("rc", 0, "x", 0),  # a computed entry: dim k of x, and the input's copy of it
    ("rc", 1, "x", 1),
    ("ex2", 1, "x", 1),  # Expand to Where(Equal(t, -1), 1, t): PyTorch's expand
    ("tn", 0, "x", 0),  # an axis of size 1 tiled by x's N (RAFT's coordinate grid)
    ("tn", 1, "x", 1),  # ... and a repeat of 1 read as a value
])
def test_new_ops_copy_a_dimension(t2, a, axis_a, b, axis_b):
    assert _values().same(t2[a], axis_a, t2[b], axis_b)


@pytest.mark.parametrize("a, axis_a, b, axis_b", [
    ("rk", 2, "x", 2),  # a reduced axis
    ("rz", 2, "x", 2),  # a constant size
    ("rng2", 0, "x", 1),  # Range by 2 has about half as many
    ("pd", 2, "x", 2),  # a padded axis
    ("tl", 1, "x", 1),  # a tiled axis
    ("fl", 1, "x", 1),  # the product of the others
    # the entry is other's M, the input's N: where M is 0 the Reshape copies N, else M
    ("rc2", 0, "other", 0),
    ("rc2", 0, "x", 0),
    ("rc3", 0, "x", 0),  # the entry is x's N, the input y's its own N
    ("att2", 0, "q", 0),  # q's N broadcast against k's (two inputs: two sizes)
    ("tx", 0, "x", 0),  # an axis of size N tiled N times: N * N
])
def test_new_ops_do_not_claim_what_varies(t2, a, axis_a, b, axis_b):
    assert not _values().same(t2[a], axis_a, t2[b], axis_b)


def test_without_a_value_reader_shape_values_are_not_followed(t2):
    assert not DimOrigins().same(t2["ex"], 1, t2["x"], 1)
    assert not DimOrigins().same(t2["tn"], 0, t2["x"], 0)
    assert not DimOrigins().same(t2["rng"], 0, t2["x"], 1)
    assert DimOrigins().same(t2["rz"], 0, t2["x"], 0)  # a constant 0 needs no reader
