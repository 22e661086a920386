"""`merge-duplicates`: compute each distinct expression once (common subexpressions).

    y1 = Op(a, b; attrs), y2 = Op(a, b; attrs)  ->  y1 = Op(a, b; attrs), readers of y2 read y1

Two nodes are duplicates when they have the same op, domain, attributes and the very
same input tensors (run `dedup-constants` first so equal constants are one tensor).
Exporters repeat whole shape computations (torchvision's SSD repeats one
`NonZero(Greater(scores, t))` per class), and every copy is a layer TensorRT builds.

Two reads of one dimension are duplicates too, whatever tensors they read it from:

    d1 = Gather(Shape(a), k), d2 = Gather(Shape(b), j)  ->  readers of d2 read d1

when dimension k of a and j of b have the same origin (`graph.dimorigin`: equal by
construction for every input, e.g. both the batch of one input through Convs, adds and
a Tile to it; never by a dim_param's name). RAFT reads its batch from twelve
tensors of its refinement loop: with what follows those reads, 1132 -> 1085 nodes
(onnxslim: 1072); the torchvision detectors lose 17-28 nodes each.

Left alone: ops whose result is random (RandomNormal, Bernoulli, ...), nodes with a
subgraph (If/Loop/Scan), nodes outside the standard ONNX domain (a custom op may
have side effects), and a duplicate whose output is a graph output (its name must
stay). Works in every graph (If/Loop/Scan bodies too), each on its own.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    is_graph_output,
    is_onnx,
    node_label,
    replace_in,
)
from graphfix.graph.dimorigin import DimOrigins
from graphfix.graph.walk import opset_of
from graphfix.passes._shape_values import entries_reader, shape_axes
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult

_RANDOM = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"})
_MERGED = "merged duplicate nodes"


class MergeDuplicates(Pass):
    """Merges nodes that compute the same op on the same inputs with the same attributes.

    Handles any deterministic standard-domain op without a subgraph, with any number of
    outputs, and a dimension read from a Shape (a scalar or one-element constant index,
    any start and end of the Shape); nodes are visited in topological order, so chains
    of duplicates merge in one run. Skips, with a note, a duplicate that writes a graph
    output.
    """

    name = "merge-duplicates"
    keeps_computation = True
    summary = "Compute each repeated expression once (same op, attributes and input tensors)"
    Options = NoOptions
    counts_rewrites = True  # each node merged is one rewrite

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        for g in all_graphs(graph):
            seen: dict[tuple, gs.Node] = {}
            # rewiring duplicates changes no tensor's dimensions: one DimOrigins a graph
            origins = DimOrigins(values=entries_reader(opset))
            for node in list(g.nodes):
                key = _dim_key(node, origins) or _key(node)
                if key is None:
                    continue
                first = seen.setdefault(key, node)
                if first is node:
                    continue
                if any(is_graph_output(g, t) for t in node.outputs):
                    result.notes.append(Note(node_label(node), f"it repeats {node_label(first)} "
                                             "but writes a graph output, whose name must stay"))
                    continue
                if not ctx.allow_rewrite(self.name, f"{node_label(node)} into {node_label(first)}"):
                    result.notes.append(Note(node_label(node), LIMIT_REACHED))
                    continue
                for dup, kept in zip(node.outputs, first.outputs, strict=True):
                    for reader in list(dup.outputs):
                        replace_in(reader.inputs, dup, kept)
                node.outputs.clear()
                node.inputs.clear()
                result.counts[_MERGED] += 1
        result.changed = bool(result.counts)
        if not result.changed and not result.notes:
            result.notes.append(
                Note("graph", "no two nodes compute the same op on the same inputs")
            )
        return result


def _key(node: gs.Node) -> tuple | None:
    """What makes two nodes the same computation, or None when the node must not merge."""
    if not node.outputs or not is_onnx(node) or node.op in _RANDOM:
        return None
    attrs = []
    for name, value in sorted(node.attrs.items()):
        key = _attr_key(value)
        if key is None:
            return None
        attrs.append((name, key))
    inputs = tuple(id(t) if t.name else "" for t in node.inputs)
    return (node.op, inputs, len(node.outputs), tuple(attrs))


def _dim_key(node: gs.Node, origins: DimOrigins) -> tuple | None:
    """One dimension read from a Shape (Gather(Shape(x), k), k a constant scalar or
    [k]): the same computation as any other read of a dimension with the same origin
    (`graph.dimorigin`: equal by construction for every input), or None."""
    if not is_onnx(node, "Gather") or len(node.inputs) != 2 or node.attrs.get("axis", 0):
        return None
    shape, index = node.inputs
    if len(shape.inputs) != 1 or not is_onnx(shape.inputs[0], "Shape"):
        return None
    source = shape.inputs[0]
    axes = shape_axes(source) if source.inputs else None
    index_value = constant_value(index) if isinstance(index, gs.Constant) else None
    if (axes is None or index_value is None or index_value.size != 1
            or index_value.dtype.kind not in "iu" or index_value.ndim > 1):
        return None
    k = int(index_value.reshape(-1)[0])
    if not -len(axes) <= k < len(axes):
        return None
    return ("dim", origins.origin(source.inputs[0], axes[k]), index_value.shape,
            index_value.dtype.str)


def _attr_key(value: Any) -> Any:
    if isinstance(value, gs.Graph):
        return None
    if isinstance(value, gs.Constant):
        value = value._values.load() if hasattr(value._values, "load") else value._values
    if isinstance(value, np.ndarray):
        # value.shape, not the contiguous copy's: np.ascontiguousarray makes 0-D arrays 1-D,
        # and a scalar index and a [1] index give Gather outputs of different ranks
        data = np.ascontiguousarray(value)
        return ("array", value.dtype.str, value.shape,
                hashlib.blake2b(data.tobytes()).hexdigest())
    if isinstance(value, (list, tuple)):
        keys = [_attr_key(v) for v in value]
        return None if any(k is None for k in keys) else ("list", tuple(keys))
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (int, str, bytes, bool)) or value is None:
        return (type(value).__name__, value)
    return ("other", type(value).__name__, repr(value))
