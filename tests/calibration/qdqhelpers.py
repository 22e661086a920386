"""Helpers for the Q/DQ tests: tiny models from onnx.helper, observed amaxes, where the
DequantizeLinear outputs go, and the checks every Q/DQ model must pass."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import build_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.calibration import qdq
from graphfix.doctor import diagnose
from graphfix.runtime.session import make_session, run_model
from graphfix.trt import parse_target

F = TP.FLOAT
RNG_SEED = 7


def init(name, shape, seed=0, scale=0.5):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def conv(name, x, w, y, b=None, **attrs):
    return helper.make_node("Conv", [x, w] + ([b] if b else []), [y], name=name, pads=[1, 1, 1, 1],
                            **attrs)


def relu(name, x, y):
    return helper.make_node("Relu", [x], [y], name=name)


def feeds(model, seed=RNG_SEED):
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        out[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def observed_amaxes(model, names, feed_sets):
    """max |x| of each tensor over the feeds, from onnxruntime with the tensors exposed."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names
                                if t not in have)
    session = make_session(exposed)
    amax = dict.fromkeys(names, 0.0)
    for f in feed_sets:
        for name, value in zip(names, session.run(list(names), f), strict=True):
            amax[name] = max(amax[name], float(np.abs(value).max()))
    return amax


def quantized(model, **plan_options):
    """(plan, Q/DQ model) with amaxes observed on the same seeded inputs."""
    plan = qdq.plan(model, **plan_options)
    return plan, qdq.quantize(model, plan, observed_amaxes(model, plan.activations,
                                                           [feeds(model)]))


def dq_sources(model):
    """{(reader node, input index): source} for every input that is a DQ output; source is
    the activation the Q read, or the INT8 initializer's float name (without _quantized)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producers.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = producers.get(dq.input[0])
            out[(node.name, i)] = q.input[0] if q is not None else \
                dq.input[0].removesuffix("_quantized")
    return out


def assert_trt_form(model):
    """INT8 zero points of 0 on every Q/DQ, INT8 weights, checker, no doctor Q/DQ finding."""
    onnx.checker.check_model(model, full_check=True)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert nodes
    for node in nodes:
        assert len(node.input) == 3
        zero = inits[node.input[2]]
        assert zero.dtype == np.int8 and not zero.any()
        assert (inits[node.input[1]] > 0).all()
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            assert inits[node.input[0]].dtype == np.int8
            assert np.abs(inits[node.input[0]]).max() <= 127
    for trt in ("8.6", "10.16"):
        assert diagnose(model, parse_target(trt), only=["qdq"]).findings == []


def assert_close_to_fp32(fp32, q, rel=0.1):
    f = feeds(fp32)
    ref, out = run_model(fp32, f), run_model(q, f)
    assert list(ref) == list(out)
    for name in ref:
        span = float(np.abs(ref[name]).max())
        np.testing.assert_allclose(out[name], ref[name], atol=rel * span, rtol=0, err_msg=name)


def dq_node(model, reads):
    return next(n for n in model.graph.node
                if n.op_type == "DequantizeLinear" and n.input[0] == reads)


def node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def conv_relu_conv():
    nodes = [conv("conv1", "x", "w1", "c1", "b1"), relu("relu", "c1", "r"),
             conv("conv2", "r", "w2", "y")]
    inits = [init("w1", [8, 3, 3, 3], 1), init("b1", [8], 2), init("w2", [4, 8, 3, 3], 3)]
    return build_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", None)], inits)


def residual_model():
    """x -conv1-> relu -> r; r -conv2-> m; Add(m, r) -> relu -> y (r read by both)."""
    nodes = [conv("conv1", "x", "w1", "c1"), relu("relu1", "c1", "r"),
             conv("conv2", "r", "w2", "m", "b2"),
             helper.make_node("Add", ["m", "r"], ["s"], name="add"), relu("relu2", "s", "y")]
    inits = [init("w1", [4, 3, 3, 3], 1), init("w2", [4, 4, 3, 3], 2), init("b2", [4], 3)]
    return build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)], inits)


def gemm_model(trans_b):
    w_shape = [4, 8] if trans_b else [8, 4]
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="gemm", transB=trans_b)]
    return build_model(nodes, [vi("x", [2, 8])], [vi("y", None)],
                       [init("w", w_shape, 1), init("b", [4], 2)])
