"""ONNX shape inference for an onnx-graphsurgeon graph, written back onto its tensors."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix.graph.skeleton import skeleton
from graphfix.graph.walk import all_graphs

Dim = int | str | None


def infer_shapes(graph: gs.Graph, clear: bool = False) -> int:
    """Run ONNX shape inference (with data propagation) and store the shapes it finds.

    With `clear`, every tensor's shape except the graphs' inputs is dropped first, so
    stale shapes (after an input shape changed) cannot survive. Otherwise a tensor
    takes the inferred shape only where that is more static than what it has.
    Inference runs on a weightless skeleton of the exported graph. Returns how many
    tensors got a new shape.
    """
    keep = {id(t) for g in all_graphs(graph) for t in g.inputs}
    tensors = [t for g in all_graphs(graph) for t in g.tensors().values()
               if isinstance(t, gs.Variable) and id(t) not in keep]
    if clear:
        for t in tensors:
            t.shape = None
    with G_LOGGER.suppress():
        model = gs.export_onnx(graph, do_type_check=False)
    inferred = onnx.shape_inference.infer_shapes(skeleton(model), data_prop=True)
    shapes = {}
    for g in _graph_protos(inferred.graph):
        for vi in list(g.value_info) + list(g.output):
            if vi.type.tensor_type.HasField("shape"):
                shapes[vi.name] = [_dim(d) for d in vi.type.tensor_type.shape.dim]
    updated = 0
    for t in tensors:
        new = shapes.get(t.name)
        if new is not None and _static_count(new) > _static_count(t.shape):
            t.shape = new
            updated += 1
    return updated


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    if d.HasField("dim_value"):
        return d.dim_value
    return d.dim_param or None


def _static_count(shape: list[Dim] | None) -> int:
    """-1 for an unknown shape, else how many dims are known numbers (rank counts too)."""
    if shape is None:
        return -1
    return sum(isinstance(d, int) and d >= 0 for d in shape)


def _graph_protos(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield g
    for node in g.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graph_protos(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graph_protos(sub)
