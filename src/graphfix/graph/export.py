"""onnx-graphsurgeon's export, written straight into one ModelProto.

`gs.export_onnx` builds every NodeProto with `helper.make_node`, copies them all into a
GraphProto (`helper.make_graph`), then copies that GraphProto into the ModelProto
(`helper.make_model`), and does the same for every If/Loop/Scan body, which a parent's
copy then copies again. The manager exports after every pass that changed the graph,
and fold-constants for each round of shape inference: on fcos_resnet50_fpn (2,457
nodes, 30 bodies) that was a quarter of `graphfix run --no-check`. Here each proto is
filled in place. The result is byte-identical to gs's (tests/graph/test_export.py
compares them on every shared model and on bodies, functions and attribute references);
what gs does per tensor (constants, value infos, attributes other than bodies) is still
gs's own code.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, update_import_domains
from onnx_graphsurgeon.ir.tensor import SparseValues

from graphfix.graph.walk import tensor_map


def export_model(graph: gs.Graph) -> onnx.ModelProto:
    """What `gs.export_onnx(graph, do_type_check=False)` returns (module docstring).
    Like gs, it adds to `graph.import_domains` the domains its nodes use."""
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION
    _fill(model.graph, graph)
    model.opset_import.extend(update_import_domains(graph))
    model.functions.extend(OnnxExporter.export_function(f) for f in graph.functions)
    model.producer_name = graph.producer_name
    model.producer_version = graph.producer_version
    if graph.ir_version is not None:
        model.ir_version = graph.ir_version
    return model


def _fill(proto: onnx.GraphProto, graph: gs.Graph) -> None:
    for node in graph.nodes:
        fill_node(proto.node.add(), node)
    proto.name = graph.name
    proto.input.extend(OnnxExporter.export_value_info_proto(t, False) for t in graph.inputs)
    proto.output.extend(OnnxExporter.export_value_info_proto(t, False) for t in graph.outputs)
    tensors = tensor_map(graph)
    constants = [t for t in tensors.values() if isinstance(t, gs.Constant)]
    proto.initializer.extend(OnnxExporter.export_tensor_proto(t) for t in constants
                             if not isinstance(t._values, SparseValues))
    proto.sparse_initializer.extend(OnnxExporter.export_sparse_tensor_proto(t)
                                    for t in constants if isinstance(t._values, SparseValues))
    for t in graph.inputs + graph.outputs:
        tensors.pop(t.name, None)
    proto.value_info.extend(
        OnnxExporter.export_value_info_proto(t, False) for t in tensors.values()
        if isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None))
    if graph.doc_string:
        proto.doc_string = graph.doc_string


def fill_node(proto: onnx.NodeProto, node: gs.Node) -> None:
    """As `helper.make_node` + gs's `export_attributes`, bodies filled in place."""
    proto.op_type = node.op
    proto.input.extend(t.name for t in node.inputs)
    proto.output.extend(t.name for t in node.outputs)
    if node.name:
        proto.name = node.name
    if node.domain is not None:
        proto.domain = node.domain
    for key, value in node.attrs.items():
        if isinstance(value, gs.Graph):
            attr = proto.attribute.add()
            attr.name = key
            attr.type = onnx.AttributeProto.GRAPH
            _fill(attr.g, value)
        else:
            proto.attribute.extend(OnnxExporter.export_attributes({key: value}))
