"""A weightless stand-in of a model for structural checks.

`onnx.checker` and shape inference serialize the whole model, weights included,
which costs about as much as saving it (and fails past 2 GB). Neither needs the
weights' values: only their names, types and shapes, plus the values of small
tensors that feed shapes (Reshape targets, Slice bounds). The skeleton keeps
initializers up to `max_elements` elements and turns larger ones into graph
inputs of the same type and shape, which both tools treat alike. So it does with
the large initializers of nested graphs (If/Loop/Scan bodies), which become inputs
of the main graph that the body reads from the outer scope (`lift_body_weights`):
a torch.cond export's branch weights in external data were otherwise read by
onnx.checker, relative to the working directory. Functions are kept as they are.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from graphfix.graph.protos import graph_protos

MAX_ELEMENTS = 1024


def skeleton(model: onnx.ModelProto, max_elements: int = MAX_ELEMENTS) -> onnx.ModelProto:
    """The model with its large main-graph initializers replaced by typed graph inputs."""
    src = model.graph
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    graph = out.graph  # filled in place: a copy of the whole graph less
    graph.name = src.name
    graph.node.extend(src.node)
    graph.output.extend(src.output)
    graph.value_info.extend(src.value_info)
    graph.sparse_initializer.extend(src.sparse_initializer)
    listed = {vi.name for vi in src.input}
    graph.input.extend(src.input)
    for t in src.initializer:
        if math.prod(t.dims) <= max_elements:
            graph.initializer.append(t)
        elif t.name not in listed:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    lift_body_weights(graph, max_elements)
    return out


def lift_body_weights(graph: onnx.GraphProto, max_elements: int = MAX_ELEMENTS) -> int:
    """Move the initializers over `max_elements` elements of every nested graph of
    `graph` (edited in place: a copy) to typed inputs of `graph`, which the bodies then
    read from the outer scope; returns how many. A name the main graph already has is
    left where it is."""
    taken = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    lifted = 0
    for body in list(graph_protos(graph))[1:]:
        keep = []
        for t in body.initializer:
            if math.prod(t.dims) <= max_elements or t.name in taken:
                keep.append(t)
                continue
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type,
                                                             list(t.dims)))
            taken.add(t.name)
            lifted += 1
        if len(keep) != len(body.initializer):
            del body.initializer[:]
            body.initializer.extend(keep)
    return lifted
