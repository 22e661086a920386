"""Doctor's Q/DQ rules: zero points, UINT8, per-channel axes, pairs nothing fuses with;
for TensorRT versions whose data differ (8.6 lists no UINT8, 9.3+ allow it at the I/O)."""

from __future__ import annotations

import numpy as np
from doctorhelpers import findings, model, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F = TP.FLOAT
ONLY = ["qdq"]
REQUANTIZE = "re-quantize symmetrically (graphfix calibrate)"


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def act_qdq(x="x", zp_value=0, zp_dtype=np.int8, with_zp=True, tag=""):
    """x -> Q -> DQ -> x_dq (per-tensor), with its initializers."""
    ins = [x, f"s{tag}", f"zp{tag}"] if with_zp else [x, f"s{tag}"]
    nodes = [helper.make_node("QuantizeLinear", ins, [f"xq{tag}"], name=f"q{tag}"),
             helper.make_node("DequantizeLinear", [f"xq{tag}", *ins[1:]], [f"{x}_dq"],
                              name=f"dq{tag}")]
    inits = [const(f"s{tag}", 0.05)] + ([const(f"zp{tag}", zp_value, zp_dtype)] if with_zp
                                         else [])
    return nodes, inits


def weight_dq(shape, axis, name="w", channels=None):
    """A constant INT8 weight with per-channel scales along `axis`."""
    channels = shape[axis] if channels is None else channels
    node = helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_zp"],
                            [name], name=f"dq_{name}", axis=axis)
    inits = [const(f"{name}_q", np.ones(shape), np.int8),
             const(f"{name}_s", np.full(channels, 0.1)),
             const(f"{name}_zp", np.zeros(channels), np.int8)]
    return node, inits


def conv_model(axis=0, zp_value=0, op="Conv", w_shape=(8, 4, 3, 3), out_c=8):
    nodes, inits = act_qdq(zp_value=zp_value)
    wnode, winits = weight_dq(w_shape, axis)
    nodes += [wnode, helper.make_node(op, ["x_dq", "w"], ["y"], name="conv")]
    return model(nodes, [vi("x", F, [1, 4, 8, 8])], [vi("y", F, None)], [*inits, *winits],
                 opset=13)


def by_rule(m, trt, rule):
    return [f for f in findings(m, trt, ONLY) if f.rule == rule]


def test_clean_symmetric_int8_model_has_no_findings():
    for trt in ("8.6", "10.16"):
        assert findings(conv_model(), trt, ONLY) == []


def test_models_without_qdq_have_no_findings():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F, [2])],
              [vi("y", F, [2])])
    assert findings(m, "8.6", ONLY) == [] and findings(m, "11.1", ONLY) == []


def test_non_zero_zero_point_on_q_and_dq():
    found = by_rule(conv_model(zp_value=3), "10.16", "qdq-zero-point")
    assert [f.nodes for f in found] == [("QuantizeLinear 'q'",), ("DequantizeLinear 'dq'",)]
    q = found[0]
    assert (q.severity, q.fix, q.tensors) == ("error", REQUANTIZE, ("zp",))
    assert 'matrix 10.16: QuantizeLinear restriction "`y_zero_point` must be 0"' in q.fact
    assert '"zero point must be 0 (symmetric)"' in q.fact
    assert "`x_zero_point` must be zero" in found[1].fact


def test_zero_points_are_grouped_per_op_type():
    first, inits = act_qdq(zp_value=2)
    second, more = act_qdq(x="h", zp_value=-4, tag="2")
    relu = helper.make_node("Relu", ["x_dq"], ["h"], name="r")
    m = model([*first, relu, *second], [vi("x", F, [4])], [vi("h_dq", F, [4])],
              [*inits, *more], opset=13)
    found = by_rule(m, "8.6", "qdq-zero-point")
    assert [(f.op, f.nodes, f.tensors) for f in found] == [
        ("QuantizeLinear", ("QuantizeLinear 'q'", "QuantizeLinear 'q2'"), ("zp", "zp2")),
        ("DequantizeLinear", ("DequantizeLinear 'dq'", "DequantizeLinear 'dq2'"),
         ("zp", "zp2"))]
    assert found[0].message.startswith("2 QuantizeLinear nodes with a non-zero zero point "
                                       "(-4, 2)")


