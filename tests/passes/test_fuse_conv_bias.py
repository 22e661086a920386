"""fuse-conv-bias: exact ops, onnxruntime numerics, checker, idempotence, every skip reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import (
    assert_rewrites,
    assert_skips,
    build_model,
    conv_skip_case,
    if_of_conv_branches,
    init,
    output_types,
    seeded,
    value,
)
from onnx import TensorProto, helper, numpy_helper

from graphfix.passes.fuse_conv_bias import FuseConvBias

FLOAT = TensorProto.FLOAT


# ----------------------------------------------------------------------------- builders


_model = build_model
_init, _value, _rand = init, value, seeded


def _conv_add(
    op="Conv", x_shape=(1, 3, 8, 8), w_shape=(4, 3, 3, 3), const_shape=(1, 4, 1, 1),
    bias=True, elem_op="Add", const_first=False, dtype=np.float32, checked=True, **attrs,
) -> onnx.ModelProto:
    """x -> op(x, W[, b]) -> elem_op(c, t) -> Relu -> y."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    cout = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    inits = [_init("W", _rand(w_shape, dtype)), _init("t", _rand(const_shape, dtype, seed=2))]
    conv_inputs = ["x", "W"]
    if bias:
        inits.append(_init("b", _rand([cout], dtype, seed=1)))
        conv_inputs.append("b")
    add_inputs = ["t", "c"] if const_first else ["c", "t"]
    nodes = [
        helper.make_node(op, conv_inputs, ["c"], name="conv", **attrs),
        helper.make_node(elem_op, add_inputs, ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    return _model(nodes, [_value("x", list(x_shape), elem)], [_value("y", None, elem)], inits,
                  checked)


def _assert_fuses(model, ops_after, counts, feed_sets=None, rtol=1e-5, atol=1e-6):
    return assert_rewrites(FuseConvBias(), model, ops_after, counts, feed_sets, rtol, atol)


def _assert_skips(model, reason, subject="Add 'add'"):
    assert_skips(FuseConvBias(), model, subject, reason)


# ----------------------------------------------------------------------------- conv family


CONV_CASES = {
    "bias-1c11": {},
    "no-bias-c11": {"bias": False, "const_shape": (4, 1, 1)},
    "const-first": {"const_first": True},
    "const-first-no-bias": {"const_first": True, "bias": False, "const_shape": (4, 1, 1)},
    "scalar": {"const_shape": ()},
    "one": {"const_shape": (1,)},
    "sub": {"elem_op": "Sub", "const_shape": (4, 1, 1)},
    "sub-no-bias": {"elem_op": "Sub", "bias": False},
    "grouped-dilated": {"x_shape": (1, 4, 9, 9), "w_shape": (6, 2, 3, 3),
                        "const_shape": (6, 1, 1), "group": 2, "dilations": [2, 2]},
    "depthwise": {"x_shape": (1, 4, 8, 8), "w_shape": (4, 1, 3, 3), "group": 4},
    "conv1d": {"x_shape": (2, 3, 16), "w_shape": (5, 3, 3), "const_shape": (5, 1),
               "strides": [2]},
    "conv1d-1c1": {"x_shape": (2, 3, 16), "w_shape": (5, 3, 3), "const_shape": (1, 5, 1),
                   "bias": False},
    "conv3d": {"x_shape": (1, 2, 5, 6, 7), "w_shape": (4, 2, 3, 3, 3),
               "const_shape": (4, 1, 1, 1), "pads": [1] * 6},
    # Cin 6, Cout/g 5, g 2: output channels 10 differ from the input channels.
    "conv-transpose-group2": {"op": "ConvTranspose", "x_shape": (1, 6, 5, 5),
                              "w_shape": (6, 5, 3, 3), "const_shape": (1, 10, 1, 1),
                              "group": 2, "strides": [2, 2]},
    "conv-transpose-no-bias": {"op": "ConvTranspose", "x_shape": (1, 3, 5, 5),
                               "w_shape": (3, 4, 3, 3), "const_shape": (4, 1, 1),
                               "bias": False, "strides": [2, 2]},
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_fuses_into_conv_family(case):
    kwargs = CONV_CASES[case]
    op, elem_op = kwargs.get("op", "Conv"), kwargs.get("elem_op", "Add")
    out = _assert_fuses(_conv_add(**kwargs), [op, "Relu"], {f"fused {elem_op} into {op} bias": 1})
    conv = out.graph.node[0]
    assert len(conv.input) == 3  # a bias is created when absent
    cout = kwargs.get("w_shape", (4,))[0] if op == "Conv" else 10 if "group2" in case else 4
    bias = next(i for i in out.graph.initializer if i.name == conv.input[2])
    assert list(bias.dims) == [cout]


def test_fp16_keeps_fp16_bias():
    # fp16 keeps 11 significant bits. The reference rounds the Conv output to fp16
    # and then the Add's; the fused Conv adds the pre-rounded b + t inside and rounds
    # once. Outputs reach |y| ~ 4-6, where one fp16 ulp is 2**-9 to 2**-8 (2e-3 to
    # 3.9e-3); the measured max error over seeds 0-4 is 9.8e-4 (one rounding), so
    # atol 2e-3 + rtol 1e-3 allows a few ulps and still fails on a wrong fold (~0.3).
    model = _conv_add(dtype=np.float16)
    out = _assert_fuses(model, ["Conv", "Relu"], {"fused Add into Conv bias": 1},
                        rtol=1e-3, atol=2e-3)
    assert {i.data_type for i in out.graph.initializer} == {TensorProto.FLOAT16}


def test_chain_of_add_and_sub_folds_in_one_run():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("t1", _rand([1, 4, 1, 1], seed=1)),
             _init("t2", _rand([4, 1, 1], seed=2))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Add", ["t1", "c"], ["a"], name="add"),
             helper.make_node("Sub", ["a", "t2"], ["y"], name="sub")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("y", None)], inits)
    _assert_fuses(model, ["Conv"], {"fused Add into Conv bias": 1, "fused Sub into Conv bias": 1})


def test_add_writing_a_graph_output_keeps_its_name():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("t", _rand([1, 4, 1, 1], seed=2))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "t"], ["logits"], name="add")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("logits", [1, 4, 6, 6])], inits)
    out = _assert_fuses(model, ["Conv"], {"fused Add into Conv bias": 1})
    assert out.graph.node[0].output == ["logits"]
    assert output_types(out) == [("logits", FLOAT)]


