"""fuse-conv-mul: exact ops, onnxruntime numerics, checker, idempotence, every skip reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import (
    apply,
    assert_idempotent,
    assert_rewrites,
    assert_same_outputs,
    assert_skips,
    build_model,
    conv_skip_case,
    feeds_for,
    if_of_conv_branches,
    init,
    ops,
    output_types,
    seeded,
    value,
)
from onnx import TensorProto, helper, numpy_helper

from graphfix.passes.fuse_conv_bias import FuseConvBias
from graphfix.passes.fuse_conv_mul import FuseConvMul

FLOAT = TensorProto.FLOAT


# ----------------------------------------------------------------------------- builders


_model = build_model
_init, _value, _rand = init, value, seeded


def _scale(shape, dtype=np.float32, seed: int = 2) -> np.ndarray:
    """Per-channel scales in [0.5, 1.5), different per channel, both signs."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)).astype(dtype)


def _conv_mul(
    op="Conv", x_shape=(1, 3, 8, 8), w_shape=(4, 3, 3, 3), const_shape=(1, 4, 1, 1),
    bias=True, elem_op="Mul", const_first=False, dtype=np.float32, **attrs,
) -> onnx.ModelProto:
    """x -> op(x, W[, b]) -> elem_op(c, s) -> Relu -> y."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    cout = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    inits = [_init("W", _rand(w_shape, dtype)), _init("s", _scale(const_shape, dtype))]
    conv_inputs = ["x", "W"]
    if bias:
        inits.append(_init("b", _rand([cout], dtype, seed=1)))
        conv_inputs.append("b")
    mul_inputs = ["s", "c"] if const_first else ["c", "s"]
    nodes = [
        helper.make_node(op, conv_inputs, ["c"], name="conv", **attrs),
        helper.make_node(elem_op, mul_inputs, ["m"], name="mul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    return _model(nodes, [_value("x", list(x_shape), elem)], [_value("y", None, elem)], inits)


def _assert_fuses(model, ops_after, counts, feed_sets=None, rtol=1e-5, atol=1e-6):
    return assert_rewrites(FuseConvMul(), model, ops_after, counts, feed_sets, rtol, atol)


def _assert_skips(model, reason, subject="Mul 'mul'"):
    assert_skips(FuseConvMul(), model, subject, reason)


# ----------------------------------------------------------------------------- folds


CASES = {
    "bias-1c11": {},
    "no-bias-c11": {"bias": False, "const_shape": (4, 1, 1)},
    "const-first": {"const_first": True},
    "scalar": {"const_shape": ()},
    "one": {"const_shape": (1,)},
    "div": {"elem_op": "Div", "const_shape": (4, 1, 1)},
    "div-no-bias": {"elem_op": "Div", "bias": False},
    "grouped-dilated": {"x_shape": (1, 4, 9, 9), "w_shape": (6, 2, 3, 3),
                        "const_shape": (6, 1, 1), "group": 2, "dilations": [2, 2]},
    "depthwise": {"x_shape": (1, 4, 8, 8), "w_shape": (4, 1, 3, 3), "group": 4},
    "conv1d": {"x_shape": (2, 3, 16), "w_shape": (5, 3, 3), "const_shape": (5, 1),
               "strides": [2]},
    "conv3d": {"x_shape": (1, 2, 5, 6, 7), "w_shape": (4, 2, 3, 3, 3),
               "const_shape": (4, 1, 1, 1), "pads": [1] * 6},
    "conv-transpose": {"op": "ConvTranspose", "x_shape": (1, 3, 5, 5), "w_shape": (3, 4, 3, 3),
                       "const_shape": (4, 1, 1), "strides": [2, 2]},
    # Cin/g 3, Cout/g 5, g 2 all differ (Cin 6 != Cout 10), so scaling the wrong
    # axis of W [Cin, Cout/g, k, k] or splitting groups wrongly cannot pass.
    "conv-transpose-group2": {"op": "ConvTranspose", "x_shape": (1, 6, 5, 5),
                              "w_shape": (6, 5, 3, 3), "const_shape": (1, 10, 1, 1),
                              "group": 2, "strides": [2, 2]},
    "conv-transpose-group3-div": {"op": "ConvTranspose", "x_shape": (1, 6, 5, 5),
                                  "w_shape": (6, 4, 2, 2), "const_shape": (12, 1, 1),
                                  "elem_op": "Div", "bias": False, "group": 3,
                                  "strides": [2, 1], "pads": [0, 1, 0, 1]},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fuses_into_conv_family(case):
    kwargs = CASES[case]
    op, elem_op = kwargs.get("op", "Conv"), kwargs.get("elem_op", "Mul")
    counts = {f"fused {elem_op} into {op} weights": 1}
    out = _assert_fuses(_conv_mul(**kwargs), [op, "Relu"], counts)
    assert len(out.graph.node[0].input) == (3 if kwargs.get("bias", True) else 2)


def test_fp16_keeps_fp16_weights():
    # fp16 keeps 11 significant bits. The fused Conv uses W * s rounded to fp16 and
    # rounds its output once; the reference rounds the Conv output and then the
    # product. Outputs reach |y| ~ 5, where one fp16 ulp is 2**-8 ~ 3.9e-3; the
    # measured max error over seeds 0-4 is 2e-3 (half an ulp), so atol 4e-3 + rtol
    # 1e-3 allows about two ulps and still fails on a wrong fold (errors ~0.3).
    model = _conv_mul(dtype=np.float16)
    out = _assert_fuses(model, ["Conv", "Relu"], {"fused Mul into Conv weights": 1},
                        rtol=1e-3, atol=4e-3)
    assert {i.data_type for i in out.graph.initializer} == {TensorProto.FLOAT16}


def test_decomposed_batchnorm_becomes_one_conv():
    """Conv -> Mul(s) -> Add(t) -> Relu, as TensorFlow and Paddle export BatchNormalization."""
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("b", _rand([4], seed=1)),
             _init("s", _scale([1, 4, 1, 1])), _init("t", _rand([4, 1, 1], seed=3))]
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["s", "c"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "t"], ["n"], name="add"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    model = _model(nodes, [_value("x", [2, 3, 8, 8])], [_value("y", None)], inits)
    scaled, first = apply(FuseConvMul(), model)
    assert dict(first.counts) == {"fused Mul into Conv weights": 1}
    assert ops(scaled) == ["Conv", "Add", "Relu"]
    out, second = apply(FuseConvBias(), scaled)
    assert dict(second.counts) == {"fused Add into Conv bias": 1}
    assert ops(out) == ["Conv", "Relu"]
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(FuseConvMul(), out)
    assert_idempotent(FuseConvBias(), out)


def test_chain_of_mul_and_div_folds_in_one_run():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("s", _scale([1, 4, 1, 1])),
             _init("d", _scale([4, 1, 1], seed=5))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Mul", ["c", "s"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "d"], ["y"], name="div")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("y", None)], inits)
    _assert_fuses(model, ["Conv"],
                  {"fused Mul into Conv weights": 1, "fused Div into Conv weights": 1})


def test_mul_writing_a_graph_output_keeps_its_name():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("s", _scale([1, 4, 1, 1]))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Mul", ["c", "s"], ["features"], name="mul")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("features", [1, 4, 6, 6])], inits)
    out = _assert_fuses(model, ["Conv"], {"fused Mul into Conv weights": 1})
    assert out.graph.node[0].output == ["features"]
    assert output_types(out) == [("features", FLOAT)]


def test_fuses_inside_both_if_branches():
    model, feed_sets = if_of_conv_branches("Mul", _scale([4, 1, 1], seed=7))
    out = _assert_fuses(model, ["If"], {"fused Mul into Conv weights": 2}, feed_sets)
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Conv", "Relu"], "else_branch": ["Conv"]}


def test_shared_weight_is_not_modified_for_the_other_conv():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("s", _scale([4, 1, 1]))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Mul", ["c", "s"], ["y1"], name="mul"),
             helper.make_node("Conv", ["x", "W"], ["y2"], name="plain")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("y1", None), _value("y2", None)],
                   inits)
    out = _assert_fuses(model, ["Conv", "Conv"], {"fused Mul into Conv weights": 1})
    plain = next(n for n in out.graph.node if n.name == "plain")
    assert list(plain.input) == ["x", "W"]
    kept = next(i for i in out.graph.initializer if i.name == "W")
    np.testing.assert_array_equal(numpy_helper.to_array(kept), _rand([4, 3, 3, 3]))


# ----------------------------------------------------------------------------- skips


def _hint(c: int) -> str:
    return f"a per-channel constant has shape [{c}, 1, 1] or [1, {c}, 1, 1]"


SKIPS = {
    "vector-rank4": ({"x_shape": (1, 3, 6, 6), "const_shape": (4,)},
                     "the constant of shape [4] lines up with the last axis of the rank-4 Conv "
                     "output (broadcasting aligns trailing axes), not with the channel axis 1; "
                     + _hint(4)),
    "width": ({"const_shape": (1, 1, 1, 6)},
              "the constant of shape [1, 1, 1, 6] varies along axis 3 of the rank-4 Conv output, "
              "not only along the channel axis 1; " + _hint(4)),
    "full-tensor": ({"const_shape": (1, 4, 6, 6)},
                    "the constant of shape [1, 4, 6, 6] varies along axis 2 of the rank-4 Conv "
                    "output, not only along the channel axis 1; " + _hint(4)),
    "higher-rank": ({"const_shape": (2, 1, 4, 1, 1)},
                    "the constant has rank 5, higher than the rank-4 Conv output, "
                    "so the result would broadcast to a larger output"),
    "vector-conv1d": ({"x_shape": (2, 3, 7), "w_shape": (5, 3, 3), "const_shape": (5,)},
                      "the constant of shape [5] lines up with the last axis of the rank-3 Conv "
                      "output (broadcasting aligns trailing axes), not with the channel axis 1; "
                      "a per-channel constant has shape [5, 1] or [1, 5, 1]"),
    "const-over-conv": ({"elem_op": "Div", "const_first": True},
                        "the Conv output is the divisor (c / Conv), which is not a per-channel "
                        "scale"),
}


@pytest.mark.parametrize("case", sorted(SKIPS))
def test_skips_constant_with_reason(case):
    kwargs, reason = SKIPS[case]
    subject = "Div 'mul'" if kwargs.get("elem_op") == "Div" else "Mul 'mul'"
    _assert_skips(_conv_mul(**kwargs), reason, subject)


def test_skips_division_by_zero():
    model = _conv_mul(elem_op="Div", const_shape=(4, 1, 1))
    s = next(i for i in model.graph.initializer if i.name == "s")
    s.CopyFrom(_init("s", np.array([1.0, 0.0, 2.0, 3.0], np.float32).reshape(4, 1, 1)))
    _assert_skips(model, "its divisor is zero for some channel, so the quotient is not a "
                  "finite scale", "Div 'mul'")


def _graph_case(case: str) -> onnx.ModelProto:
    return conv_skip_case("Mul", "s", _scale([4, 1, 1]), case)


# A copy of the 3x3 Conv (3 -> 4 channels) costs more than the layer it would save
# (`_conv_copy`): 144 outputs x 27 MACs / 16 + 192 inputs + 108 weights > 144.
_COPY_COST = (
    "copying Conv 'conv' to fold the Mul would add 3.89 kMAC and re-read 1.2 kB (its input "
    "and weights) to save one read of its 576 B output (cost model: 543 element moves "
    "added, 144 saved), so it is not copied")

GRAPH_SKIPS = {
    "second-reader": "the Conv output is also read by Relu 'relu'; " + _COPY_COST,
    "conv-output-is-graph-output": "the Conv output is also a graph output; " + _COPY_COST,
    "other-input": "its other input 's' is not a constant",
    "weights-input": "the Conv weights are not a constant",
    "conv-bias-input": "the Conv bias is not a constant",
}


@pytest.mark.parametrize("case", sorted(GRAPH_SKIPS))
def test_skips_with_reason(case):
    _assert_skips(_graph_case(case), GRAPH_SKIPS[case])


def test_reports_when_no_mul_follows_a_conv():
    inits = [_init("W", _rand([6, 4]))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Mul", ["m", "m"], ["y"], name="square")]
    model = _model(nodes, [_value("x", [2, 6])], [_value("y", [2, 4])], inits)
    _assert_skips(model, "no Mul or Div of a Conv or ConvTranspose output", "graph")
