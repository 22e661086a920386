"""ModelProto <-> onnx_graphsurgeon.Graph, keeping model-level fields gs drops."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper
from onnx_graphsurgeon.exporters.onnx_exporter import constant_to_onnx_tensor
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import weights
from graphfix.graph.export import export_model
from graphfix.graph.importer import import_model
from graphfix.graph.protos import all_nodes, graph_protos
from graphfix.graph.rewire import constant_value, replace_in
from graphfix.graph.skeleton import MAX_ELEMENTS, skeleton
from graphfix.graph.walk import all_graphs, tensor_map


def to_graph(model: onnx.ModelProto) -> gs.Graph:
    """Import a model into onnx-graphsurgeon (weights stay lazy, not copied).

    Negative dim values, which some exporters (paddle2onnx) write for "unknown" although
    ONNX dims are >= 0, become unknown dims, so shape inference does not see a conflict.
    An IR version below `MIN_IR_VERSION` is raised to it (see there).
    """
    with G_LOGGER.suppress():
        # gs.import_onnx's objects, built directly, with the main graph's type attributes
        graph, bodies = import_model(model, keep_types=True)
    if graph.ir_version is not None and 0 < graph.ir_version < MIN_IR_VERSION:
        graph.ir_version = MIN_IR_VERSION
    # gs keeps the model's own opset_import container; a copy keeps `model` untouched.
    if graph.import_domains is not None:
        graph.import_domains = [
            onnx.helper.make_opsetid(d.domain, d.version) for d in graph.import_domains
        ]
    for g in all_graphs(graph):
        for t in tensor_map(g).values():
            if isinstance(t, gs.Variable) and t.shape is not None and any(
                isinstance(d, int) and d < 0 for d in t.shape
            ):
                t.shape = [None if isinstance(d, int) and d < 0 else d for d in t.shape]
            elif isinstance(t, gs.Constant) and type(t._values) is LazyValues and (
                weights.is_deferred(t._values.tensor)
            ):
                t._values = _DeferredValues(t._values.tensor)
                # export keeps the proto (and its reference) while the values are lazy;
                # values a pass sets are written inline, never marked external
                t.data_location = None
    if bodies:  # gs imported them, and dropped their nodes' type attributes
        _keep_type_attributes(model, graph)
    return graph


def _keep_type_attributes(model: onnx.ModelProto, graph: gs.Graph) -> None:
    """gs 0.6.1 drops TYPE_PROTO attributes on import (Optional's `type`: the node is
    then invalid); put them back (gs exports a TypeProto value as one), matching nodes
    by op and outputs."""
    typed: dict[tuple, dict[str, onnx.TypeProto]] = {}
    for node in all_nodes(model.graph):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TYPE_PROTO:
                typed.setdefault((node.op_type, tuple(node.output)), {})[attr.name] = attr.tp
    if not typed:
        return
    for g in all_graphs(graph):
        for node in g.nodes:
            extra = typed.get((node.op, tuple(t.name for t in node.outputs)))
            if extra:
                node.attrs.update(extra)


class _DeferredValues(LazyValues):
    """gs's lazy values of a weight left in its file (`graphfix.weights`): read from the
    file on each load; export writes the reference back. `sample`: `weights.sample` of
    the values when they were at hand as they were written (`spilled`), else None."""

    sample: bytes | None = None

    def load(self) -> np.ndarray:
        return weights.to_array(self.tensor)


MIN_IR_VERSION = 4
"""The lowest IR version a graph is exported with. Up to IR 3 every initializer had to be
listed as a graph input too (old exports and the classic ONNX Model Zoo "-7" models);
onnx-graphsurgeon holds weights as constants, never as inputs, so a rewritten IR-3
graph broke that rule (onnx.checker refused fold-bn's new weights, and the version
converter found its initializers undefined). IR 4 drops the rule and reads the same
opsets (onnx.checker and onnxruntime accept opset 7-9 models at IR 4)."""


def to_model(graph: gs.Graph, like: onnx.ModelProto) -> onnx.ModelProto:
    """Export `graph`, carrying over `like`'s metadata, version fields and IR version (at
    least `MIN_IR_VERSION`)."""
    model = export(graph)
    model.ir_version = max(like.ir_version, MIN_IR_VERSION) if like.ir_version else 0
    model.producer_name = like.producer_name
    model.producer_version = like.producer_version
    model.domain = like.domain
    model.model_version = like.model_version
    model.doc_string = like.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(like.metadata_props)
    return model


_GS_EXPORTS = ("tensor_type", "sequence_type", "sparse_tensor_type")


SETTLE_MIN_ELEMENTS = MAX_ELEMENTS + 1
"""New in-memory constants with at least this many elements are kept as their
TensorProto or spilled (`settle_constants`): exactly those the skeleton leaves out
(`graph.skeleton`), so a spilled tensor never reaches onnx.checker, which could not find
its file. Was 64 KiB: synthetic_1000's 2,000 folded 36 KB Conv weights stayed arrays,
copied into every export (--no-check peak 375 MB -> 240 MB, with the check 588 MB ->
323 MB, same time and output)."""


def settle_constants(graph: gs.Graph, spill=None) -> int:
    """Keep each large constant a pass made as a numpy array as its exported TensorProto
    instead (gs's lazy values over that proto), or, given a `graphfix.spill.Spill`, as a
    reference to its bytes written there (deferred, like the input's weights); returns
    how many.

    gs exports an array constant by copying its bytes twice (`tobytes`, then into a new
    TensorProto), at every export: after fold-bn made fcos_resnet50_fpn's 100 MB of
    weights arrays, each later pass's export cost 0.14 s. A lazy constant exports its
    proto as it is, and its array is freed (passes never keep or write into arrays they
    did not create, `passes.base`). Reading it (`graph.constant_value`) gives the same
    values; the export is byte-identical.

    Only main-graph initializers that no body reads are spilled: gs exports a constant a
    body reads as an initializer of that body too, and a deferred tensor is a main-graph
    initializer by contract (`graphfix.weights`; onnx.checker looks for the file of any
    other)."""
    count = 0
    main = {id(n) for n in graph.nodes}
    for g in all_graphs(graph):
        for t in tensor_map(g).values():
            values = getattr(t, "_values", None)
            if (isinstance(values, np.ndarray) and values.size >= SETTLE_MIN_ELEMENTS
                    and values.dtype.num < 256 and values.dtype != object
                    and t.data_location is None and t.export_dtype == t.dtype):
                if spill is not None and g is graph and all(id(n) in main
                                                            for n in t.outputs):
                    t._values = spilled(spill, t.name, values)
                else:
                    t._values = LazyValues(constant_to_onnx_tensor(t))
                count += 1
    return count


def spilled(spill, name: str, values: np.ndarray) -> LazyValues:
    """`values` written to `spill` (`graphfix.spill.Spill`), as the lazy values of a
    constant named `name` that refer to them there (`settle_constants`). They carry their
    sample (`weights.sample`), taken from the array: dedup-constants compares samples
    first, and read 2,000 of them back from the spill on synthetic_1000 (50 ms)."""
    return deferred_values(spill.put(name, values), weights.sample(values))


def deferred_values(tensor: onnx.TensorProto, sample: bytes | None = None) -> LazyValues:
    """gs's lazy values of a deferred tensor (`graphfix.weights`), with its `sample` when
    the caller has it."""
    deferred = _DeferredValues(tensor)
    deferred.sample = sample
    return deferred


def export_skeleton(graph: gs.Graph) -> onnx.ModelProto:
    """`skeleton(export(graph))` without copying the weights it drops (graph.skeleton):
    for onnx.checker and shape inference."""
    return export(graph, MAX_ELEMENTS)


def export(graph: gs.Graph, max_elements: int | None = None) -> onnx.ModelProto:
    """gs.export_onnx, also for tensors of optional type: onnx-graphsurgeon 0.6.1 imports
    them (its dtype: the element's TypeProto) but its exporter knows tensor, sequence and
    sparse types only (UnboundLocalError). They are exported untyped, then given their
    type back by name; so are tensors whose type the import kept (`kept_type`: a
    sequence of maps, which gs would write as a sequence of tensors)."""
    odd: dict[str, onnx.TypeProto] = {}
    held = []
    for g in all_graphs(graph):
        for tensor in tensor_map(g).values():
            kind = getattr(tensor, "type", "tensor_type")
            kept = tensor.__dict__.get("kept_type")  # graph.importer: a type gs cannot write
            if kept is not None and isinstance(tensor, gs.Variable):
                odd[tensor.name] = kept
                held.append((tensor, tensor.dtype))
                tensor.dtype = None
            elif (isinstance(tensor, gs.Variable) and kind not in _GS_EXPORTS
                    and tensor.dtype is not None):
                odd[tensor.name] = _type_proto(kind, tensor.dtype)
                held.append((tensor, tensor.dtype))
                tensor.dtype = None
    try:
        with G_LOGGER.suppress():
            model = export_model(graph, max_elements)
    finally:
        for tensor, dtype in held:
            tensor.dtype = dtype
    if odd:
        for g in graph_protos(model.graph):
            for info in [*g.input, *g.output, *g.value_info]:
                if info.name in odd and odd[info.name] is not None:
                    info.type.CopyFrom(odd[info.name])
    return model


def _type_proto(kind: str, dtype) -> onnx.TypeProto | None:
    """The TypeProto of an optional-typed tensor from gs's dtype for it (None: unknown)."""
    if kind == "optional_type" and isinstance(dtype, onnx.TypeProto):
        proto = onnx.TypeProto()
        proto.optional_type.elem_type.CopyFrom(dtype)
        return proto
    return None


def runnable_model(graph: gs.Graph) -> onnx.ModelProto:
    """The graph as it is now, exported for a pass that must run it in onnxruntime (to
    plan or verify a rewrite), with an IR version the installed onnxruntime loads
    (`io.compatible_ir_version`). Exporting leaves the graph as it was (`to_model`
    relies on that too)."""
    from graphfix.io import compatible_ir_version

    model = export(graph)
    model.ir_version = compatible_ir_version(model)
    return model


def node_proto(node: gs.Node) -> onnx.NodeProto:
    """A graphsurgeon node as an ONNX NodeProto (TENSOR attributes as tensors), for code
    that builds from protos (reference forms, plugin migrations)."""
    attrs = {}
    for key, value in node.attrs.items():
        if isinstance(value, gs.Constant):
            value = numpy_helper.from_array(np.asarray(constant_value(value)), value.name)
        attrs[key] = value
    return helper.make_node(node.op, [t.name for t in node.inputs],
                            [t.name for t in node.outputs], name=node.name,
                            domain=node.domain or None, **attrs)


def light_model(graph: gs.Graph) -> tuple[onnx.ModelProto, dict[str, gs.Constant]]:
    """The graph as a model for an ONNX tool that rewrites whole models (the version
    converter, the inliner), and the large constants kept out of it.

    `skeleton` turns main-graph initializers over its size limit into typed graph
    inputs; such tools never read weights of that size (the converter's adapters read
    small constant inputs such as axes, splits and scales). `adopt` puts them back.
    """
    model = export(graph)
    light = skeleton(model)
    listed = {vi.name for vi in model.graph.input}
    moved = {vi.name for vi in light.graph.input} - listed
    constants = {name: t for g in all_graphs(graph) for name, t in tensor_map(g).items()
                 if name in moved and isinstance(t, gs.Constant)}  # bodies' too
    return light, {name: constants[name] for name in moved}


def adopt(graph: gs.Graph, new: gs.Graph, large: dict[str, gs.Constant]) -> None:
    """Move `new`'s contents (imported from a `light_model` a tool rewrote) into `graph`;
    the large constants come back as the same objects, for every reader: If/Loop/Scan
    bodies read them from the outer scope too (a torch.cond export's branch weights),
    and a body still reading the stand-in input would get the weight as its own
    initializer at export."""
    inputs = [t for t in new.inputs if t.name not in large]
    standins = {id(t): large[t.name] for t in new.inputs if t.name in large}
    if standins:
        for g in all_graphs(new):
            for node in g.nodes:
                for t in list(node.inputs):
                    if id(t) in standins:
                        replace_in(node.inputs, t, standins[id(t)])
    moved = set(standins)
    graph.nodes = new.nodes
    graph.inputs = inputs
    graph.outputs = [large[t.name] if id(t) in moved else t for t in new.outputs]
    graph.opset = new.opset
    graph.import_domains = new.import_domains
