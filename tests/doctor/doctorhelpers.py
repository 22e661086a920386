"""Small models and finders for the doctor tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import Finding, diagnose
from graphfix.trt import parse_target


def model(nodes, inputs, outputs, inits=(), opset=17, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 8
    return m


def vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def findings(m: onnx.ModelProto, trt: str, only=None) -> list[Finding]:
    return diagnose(m, parse_target(trt), only=only).findings


def one(m: onnx.ModelProto, trt: str, rule: str, only=None) -> Finding:
    found = [f for f in findings(m, trt, only) if f.rule == rule]
    assert len(found) == 1, findings(m, trt, only)
    return found[0]


def rule_ids(m: onnx.ModelProto, trt: str, only=None) -> set[str]:
    return {f.rule for f in findings(m, trt, only)}


def said(m, trt: str, rule: str = "restriction-violated") -> list[tuple[str, str]]:
    """(message, fact) of each finding of `rule` from the restrictions rule."""
    return [(f.message, f.fact) for f in findings(m, trt, ["restrictions"]) if f.rule == rule]


def messages(m, trt: str, rule: str = "restriction-violated") -> list[str]:
    return [message for message, _ in said(m, trt, rule)]


def recurrent(op: str, activations=None, direction="bidirectional", opset=17, **attrs):
    """One `op` node reading x [seq 5, batch 2, input 3] with hidden size 4."""
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if direction == "bidirectional" else 1
    w = numpy_helper.from_array(np.zeros((dirs, gates * 4, 3), np.float32), "w")
    r = numpy_helper.from_array(np.zeros((dirs, gates * 4, 4), np.float32), "r")
    if activations is not None:
        attrs["activations"] = activations
    node = helper.make_node(op, ["x", "w", "r"], ["y"], name="rnn", hidden_size=4,
                            direction=direction, **attrs)
    return model([node], [vi("x", TensorProto.FLOAT, [5, 2, 3])],
                 [vi("y", TensorProto.FLOAT, None)], [w, r], opset=opset)