def test_quantize_without_zero_point_is_uint8_cited_per_version():
    nodes, inits = act_qdq(with_zp=False)
    m = model([*nodes, helper.make_node("Relu", ["x_dq"], ["y"], name="r")],
              [vi("x", F, [4])], [vi("y", F, [4])], inits, opset=13)
    assert by_rule(m, "10.16", "qdq-zero-point") == []  # no zero point means 0
    new = by_rule(m, "10.16", "qdq-uint8")
    assert [(f.nodes, f.severity) for f in new] == [
        (("QuantizeLinear 'q'",), "error"), (("DequantizeLinear 'dq'",), "error")]
    assert new[0].fix.startswith(REQUANTIZE)
    assert ('matrix 10.16 notes: "Note: UINT8 is only supported as network input or output '
            'tensor types."') in new[0].fact
    assert "DequantizeLinear supported types INT8, FP8, FP4, INT4" in new[1].fact
    old = by_rule(m, "8.6", "qdq-uint8")
    assert [f.nodes for f in old] == [f.nodes for f in new]
    assert "matrix 8.6: supported ONNX data types DOUBLE, FLOAT32, FLOAT16, INT8, BOOL " \
           "(no UINT8)" in old[0].fact
    assert "8.6: zero-point UINT8 rejected" in old[0].fact
    assert "zero-point UINT8" not in by_rule(m, "8.5", "qdq-uint8")[0].fact  # 8.6 importer


def test_uint8_zero_point_128_is_both_asymmetric_and_uint8():
    nodes, inits = act_qdq(zp_value=128, zp_dtype=np.uint8)
    m = model([*nodes, helper.make_node("Relu", ["x_dq"], ["y"], name="r")],
              [vi("x", F, [4])], [vi("y", F, [4])], inits, opset=13)
    rules = [f.rule for f in findings(m, "10.16", ONLY)]
    assert rules.count("qdq-zero-point") == 2 and rules.count("qdq-uint8") == 2


def test_uint8_tensor_inside_the_network_any_op():
    nodes = [helper.make_node("Cast", ["x"], ["u"], name="to_u8", to=TP.UINT8),
             helper.make_node("Cast", ["u"], ["y"], name="to_f", to=TP.FLOAT)]
    m = model(nodes, [vi("x", F, [3])], [vi("y", F, [3])])
    f = by_rule(m, "10.16", "qdq-uint8")
    assert [(x.nodes, x.tensors, x.severity) for x in f] == [
        (("Cast 'to_u8'",), ("u",), "error")]
    io = model([helper.make_node("Cast", ["x"], ["y"], name="c", to=TP.FLOAT)],
               [vi("x", TP.UINT8, [3])], [vi("y", F, [3])])
    assert by_rule(io, "10.16", "qdq-uint8") == []  # UINT8 network input: allowed there
    old = by_rule(io, "8.6", "qdq-uint8")
    assert [(x.tensors, x.severity) for x in old] == [(("x",), "warn")]


def test_conv_weight_scales_on_the_wrong_axis():
    f = by_rule(conv_model(axis=1), "10.16", "qdq-axis")
    assert [(x.nodes, x.severity) for x in f] == [
        (("DequantizeLinear 'dq_w'", "Conv 'conv'"), "warn")]
    assert f[0].fix == f"{REQUANTIZE}: per-channel scales on axis 0"
    assert "per-axis only where #scales == dim size" in f[0].fact
    assert by_rule(conv_model(axis=0), "10.16", "qdq-axis") == []


def test_conv_transpose_wants_axis_1():
    wrong = conv_model(axis=0, op="ConvTranspose", w_shape=(4, 6, 3, 3))
    assert by_rule(wrong, "8.6", "qdq-axis")[0].fix.endswith("axis 1")
    right = conv_model(axis=1, op="ConvTranspose", w_shape=(4, 6, 3, 3))
    assert by_rule(right, "8.6", "qdq-axis") == []


def gemm_model(axis, trans_b, op="Gemm"):
    shape = (6, 4) if trans_b else (4, 6)
    wnode, winits = weight_dq(shape, axis)
    attrs = {"transB": trans_b} if op == "Gemm" else {}
    node = helper.make_node(op, ["x", "w"], ["y"], name="mm", **attrs)
    return model([wnode, node], [vi("x", F, [2, 4])], [vi("y", F, [2, 6])], winits, opset=13)


def test_gemm_and_matmul_output_channel_axis():
    assert by_rule(gemm_model(1, 0), "10.16", "qdq-axis") == []
    assert by_rule(gemm_model(0, 1), "10.16", "qdq-axis") == []
    assert by_rule(gemm_model(0, 0), "10.16", "qdq-axis")[0].fix.endswith("axis 1")
    assert by_rule(gemm_model(1, 1), "10.16", "qdq-axis")[0].fix.endswith("axis 0")
    assert by_rule(gemm_model(1, 0, "MatMul"), "10.16", "qdq-axis") == []
    bad = by_rule(gemm_model(0, 0, "MatMul"), "10.16", "qdq-axis")
    assert bad[0].nodes == ("DequantizeLinear 'dq_w'", "MatMul 'mm'")


