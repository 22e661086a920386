"""Shapes, permutations, axes and dtypes as `eliminate-noops` reads them (private helpers).

Pure functions over gs tensors, attribute values and constant values: none of
them edits a graph or loads a weight (dtypes come from the tensor or the
initializer's header, constants through `graphfix.graph.constant_value`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import constant_value, is_onnx


def reshape_keeps(dims: list, target: list[int], allowzero: int) -> bool | None:
    """Whether Reshape(x[dims], target) has x's shape; None when it depends on unknown dims."""
    if len(target) != len(dims):
        return False
    unknown, free = False, []
    for i, (t, d) in enumerate(zip(target, dims, strict=True)):
        if t == 0 and not allowzero:
            continue
        if t == -1:
            free.append(i)
        elif not isinstance(d, int):
            unknown = True
        elif t != d:
            return False
    if len(free) > 1 or (free and any(isinstance(d, int) and d == 0 for d in dims)):
        return None
    return None if unknown else True


def expand_keeps(dims: list, target: list[int]) -> bool | None:
    """Whether Expand(x[dims], target) has x's shape; None when it depends on unknown dims."""
    if len(target) > len(dims):
        return False
    unknown = False
    for t, d in zip(target, dims[len(dims) - len(target) :], strict=True):
        if t == 1 or t == d:
            continue
        if not isinstance(d, int):
            unknown = True
        else:  # the dim becomes t (d == 1) or x does not broadcast
            return False
    return None if unknown else True


def perm_of(node: gs.Node) -> list[int] | None:
    perm = node.attrs.get("perm")
    return [int(p) for p in perm] if perm is not None else None


def is_identity_perm(perm: list[int] | None, rank: int | None) -> bool:
    if perm is None:  # the default perm reverses the axes
        return rank is not None and rank <= 1
    return perm == list(range(len(perm)))


def compose_perms(p1: list[int] | None, p2: list[int] | None) -> list[int] | None:
    """The perm of Transpose(Transpose(x, p1), p2), or None when it is the identity."""
    if p1 is None and p2 is None:
        return None  # two reversals
    n = len(p1) if p1 is not None else len(p2 or [])
    p1 = p1 if p1 is not None else list(reversed(range(n)))
    p2 = p2 if p2 is not None else list(reversed(range(n)))
    perm = [p1[i] for i in p2]
    return None if perm == list(range(n)) else perm


def squeeze_axes(node: gs.Node, opset: int) -> list[int] | str | None:
    """Squeeze/Unsqueeze axes (attribute before opset 13, input from 13); None when absent."""
    if opset < 13:
        axes = node.attrs.get("axes")
        return [int(a) for a in axes] if axes is not None else None
    if len(node.inputs) < 2 or node.inputs[1].is_empty():
        return None
    value = constant_value(node.inputs[1])
    return [int(a) for a in value.reshape(-1)] if value is not None else "are not a constant"


def normalized_axes(axes: list[int], rank: int | None) -> list[int] | None:
    if all(a >= 0 for a in axes):
        return axes
    return [a + rank if a < 0 else a for a in axes] if rank is not None else None


def slice_params(node: gs.Node, opset: int) -> tuple[list[int], ...] | str:
    """(starts, ends, axes, steps) of a Slice, or why they are not known."""
    if opset < 10:
        starts, ends = node.attrs.get("starts", []), node.attrs.get("ends", [])
        axes, steps = node.attrs.get("axes"), None
    else:
        values = []
        for i, what in enumerate(("starts", "ends", "axes", "steps"), start=1):
            present = len(node.inputs) > i and not node.inputs[i].is_empty()
            value = constant_value(node.inputs[i]) if present else None
            if present and value is None:
                return f"its {what} input is not a constant"
            values.append(value.reshape(-1).tolist() if value is not None else None)
        starts, ends, axes, steps = values
    starts = [int(v) for v in starts]
    axes = [int(a) for a in axes] if axes is not None else list(range(len(starts)))
    steps = [int(s) for s in steps] if steps is not None else [1] * len(starts)
    return starts, [int(v) for v in ends], axes, steps


def clamp_index(index: int, dim: int) -> int:
    return min(max(index + dim if index < 0 else index, 0), dim)


def rank_of(tensor: gs.Tensor) -> int | None:
    return len(tensor.shape) if tensor.shape is not None else None


def broadcast_refusal(x: gs.Tensor, shape: list[int]) -> str | None:
    """Why a constant of `shape` may broadcast `x` to a larger shape, None if it cannot
    (x + c, x * c, Max(x, c) then have x's shape)."""
    if not shape:
        return None
    rank = rank_of(x)
    if rank is None or rank < len(shape):
        return (
            f"shape unknown: its constant of rank {len(shape)} may add dimensions "
            "to an input of unknown rank" if rank is None
            else f"its constant of rank {len(shape)} adds dimensions to an input of rank {rank}"
        )
    dims = list(x.shape)[rank - len(shape):]
    for axis, (dim, size) in enumerate(zip(dims, shape, strict=True), rank - len(shape)):
        if size != 1 and dim != size:
            return (f"shape unknown: its constant has {size} on axis {axis}, which may "
                    f"broadcast the input's {dim}" if not isinstance(dim, int)
                    else f"its constant broadcasts axis {axis} from {dim} to {size}")
    return None


def static_shape(dims: Sequence | None) -> tuple[int, ...] | None:
    if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return tuple(dims)


def shape_text(tensor: gs.Tensor) -> str:
    return str(tuple(d if isinstance(d, int) else str(d) for d in tensor.shape))


def elem_type(tensor: gs.Tensor) -> int | None:
    """The ONNX element type of a tensor, or None when not known (never loads weights)."""
    if isinstance(tensor, gs.Constant):
        dtype = tensor.export_dtype
    else:
        dtype = tensor.dtype
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if dtype is None and producer is not None:
            dtype = _written_type(producer)
    if dtype is None or isinstance(dtype, int):
        return dtype
    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (KeyError, TypeError, ValueError):
        return None


def _written_type(producer: gs.Node) -> np.dtype | int | None:
    """The dtype a node writes when its op alone fixes it (Constant, Cast, Shape, Size)."""
    if not is_onnx(producer):
        return None
    if producer.op == "Constant":
        value = producer.attrs.get("value")
        return value.export_dtype if isinstance(value, gs.Constant) else None
    if producer.op == "Cast":
        return int(producer.attrs["to"])
    if producer.op in ("Shape", "Size"):
        return np.dtype(np.int64)
    return None


def type_name(elem_type: int) -> str:
    return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()
