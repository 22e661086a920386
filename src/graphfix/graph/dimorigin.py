"""Which dimensions of a graph are equal by construction, whatever the input sizes.

`DimOrigins.origin(t, axis)` follows a dimension back through the ops that copy it
from an operand (an elementwise op, a convolution's batch, a transposed axis, ...) to
the first tensor that does not: a graph input, or a tensor some other op gives a new
size. Two dimensions with the same origin are the same number for every input the
model runs on. This is structural: it never trusts a `dim_param` name, so two graph
inputs both declared `batch` are two origins (onnxruntime runs them with different
sizes, broadcasting one against the other).

Broadcasting ops (Add, Mul, Where, a batched MatMul's batch axes, Expand) copy an
output dimension from the operands whose aligned dimension is not statically 1; their
origins must all be the same (an `x * sigmoid(x)` keeps x's batch), else the output is
its own origin.

A dimension a shape value gives (Expand's or ConstantOfShape's shape, a Reshape
target, Range(0, d, 1)'s length) is followed only through the caller's `values`, which
reads such a value as entries (`fold-reshape-targets` passes its evaluator:
`Shape(y)[k]` is dimension k of y). A Reshape with allowzero=0 copies the input's
dimension where its target is 0: a constant 0 is that copy, and an entry computed as
dimension k of y is y's dimension k or, where that is 0 at run time (an empty
tensor), the input's, so it has an origin only when the two have the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph.rewire import constant_value
from graphfix.graph.walk import is_onnx

_ELEMENTWISE = frozenset({
    "Identity", "Cast", "CastLike", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Erf", "Gelu",
    "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Sin", "Cos", "Floor", "Ceil",
    "Round", "Sign", "Not", "Clip", "Dropout", "Softmax", "LogSoftmax", "Hardmax",
    "BatchNormalization", "InstanceNormalization", "LayerNormalization",
    "GroupNormalization", "LRN", "QuantizeLinear", "DequantizeLinear", "IsNaN", "IsInf",
    "ThresholdedRelu", "Shrink", "CumSum", "Swish", "Trilu", "LpNormalization",
    "MeanVarianceNormalization", "ReverseSequence", "ScatterND", "ScatterElements",
    "Scatter", "BitwiseNot",
})
"""Output 0 has input 0's shape (the others are parameters of that shape or smaller)."""

_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "And", "Or", "Xor",
    "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Mod", "BitShift",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})
"""Multidirectional broadcasting of all inputs (numpy's rules)."""

_KEEPS_N = frozenset({"Conv", "ConvTranspose", "ConvInteger", "DeformConv", "QLinearConv",
                      "DepthToSpace", "SpaceToDepth"})
_KEEPS_NC = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
                       "GlobalMaxPool", "GlobalLpPool", "MaxRoiPool", "GridSample"})
_REDUCES = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin",
})

Origin = tuple[int, int]  # (id of the tensor, axis)
Entries = Callable[[gs.Tensor], "Sequence[int | tuple[gs.Tensor, int] | None] | None"]
"""A caller's reader of a 0-D/1-D integer value: each entry an int, (tensor, axis) for
that tensor's dimension, or None for unknown; None when it cannot read the value."""


class DimOrigins:
    """Dimension origins of one graph as it is now (memoized: make a new one after the
    graph changes the nodes this walks)."""

    def __init__(self, max_depth: int = 512, values: Entries | None = None) -> None:
        self._memo: dict[Origin, Origin] = {}
        self._max_depth = max_depth
        self._values = values

    def same(self, a: gs.Tensor, axis_a: int, b: gs.Tensor, axis_b: int) -> bool:
        """Whether dimension `axis_a` of `a` equals dimension `axis_b` of `b` by
        construction."""
        if a is b and axis_a == axis_b:
            return True
        return self.origin(a, axis_a) == self.origin(b, axis_b)

    def origin(self, tensor: gs.Tensor, axis: int, depth: int = 0) -> Origin:
        key = (id(tensor), axis)
        found = self._memo.get(key)
        if found is None:
            source = None if depth > self._max_depth else _copied_from(
                tensor, axis, self._values)
            if source is None:
                found = key
            elif isinstance(source, list):  # broadcast operands: all the same, or none
                origins = {self.origin(t, k, depth + 1) for t, k in source}
                found = origins.pop() if len(origins) == 1 else key
            else:
                found = self.origin(source[0], source[1], depth + 1)
            self._memo[key] = found
        return found


