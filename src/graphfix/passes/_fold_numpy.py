"""fold-constants' exact evaluation in numpy: small shape arithmetic without onnxruntime.

Most of what fold-constants evaluates in an exported transformer or detector is shape
arithmetic: Unsqueeze, Concat, Gather, Slice, Cast, Mul, Div of a few INT64 values,
window masks built by Slice/Expand/Where. An onnxruntime session for that costs more to
build than to run (swin_t: five sessions of 26-1,026 such nodes, 80 ms), and a round's
result is often what the next round needs to know a shape (`graph.propagate`).

`evaluate` computes one node here when that is exact, i.e. gives the bits onnxruntime's
CPU kernels give: data movement of any numeric type (copies, reshapes, selections,
scatters), integer and boolean arithmetic (two's-complement wrap-around, as both do;
integer Div truncates toward zero as C++ does, never numpy's floor), comparisons, and
float32/float64 Add/Sub/Mul/Div/Sqrt/Floor/Ceil/Round/Neg/Abs, which IEEE 754 defines
exactly everywhere, and ReduceMax/ReduceMin (an extreme is one of the values). Anything
else (Pow, Exp, sums of floats, float16, NaN where its sign or payload would matter, a
Cast from float out of range, a division by zero, duplicate scatter indices, ...)
returns None: onnxruntime evaluates
it as before (`_fold_closure`). Every input and output holds at most `MAX_ELEMENTS`
elements, so weights never come here (tests/passes/test_fold_numpy.py compares every
op with onnxruntime, bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph.dtypes import np_dtype
from graphfix.graph.rewire import constant_value

MAX_ELEMENTS = 4096
"""The largest input or output (in elements) evaluated here; larger go to onnxruntime."""

_INTS = frozenset("bBhHiIlLqQ")  # numpy type chars of the integer types
_EXACT_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

Inputs = list  # np.ndarray or None (an omitted optional input)
_Rule = Callable[[gs.Node, Inputs], "np.ndarray | None"]


def evaluate(node: gs.Node, read: dict | None = None) -> list[np.ndarray] | None:
    """`node`'s outputs computed exactly from its constant inputs, or None when this
    module does not compute it (module docstring). `read`, given, keeps the inputs' values
    read so far (a caller folding many nodes reads a shared constant once: gs parses its
    proto on every read)."""
    rule = _RULES.get(node.op)
    if rule is None or len(node.outputs) != 1 or (node.domain or "") not in ("", "ai.onnx"):
        return None
    if node.op in _SHAPE_OPS:  # the input's dims, never its values
        x = node.inputs[0] if node.inputs else None
        if not isinstance(x, gs.Constant) or not _static(x.shape):
            return None
        return _checked(node, _SHAPE_OPS[node.op](node, x.shape))
    inputs: Inputs = []
    for t in node.inputs:
        if not t.name:
            inputs.append(None)
            continue
        if not isinstance(t, gs.Constant) or not _small(t.shape):
            return None
        value = _value(t, read)
        if value is None or value.dtype.kind not in "biuf" or value.size > MAX_ELEMENTS:
            return None
        inputs.append(value)
    with np.errstate(all="ignore"):
        try:
            out = rule(node, inputs)
        except (ValueError, IndexError, TypeError, OverflowError):
            return None  # what onnxruntime would refuse too, or an odd case: its call
    return _checked(node, out)


def _value(t: gs.Constant, read: dict | None) -> np.ndarray | None:
    if read is None:
        return constant_value(t)
    key = id(t)
    if key not in read:
        read[key] = (t, constant_value(t))  # the tensor kept: its id is not reused
    return read[key][1]


def _checked(node: gs.Node, out: np.ndarray | None) -> list[np.ndarray] | None:
    """`[out]` when it is a small numeric array of the output's declared type."""
    if out is None or out.dtype.kind not in "biuf" or out.size > MAX_ELEMENTS:
        return None
    declared = node.outputs[0].dtype
    if declared is not None and np.dtype(declared) != out.dtype:
        return None  # a rule's slip must not give the graph a wrong type
    return [out if out.flags.c_contiguous else out.copy()]  # ascontiguousarray: 1-D


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _small(shape) -> bool:
    return _static(shape) and math.prod(shape) <= MAX_ELEMENTS


