"""Which dimensions of a graph are equal by construction, whatever the input sizes.

`DimOrigins.origin(t, axis)` follows a dimension back through the ops that copy it
from an operand (an elementwise op, a convolution's batch, a transposed axis, ...) to
the first tensor that does not: a graph input, or a tensor some other op gives a new
size. Two dimensions with the same origin are the same number for every input the
model runs on. This is structural: it never trusts a `dim_param` name, so two graph
inputs both declared `batch` are two origins (onnxruntime runs them with different
sizes, broadcasting one against the other).

Broadcasting ops (Add, Mul, Where, ...) copy an output dimension from the operands
whose aligned dimension is not statically 1; their origins must all be the same (an
`x * sigmoid(x)` keeps x's batch), else the output is its own origin.
"""

from __future__ import annotations

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
    "ThresholdedRelu", "Shrink", "CumSum", "Swish",
})
"""Output 0 has input 0's shape (the others are parameters of that shape or smaller)."""

_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "And", "Or", "Xor",
    "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Mod", "BitShift",
})
"""Multidirectional broadcasting of all inputs (numpy's rules)."""

_KEEPS_N = frozenset({"Conv", "ConvTranspose", "ConvInteger", "DeformConv"})
_KEEPS_NC = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
                       "GlobalMaxPool", "GlobalLpPool", "MaxRoiPool"})

Origin = tuple[int, int]  # (id of the tensor, axis)


class DimOrigins:
    """Dimension origins of one graph as it is now (memoized: make a new one after the
    graph changes the nodes this walks)."""

    def __init__(self, max_depth: int = 512) -> None:
        self._memo: dict[Origin, Origin] = {}
        self._max_depth = max_depth

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
            source = None if depth > self._max_depth else _copied_from(tensor, axis)
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


def _copied_from(tensor: gs.Tensor, axis: int):
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
        return (b, rb - 1) if rb >= 2 else None
    if axis == rank - 2:
        return (a, ra - 2)
    if rb <= 2 and ra == rank:  # batch axes of A alone (weights as B)
        return (a, axis)
    return None


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
