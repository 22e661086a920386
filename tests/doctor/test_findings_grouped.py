"""Findings that say the same about several nodes or tensors are one finding naming all of
them: a dynamically quantized model (onnxruntime's quantize_dynamic form) gets one
qdq-uint8 finding, not one per UINT8 tensor; counts stay per node."""

from __future__ import annotations

import numpy as np
import onnx
from doctorhelpers import model, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.doctor import ERROR, WARN, Finding, diagnose
from graphfix.doctor.findings import grouped
from graphfix.trt import parse_target

BLOCKS = 5


def dynamic_quantized(blocks: int = BLOCKS) -> onnx.ModelProto:
    """x -> `blocks` x (DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul), each block
    named q<i>/conv<i>, as onnxruntime.quantization.quantize_dynamic writes Conv."""
    nodes, inits, h = [], [], "x"
    for i in range(blocks):
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [h], [f"hq{i}", f"hs{i}", f"hz{i}"],
                             name=f"q{i}"),
            helper.make_node("ConvInteger", [f"hq{i}", f"w{i}", f"hz{i}", f"wz{i}"],
                             [f"acc{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
            helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], name=f"cast{i}", to=TP.FLOAT),
            helper.make_node("Mul", [f"accf{i}", f"hs{i}"], [f"h{i}"], name=f"scale{i}"),
        ]
        inits += [numpy_helper.from_array(np.ones((2, 2, 3, 3), np.int8), f"w{i}"),
                  numpy_helper.from_array(np.array(0, np.int8), f"wz{i}")]
        h = f"h{i}"
    return model(nodes, [vi("x", TP.FLOAT, [1, 2, 8, 8])], [vi(h, TP.FLOAT, [1, 2, 8, 8])],
                 inits, opset=17)


def test_per_tensor_uint8_findings_are_one_finding_with_every_tensor():
    d = diagnose(dynamic_quantized(), parse_target("10.16"))
    assert [(f.rule, f.op, len(f.nodes), len(f.tensors)) for f in d.findings] == [
        ("op-unsupported", "DynamicQuantizeLinear", BLOCKS, 0),
        ("op-unsupported", "ConvInteger", BLOCKS, 0),
        ("qdq-uint8", "", BLOCKS, 2 * BLOCKS),
    ]
    uint8 = d.findings[2]
    assert uint8.message == ("UINT8 tensor inside the network; TensorRT 10.16 takes UINT8 "
                             "only as a network input or output")
    assert uint8.nodes == tuple(f"DynamicQuantizeLinear 'q{i}'" for i in range(BLOCKS))
    assert uint8.tensors == tuple(t for i in range(BLOCKS) for t in (f"hq{i}", f"hz{i}"))
    assert d.verdict() == f"TensorRT 10.16 will parse this model: no — {2 * BLOCKS} blocking nodes"


def test_json_keeps_every_node_and_counts_nodes():
    data = diagnose(dynamic_quantized(), parse_target("10.16")).to_json()
    assert data["counts"] == {"error": 3, "warn": 0, "info": 0}
    assert data["node_counts"] == {"error": 2 * BLOCKS, "warn": 0, "info": 0}
    uint8 = data["findings"][2]
    assert uint8["nodes"] == [f"DynamicQuantizeLinear 'q{i}'" for i in range(BLOCKS)]
    assert len(uint8["tensors"]) == 2 * BLOCKS


def test_grouping_merges_only_findings_that_say_the_same():
    first = Finding("r", ERROR, "same", nodes=("a", "b"), tensors=("t1",), fix="f")
    second = Finding("r", ERROR, "same", nodes=("b", "c"), tensors=("t2",), fix="f")
    other_fix = Finding("r", ERROR, "same", nodes=("d",), fix="g")
    other_severity = Finding("r", WARN, "same", nodes=("e",), fix="f")
    assert grouped([first, other_fix, second, other_severity]) == [
        Finding("r", ERROR, "same", nodes=("a", "b", "c"), tensors=("t1", "t2"), fix="f"),
        other_fix, other_severity]