def _ints(*arrays: np.ndarray) -> bool:
    return all(a.dtype.char in _INTS for a in arrays)


def _same_type(arrays: Inputs, floats: bool) -> np.dtype | None:
    """The one type of `arrays` when the rule computes it exactly: an integer type, bool,
    or (with `floats`) float32/float64; else None."""
    types = {a.dtype for a in arrays}
    if len(types) != 1:
        return None
    (dtype,) = types
    if dtype.char in _INTS or dtype == np.bool_ or (floats and dtype in _EXACT_FLOATS):
        return dtype
    return None


def _axes(node: gs.Node, inputs: Inputs, index: int) -> list[int] | None:
    """The `axes` attribute (older opsets) or input `index` (newer), None when neither."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(inputs) > index and inputs[index] is not None:
        return [int(a) for a in np.ravel(inputs[index])]
    return None


def _fits(shape) -> bool:
    return math.prod(int(d) for d in shape) <= MAX_ELEMENTS


# ----------------------------------------------------------------------------- data movement


def _unsqueeze(node, inputs):
    x, axes = inputs[0], _axes(node, inputs, 1)
    if axes is None:
        return None
    rank = x.ndim + len(axes)
    normal = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(normal)) != len(normal) or any(not 0 <= a < rank for a in normal):
        return None
    for a in normal:
        x = np.expand_dims(x, a)
    return x


def _squeeze(node, inputs):
    x, axes = inputs[0], _axes(node, inputs, 1)
    if axes is None:
        return np.squeeze(x)
    normal = tuple(a + x.ndim if a < 0 else a for a in axes)
    if any(not 0 <= a < x.ndim or x.shape[a] != 1 for a in normal):
        return None
    return np.squeeze(x, axis=normal)


def _concat(node, inputs):
    if any(v is None for v in inputs) or len({v.dtype for v in inputs}) != 1:
        return None
    return np.concatenate(inputs, axis=int(node.attrs["axis"]))


def _gather(node, inputs):
    x, indices = inputs
    if not _ints(indices) or x.ndim == 0:
        return None
    axis = int(node.attrs.get("axis", 0))
    axis += x.ndim if axis < 0 else 0
    extent = x.shape[axis]
    if indices.size and (indices.min() < -extent or indices.max() >= extent):
        return None
    return np.take(x, indices.astype(np.int64), axis=axis)


def _slice(node, inputs):
    x = inputs[0]
    if len(inputs) >= 3:
        starts, ends = inputs[1], inputs[2]
        axes = inputs[3] if len(inputs) > 3 and inputs[3] is not None else None
        steps = inputs[4] if len(inputs) > 4 and inputs[4] is not None else None
        if not _ints(*(v for v in (starts, ends, axes, steps) if v is not None)):
            return None
    elif "starts" in node.attrs and "ends" in node.attrs:
        starts, ends = node.attrs["starts"], node.attrs["ends"]
        axes, steps = node.attrs.get("axes"), None
    else:
        return None
    starts, ends = np.ravel(starts), np.ravel(ends)
    axes = np.arange(starts.size) if axes is None else np.ravel(axes)
    steps = np.ones(starts.size, dtype=np.int64) if steps is None else np.ravel(steps)
    if not starts.size == ends.size == axes.size == steps.size or np.any(steps == 0):
        return None
    index = [slice(None)] * x.ndim
    normal = [int(a) + (x.ndim if a < 0 else 0) for a in axes]
    if len(set(normal)) != len(normal) or any(not 0 <= a < x.ndim for a in normal):
        return None
    for start, end, axis, step in zip(starts, ends, normal, steps, strict=True):
        index[axis] = _onnx_slice(int(start), int(end), int(step), x.shape[axis])
    return x[tuple(index)]


def _onnx_slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice's clamping of one axis (its spec, INT64 sentinels included) as a
    Python slice of non-negative bounds (a Python slice clamps a negative step's
    out-of-range start differently)."""
    if dim == 0:
        return slice(0, 0)
    start += dim if start < 0 else 0
    end += dim if end < 0 else 0
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def _reshape(node, inputs):
    x, shape = inputs
    if shape is None or not _ints(shape) or "shape" in node.attrs:
        return None
    target = [int(d) for d in np.ravel(shape)]
    if not node.attrs.get("allowzero", 0):
        if any(d == 0 and i >= x.ndim for i, d in enumerate(target)):
            return None  # copies a dim the input does not have: onnxruntime's error
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


