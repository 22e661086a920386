"""Dtype lowerings: ops a TensorRT target parses only on float types, computed in float
where that gives exactly the integer result.

A target's table can support an op and still not list the integer type a node computes
it on (TensorRT 10.16: CumSum for FP32, FP16, BF16 only; 8.6 and 10.0: ConstantOfShape
for FP32 only). Where the float computation is exact, the node is computed in float32
and cast back::

    ConstantOfShape(shape){value = v: an integer or BOOL}
        = Cast<T>(ConstantOfShape(shape){value = float32(v)})
        exact: v is an integer within +-2^24 (or 0/1), which float32 holds exactly
    CumSum(x: an integer type, axis){exclusive, reverse},  x = Cast<integer>(b), b BOOL
        = Cast<T>(CumSum(Cast<float32>(b), axis){exclusive, reverse})
        exact while no partial sum passes 2^24: the terms are 0 or 1, so when the summed
        axis is at most 2^24 long (a dynamic axis: assumed, and said in a note)

Any other integer CumSum is left with the reason: its terms are not known to be small,
and a float32 sum of large integers rounds. RoBERTa-family exports compute their
position ids as CumSum(Cast<INT32>(Not(Equal(ids, pad)))), which is the BOOL form.

`RETYPES` is the table op type -> planner; `lower-unsupported` applies it where the
target row supports the op but not the node's type (`TrtTarget.unlisted_type`), and
doctor names that pass as the fix then.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import constant_value
from graphfix.plugins.lowering import Builder, Emit, Env

EXACT_INTEGERS = 2**24
"""float32 holds every integer of magnitude up to this exactly."""


def typed_dtype(node: gs.Node) -> np.dtype | None:
    """The type the target's Supported Types column describes for a node of a `RETYPES`
    op, None when unknown: ConstantOfShape's value's (float32 by default), CumSum's input's
    (from its producer where a Cast writes it and inference has not run)."""
    if node.op == "ConstantOfShape":
        value = node.attrs.get("value")
        array = constant_value(value) if isinstance(value, gs.Constant) else None
        return np.dtype(np.float32) if value is None else (
            None if array is None else np.asarray(array).dtype)
    return _input_dtype(node.inputs[0]) if node.inputs else None


def _input_dtype(x: gs.Tensor) -> np.dtype | None:
    if x.dtype is not None:
        return np.dtype(x.dtype)
    source = x.inputs[0] if len(x.inputs) == 1 else None
    if source is not None and source.op == "Cast" and "to" in source.attrs:
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(int(source.attrs["to"])))
        except (KeyError, TypeError, ValueError):
            return None
    return None


def _constant_of_shape(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    value = node.attrs.get("value")
    array = constant_value(value) if isinstance(value, gs.Constant) else None
    if array is None or np.size(array) != 1:
        return "its value is not a one-element constant"
    v = np.asarray(array).reshape(())
    if v.dtype == np.bool_:
        fill = np.float32(bool(v))
    elif np.issubdtype(v.dtype, np.integer) and abs(int(v)) <= EXACT_INTEGERS:
        fill = np.float32(int(v))
    else:
        return (f"its value {v.item()!r} ({v.dtype}) is not an integer float32 holds "
                f"exactly (|v| <= 2^24) or a BOOL")
    shape, y, dtype = node.inputs[0], node.outputs[0], v.dtype

    def emit(b: Builder) -> None:
        attr = gs.Constant(f"{b.base}_value", np.array([fill], dtype=np.float32))
        filled = b.node("ConstantOfShape", [shape], {"value": attr}, dtype=np.float32)
        b.node("Cast", [filled], {"to": helper.np_dtype_to_tensor_dtype(dtype)}, out=y)

    return emit, ""


def _cumsum(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    x, axis, y = node.inputs[0], node.inputs[1], node.outputs[0]
    source = x.inputs[0] if len(x.inputs) == 1 else None
    if source is None or source.op != "Cast" or not source.inputs or (
            _bits_dtype(source.inputs[0]) != np.bool_):
        return ("its terms are not a Cast of a BOOL tensor, so they may be large, and a "
                "float32 sum of large integers rounds")
    dtype = _input_dtype(x)
    if dtype is None:
        return "its integer type is unknown; run shape inference on the model first"
    axis_value = constant_value(axis)
    shape = next((t.shape for t in (x, source.inputs[0], y) if t.shape is not None), None)
    length = None
    if axis_value is not None and shape and np.size(axis_value) == 1:
        dim = shape[int(np.asarray(axis_value).reshape(())) % len(shape)]
        length = dim if isinstance(dim, int) and dim >= 0 else None
    if length is not None and length > EXACT_INTEGERS:
        return f"its summed axis is {length} long, so a float32 partial sum may round"
    note = ("" if length is not None else
            "summed in float32: exact while the summed axis (dynamic here) is at most "
            "2^24 = 16,777,216 long")
    bits = source.inputs[0]

    def emit(b: Builder) -> None:
        terms = b.cast(bits, np.dtype(np.float32))
        total = b.node("CumSum", [terms, axis], dict(node.attrs), dtype=np.float32)
        b.node("Cast", [total], {"to": helper.np_dtype_to_tensor_dtype(dtype)}, out=y)

    return emit, note


_BOOL_OPS = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not",
                       "And", "Or", "Xor", "IsNaN", "IsInf"})
"""Ops whose output is BOOL whatever their inputs."""


def _bits_dtype(t: gs.Tensor) -> np.dtype | None:
    """The tensor's type, known without inference where a comparison or logic op writes
    it."""
    if t.dtype is not None:
        return np.dtype(t.dtype)
    if len(t.inputs) == 1 and t.inputs[0].op in _BOOL_OPS:
        return np.dtype(np.bool_)
    return _input_dtype(t)


RETYPES: dict[str, Callable[[gs.Node, Env], tuple[Emit, str] | str]] = {
    "ConstantOfShape": _constant_of_shape,
    "CumSum": _cumsum,
}
"""op type -> planner: (the emitting function, a note or "") or why it cannot."""
