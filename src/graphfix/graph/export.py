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
gs's own code. Two departures, each for a model gs's export breaks: a constant that
more than one graph reads is written once, in the main graph (`_bodies_of`; gs
writes it into each body), and an empty list attribute keeps its type (gs raises).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

import onnx
import onnx_graphsurgeon as gs
from onnx import helper
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, dtype_to_onnx
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues

from graphfix.graph.skeleton import lift_body_weights
from graphfix.graph.walk import all_graphs, tensor_map


def export_model(graph: gs.Graph, max_elements: int | None = None) -> onnx.ModelProto:
    """What `gs.export_onnx(graph, do_type_check=False)` returns (module docstring).
    Like gs, it adds to `graph.import_domains` the domains its nodes use.

    With `max_elements`, what `skeleton.skeleton(export, max_elements)` makes of that,
    without ever copying the large weights: main-graph constants over `max_elements`
    elements are typed graph inputs instead of initializers (shape inference's input);
    so are those of bodies (`lift_body_weights`, after they were exported: rare)."""
    model = onnx.ModelProto()
    model.ir_version = onnx.IR_VERSION
    domains: set[str | None] = set()
    _fill(model.graph, graph, max_elements, domains, _bodies_of(graph), main=True)
    if max_elements is not None:
        lift_body_weights(model.graph, max_elements)
    model.opset_import.extend(_import_domains(graph, domains))
    model.functions.extend(OnnxExporter.export_function(f) for f in graph.functions)
    model.producer_name = graph.producer_name
    model.producer_version = graph.producer_version
    if graph.ir_version is not None:
        model.ir_version = graph.ir_version
    return model


def _import_domains(graph: gs.Graph, used: set[str | None]) -> list:
    """gs's `update_import_domains`, given the domains the nodes use (collected while
    filling them: gs walks every node's bodies again, a fifth of an export): the graph's
    opset imports, and version 1 of each other domain a node uses (in name order)."""
    if graph.import_domains is None:
        graph.import_domains = [helper.make_opsetid("", graph.opset)]
    current = {opset.domain for opset in graph.import_domains}
    for domain in sorted(d for d in used if d is not None and d not in current):
        graph.import_domains.append(helper.make_opsetid(domain, 1))
    return graph.import_domains


class _Bodies(NamedTuple):
    """What the export of a model with bodies works out once for all its graphs."""

    shared: dict[int, gs.Constant]
    """The constants more than one graph reads, by id (`_bodies_of`)."""
    maps: dict[int, dict[str, gs.Tensor]]
    """Each graph's `tensor_map`, by the graph's id."""


def _bodies_of(graph: gs.Graph) -> _Bodies | None:
    """None for a graph without bodies; else the tensor map of every graph and the
    constants that more than one of them reads. gs exports a constant in every graph
    whose nodes read it, so a weight an If's two branches share (optimum's merged
    decoders: the embedding, in both) was written twice, inside each branch, and a weight
    the main graph reads too once more. They are written once, in the main graph, which
    every body can read; a name the main graph already uses for another tensor keeps
    gs's placement, and so do constants of one name in sibling bodies (onnxslim's output
    of silero_vad names a constant alike in both branches of its If, each branch sharing
    its own with a body inside it): written in main, the two were one name twice."""
    graphs = list(all_graphs(graph))
    if len(graphs) == 1:
        return None
    maps = {id(g): tensor_map(g) for g in graphs}
    seen: set[int] = set()
    shared: dict[int, gs.Constant] = {}
    for tensors in maps.values():
        for t in tensors.values():
            if isinstance(t, gs.Constant):
                if id(t) in seen:
                    shared[id(t)] = t
                seen.add(id(t))
    main = maps[id(graph)]
    names = Counter(t.name for t in shared.values())
    shared = {k: t for k, t in shared.items()
              if main.get(t.name, t) is t and names[t.name] == 1}
    return _Bodies(shared, maps)