def _expand(node, inputs):
    x, shape = inputs
    if not _ints(shape):
        return None
    out = np.broadcast_shapes(x.shape, tuple(int(d) for d in np.ravel(shape)))
    return np.broadcast_to(x, out).copy() if _fits(out) else None


def _transpose(node, inputs):
    perm = node.attrs.get("perm")
    return np.transpose(inputs[0], None if perm is None else [int(p) for p in perm])


def _identity(node, inputs):
    return inputs[0].copy()


def shape_slice(node: gs.Node, dims: Sequence) -> list:
    """The dims a Shape node outputs from its input's `dims`: its start/end attributes
    (opset 15), clamped as ONNX says."""
    rank = len(dims)
    start, end = int(node.attrs.get("start", 0)), int(node.attrs.get("end", rank))
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return list(dims)[start:end]


def _shape(node, dims):
    return np.array(shape_slice(node, dims), dtype=np.int64)


def _size(node, dims):
    return np.array(math.prod(dims), dtype=np.int64)


def _constant_of_shape(node, inputs):
    shape = inputs[0]
    if not _ints(shape) or np.any(shape < 0) or not _fits(np.ravel(shape)):
        return None
    value = node.attrs.get("value")
    fill = np.zeros(1, np.float32) if value is None else constant_value(value)
    if fill is None or fill.size != 1:
        return None
    return np.full([int(d) for d in np.ravel(shape)], fill.reshape(()), dtype=fill.dtype)


def _range(node, inputs):
    if not _ints(*inputs) or any(v.size != 1 for v in inputs):
        return None
    start, limit, delta = (int(v.reshape(())) for v in inputs)
    if delta == 0 or max(math.ceil((limit - start) / delta), 0) > MAX_ELEMENTS:
        return None
    return np.arange(start, limit, delta, dtype=inputs[0].dtype)


def _where(node, inputs):
    cond, x, y = inputs
    if cond.dtype != np.bool_ or x.dtype != y.dtype:
        return None
    out = np.broadcast_shapes(cond.shape, x.shape, y.shape)
    return np.where(cond, x, y) if _fits(out) else None


def _scatter_nd(node, inputs):
    data, indices, updates = inputs
    if node.attrs.get("reduction", "none") != "none" or not _ints(indices) or (
            updates.dtype != data.dtype):
        return None
    k = indices.shape[-1] if indices.ndim else 0
    if not 1 <= k <= data.ndim or updates.shape != indices.shape[:-1] + data.shape[k:]:
        return None
    index = indices.reshape(-1, k).astype(np.int64)
    dims = np.array(data.shape[:k], dtype=np.int64)
    if np.any(index < -dims) or np.any(index >= dims):
        return None
    index = np.where(index < 0, index + dims, index)
    flat = np.ravel_multi_index(index.T, data.shape[:k]).tolist()
    if len(set(flat)) != len(flat):
        return None  # the same element updated twice: which update wins is the kernel's
    out = data.copy()
    out[tuple(index.T)] = updates.reshape((-1,) + data.shape[k:])
    return out