def test_fuses_inside_both_if_branches():
    model, feed_sets = if_of_conv_branches("Add", _rand([4, 1, 1], seed=7))
    out = _assert_fuses(model, ["If"], {"fused Add into Conv bias": 2}, feed_sets)
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Conv", "Relu"], "else_branch": ["Conv"]}


def test_shared_bias_is_not_modified_for_the_other_conv():
    inits = [_init("W", _rand([4, 3, 3, 3])), _init("b", _rand([4], seed=1)),
             _init("t", _rand([4, 1, 1], seed=2))]
    nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "t"], ["y1"], name="add"),
             helper.make_node("Conv", ["x", "W", "b"], ["y2"], name="plain")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("y1", None), _value("y2", None)],
                   inits)
    out = _assert_fuses(model, ["Conv", "Conv"], {"fused Add into Conv bias": 1})
    plain = next(n for n in out.graph.node if n.name == "plain")
    assert list(plain.input) == ["x", "W", "b"]
    kept = next(i for i in out.graph.initializer if i.name == "b")
    np.testing.assert_array_equal(numpy_helper.to_array(kept), _rand([4], seed=1))


# ----------------------------------------------------------------------------- gemm, matmul


ADD_SHAPES = {"row": [4], "row2d": [1, 4], "scalar": [], "col": [5, 1], "full": [5, 4]}
GEMM_C = {"none": None, "row": [4], "full": [5, 4]}


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_kind", sorted(GEMM_C))
@pytest.mark.parametrize("add_kind", sorted(ADD_SHAPES))
def test_fuses_into_gemm_c(trans_b, c_kind, add_kind):
    inits = [_init("B", _rand([4, 6] if trans_b else [6, 4])),
             _init("t", _rand(ADD_SHAPES[add_kind], seed=2))]
    inputs = ["a", "B"]
    if GEMM_C[c_kind] is not None:
        inits.append(_init("C", _rand(GEMM_C[c_kind], seed=1)))
        inputs.append("C")
    nodes = [helper.make_node("Gemm", inputs, ["g"], name="gemm", transB=trans_b, alpha=0.7,
                              beta=1.3),
             helper.make_node("Add", ["g", "t"], ["y"], name="add")]
    model = _model(nodes, [_value("a", [5, 6])], [_value("y", [5, 4])], inits)
    out = _assert_fuses(model, ["Gemm"], {"fused Add into Gemm C": 1})
    assert {a.name: helper.get_attribute_value(a) for a in out.graph.node[0].attribute} == {
        "transB": trans_b, "alpha": pytest.approx(0.7), "beta": 1.0,
    }