def _rank(t: gs.Tensor) -> int | None:
    """The tensor's rank (a constant's from its lazy values: no weight is read)."""
    return None if t.shape is None else len(t.shape)


def _ints(t: gs.Tensor | None) -> list[int] | None:
    value = None if t is None else constant_value(t)
    if value is None or value.dtype.kind not in "iu" or value.ndim > 1:
        return None
    return [int(v) for v in value.reshape(-1)]


def _copied_from(tensor: gs.Tensor, axis: int, values: Entries | None = None):
    """The (operand, axis) the dimension is a copy of, a list of them for broadcasting
    (each must have the same origin), or None when no rule applies."""
    if len(tensor.inputs) != 1:
        return None
    node = tensor.inputs[0]
    if not is_onnx(node) or not node.inputs or not node.inputs[0].name:
        return None
    op, x = node.op, node.inputs[0]
    rank = _rank(tensor)
    if rank is None or not 0 <= axis < rank:
        return None
    if op in _ELEMENTWISE and node.outputs[0] is tensor:
        return (x, axis) if _rank(x) == rank else None
    if op in _KEEPS_N and axis == 0 or op in _KEEPS_NC and axis <= 1:
        return (x, axis) if node.outputs[0] is tensor or op == "MaxPool" else None
    if op in _BROADCAST:
        return _broadcast(node.inputs, rank, axis)
    if op == "Transpose":
        perm = node.attrs.get("perm") or list(range(rank))[::-1]
        return (x, int(perm[axis])) if len(perm) == rank else None
    if op in ("Concat", "Split"):
        along = int(node.attrs.get("axis", 0))
        along = along + rank if along < 0 else along
        return (x, axis) if axis != along and _rank(x) == rank else None
    if op == "MatMul":
        return _matmul(node.inputs, rank, axis)
    if op in ("Unsqueeze", "Squeeze"):
        return _unsqueeze_squeeze(node, rank, axis)
    if op == "Slice":
        return _slice(node, rank, axis)
    if op in ("Resize", "Upsample"):
        return _resize(node, axis)
    if op == "Gather":
        return _gather(node, rank, axis)
    if op == "GatherElements":
        return (node.inputs[1], axis) if len(node.inputs) > 1 else None
    if op in _REDUCES:
        return _reduce(node, rank, axis)
    if op == "TopK":
        along = int(node.attrs.get("axis", -1))
        return None if axis == (along + rank if along < 0 else along) else (x, axis)
    if op == "Gemm":
        return _gemm(node, axis)
    if op == "Flatten":
        return _flatten(node, axis)
    if op in ("Pad", "Tile"):
        return _unchanged_axis(node, axis, values)
    if op == "RoiAlign":  # one box per row of rois, x's channels
        return (node.inputs[1], 0) if axis == 0 and len(node.inputs) > 1 else (
            (x, 1) if axis == 1 else None)
    if op in ("Reshape", "Expand", "ConstantOfShape"):
        return _shaped(node, rank, axis, values)
    if op == "Range":
        return _range(node, values)
    return None


def _broadcast(inputs: list[gs.Tensor], rank: int, axis: int):
    sources = []
    for t in inputs:
        r = _rank(t)
        if r is None:
            return None
        k = axis - (rank - r)
        if k < 0:
            continue  # a lower-rank operand has no dimension here
        dim = _static_dim(t, k)
        if dim == 1:
            continue
        sources.append((t, k))
    return sources or None


def _static_dim(t: gs.Tensor, k: int) -> int | None:
    d = t.shape[k] if t.shape is not None else None
    return int(d) if isinstance(d, (int, np.integer)) and d >= 0 else None