def _cast(node, inputs):
    x, to = inputs[0], np_dtype(int(node.attrs["to"]))
    if to is None or x.dtype.kind not in "biuf" or x.dtype == np.float16:
        return None
    if to.kind not in "biuf" or (to.kind == "f" and to not in _EXACT_FLOATS):
        return None  # strings, float16, bfloat16, float8: the kernel's roundings
    if to.kind == "f":
        return x.astype(to)  # to nearest, as a C++ conversion rounds
    if x.dtype.kind == "f":  # truncation; NaN, inf and out-of-range are the kernel's
        if to == np.bool_ or not np.all(np.isfinite(x)):
            return None
        info, whole = np.iinfo(to), np.trunc(x)
        # float(info.max) + 1 is the power of two above the range, exactly
        if np.any(whole < float(info.min)) or np.any(whole >= float(info.max) + 1):
            return None
        return whole.astype(to)
    if to == np.bool_:
        return x != 0
    return x.astype(to)


# ----------------------------------------------------------------------------- arithmetic


def _elementwise(ufunc, floats: bool) -> _Rule:
    def rule(node, inputs):
        if any(v is None for v in inputs) or _same_type(inputs, floats) is None:
            return None
        if inputs[0].dtype == np.bool_:
            return None  # ONNX's arithmetic takes numbers only
        out = np.broadcast_shapes(*(v.shape for v in inputs))
        return ufunc(*inputs).astype(inputs[0].dtype) if _fits(out) else None

    return rule


def _div(node, inputs):
    a, b = inputs
    dtype = _same_type(inputs, floats=True)
    if dtype is None or dtype == np.bool_:
        return None
    if dtype.kind == "f":
        return np.divide(a, b).astype(dtype)
    if np.any(b == 0) or (dtype.kind == "i" and np.any((a == np.iinfo(dtype).min) & (b == -1))):
        return None  # the kernel's division traps or overflows
    q = np.floor_divide(a, b)
    # C++ truncates toward zero: one more where the quotient is negative and inexact
    return (q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)))).astype(dtype)


def _mod(node, inputs):
    a, b = inputs
    dtype = _same_type(inputs, floats=True)
    if dtype is None or dtype == np.bool_:
        return None
    fmod = int(node.attrs.get("fmod", 0))
    if dtype.kind == "f":
        return np.fmod(a, b).astype(dtype) if fmod else None
    if np.any(b == 0):
        return None
    return (np.fmod(a, b) if fmod else np.remainder(a, b)).astype(dtype)


def _compare(ufunc) -> _Rule:
    def rule(node, inputs):
        if _same_type(inputs, floats=True) is None:
            return None
        return ufunc(*inputs)

    return rule


def _logical(ufunc) -> _Rule:
    def rule(node, inputs):
        return ufunc(*inputs) if all(v.dtype == np.bool_ for v in inputs) else None

    return rule


def _int_unary(ufunc) -> _Rule:
    def rule(node, inputs):
        x = inputs[0]
        return ufunc(x).astype(x.dtype) if x.dtype.kind == "i" else None

    return rule


def _float_exact(ufunc) -> _Rule:
    """Sqrt, Floor, Ceil, Round (halves to even, as ONNX says) and Neg/Abs of float32 or
    float64: IEEE 754 defines each result exactly (sqrt correctly rounded), so every
    kernel gives the same bits. A NaN in or out is declined: its sign and payload are the
    kernel's."""
    def rule(node, inputs):
        x = inputs[0]
        if x.dtype not in _EXACT_FLOATS or np.isnan(x).any():
            return None
        out = ufunc(x).astype(x.dtype)
        return None if np.isnan(out).any() else out

    return rule


