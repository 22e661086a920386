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
