"""Doctor's verdict does not depend on how a constant is stored: an initializer and a
Constant node holding the same tensor get the same findings (issue 16: after `run` moved
SSDlite's INT64_MAX NMS constant into an initializer, int64-overflow appeared)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from doctorhelpers import findings, model, one, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.graph.protos import graph_protos


def as_constant_nodes(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every initializer (subgraphs too) turned into a Constant node."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for g in reversed(list(graph_protos(out.graph))):  # inner first: parents copy nodes
        inits = list(g.initializer)
        del g.initializer[:]
        names = {t.name for t in inits}
        kept = [i for i in g.input if i.name not in names]
        del g.input[:]
        g.input.extend(kept)
        nodes = [helper.make_node("Constant", [], [t.name], value=t, name=f"const_{t.name}")
                 for t in inits] + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return out


def as_initializers(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every Constant node (its `value` tensor; subgraphs too) turned into
    an initializer of its graph."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for g in reversed(list(graph_protos(out.graph))):  # inner first: parents copy nodes
        nodes, inits = [], []
        for node in g.node:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and \
                    value is not None:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
                tensor.name = node.output[0]
                inits.append(tensor)
            else:
                nodes.append(node)
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(inits)
    return out


def verdict(m: onnx.ModelProto, trt: str) -> Counter:
    return Counter((f.rule, f.severity) for f in findings(m, trt))


@pytest.mark.parametrize("trt", ["8.6", "10.16"])
def test_ssdlite_gets_one_verdict_whichever_way_its_constants_are_stored(shared_model, trt):
    original = onnx.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    assert any(n.op_type == "Constant" for n in original.graph.node)
    assert original.graph.initializer
    expected = verdict(original, trt)
    assert verdict(as_constant_nodes(original), trt) == expected
    assert verdict(as_initializers(original), trt) == expected


@pytest.mark.parametrize("stored", ["initializer", "Constant value", "Constant value_ints"])
def test_an_int64_constant_outside_int32_is_an_error_however_stored(stored):
    values = [1, 2**31 + 5]
    add = helper.make_node("Add", ["x", "big"], ["y"], name="add")
    if stored == "initializer":
        nodes, inits = [add], [numpy_helper.from_array(np.array(values, np.int64), "big")]
    elif stored == "Constant value":
        nodes, inits = [helper.make_node("Constant", [], ["big"], value=numpy_helper.from_array(
            np.array(values, np.int64)), name="c"), add], []
    else:
        nodes, inits = [helper.make_node("Constant", [], ["big"], value_ints=values,
                                         name="c"), add], []
    m = model(nodes, [vi("x", TP.INT64, [2])], [vi("y", TP.INT64, [2])], inits)
    f = one(m, "8.6", "int64-overflow", only=["int64"])
    assert (f.severity, f.tensors) == ("error", ("big",)) and str(2**31 + 5) in f.message


@pytest.mark.parametrize("stored", ["initializer", "Constant value"])
def test_an_int64_max_nms_limit_is_no_overflow_however_stored(stored):
    """The parser clamps max_output_boxes_per_class to INT32_MAX itself (nms_notes.md),
    so torchvision's sys.maxsize keeps its meaning: no int64-overflow at 8.6."""
    limit = numpy_helper.from_array(np.array([2**63 - 1], np.int64), "limit")
    nms = helper.make_node("NonMaxSuppression", ["b", "s", "limit"], ["sel"], name="nms")
    nodes, inits = [nms], [limit]
    if stored == "Constant value":
        nodes, inits = [helper.make_node("Constant", [], ["limit"], value=limit), nms], []
    m = model(nodes, [vi("b", TP.FLOAT, [1, 10, 4]), vi("s", TP.FLOAT, [1, 1, 10])],
              [vi("sel", TP.INT64, [None, 3])], inits)
    assert "int64-overflow" not in {f.rule for f in findings(m, "8.6", only=["int64"])}
    limit_as_add = model([helper.make_node("Add", ["x", "limit"], ["y"])],
                         [vi("x", TP.INT64, [1])], [vi("y", TP.INT64, [1])], [limit])
    assert one(limit_as_add, "8.6", "int64-overflow", only=["int64"]).tensors == ("limit",)