def _signed(ufunc) -> _Rule:
    """Neg and Abs: integers wrap as in C++; floats are exact (`_float_exact`)."""
    ints, floats = _int_unary(ufunc), _float_exact(ufunc)
    return lambda node, inputs: (floats if inputs[0].dtype.kind == "f" else ints)(node, inputs)


def _reduce_extreme(ufunc) -> _Rule:
    """ReduceMax/ReduceMin of integers or float32/float64 (an extreme is one of the
    values, so exact), NaN and -0.0 declined (which zero of two wins is the kernel's:
    onnxruntime's ReduceMin of [-0.0, 0.0] is -0.0, numpy's 0.0); `axes` an attribute
    (opset < 18) or input 1, `keepdims` and opset 18's `noop_with_empty_axes` as ONNX
    says. An empty reduction (its identity is the kernel's) is declined."""
    def rule(node, inputs):
        x = inputs[0]
        if not (x.dtype.char in _INTS or x.dtype in _EXACT_FLOATS) or (
                x.dtype.kind == "f" and (np.isnan(x).any() or np.signbit(x[x == 0]).any())):
            return None
        axes = _axes(node, inputs, 1)
        if not axes:
            if node.attrs.get("noop_with_empty_axes", 0):
                return x.copy()
            axes = list(range(x.ndim))
        normal = tuple(sorted({a + x.ndim if a < 0 else a for a in axes}))
        if len(normal) != len(axes) or any(not 0 <= a < x.ndim for a in normal) or any(
                x.shape[a] == 0 for a in normal):
            return None
        keep = bool(node.attrs.get("keepdims", 1))
        return np.asarray(ufunc(x, axis=normal, keepdims=keep))

    return rule


def _tile(node, inputs):
    x, repeats = inputs
    if not _ints(repeats) or repeats.ndim != 1 or repeats.size != x.ndim or np.any(repeats < 0):
        return None
    out = [int(d) * int(r) for d, r in zip(x.shape, repeats, strict=True)]
    return np.tile(x, [int(r) for r in repeats]) if _fits(out) else None


def _int_minmax(ufunc) -> _Rule:
    def rule(node, inputs):
        if not inputs or not _ints(*inputs) or len({v.dtype for v in inputs}) != 1:
            return None
        out = inputs[0]
        for v in inputs[1:]:
            out = ufunc(out, v)
        return out

    return rule


_SHAPE_OPS = {"Shape": _shape, "Size": _size}

_RULES: dict[str, _Rule] = {
    "Identity": _identity, "Shape": _shape, "Size": _size,  # both via _SHAPE_OPS
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat, "Gather": _gather,
    "Slice": _slice, "Reshape": _reshape, "Expand": _expand, "Transpose": _transpose,
    "ConstantOfShape": _constant_of_shape, "Range": _range, "Where": _where,
    "ScatterND": _scatter_nd, "Cast": _cast,
    "Add": _elementwise(np.add, True), "Sub": _elementwise(np.subtract, True),
    "Mul": _elementwise(np.multiply, True), "Div": _div, "Mod": _mod,
    "Neg": _signed(np.negative), "Abs": _signed(np.abs), "Sqrt": _float_exact(np.sqrt),
    "Floor": _float_exact(np.floor), "Ceil": _float_exact(np.ceil),
    "Round": _float_exact(np.rint), "Tile": _tile,
    "ReduceMax": _reduce_extreme(np.max), "ReduceMin": _reduce_extreme(np.min),
    "Min": _int_minmax(np.minimum), "Max": _int_minmax(np.maximum),
    "Equal": _compare(np.equal), "Less": _compare(np.less), "Greater": _compare(np.greater),
    "LessOrEqual": _compare(np.less_equal), "GreaterOrEqual": _compare(np.greater_equal),
    "Not": _logical(np.logical_not), "And": _logical(np.logical_and),
    "Or": _logical(np.logical_or), "Xor": _logical(np.logical_xor),
}
