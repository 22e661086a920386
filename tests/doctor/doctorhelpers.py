"""Small models and a finder for the doctor tests."""

from __future__ import annotations

import onnx
from onnx import helper

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
