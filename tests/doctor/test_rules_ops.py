"""Doctor's operator, dtype, opset and domain rules, for TensorRT versions where the
answers differ."""

from __future__ import annotations

import numpy as np
import pytest
from doctorhelpers import findings, model, one, rule_ids, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F = TP.FLOAT


def test_op_listed_unsupported_in_8_6_is_supported_in_10():
    m = model([helper.make_node("Hardmax", ["x"], ["y"], name="hm")],
              [vi("x", F, [2, 5])], [vi("y", F, [2, 5])], opset=13)
    f = one(m, "8.6", "op-unsupported", only=["operators"])
    assert (f.severity, f.nodes, f.op) == ("error", ("Hardmax 'hm'",), "Hardmax")
    assert f.fact == "matrix 8.6: Hardmax listed as unsupported"
    assert f.fix.startswith("TensorRT 9.3 supports it")
    assert "op-unsupported" not in rule_ids(m, "10.16", only=["operators"])


def test_conv_integer_is_unsupported_everywhere():
    m = model([helper.make_node("ConvInteger", ["x", "w"], ["y"], name="ci")],
              [vi("x", TP.UINT8, [1, 1, 4, 4]), vi("w", TP.UINT8, [1, 1, 3, 3])],
              [vi("y", TP.INT32, [1, 1, 2, 2])], opset=13)
    for trt in ("8.6", "10.16"):
        f = one(m, trt, "op-unsupported", only=["operators"])
        assert f.nodes == ("ConvInteger 'ci'",)
        assert f.severity == "error"


def test_node_inside_an_if_branch_is_named_with_its_path():
    then = helper.make_graph([helper.make_node("Hardmax", ["x"], ["t"], name="inner")],
                             "then", [], [vi("t", F, [2, 5])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")],
                              "else", [], [vi("e", F, [2, 5])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                            else_branch=other)
    m = model([node], [vi("c", TP.BOOL, []), vi("x", F, [2, 5])], [vi("y", F, [2, 5])],
              opset=13)
    f = one(m, "8.6", "op-unsupported", only=["operators"])
    assert f.nodes == ("If 'branch'.then_branch > Hardmax 'inner'",)


def test_bool_input_to_an_op_listed_for_floats_only():
    m = model([helper.make_node("NonZero", ["x"], ["y"], name="nz")],
              [vi("x", TP.BOOL, [4])], [vi("y", TP.INT64, [1, None])])
    f = one(m, "10.16", "dtype-unsupported", only=["dtypes"])
    assert (f.severity, f.nodes, f.tensors) == ("error", ("NonZero 'nz'",), ("x",))
    assert f.fact == "matrix 10.16: NonZero supported types FP32, FP16"


def test_before_9_int64_is_checked_as_the_int32_the_parser_makes_of_it():
    """ReduceMin lists FP32/FP16 at 8.6: INT64 becomes INT32, which is not listed either,
    so the finding says so and names a Cast (int64-to-int32 would change nothing);
    with that Cast applied the finding is gone. 10.16 lists INT64."""
    def reduce_min(cast: bool):
        nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT, name="cast")] \
            if cast else []
        nodes.append(helper.make_node("ReduceMin", ["xf" if cast else "x"], ["y"],
                                      keepdims=0, name="rmin"))
        return model(nodes, [vi("x", TP.INT64, [3])],
                     [vi("y", TP.FLOAT if cast else TP.INT64, [])])

    f = one(reduce_min(False), "8.6", "dtype-unsupported", only=["dtypes"])
    assert "INT64 (INT32 after the parser's cast)" in f.message
    assert "Cast" in f.fix and "would not help" in f.fix
    assert "dtype-unsupported" not in rule_ids(reduce_min(True), "8.6", only=["dtypes"])
    assert "dtype-unsupported" not in rule_ids(reduce_min(False), "10.16", only=["dtypes"])


def test_int64_is_cast_down_by_8_6_but_checked_from_9():
    m = model([helper.make_node("Equal", ["a", "b"], ["y"], name="eq")],
              [vi("a", TP.INT64, [3]), vi("b", TP.INT64, [3])], [vi("y", TP.BOOL, [3])])
    assert "dtype-unsupported" not in rule_ids(m, "8.6", only=["dtypes"])  # cast to INT32
    assert "dtype-unsupported" not in rule_ids(m, "10.16", only=["dtypes"])  # INT64 listed
    conv = model([helper.make_node("Conv", ["x", "w"], ["y"], name="c")],
                 [vi("x", TP.DOUBLE, [1, 1, 3, 3]), vi("w", TP.DOUBLE, [1, 1, 1, 1])],
                 [vi("y", TP.DOUBLE, [1, 1, 3, 3])])
    f = one(conv, "10.16", "dtype-cast-down", only=["dtypes"])
    assert f.severity == "warn"