def test_fuses_sub_into_gemm_with_trans_a():
    inits = [_init("B", _rand([6, 4])), _init("C", _rand([4], seed=1)),
             _init("t", _rand([1, 4], seed=2))]
    nodes = [helper.make_node("Gemm", ["a", "B", "C"], ["g"], name="gemm", transA=1, beta=0.5),
             helper.make_node("Sub", ["g", "t"], ["y"], name="add")]
    model = _model(nodes, [_value("a", [6, 5])], [_value("y", [5, 4])], inits)
    _assert_fuses(model, ["Gemm"], {"fused Sub into Gemm C": 1})


@pytest.mark.parametrize("add_shape", [[4], [5, 4], [5, 1], []])
def test_fuses_matmul_and_add_into_gemm(add_shape):
    inits = [_init("W", _rand([6, 4])), _init("t", _rand(add_shape, seed=2))]
    nodes = [helper.make_node("MatMul", ["a", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["t", "m"], ["n"], name="add"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    model = _model(nodes, [_value("a", [5, 6])], [_value("y", [5, 4])], inits)
    out = _assert_fuses(model, ["Gemm", "Relu"], {"fused Add into MatMul as a Gemm": 1})
    assert list(out.graph.node[0].input)[:2] == ["a", "W"]


# ----------------------------------------------------------------------------- skips


def test_skips_a_channel_sized_vector_against_a_rank4_output():
    # [4] against [1, 4, 4, 4] lines up with W (also 4 wide), so it is not per channel.
    model = _conv_add(x_shape=(1, 3, 6, 6), const_shape=(4,))
    _assert_skips(model, "the constant of shape [4] lines up with the last axis of the rank-4 "
                  "Conv output (broadcasting aligns trailing axes), not with the channel axis 1; "
                  "a per-channel constant has shape [4, 1, 1] or [1, 4, 1, 1]")


CONV_SKIPS = {
    "width": ({"const_shape": (1, 1, 1, 6)},
              "the constant of shape [1, 1, 1, 6] varies along axis 3 of the rank-4 Conv output, "
              "not only along the channel axis 1; a per-channel constant has shape [4, 1, 1] "
              "or [1, 4, 1, 1]"),
    "full-tensor": ({"const_shape": (1, 4, 6, 6)},
                    "the constant of shape [1, 4, 6, 6] varies along axis 2 of the rank-4 Conv "
                    "output, not only along the channel axis 1; a per-channel constant has shape "
                    "[4, 1, 1] or [1, 4, 1, 1]"),
    "higher-rank": ({"const_shape": (1, 1, 4, 1, 1)},
                    "the constant has rank 5, higher than the rank-4 Conv output, "
                    "so the result would broadcast to a larger output"),
    "grows-channels": ({"w_shape": (1, 3, 3, 3), "const_shape": (1, 3, 1, 1)},
                       "the constant has 3 values along the channel axis "
                       "but the Conv output has 1 channel"),
    "const-minus-conv": ({"elem_op": "Sub", "const_first": True},
                         "the Conv output is subtracted from a constant (c - Conv), which would "
                         "negate its weights; only Conv - c folds into the bias"),
}


@pytest.mark.parametrize("case", sorted(CONV_SKIPS))
def test_skips_conv_constant_with_reason(case):
    kwargs, reason = CONV_SKIPS[case]
    subject = "Sub 'add'" if kwargs.get("elem_op") == "Sub" else "Add 'add'"
    _assert_skips(_conv_add(**kwargs), reason, subject)


def _graph_case(case: str) -> onnx.ModelProto:
    return conv_skip_case("Add", "t", _rand([4, 1, 1], seed=2), case)


# A copy of the 3x3 Conv (3 -> 4 channels) costs more than the layer it would save
# (`_conv_copy`): 144 outputs x 27 MACs / 16 + 192 inputs + 108 weights > 144.
_COPY_COST = (
    "copying Conv 'conv' to fold the Add would add 3.89 kMAC and re-read 1.2 kB (its input "
    "and weights) to save one read of its 576 B output (cost model: 543 element moves "
    "added, 144 saved), so it is not copied")

GRAPH_SKIPS = {
    "second-reader": "the Conv output is also read by Relu 'relu'; " + _COPY_COST,
    "conv-output-is-graph-output": "the Conv output is also a graph output; " + _COPY_COST,
    "other-input": "its other input 't' is not a constant",
    "weights-input": "the Conv weights are not a constant",
    "conv-bias-input": "the Conv bias is not a constant",
}


@pytest.mark.parametrize("case", sorted(GRAPH_SKIPS))
def test_skips_with_reason(case):
    _assert_skips(_graph_case(case), GRAPH_SKIPS[case])


def test_skips_add_in_a_branch_reading_an_outer_conv():
    then = helper.make_graph([helper.make_node("Add", ["c", "t"], ["a"], name="add")], "then", [],
                             [_value("a", [1, 4, 6, 6])], [_init("t", _rand([4, 1, 1]))])
    other = helper.make_graph([helper.make_node("Neg", ["c"], ["e"], name="neg")], "else", [],
                              [_value("e", [1, 4, 6, 6])])
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then,
                              else_branch=other)]
    model = _model(nodes, [_value("x", [1, 3, 8, 8]), _value("cond", [], TensorProto.BOOL)],
                   [_value("y", [1, 4, 6, 6])], [_init("W", _rand([4, 3, 3, 3]))])
    _assert_skips(model, "its Conv input comes from an enclosing graph")


def _gemm_model(a_shape, b_shape, add_shape, c_input=False, rank3=False) -> onnx.ModelProto:
    inits = [_init("t", _rand(add_shape, seed=2))]
    inputs = [_value("a", a_shape)]
    if isinstance(b_shape, list) and all(isinstance(d, int) for d in b_shape):
        inits.append(_init("B", _rand(b_shape)))
    else:
        inputs.append(_value("B", b_shape))
    gemm_inputs = ["a", "B"]
    if c_input:
        inputs.append(_value("C", [4]))
        gemm_inputs.append("C")
    nodes = [helper.make_node("Gemm", gemm_inputs, ["g"], name="gemm"),
             helper.make_node("Add", ["g", "t"], ["y"], name="add")]
    return _model(nodes, inputs, [_value("y", None)], inits)


GEMM_SKIPS = {
    "c-input": (([5, 6], [6, 4], [4], True),
                "the Gemm C input is not a constant"),
    "rank3": (([5, 6], [6, 4], [1, 1, 4]),
              "the constant has rank 3, higher than the rank-2 Gemm output, "
              "so the result would broadcast to a larger output"),
    "rows-dynamic": ((["m", 6], [6, 4], [5, 1]),
                     "the constant of shape [5, 1] varies along the rows and the Gemm output row "
                     "count is not static, so it may broadcast to more rows than a Gemm C can"),
    "rows-grow": (([1, 6], [6, 4], [5, 4]),
                  "the constant has 5 rows but the Gemm output has 1"),
    "cols-grow": (([5, 6], [6, 1], [1, 3]),
                  "the constant has 3 columns but the Gemm output has 1 columns"),
    "cols-unknown": (([5, 6], ["k", "n"], [4]),
                     "the constant has 4 columns but the Gemm output has an unknown number of "
                     "columns"),
}


@pytest.mark.parametrize("case", sorted(GEMM_SKIPS))
def test_skips_gemm_with_reason(case):
    args, reason = GEMM_SKIPS[case]
    _assert_skips(_gemm_model(*args), reason)


def _matmul_model(a_shape, w_shape, w_const=True, relu_first=False) -> onnx.ModelProto:
    inits = [_init("t", _rand([4], seed=2))]
    inputs = [_value("a", a_shape)]
    if w_const:
        inits.append(_init("W", _rand(w_shape)))
    else:
        inputs.append(_value("W", w_shape))
    nodes = [helper.make_node("MatMul", ["a", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "t"], ["y"], name="add")]
    if relu_first:  # the Relu output has no shape information
        nodes.insert(0, helper.make_node("Relu", ["x"], ["a"], name="relu"))
        inputs[0] = _value("x", a_shape)
    return _model(nodes, inputs, [_value("y", None)], inits)


MATMUL_SKIPS = {
    "rank3-input": (([3, 5, 6], [6, 4]),
                    "the MatMul input has rank 3, so it cannot become a Gemm (2-D inputs only)"),
    "rank-unknown": (([5, 6], [6, 4], True, True),
                     "the MatMul input rank is unknown, so it may not be 2-D "
                     "(a Gemm takes 2-D inputs)"),
    "weights-input": (([5, 6], [6, 4], False), "the MatMul weights are not a constant"),
    "weights-rank3": (([3, 5, 6], [3, 6, 4]), "the MatMul weights have rank 3, not 2"),
}


@pytest.mark.parametrize("case", sorted(MATMUL_SKIPS))
def test_skips_matmul_with_reason(case):
    args, reason = MATMUL_SKIPS[case]
    _assert_skips(_matmul_model(*args), reason)


# Models onnx rejects (mismatched types or ranks) but a pass may still be handed
# by a sloppy exporter: the pass must leave them alone and say why.
INVALID_SKIPS = {
    "float64-constant": (lambda: _replaced("t", _rand([1, 4, 1, 1], np.float64)),
                         "its constant is float64 but the Conv computes float32"),
    "int-constant": (lambda: _replaced("t", np.ones([1, 4, 1, 1], np.int64)),
                     "its constant 't' is int64, not floating point"),
    "int-weights": (lambda: _replaced("W", np.ones([4, 3, 3, 3], np.int32)),
                    "the Conv weights are int32, not floating point"),
    "rank2-weights": (lambda: _conv_add(w_shape=(4, 3), checked=False),
                      "the Conv weights have rank 2, not 3 or more"),
    "bias-size": (lambda: _replaced("b", _rand([5])),
                  "the Conv bias has 5 values for 4 output channels"),
    "group-indivisible": (lambda: _conv_add(op="ConvTranspose", w_shape=(3, 4, 3, 3), group=2,
                                            const_shape=(8, 1, 1), checked=False),
                          "the ConvTranspose has 3 input channels, not divisible by group=2"),
    "float64-output": (lambda: _float64_output(),
                       "its output is float64 but the Conv output is float32"),
}


def _replaced(name: str, array: np.ndarray) -> onnx.ModelProto:
    """The Conv -> Add model with initializer `name` replaced (types no longer agree)."""
    model = _conv_add(checked=False)
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(_init(name, array))
    return model


def _float64_output() -> onnx.ModelProto:
    model = _conv_add(checked=False)
    model.graph.value_info.append(_value("a", [1, 4, 6, 6], TensorProto.DOUBLE))
    return model


@pytest.mark.parametrize("case", sorted(INVALID_SKIPS))
def test_skips_inconsistent_models_with_reason(case):
    build, reason = INVALID_SKIPS[case]
    _assert_skips(build(), reason)


def test_reports_when_nothing_follows_a_linear_op():
    nodes = [helper.make_node("Add", ["x", "x"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    model = _model(nodes, [_value("x", [2, 3])], [_value("y", [2, 3])], [])
    _assert_skips(model, "no Add or Sub of a Conv, ConvTranspose, Gemm or MatMul output", "graph")