def _fill(proto: onnx.GraphProto, graph: gs.Graph, max_elements: int | None = None,
          domains: set[str | None] | None = None, bodies: _Bodies | None = None,
          main: bool = False) -> None:
    """Fill `proto` from `graph`; the domains its nodes (bodies included) use are added
    to `domains`. With `bodies` (`_bodies_of` the main graph), the constants several
    graphs read are written in the `main` graph only."""
    if domains is None:
        domains = set()
    for node in graph.nodes:
        domains.add(node.domain)
        fill_node(proto.node.add(), node, domains, bodies)
    proto.name = graph.name
    for t in graph.inputs:
        _fill_value_info(proto.input, t)
    for t in graph.outputs:
        _fill_value_info(proto.output, t)
    tensors = bodies.maps.get(id(graph)) if bodies else None
    if tensors is None:
        tensors = tensor_map(graph)
    constants = [t for t in tensors.values() if isinstance(t, gs.Constant)]
    if bodies and bodies.shared:
        if main:  # also the shared constants its own nodes do not read
            have = {id(t) for t in constants}
            constants += [t for k, t in bodies.shared.items() if k not in have]
        else:
            constants = [t for t in constants if id(t) not in bodies.shared]
    if max_elements is not None:
        listed = {t.name for t in graph.inputs}
        large = {id(t) for t in constants if not isinstance(t._values, SparseValues)
                 and math.prod(t.shape) > max_elements}
        for t in constants:
            if id(t) in large and t.name not in listed:
                proto.input.append(helper.make_tensor_value_info(
                    t.name, _constant_elem_type(t), list(t.shape)))
        constants = [t for t in constants if id(t) not in large]
    proto.initializer.extend(tensor_proto(t) for t in constants
                             if not isinstance(t._values, SparseValues))
    proto.sparse_initializer.extend(OnnxExporter.export_sparse_tensor_proto(t)
                                    for t in constants if isinstance(t._values, SparseValues))
    for t in graph.inputs + graph.outputs:
        tensors.pop(t.name, None)
    for t in tensors.values():
        if isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None):
            _fill_value_info(proto.value_info, t)
    if graph.doc_string:
        proto.doc_string = graph.doc_string


def tensor_proto(t: gs.Constant) -> onnx.TensorProto:
    """What `OnnxExporter.export_tensor_proto(t)` returns, for the caller to copy, without
    writing to the model the constant was imported from. gs hands back a lazily loaded
    constant's own TensorProto with the constant's name written into it: an edit of the
    input model on every export, while the output check's thread reads that model
    (`runtime.outputs`). Here the source is returned as it is when the name is the same,
    and a renamed copy when not."""
    values = t._values
    if not isinstance(values, LazyValues):
        return OnnxExporter.export_tensor_proto(t)
    source = values.tensor
    if source.name == t.name:
        return source
    renamed = onnx.TensorProto()
    renamed.CopyFrom(source)
    renamed.name = t.name
    return renamed


def _fill_value_info(field, tensor: gs.Tensor) -> None:
    """Append what `OnnxExporter.export_value_info_proto(tensor, False)` returns to the
    repeated `field`. A plain tensor type with a numpy dtype and int/str/None dims is
    filled in place (gs converts the dtype through a table it rebuilds per call, then
    `helper.make_tensor_value_info` copies the type twice: a third of an export of
    swin_t); anything else goes through gs."""
    elem = elem_type(tensor.dtype) if tensor.dtype is not None else None
    if elem is None or getattr(tensor, "type", "tensor_type") != "tensor_type" or (
            not plain_shape(tensor.shape)):
        field.append(OnnxExporter.export_value_info_proto(tensor, False))
        return
    info = field.add()
    info.name = tensor.name
    fill_tensor_type(info.type.tensor_type, elem, tensor.shape)


def plain_shape(shape) -> bool:
    """Unknown, or every dim a Python int, a str or None (what `fill_tensor_type` writes)."""
    return shape is None or all(d is None or type(d) in (int, str) for d in shape)