def test_opset_above_the_parser_range():
    m = model([helper.make_node("Gelu", ["x"], ["y"], name="g")],
              [vi("x", F, [3])], [vi("y", F, [3])], opset=20)
    f = one(m, "8.6", "opset-out-of-range", only=["opset"])
    assert (f.severity, f.fix) == ("error", "opset{version=17}")
    assert "opset-out-of-range" not in rule_ids(m, "10.16", only=["opset"])


def test_onnxruntime_contrib_ops_suggest_unfuse_contrib():
    fused = helper.make_node("FusedConv", ["x", "w"], ["y"], name="fc", domain="com.microsoft",
                             activation="Relu")
    gelu = helper.make_node("BiasGelu", ["y", "b"], ["z"], name="bg", domain="com.microsoft")
    inverse = helper.make_node("Inverse", ["z"], ["v"], name="inv", domain="com.microsoft")
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    b = numpy_helper.from_array(np.ones((1,), np.float32), "b")
    m = model([fused, gelu, inverse], [vi("x", F, [1, 1, 3, 3])], [vi("v", F, [1, 1, 3, 3])],
              [w, b], domains=["com.microsoft"])
    found = {f.op: f for f in findings(m, "10.16", only=["domains"])}
    assert found["com.microsoft::FusedConv"].fix == "unfuse-contrib"
    assert found["com.microsoft::FusedConv"].nodes == ("FusedConv 'fc'",)
    assert found["com.microsoft::BiasGelu"].fix == "unfuse-contrib"  # a transformer fusion
    assert found["com.microsoft::Inverse"].severity == "error"
    assert "unfuse-contrib" not in found["com.microsoft::Inverse"].fix


def test_dynamic_quantize_linear_is_unsupported_in_8_6_and_10():
    m = model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dq")],
              [vi("x", F, [4])], [vi("y", TP.UINT8, [4]), vi("s", F, []), vi("z", TP.UINT8, [])])
    for trt in ("8.6", "10.1"):
        f = one(m, trt, "op-unsupported", only=["operators"])
        assert (f.nodes, f.severity) == (("DynamicQuantizeLinear 'dq'",), "error")


def test_quantizer_ops_point_at_qdq_not_at_export_or_optimizations():
    """Probe 4: onnxruntime's QOperator and dynamic-quantization ops were told to
    "re-export without onnxruntime's offline optimizations", which does not remove them."""
    from graphfix.doctor.rules_ops import QUANTIZED_FIX

    u8 = TP.UINT8
    conv = model([helper.make_node("QLinearConv", ["x", "s", "z", "w", "s", "z", "s", "z"],
                                   ["y"], name="qc")],
                 [vi("x", u8, [1, 1, 4, 4]), vi("w", u8, [1, 1, 3, 3]), vi("s", F, []),
                  vi("z", u8, [])], [vi("y", u8, [1, 1, 2, 2])], opset=13)
    add = model([helper.make_node("QLinearAdd", ["a", "s", "z", "a", "s", "z", "s", "z"],
                                  ["y"], name="qa", domain="com.microsoft")],
                [vi("a", u8, [4]), vi("s", F, []), vi("z", u8, [])], [vi("y", u8, [4])],
                opset=13, domains=["com.microsoft"])
    assert one(conv, "10.16", "op-unsupported", only=["operators"]).fix == QUANTIZED_FIX
    found = one(add, "10.16", "domain-nonstandard", only=["domains"])
    assert found.fix == QUANTIZED_FIX
    assert "offline optimizations" not in found.fix and "graphfix calibrate" in found.fix


@pytest.mark.parametrize("op", ["MatMulNBits", "DequantizeLinear"])
def test_weight_only_and_contrib_qdq_quantizer_ops_point_at_qdq(op):
    """onnxruntime's 4-bit weight-only quantizer writes com.microsoft::MatMulNBits, and its
    QDQ with contrib ops com.microsoft Q/DQ: quantizer output, not offline optimizations."""
    from graphfix.doctor.rules_ops import QUANTIZED_FIX

    node = helper.make_node(op, ["a", "b"], ["y"], name="q", domain="com.microsoft")
    m = model([node], [vi("a", F, [2, 4]), vi("b", TP.UINT8, [4, 1, 2])], [vi("y", F, [2, 4])],
              domains=["com.microsoft"])
    assert one(m, "10.16", "domain-nonstandard", only=["domains"]).fix == QUANTIZED_FIX