def _matmul(inputs: list[gs.Tensor], rank: int, axis: int):
    if len(inputs) != 2:
        return None
    a, b = inputs
    ra, rb = _rank(a), _rank(b)
    if ra is None or rb is None or ra < 2:
        return None
    if rb == 1:  # a matrix times a vector: A's shape without its last axis
        return (a, axis) if rank == ra - 1 else None
    if axis == rank - 1:
        return (b, rb - 1)
    if axis == rank - 2:
        return (a, ra - 2)
    # batch axes: broadcast between A's and B's (B's none for weights of rank 2)
    sources = []
    for t, r in ((a, ra), (b, rb)):
        k = axis - (rank - r)
        if k >= 0 and _static_dim(t, k) != 1:
            sources.append((t, k))
    return sources or None


def _gather(node: gs.Node, rank: int, axis: int):
    """Gather(data, indices, axis=a): data's axes before a, then the indices' axes, then
    data's after a."""
    if len(node.inputs) < 2:
        return None
    data, indices = node.inputs[0], node.inputs[1]
    r, q = _rank(data), _rank(indices)
    if r is None or q is None or rank != r + q - 1:
        return None
    a = int(node.attrs.get("axis", 0))
    a = a + r if a < 0 else a
    if axis < a:
        return (data, axis)
    if axis < a + q:
        return (indices, axis - a)
    return (data, axis - q + 1)


def _reduce(node: gs.Node, rank: int, axis: int):
    """The axes a Reduce (or ArgMax/ArgMin) keeps, at their place or, without keepdims,
    moved down past the reduced ones."""
    x = node.inputs[0]
    rank_in = _rank(x)
    if rank_in is None:
        return None
    if node.op in ("ArgMax", "ArgMin"):
        axes = [int(node.attrs.get("axis", 0))]
    elif len(node.inputs) > 1 and node.inputs[1].name:
        axes = _ints(node.inputs[1])
        if axes is None:
            return None
    else:
        axes = node.attrs.get("axes")
    if not axes:  # none given: all of them, unless noop_with_empty_axes
        if len(node.inputs) > 1 or not int(node.attrs.get("noop_with_empty_axes", 0)):
            return None
        return (x, axis) if rank == rank_in else None
    reduced = {int(a) + rank_in if int(a) < 0 else int(a) for a in axes}
    if int(node.attrs.get("keepdims", 1)):
        return None if axis in reduced or rank != rank_in else (x, axis)
    kept = [k for k in range(rank_in) if k not in reduced]
    return (x, kept[axis]) if axis < len(kept) and len(kept) == rank else None


def _gemm(node: gs.Node, axis: int):
    if len(node.inputs) < 2 or axis > 1:
        return None
    if axis == 0:
        return (node.inputs[0], 1 if node.attrs.get("transA", 0) else 0)
    return (node.inputs[1], 0 if node.attrs.get("transB", 0) else 1)


def _flatten(node: gs.Node, axis: int):
    """Flatten to 2-D: a side made of a single input axis is that axis."""
    x = node.inputs[0]
    rank_in = _rank(x)
    if rank_in is None:
        return None
    along = int(node.attrs.get("axis", 1))
    along = along + rank_in if along < 0 else along
    if axis == 0 and along == 1:
        return (x, 0)
    if axis == 1 and along == rank_in - 1:
        return (x, rank_in - 1)
    return None


def _unchanged_axis(node: gs.Node, axis: int, values: Entries | None = None):
    """Pad with no padding, or Tile with a repeat of 1, on this axis (constant
    parameters; Pad's `pads` attribute before opset 11 and `axes` input from 18); Tile
    of an axis of size 1 repeated a dimension's times, read through the caller's
    `values` (RAFT's coordinate grid, tiled to the batch), is that dimension."""
    x = node.inputs[0]
    rank_in = _rank(x)
    if rank_in is None:
        return None
    if node.op == "Tile":
        if len(node.inputs) < 2:
            return None
        repeats = _ints(node.inputs[1])
        if repeats is None and values is not None:
            repeats = values(node.inputs[1])
        if repeats is None or len(repeats) != rank_in:
            return None
        if repeats[axis] == 1:
            return (x, axis)
        return repeats[axis] if isinstance(repeats[axis], tuple) and x.shape[axis] == 1 \
            else None
    pads = (_ints(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1].name
            else node.attrs.get("pads"))
    if pads is None:
        return None
    axes = (_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name
            else list(range(rank_in)))
    if axes is None or len(pads) != 2 * len(axes):
        return None
    axes = [a + rank_in if a < 0 else a for a in axes]
    if axis not in axes:
        return (x, axis)
    i = axes.index(axis)
    return (x, axis) if pads[i] == 0 and pads[i + len(axes)] == 0 else None


