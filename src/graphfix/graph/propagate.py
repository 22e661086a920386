"""ONNX shape inference node by node, forward from the tensors that changed.

fold-constants folds in rounds: a Reshape target or Slice bound that one round made
constant gives its output a static shape, which a Shape further down can fold in the
next round. A whole-graph inference per round re-exports and re-infers every node
(swin_t: five rounds of 0.03-0.1 s); `propagate_shapes` re-infers only the readers of
what changed and, where their outputs get more static, the readers of those, with
ONNX's own per-node inference (`onnx.shape_inference.infer_node_outputs`), so a node
gets the shape whole-graph inference would give it from the same input shapes.

It sees less than whole-graph inference: no symbolic data propagation (a Reshape target
built from a Shape of a dynamic tensor), nothing inside If/Loop/Scan bodies, no node
outside ONNX's domain. Callers that need the fixed point run `shapes.infer_shapes`
once when propagation stops finding more (fold-constants does).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from graphfix.graph.dtypes import np_dtype
from graphfix.graph.export import elem_type, fill_node, fill_tensor_type, plain_shape
from graphfix.graph.rewire import constant_value
from graphfix.graph.shapes import proto_dim, static_count
from graphfix.graph.walk import bodies, opset_of

DATA_ELEMENTS = 64
"""Constant inputs up to this many elements are passed as data (a Reshape's target, a
Slice's bounds); larger ones (weights) only as types, which is all inference reads of
them."""


def propagate_shapes(graph: gs.Graph, changed: Iterable[gs.Tensor],
                     fold: Callable[[gs.Node], list[gs.Tensor]] | None = None,
                     reshaped: Callable[[gs.Node], list | None] | None = None) -> int:
    """Re-infer the main graph's nodes that read `changed` tensors, and onward from every
    node whose outputs got a more static shape or a dtype; returns how many tensors
    changed. Nodes are visited in graph order (in a topologically sorted graph each
    once; in any other, a node is visited again when an input changes after it). A
    shape is only refined: a new one must have the old rank and agree with its static
    dims.

    `fold(node)`, given, is asked first for each node visited: the tensors it made
    constants (fold-constants folds a Shape whose input just got static dims, and the
    shape arithmetic after it, on the way: one propagation instead of a round each);
    their readers are visited next, and the node is not inferred.

    `reshaped(node)`, given, is asked for each Reshape visited whose target is not a
    constant: its output dims as far as the target's entries say (`Dim` values: ints,
    names, None), what whole-graph inference's data propagation finds from a target
    built of Shape dims and constants (maxvit_t at a dynamic batch: [batch, 64, 8, 7, 8,
    7]). Such targets are small integer tensors: the readers of every one visited are
    visited too, since its entries may have become known without its shape changing."""
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    queue: list[tuple[int, int]] = []
    queued: set[int] = set()
    nodes: dict[int, gs.Node] = {}

    def push(readers: Iterable[gs.Node]) -> None:
        for node in readers:
            key = id(node)
            if key in position and key not in queued:
                queued.add(key)
                nodes[key] = node
                heapq.heappush(queue, (position[key], key))

    for t in changed:
        push(t.outputs)
    opsets = [onnx.helper.make_opsetid(d.domain, d.version)
              for d in graph.import_domains or ()] or [onnx.helper.make_opsetid("", graph.opset)]
    opset = opset_of(graph)
    known = _Inputs()
    updated = 0
    while queue:
        _, key = heapq.heappop(queue)
        queued.discard(key)
        node = nodes.pop(key)
        if not node.outputs:
            continue  # folded while queued
        made = fold(node) if fold is not None else []
        if made:
            for t in made:
                known.forget(t)
                updated += 1
                push(t.outputs)
            continue
        inferred = _infer(node, opset, opsets, known)
        for t in node.outputs:
            proto = inferred.get(t.name)
            if proto is not None and isinstance(t, gs.Variable) and _refine(t, proto):
                known.types.pop(id(t), None)
                updated += 1
                push(t.outputs)
        if reshaped is None:
            continue
        if node.op == "Reshape" and node.domain in (None, "", "ai.onnx"):
            out, dims = node.outputs[0], reshaped(node)
            if dims is not None and isinstance(out, gs.Variable) and _refine_dims(out, dims):
                known.types.pop(id(out), None)
                updated += 1
                push(out.outputs)
        for t in node.outputs:
            if _shape_value(t):
                push(t.outputs)
    return updated


def _shape_value(t: gs.Tensor) -> bool:
    """A 0-D/1-D integer tensor of at most `DATA_ELEMENTS` entries (a shape's value)."""
    shape = t.shape
    return (t.dtype is not None and np.dtype(t.dtype).kind in "iu" and shape is not None
            and len(shape) <= 1 and all(isinstance(d, int) for d in shape)
            and math.prod(shape) <= DATA_ELEMENTS)


class _Inputs:
    """Each input's type (None: unknown) and constant data, made once per propagation
    (a tensor is often read by several nodes)."""

    def __init__(self) -> None:
        self.types: dict[int, onnx.TypeProto | None] = {}
        self.data: dict[int, onnx.TensorProto | None] = {}

    def forget(self, t: gs.Tensor) -> None:
        """`t` became a constant: its type and data are read again."""
        self.types.pop(id(t), None)
        self.data.pop(id(t), None)

    def type(self, t: gs.Tensor) -> onnx.TypeProto | None:
        key = id(t)
        if key not in self.types:
            self.types[key] = _type(t)
        return self.types[key]

    def value(self, t: gs.Tensor) -> onnx.TensorProto | None:
        key = id(t)
        if key not in self.data:
            value = None
            if isinstance(t, gs.Constant) and t.shape is not None and (
                    math.prod(t.shape) <= DATA_ELEMENTS):
                array = constant_value(t)
                if array is not None:
                    value = numpy_helper.from_array(np.asarray(array), t.name)
            self.data[key] = value
        return self.data[key]


@functools.cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def _infer(node: gs.Node, opset: int, opsets, known: _Inputs) -> dict[str, onnx.TypeProto]:
    """ONNX's inferred output types of one node, {} where it cannot say."""
    if node.domain not in (None, "", "ai.onnx") or any(True for _ in bodies(node)):
        return {}
    schema = _schema(node.op, opset)
    if schema is None:
        return {}
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for t in node.inputs:
        if not t.name:
            continue
        proto = known.type(t)
        if proto is None:
            return {}
        types[t.name] = proto
        value = known.value(t)
        if value is not None:
            data[t.name] = value
    proto = onnx.NodeProto()
    fill_node(proto, node)
    try:
        return onnx.shape_inference.infer_node_outputs(schema, proto, types, data,
                                                       opset_imports=opsets)
    except Exception:  # noqa: BLE001 - onnx raises InferenceError, RuntimeError, ...
        return {}


def _type(t: gs.Tensor) -> onnx.TypeProto | None:
    """The tensor's type as the export whole-graph inference reads writes it
    (`export.fill_tensor_type`), None where its dtype is unknown or its shape is not
    plain."""
    if getattr(t, "type", "tensor_type") != "tensor_type" or t.dtype is None:
        return None
    elem = elem_type(t.dtype)
    if elem is None or not plain_shape(t.shape):
        return None
    proto = onnx.TypeProto()
    fill_tensor_type(proto.tensor_type, elem, t.shape)
    return proto


def _refine(t: gs.Variable, proto: onnx.TypeProto) -> bool:
    """Give `t` the inferred shape where more static and agreeing, and the dtype where it
    has none; whether either changed."""
    if not proto.HasField("tensor_type"):
        return False
    tensor_type = proto.tensor_type
    changed = False
    if t.dtype is None and tensor_type.elem_type:
        dtype = np_dtype(tensor_type.elem_type)
        if dtype is not None:
            t.dtype = dtype
            changed = True
    if not tensor_type.HasField("shape"):
        return changed
    return _refine_dims(t, [proto_dim(d) for d in tensor_type.shape.dim]) or changed


def _refine_dims(t: gs.Variable, new: list) -> bool:
    """Give `t` the shape `new` (ints, names, None) where it has none, or where `new` is
    more static and agrees with its static dims; whether it did."""
    old = t.shape
    if old is not None:
        if len(new) != len(old) or static_count(new) <= static_count(old):
            return False
        if any(_known(a) and _known(b) and a != b for a, b in zip(old, new, strict=True)):
            return False  # a conflict: whole-graph inference decides, not this
    t.shape = list(new)
    return True


def _known(d) -> bool:
    """A static dim, as `shapes.static_count` counts them."""
    return isinstance(d, int) and d >= 0
