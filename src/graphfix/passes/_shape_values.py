"""Small integer shape values, entry by entry (private: `fold-reshape-targets`, `eliminate-noops`).

`evaluate(tensor)` reads a 0-D/1-D integer tensor computed from Shape() as a `Value`:
each entry is a known int, `Dim(T, i)` (dimension i of tensor T, size not known
statically) or `Opaque` (an element of an integer tensor this module does not
evaluate). Read: initializers and Constant nodes, Shape (start/end, opset 15+), Cast
to an integer type, Identity, Concat, Slice, Gather (axis 0), Unsqueeze/Squeeze of
0-D/1-D values, Equal (1 or 0 where known: a dimension, or a value built from
dimensions by Add/Mul/Max/Min, is never negative) and Where entry by entry where its
condition is known. Nothing here edits a graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from graphfix.graph import constant_value, is_onnx
from graphfix.passes._noop_shapes import slice_params, squeeze_axes

# A Cast between these keeps any dimension below 2**31 (exporters cast Shape to INT32 and back).
_INT_TYPES = {TensorProto.INT64, TensorProto.INT32}


@dataclass(frozen=True)
class Dim:
    """Dimension `axis` of `tensor`, size not known statically."""

    tensor: gs.Tensor
    axis: int


@dataclass(frozen=True)
class Opaque:
    """Element `index` of an integer `tensor` not evaluated here (B * nW, a ReduceProd).
    A Reshape target can use one as its single -1 entry, which means the same whatever
    it is (the Reshape's element count fixes it)."""

    tensor: gs.Tensor
    index: int


Entry = int | Dim | Opaque


@dataclass(frozen=True)
class Value:
    """A small integer tensor, symbolically: its entries, and whether it is 0-D."""

    entries: tuple[Entry, ...]
    scalar: bool = False


def evaluate(tensor: gs.Tensor, opset: int, depth: int = 0) -> Value | str:
    """`tensor` as entries, or why it cannot be evaluated."""
    value = constant_value(tensor)
    if value is not None:
        if value.ndim > 1 or value.dtype.kind not in "iu":
            return f"'{tensor.name}' is a constant that is not a 0-D/1-D integer"
        return Value(tuple(int(v) for v in value.reshape(-1)), value.ndim == 0)
    if len(tensor.inputs) != 1 or depth > 32:
        return f"'{tensor.name}' is not computed by a node of this graph"
    node = tensor.inputs[0]
    rule = _RULES.get(node.op) if is_onnx(node) else None
    if rule is None:
        return _opaque(tensor) or (
            f"'{tensor.name}' is computed by {node.op}, which this pass does not evaluate")
    return rule(node, opset, depth + 1)


def entries_reader(opset: int):
    """`evaluate` as `graph.dimorigin.DimOrigins` reads a shape value: an int, (tensor,
    axis) for a dimension, None for unknown; None when it cannot read the value."""
    def entries(tensor: gs.Tensor) -> list | None:
        value = evaluate(tensor, opset)
        if isinstance(value, str):
            return None
        return [(e.tensor, e.axis) if isinstance(e, Dim) else e if isinstance(e, int) else None
                for e in value.entries]
    return entries


def _opaque(tensor: gs.Tensor) -> Value | None:
    """An integer tensor of known 0-D/1-D static shape as unknown entries, else None."""
    shape, dtype = tensor.shape, tensor.dtype
    if (shape is None or len(shape) > 1 or not all(isinstance(d, int) and d >= 0 for d in shape)
            or dtype is None or np.dtype(dtype).kind not in "iu"):
        return None
    count = shape[0] if shape else 1
    return Value(tuple(Opaque(tensor, i) for i in range(count)), scalar=not shape)


def shape_axes(node: gs.Node) -> range | None:
    """The axes of its input a Shape node gives (its `start` and `end`, clamped as ONNX
    says), or None when the input's rank is not known."""
    x = node.inputs[0]
    if x.shape is None:
        return None
    rank = len(x.shape)
    start, end = int(node.attrs.get("start", 0)), node.attrs.get("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = rank if end is None else int(end)
    end = max(0, min(rank, end + rank if end < 0 else end))
    return range(start, max(start, end))


def _shape(node: gs.Node, opset: int, depth: int) -> Value | str:
    x, axes = node.inputs[0], shape_axes(node)
    if axes is None:
        return f"the rank of '{x.name}' is not known"
    return Value(tuple(d if isinstance(d, int) and d >= 0 else Dim(x, i)
                       for i, d in ((i, x.shape[i]) for i in axes)))


def _passthrough(node: gs.Node, opset: int, depth: int) -> Value | str:
    if node.op == "Cast" and int(node.attrs["to"]) not in _INT_TYPES:
        return f"Cast '{node.outputs[0].name}' casts to a type other than INT32/INT64"
    return evaluate(node.inputs[0], opset, depth)


def _concat(node: gs.Node, opset: int, depth: int) -> Value | str:
    entries: list[Entry] = []
    for inp in node.inputs:
        part = evaluate(inp, opset, depth)
        if isinstance(part, str):
            return part
        entries.extend(part.entries)
    return Value(tuple(entries))


def _slice(node: gs.Node, opset: int, depth: int) -> Value | str:
    data = evaluate(node.inputs[0], opset, depth)
    if isinstance(data, str):
        return data
    params = slice_params(node, opset)
    if isinstance(params, str):
        return f"Slice '{node.outputs[0].name}': {params}"
    starts, ends, axes, steps = params
    if len(starts) != 1 or axes[0] not in (0, -1) or steps[0] == 0:
        return f"Slice '{node.outputs[0].name}' is not a 1-D slice"
    return Value(tuple(list(data.entries)[slice(starts[0], ends[0], steps[0])]))


def _gather(node: gs.Node, opset: int, depth: int) -> Value | str:
    data = evaluate(node.inputs[0], opset, depth)
    index = constant_value(node.inputs[1])
    if isinstance(data, str):
        return data
    if index is None or index.ndim > 1 or int(node.attrs.get("axis", 0)) != 0:
        return f"Gather '{node.outputs[0].name}' has no constant 0-D/1-D index on axis 0"
    n = len(data.entries)
    picked = [data.entries[int(i)] for i in index.reshape(-1) if -n <= int(i) < n]
    if len(picked) != index.size:
        return f"Gather '{node.outputs[0].name}' indexes out of range"
    return Value(tuple(picked), index.ndim == 0)


def _unsqueeze(node: gs.Node, opset: int, depth: int) -> Value | str:
    data = evaluate(node.inputs[0], opset, depth)
    if isinstance(data, str):
        return data
    axes = squeeze_axes(node, opset)
    if not data.scalar or axes is None or isinstance(axes, str) or list(axes) not in ([0], [-1]):
        return f"{node.op} '{node.outputs[0].name}' does not turn a 0-D value into 1-D"
    return Value(data.entries)


def _squeeze(node: gs.Node, opset: int, depth: int) -> Value | str:
    data = evaluate(node.inputs[0], opset, depth)
    if isinstance(data, str):
        return data
    axes = squeeze_axes(node, opset)
    if data.scalar or len(data.entries) != 1 or isinstance(axes, str) or (
            axes is not None and list(axes) not in ([0], [-1])):
        return f"{node.op} '{node.outputs[0].name}' does not turn a 1-element value into 0-D"
    return Value(data.entries, scalar=True)


def _equal(node: gs.Node, opset: int, depth: int) -> Value | str:
    """Entry by entry, 1 or 0 where known (a dimension, or a value `never_negative` says is
    >= 0, never equals a negative k), else opaque."""
    pair = _broadcast_values(node, opset, depth)
    if isinstance(pair, str):
        return pair
    (a, b), scalar = pair
    out = node.outputs[0]
    entries: list[Entry] = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, int) and isinstance(y, int):
            entries.append(int(x == y))
        elif _never_negative(x) and isinstance(y, int) and y < 0 or (
                _never_negative(y) and isinstance(x, int) and x < 0):
            entries.append(0)
        elif isinstance(x, Dim) and x == y:
            entries.append(1)
        else:
            entries.append(Opaque(out, i))
    return Value(tuple(entries), scalar)


def _never_negative(entry: Entry) -> bool:
    """Whether `entry`, not a known int, is >= 0 whatever the input sizes are."""
    return isinstance(entry, Dim) or (
        isinstance(entry, Opaque) and never_negative(entry.tensor))


_ALL_INPUTS = {"Identity", "Flatten", "Concat", "Add", "Mul", "Max", "Min"}
_FIRST_INPUT = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Gather", "Slice", "Expand", "Tile"}
"""Ops whose elements are >= 0 when those of all their inputs are, or of their first."""


def never_negative(tensor: gs.Tensor, depth: int = 0, seen: dict[int, bool] | None = None
                   ) -> bool:
    """Whether every element of an integer `tensor` is >= 0: sizes from Shape/Size, non-negative
    constants, and what Add, Mul, Max, Min, Concat or a reshaping, gathering or slicing
    op makes of them (exporters write `past + seq` so; like onnxslim, it takes sums and
    products of sizes not to overflow int64). `seen` keeps shared inputs from being read
    twice."""
    seen = {} if seen is None else seen
    if id(tensor) not in seen:
        seen[id(tensor)] = False  # also what a cycle gives
        seen[id(tensor)] = _never_negative_from(tensor, depth, seen)
    return seen[id(tensor)]


def _never_negative_from(tensor: gs.Tensor, depth: int, seen: dict[int, bool]) -> bool:
    value = constant_value(tensor)
    if value is not None:
        return value.dtype.kind in "iu" and bool(np.all(value >= 0))
    if len(tensor.inputs) != 1 or depth > 32:
        return False
    node = tensor.inputs[0]
    if not is_onnx(node) or not node.inputs:
        return False
    if node.op in ("Shape", "Size"):
        return True
    if node.op == "Cast" and int(node.attrs["to"]) not in _INT_TYPES:
        return False
    data = (node.inputs[:1] if node.op in _FIRST_INPUT
            else node.inputs if node.op in _ALL_INPUTS else [])
    return bool(data) and all(never_negative(t, depth + 1, seen) for t in data
                              if not t.is_empty())


def _where(node: gs.Node, opset: int, depth: int) -> Value | str:
    """The chosen entry where the condition is known, else opaque."""
    parts = _broadcast_values(node, opset, depth)
    if isinstance(parts, str):
        return parts
    (cond, a, b), scalar = parts
    out = node.outputs[0]
    entries = [x if c == 1 and isinstance(c, int) else y if c == 0 and isinstance(c, int)
               else Opaque(out, i) for i, (c, x, y) in enumerate(zip(cond, a, b, strict=True))]
    return Value(tuple(entries), scalar)


def _broadcast_values(node: gs.Node, opset: int, depth: int
                      ) -> tuple[list[tuple[Entry, ...]], bool] | str:
    """The inputs' entries, each 1-entry value repeated to the others' length."""
    values = []
    for inp in node.inputs:
        value = evaluate(inp, opset, depth)
        if isinstance(value, str):
            return value
        values.append(value)
    length = max(len(v.entries) for v in values)
    if any(len(v.entries) not in (1, length) for v in values):
        return f"{node.op} '{node.outputs[0].name}' broadcasts values of different lengths"
    return ([v.entries * length if len(v.entries) == 1 else v.entries for v in values],
            all(v.scalar for v in values))


_RULES = {
    "Equal": _equal,
    "Where": _where,
    "Shape": _shape,
    "Cast": _passthrough,
    "Identity": _passthrough,
    "Concat": _concat,
    "Slice": _slice,
    "Gather": _gather,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
}