def test_weight_quantized_through_a_q_dq_pair_counts_as_a_weight():
    q = helper.make_node("QuantizeLinear", ["wf", "w_s", "w_zp"], ["w_q"], name="qw", axis=1)
    dq = helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dqw", axis=1)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    inits = [const("wf", np.ones((8, 8, 1, 1))), const("w_s", np.full(8, 0.1)),
             const("w_zp", np.zeros(8), np.int8)]
    m = model([q, dq, conv], [vi("x", F, [1, 8, 4, 4])], [vi("y", F, None)], inits, opset=13)
    f = by_rule(m, "10.16", "qdq-axis")
    assert [x.nodes for x in f] == [("DequantizeLinear 'dqw'", "Conv 'conv'")]


def test_per_axis_activation_scales_and_scale_count_mismatch():
    q = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="q", axis=1)
    dq = helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["y"], name="dq", axis=1)
    inits = [const("s", np.full(4, 0.1)), const("zp", np.zeros(4), np.int8)]
    m = model([q, dq], [vi("x", F, [1, 4, 2, 2])], [vi("y", F, [1, 4, 2, 2])], inits, opset=13)
    f = by_rule(m, "8.6", "qdq-axis")
    assert [(x.nodes, x.severity) for x in f] == [(("DequantizeLinear 'dq'",), "warn")]
    assert "activations per-tensor" in f[0].fact
    wnode, winits = weight_dq((8, 4, 3, 3), 0, channels=3)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
    bad = model([wnode, conv], [vi("x", F, [1, 4, 8, 8])], [vi("y", F, None)], winits, opset=13)
    f = by_rule(bad, "10.16", "qdq-axis")
    assert [(x.nodes, x.severity) for x in f] == [(("DequantizeLinear 'dq_w'",), "error")]


def test_blocked_int4_weights_are_not_per_axis():
    dq = helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], name="dq_w", axis=0,
                          block_size=2)
    inits = [numpy_helper.from_array(np.ones((4, 6), np.int8), "w_q"),
             const("w_s", np.full((2, 6), 0.1))]
    mm = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    m = model([dq, mm], [vi("x", F, [2, 4])], [vi("y", F, [2, 6])], inits, opset=21)
    assert findings(m, "10.16", ONLY) == []


def qdq_into(*ops):
    nodes, inits = act_qdq()
    prev = "x_dq"
    for i, op in enumerate(ops):
        ins = [prev, "shape"] if op == "Reshape" else [prev]
        nodes.append(helper.make_node(op, ins, [f"t{i}"], name=f"n{i}"))
        prev = f"t{i}"
    if "Conv" in ops:
        inits.append(const("wc", np.ones((2, 2, 1, 1))))
        nodes[-1].input.append("wc")
    inits.append(const("shape", [1, 2, 4, 4], np.int64))
    return model(nodes, [vi("x", F, [1, 2, 4, 4])], [vi(prev, F, None)], inits, opset=13)


def test_q_dq_pair_feeding_only_ops_that_do_not_run_in_int8():
    f = by_rule(qdq_into("Sigmoid"), "10.16", "qdq-unfusable")
    assert [(x.nodes, x.severity) for x in f] == [
        (("QuantizeLinear 'q'", "DequantizeLinear 'dq'"), "warn")]
    assert f[0].message.startswith("a Q/DQ pair feeds only Sigmoid, which")
    assert "calibration_notes.md (d)" in f[0].fact
    assert f[0].fix.startswith("remove the pair")
    assert by_rule(qdq_into("Reshape", "Sigmoid"), "10.16", "qdq-unfusable")
    assert by_rule(qdq_into("Reshape", "Conv"), "10.16", "qdq-unfusable") == []
    assert by_rule(qdq_into("Relu", "Conv"), "10.16",
                   "qdq-unfusable")  # Relu is not a commuting op in the notes
    assert by_rule(qdq_into("Conv"), "8.6", "qdq-unfusable") == []


def test_node_inside_an_if_branch_is_named_with_its_path():
    nodes, inits = act_qdq(zp_value=5)
    then = helper.make_graph(nodes, "then", [], [vi("x_dq", F, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")],
                              "else", [], [vi("e", F, [4])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                            else_branch=other)
    m = model([node], [vi("c", TP.BOOL, []), vi("x", F, [4])], [vi("y", F, [4])], inits,
              opset=13)
    f = by_rule(m, "10.16", "qdq-zero-point")
    assert [x.nodes for x in f] == [("If 'branch'.then_branch > QuantizeLinear 'q'",),
                                    ("If 'branch'.then_branch > DequantizeLinear 'dq'",)]
