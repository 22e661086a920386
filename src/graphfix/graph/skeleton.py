"""A weightless stand-in of a model for structural checks.

`onnx.checker` and shape inference serialize the whole model, weights included,
which costs about as much as saving it (and fails past 2 GB). Neither needs the
weights' values: only their names, types and shapes, plus the values of small
tensors that feed shapes (Reshape targets, Slice bounds). The skeleton keeps
initializers up to `max_elements` elements and turns larger ones into graph
inputs of the same type and shape, which both tools treat alike. Nested graphs
and functions are kept as they are.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

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
    return out