def fill_tensor_type(tensor_type: onnx.TypeProto.Tensor, elem: int, shape) -> None:
    """A tensor type of element type `elem` and `shape` (None: unknown; a `plain_shape`),
    as gs exports it."""
    tensor_type.elem_type = elem
    if shape is not None:
        dims = tensor_type.shape
        dims.SetInParent()  # rank 0 still has a (empty) shape
        for d in shape:
            dim = dims.dim.add()
            if type(d) is int:
                dim.dim_value = d
            elif d is not None:
                dim.dim_param = d


def _constant_elem_type(t: gs.Constant) -> int:
    """The element type the constant's exported initializer would have."""
    if isinstance(t._values, LazyValues):
        return t._values.tensor.data_type
    return dtype_to_onnx(t.export_dtype)


_ELEM_TYPES: dict = {}  # numpy dtype -> ONNX element type, as gs's dtype_to_onnx maps it


def elem_type(dtype) -> int | None:
    """The ONNX element type gs exports a numpy `dtype` as (its `dtype_to_onnx`, which
    rebuilds its table per call, learnt once per dtype); None where gs has none."""
    try:
        elem = _ELEM_TYPES.get(dtype)
    except TypeError:  # unhashable: a TypeProto (optional types)
        return None
    if elem is None and not isinstance(dtype, int):
        try:
            elem = _ELEM_TYPES[dtype] = dtype_to_onnx(dtype)
        except Exception:  # noqa: BLE001 - gs's own export raises it again, as before
            return None
    return elem


def fill_node(proto: onnx.NodeProto, node: gs.Node, domains: set | None = None,
              bodies: _Bodies | None = None) -> None:
    """As `helper.make_node` + gs's `export_attributes`, bodies filled in place (the
    domains their nodes use go to `domains`; `bodies` as `_fill` takes it)."""
    proto.op_type = node.op
    proto.input.extend(t.name for t in node.inputs)
    proto.output.extend(t.name for t in node.outputs)
    if node.name:
        proto.name = node.name
    if node.domain is not None:
        proto.domain = node.domain
    for key, value in node.attrs.items():
        kind = type(value)
        if kind is int or kind is float or kind is str or (
                kind is list and value and _plain_list(value)):
            _fill_plain_attribute(proto.attribute.add(), key, value)
        elif isinstance(value, list) and not value:  # no element to tell the type by
            attr = proto.attribute.add()
            attr.name = key
            attr.type = getattr(value, "attr_type", onnx.AttributeProto.INTS)
        elif isinstance(value, gs.Graph):
            attr = proto.attribute.add()
            attr.name = key
            attr.type = onnx.AttributeProto.GRAPH
            _fill(attr.g, value, None, domains, bodies)
        else:
            proto.attribute.extend(OnnxExporter.export_attributes({key: value}))


def _plain_list(values: list) -> bool:
    """All Python ints or all Python floats (bool, numpy scalars, mixes: gs's way)."""
    first = type(values[0])
    return (first is int or first is float) and all(type(v) is first for v in values)


def _fill_plain_attribute(attr: onnx.AttributeProto, key: str, value) -> None:
    """`helper.make_attribute(key, value)` for a Python int, float, str, or a non-empty
    list of ints or of floats, filled in place (gs's export goes through make_attribute's
    type inference and a copy per attribute: half of the attribute-heavy exports)."""
    attr.name = key
    kind = type(value)
    if kind is int:
        attr.i = value
        attr.type = onnx.AttributeProto.INT
    elif kind is float:
        attr.f = value
        attr.type = onnx.AttributeProto.FLOAT
    elif kind is str:
        attr.s = value.encode("utf-8")
        attr.type = onnx.AttributeProto.STRING
    elif type(value[0]) is int:
        attr.ints.extend(value)
        attr.type = onnx.AttributeProto.INTS
    else:
        attr.floats.extend(value)
        attr.type = onnx.AttributeProto.FLOATS