def _range(node: gs.Node, values: Entries | None):
    """Range(0, d, 1) has d elements (d is a dimension: never negative)."""
    if len(node.inputs) != 3 or values is None:
        return None
    start, limit, delta = node.inputs
    if _ints(start) != [0] or _ints(delta) != [1]:
        return None
    entries = values(limit)
    return entries[0] if entries is not None and len(entries) == 1 and isinstance(
        entries[0], tuple) else None


def _shaped(node: gs.Node, rank: int, axis: int, values: Entries | None):
    """A dimension a shape value gives: Reshape (a constant 0 copies the input's, with
    allowzero=0; any entry is that size with allowzero=1), Expand (broadcast of the
    input and the entry), ConstantOfShape (the entry)."""
    op, x = node.op, node.inputs[0]
    shape = x if op == "ConstantOfShape" else (node.inputs[1] if len(node.inputs) > 1
                                                else None)
    if shape is None:
        return None
    constant = _ints(shape)
    entries = constant if constant is not None else (
        values(shape) if values is not None else None)
    if entries is None or len(entries) != rank and op != "Expand":
        return None
    if op == "Reshape":
        entry = entries[axis]
        if int(node.attrs.get("allowzero", 0)):
            return entry if isinstance(entry, tuple) else None
        if entry == 0:  # copies the input's
            return (x, axis)
        if not isinstance(entry, tuple):
            return None
        # the entry's size, or the input's where that size is 0 at run time: one
        # number when the two have one origin
        rank_in = _rank(x)
        return [entry, (x, axis)] if rank_in is not None and axis < rank_in else entry
    if op == "ConstantOfShape":
        entry = entries[axis]
        return entry if isinstance(entry, tuple) else None
    sources = []  # Expand: broadcast of the input and the shape, right-aligned
    for length, source in ((_rank(x), x), (len(entries), None)):
        if length is None:
            return None
        k = axis - (rank - length)
        if k < 0:
            continue
        if source is None:
            entry = entries[k]
            if isinstance(entry, tuple):
                sources.append(entry)
            elif entry != 1:
                return None  # a static size, or one not known
        elif _static_dim(x, k) != 1:
            sources.append((x, k))
    return sources or None


def _unsqueeze_squeeze(node: gs.Node, rank: int, axis: int):
    x = node.inputs[0]
    axes = _ints(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    if axes is None:
        return None
    if node.op == "Unsqueeze":
        axes = {a + rank if a < 0 else a for a in axes}
        if axis in axes:
            return None
        return (x, axis - sum(1 for a in axes if a < axis))
    rank_in = _rank(x)
    if rank_in is None:
        return None
    axes = {a + rank_in if a < 0 else a for a in axes}
    kept = [k for k in range(rank_in) if k not in axes]
    return (x, kept[axis]) if axis < len(kept) else None


def _slice(node: gs.Node, rank: int, axis: int):
    x = node.inputs[0]
    if len(node.inputs) < 3 or _rank(x) != rank:
        return None
    starts = _ints(node.inputs[1])
    axes = _ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else (
        None if starts is None else list(range(len(starts))))
    if axes is None:
        return None
    sliced = {a + rank if a < 0 else a for a in axes}
    return None if axis in sliced else (x, axis)


def _resize(node: gs.Node, axis: int):
    """A scale of exactly 1 keeps the dimension (floor(d * 1) = d); sizes do not."""
    if len(node.inputs) > 3 and node.inputs[3].name:
        return None
    scales = node.inputs[2] if node.op == "Resize" and len(node.inputs) > 2 else (
        node.inputs[1] if node.op == "Upsample" and len(node.inputs) > 1 else None)
    value = None if scales is None else constant_value(scales)
    if value is None or value.ndim != 1 or axis >= value.size:
        return None
    return (node.inputs[0], axis) if float(value[axis]) == 1.0 and np.isfinite(value[axis]) \
        else None
