"""Dtype lowerings: ops a TensorRT target parses only on some float types, computed in
float32 where that gives exactly the same result.

A target's table can support an op and still not list the type a node computes
it on (TensorRT 10.16: CumSum and NonZero for float types only; 8.0 to 10.0:
ConstantOfShape for FP32 only, so neither integer nor FP16/BF16 fills; ReduceSum for FP32
and FP16). Where the float32 computation is exact, the node is computed in float32 and
cast back::

    ConstantOfShape(shape){value = v: an integer or BOOL}
        = Cast<T>(ConstantOfShape(shape){value = float32(v)})
        exact: v is an integer within +-2^24 (or 0/1), which float32 holds exactly
    ConstantOfShape(shape){value = v: FP16 or BF16}
        = Cast<T>(ConstantOfShape(shape){value = float32(v)})
        exact: float32 holds every FP16 and BF16 value (infinities and NaN too), and
        the Cast back rounds nothing; only where the target's Cast row lists T
        (`float_fill_refusal`: BF16 needs 9.0 or newer)
    Op(x: an integer type, ...){...},  x = Cast<integer>(b), b BOOL,
    Op one of CumSum, ReduceSum, ReduceMax, ReduceMin, ReduceProd
        = Cast<T>(Op(Cast<float32>(b), ...){...})
        exact: the terms are 0 or 1; a sum while it adds at most 2^24 of them (when how
        many is not known statically: assumed, and said in a note). The same for x a
        Gather from a constant integer table of 0s and 1s (Cast<float32>(x) then)
    NonZero(x: BOOL or an integer type) = NonZero(Cast<float32>(x))
        exact: no integer becomes 0 in float32
    Clip(x: an integer type, lo, hi) = Min(Max(x, lo), hi)
        exact: the same integer comparisons, in x's type (where the target lists Min
        and Max for it: 10.16 lists INT32 and INT64)

    ReduceMin/ReduceMax/ReduceSum/ReduceProd(x: an integer type) over axes of static
    extent, at most `ELEMENTWISE_TERMS` elements reduced into each output element
        = Min/Max(Gather(x, 0), Gather(x, 1), ...), Add/Mul(Add/Mul(Gather(x, 0), ...), ...)
        one reduced axis after another (Gather with a scalar index drops the axis, with
        index [i] keeps it for keepdims=1)
        exact: the same integer operations, in the integer type (the target's Gather,
        Min, Max, Add and Mul rows list INT32, which the 8.x parser makes of INT64);
        torchvision's detectors take ReduceMin/ReduceMax of their image size and
        ReduceProd of a shape, each a [2] vector

    CumSum(x: an integer type, axis a) = ReduceSum(Unsqueeze(x, a + 1) * M, a),
        M[j, i] = 1 where term j goes into sum i (built from Range at run time)
        exact: the same integer additions in x's type, where the target lists Mul,
        ReduceSum, Less, Add and Range for them (10.x); the product holds L times x

Any other integer CumSum or ReduceX is left with the reason: its terms are not known to
be small, and a float32 sum of large integers rounds. RoBERTa-family exports compute
their position ids as CumSum(Cast<INT32>(Not(Equal(ids, pad)))), Mask2Former counts mask
pixels as ReduceSum(Cast<INT64>(Not(mask))), and torchvision's detectors and YOLO's NMS
export call NonZero on BOOL: each is the form above.

`RETYPES` is the table op type -> planner; `lower-unsupported` applies it where the
target row supports the op but not the node's type (`TrtTarget.unlisted_type`), and
doctor names that pass as the fix then.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from graphfix.graph import constant_value
from graphfix.graph.dtypes import known_dtype
from graphfix.plugins.lowering import Builder, Emit, Env
from graphfix.trt import TrtTarget

EXACT_INTEGERS = 2**24
"""float32 holds every integer of magnitude up to this exactly."""

FLOAT_FILLS = {"FP16": TensorProto.FLOAT16, "BF16": TensorProto.BFLOAT16}
"""The table's names of the float types a ConstantOfShape value can be lowered from
(float32 holds each of their values exactly), with their ONNX element types."""


def typed_dtype(node: gs.Node) -> np.dtype | None:
    """The type the target's Supported Types column describes for a node of a `RETYPES`
    op, None when unknown: ConstantOfShape's value's (float32 by default), the others'
    input's (from its producer where a Cast or a comparison writes it and inference has
    not run)."""
    if node.op == "ConstantOfShape":
        value = node.attrs.get("value")
        array = constant_value(value) if isinstance(value, gs.Constant) else None
        return np.dtype(np.float32) if value is None else (
            None if array is None else np.asarray(array).dtype)
    return known_dtype(node.inputs[0]) if node.inputs else None


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
    elif v.dtype.name in ("float16", "bfloat16"):  # bfloat16: ml_dtypes, onnx's own
        fill = v.astype(np.float32)
    else:
        return (f"its value {v.item()!r} ({v.dtype}) is not an integer float32 holds "
                f"exactly (|v| <= 2^24) or a BOOL")
    shape, y, dtype = node.inputs[0], node.outputs[0], v.dtype

    def emit(b: Builder) -> None:
        attr = gs.Constant(f"{b.base}_value", np.array([fill], dtype=np.float32))
        filled = b.node("ConstantOfShape", [shape], {"value": attr}, dtype=np.float32)
        b.node("Cast", [filled], {"to": helper.np_dtype_to_tensor_dtype(dtype)}, out=y)

    return emit, ""


def _count(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """CumSum or ReduceSum/Max/Min/Prod over a BOOL tensor cast to an integer type."""
    x, y, op = node.inputs[0], node.outputs[0], node.op
    bits = _zero_or_one(x)
    if bits is None:
        return ("its terms are not a Cast of a BOOL tensor or rows of a 0/1 table, so they "
                "may be large, and a float32 sum of large integers rounds")
    dtype = known_dtype(x)
    if dtype is None:
        return "its integer type is unknown; run shape inference on the model first"
    rest, attrs, note = list(node.inputs[1:]), dict(node.attrs), ""
    if node.op in ("CumSum", "ReduceSum"):  # max, min and product of 0/1 are 0 or 1
        same = (x, bits, y) if op == "CumSum" else (x, bits)  # tensors of x's shape
        shape = next((t.shape for t in same if t.shape is not None), None)
        count = _summed(node, shape)
        if count is not None and count > EXACT_INTEGERS:
            return f"it sums {count} terms, so a float32 sum may round"
        if count is None:
            note = ("summed in float32: exact while it sums at most 2^24 = 16,777,216 terms "
                    "(how many is not known statically here)")

    def emit(b: Builder) -> None:
        terms = b.cast(bits, np.dtype(np.float32))
        total = b.node(op, [terms, *rest], attrs, dtype=np.float32)
        b.node("Cast", [total], {"to": helper.np_dtype_to_tensor_dtype(dtype)}, out=y)

    return emit, note


def _cumsum(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """An integer CumSum: in float32 over 0/1 terms (`_count`), else as a sum under a
    triangular mask in its own type (`_masked_sum`), or why neither."""
    counted = _count(node, env)
    if not isinstance(counted, str):
        return counted
    masked = _masked_sum(node, env)
    if not isinstance(masked, str):
        return masked
    return f"{counted}; nor as a masked sum in its own type: {masked}"


def _masked_sum(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """CumSum(x, axis a) of an integer x of known rank as ReduceSum(Unsqueeze(x, a + 1) *
    M, a), M[j, i] = 1 where term j goes into output i (j <= i; j < i exclusive; reversed
    the other way), built from Range(0, L) at run time: the same integer additions, in
    x's type. Where the target lists Mul, ReduceSum, Less, Add and Range for the types
    (TensorRT 10.x: INT32 and INT64; 8.x lists ReduceSum for floats only). The product
    holds L times x's elements (L the summed axis' length), said in a note. BLOOM's
    ALiBi positions are CumSum(attention_mask), an INT64 graph input."""
    x, y = node.inputs[0], node.outputs[0]
    dtype = known_dtype(x)
    if dtype is None or not np.issubdtype(dtype, np.integer):
        return "its input is not of a known integer type"
    shape = next((t.shape for t in (x, y) if t.shape is not None), None)
    axes = _axes(node, len(shape) if shape is not None else None)
    if not axes or env.opset < 11:
        return ("its axis or its input's rank is not known statically" if env.opset >= 11
                else "Range needs opset 11")
    axis, rank = axes[0], len(shape)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    if env.target is not None:
        for op, t in (("Mul", elem), ("ReduceSum", elem), ("Less", TensorProto.INT64),
                      ("Add", TensorProto.INT64), ("Range", TensorProto.INT64)):
            unlisted = env.target.unlisted_type(op, t)
            if unlisted is not None:
                return f"{env.target.label()} lists {op} without {unlisted}"
    exclusive = bool(node.attrs.get("exclusive", 0))
    reverse = bool(node.attrs.get("reverse", 0))
    trailing = [1] * (rank - axis - 1)
    length = shape[axis] if isinstance(shape[axis], int) and shape[axis] >= 0 else "L"

    def emit(b: Builder) -> None:
        i64 = np.dtype(np.int64)
        dims = b.node("Shape", [x], dtype=i64)
        size = b.node("Gather", [dims, b.const("axis", np.array(axis, np.int64))],
                      {"axis": 0}, dtype=i64)
        index = b.node("Range", [b.const("zero", np.array(0, np.int64)), size,
                                 b.const("one", np.array(1, np.int64))], dtype=i64)
        j = b.node("Reshape", [index, b.const("terms", np.array([-1, 1, *trailing]))],
                   dtype=i64)
        i = b.node("Reshape", [index, b.const("sums", np.array([1, -1, *trailing]))],
                   dtype=i64)
        low, high = (i, j) if reverse else (j, i)  # term j goes into sum i when low < high
        if not exclusive:  # or equal: low < high + 1
            high = b.node("Add", [high, b.const("step", np.array(1, np.int64))], dtype=i64)
        mask = b.cast(b.node("Less", [low, high], dtype=np.bool_), dtype)
        spread = _unsqueeze(b, x, axis + 1, dtype)
        terms = b.node("Mul", [spread, mask], dtype=dtype)
        if b.env.opset >= 13:
            b.node("ReduceSum", [terms, b.const("summed", np.array([axis], np.int64))],
                   {"keepdims": 0}, out=y)
        else:
            b.node("ReduceSum", [terms], {"axes": [axis], "keepdims": 0}, out=y)

    return emit, (f"summed under a triangular mask in {np.dtype(dtype).name}: exact; its "
                  f"product holds {length} times the input's elements")


def _unsqueeze(b: Builder, x: gs.Tensor, axis: int, dtype) -> gs.Tensor:
    if b.env.opset >= 13:
        return b.node("Unsqueeze", [x, b.const("spread", np.array([axis], np.int64))],
                      dtype=dtype)
    return b.node("Unsqueeze", [x], {"axes": [axis]}, dtype=dtype)


def _zero_or_one(x: gs.Tensor) -> gs.Tensor | None:
    """A tensor holding `x`'s values when they are all 0 or 1, to cast to float32: the BOOL
    tensor a Cast to an integer type reads, or `x` itself where a Gather picks it from a
    constant integer table of 0s and 1s (tf2onnx writes CombinedNonMaxSuppression's
    class counts as rows of an identity matrix); None otherwise. Casts between integer
    types before it are looked through (torch's dynamo exporter writes RoBERTa's
    position-id mask as Cast<INT64>(Cast<INT32>(Not(Equal(ids, pad))))): they keep 0
    and 1 as they are."""
    source = x.inputs[0] if len(x.inputs) == 1 else None
    if source is None or not source.inputs:
        return None
    while source.op == "Cast":
        inner = source.inputs[0]
        dtype = known_dtype(inner)
        if dtype == np.bool_:
            return inner
        if dtype is None or not np.issubdtype(dtype, np.integer) or len(inner.inputs) != 1:
            return None
        source = inner.inputs[0]
    if source.op == "Gather":
        table = constant_value(source.inputs[0])
        if (table is not None and np.issubdtype(table.dtype, np.integer)
                and table.size <= _TABLE_READ and np.isin(table, (0, 1)).all()):
            return x
    return None


_TABLE_READ = 1 << 20
"""The most elements of a table `_zero_or_one` reads."""


def _summed(node: gs.Node, shape) -> int | None:
    """How many terms one output element of a CumSum or ReduceSum adds at most, None where
    not known statically."""
    rank = len(shape) if shape is not None else None
    axes = _axes(node, rank)
    if axes is None or rank is None:
        return None
    dims = [shape[a] for a in axes]
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64))


def _axes(node: gs.Node, rank: int | None) -> list[int] | None:
    """The axes a CumSum or ReduceX node reduces, in [0, rank), sorted (all of them where
    none are given); None where not known statically or the rank is unknown, [] where
    it reduces nothing (noop_with_empty_axes)."""
    if rank is None:
        return None
    if node.op == "CumSum":
        axes = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    elif "axes" in node.attrs:
        axes = node.attrs["axes"]
    elif len(node.inputs) > 1 and node.inputs[1].name:
        axes = constant_value(node.inputs[1])
    else:
        axes = []
    if axes is None:
        return None
    axes = sorted({int(a) % rank for a in np.ravel(axes)}) if rank else []
    if not axes and not (node.op != "CumSum" and node.attrs.get("noop_with_empty_axes", 0)):
        axes = list(range(rank))
    return axes


ELEMENTWISE_TERMS = 16
"""The most elements `_by_elements` combines into one output element (one Gather each)."""

ELEMENTWISE_OPS = {"ReduceMin": "Min", "ReduceMax": "Max", "ReduceSum": "Add", "ReduceProd": "Mul"}
"""ReduceX -> the elementwise op that combines its slices (Min and Max take any number of
inputs, Add and Mul two; ONNX's Sum takes float types only)."""


def _reduce(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """An integer ReduceSum/Max/Min/Prod: over a Cast of BOOL in float32 (`_count`), else
    slice by slice in its own type (`_by_elements`)."""
    counted = _count(node, env)
    if not isinstance(counted, str):
        return counted
    sliced = _by_elements(node)
    if not isinstance(sliced, str):
        return sliced
    return f"{counted}; nor slice by slice: {sliced}"


def _by_elements(node: gs.Node) -> tuple[Emit, str] | str:
    """ReduceX over axes of static extent as Gathers of each slice, combined by the op
    `ELEMENTWISE_OPS` names (module docstring), or why not."""
    x, y, op = node.inputs[0], node.outputs[0], ELEMENTWISE_OPS[node.op]
    shape = x.shape
    axes = _axes(node, len(shape) if shape is not None else None)
    if axes is None:
        return "its input's rank or its axes are not known statically"
    if not axes:
        return "it reduces no axis (noop_with_empty_axes)"
    extents = [shape[a] for a in axes]
    if not all(isinstance(d, int) and d > 0 for d in extents):
        return f"the extents of its axes {axes} are not known statically (or are 0)"
    terms = int(np.prod(extents))
    if terms > ELEMENTWISE_TERMS:
        return (f"it reduces {terms} elements into each output element, more than the "
                f"{ELEMENTWISE_TERMS} graphfix combines one by one")
    keep = bool(node.attrs.get("keepdims", 1))
    dtype = known_dtype(x)

    def emit(b: Builder) -> None:
        t = x
        for step, axis in enumerate(reversed(axes)):  # the highest first: lower ones stay
            last = step == len(axes) - 1
            pieces = []
            for i in range(shape[axis]):
                index = b.const(f"index{axis}_{i}", np.array([i] if keep else i, np.int64))
                alone = last and shape[axis] == 1
                pieces.append(b.node("Gather", [t, index], {"axis": axis},
                                     out=y if alone else None, dtype=dtype))
            if len(pieces) == 1:
                t = pieces[0]
            elif op in ("Add", "Mul"):
                t = pieces[0]
                for i, piece in enumerate(pieces[1:], start=2):
                    t = b.node(op, [t, piece], out=y if last and i == len(pieces) else None,
                               dtype=dtype)
            else:
                t = b.node(op, pieces, out=y if last else None, dtype=dtype)

    return emit, ""


def _nonzero(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """NonZero of a BOOL or integer tensor: which elements are nonzero is the same in
    float32 (no integer becomes 0 there)."""
    x, y, attrs = node.inputs[0], node.outputs[0], dict(node.attrs)
    dtype = known_dtype(x)
    if dtype is None or not (dtype == np.bool_ or np.issubdtype(dtype, np.integer)):
        return "its input is not BOOL or an integer type (a float would round to 0)"

    def emit(b: Builder) -> None:
        b.node("NonZero", [b.cast(x, np.dtype(np.float32))], attrs, out=y)

    return emit, ""


def _clip(node: gs.Node, env: Env) -> tuple[Emit, str] | str:
    """Clip of an integer tensor as Min(Max(x, min), max) in its own type: what ONNX's
    reference and onnxruntime compute (min > max gives max), with the same integers;
    a missing bound leaves its op out. Where the target lists Min and Max for the type
    (TensorRT 10.16: INT32 and INT64; DeBERTa-v2's relative-position buckets clip INT64)."""
    x, y = node.inputs[0], node.outputs[0]
    dtype = known_dtype(x)
    if dtype is None or not np.issubdtype(dtype, np.integer):
        return "its input is not of a known integer type"
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    if env.target is not None:
        for op in ("Max", "Min"):
            unlisted = env.target.unlisted_type(op, elem)
            if unlisted is not None:
                return f"{env.target.label()} lists {op} without {unlisted} as well"
    bounds = [node.inputs[i] if len(node.inputs) > i and not node.inputs[i].is_empty()
              else None for i in (1, 2)]

    def emit(b: Builder) -> None:
        t = x
        steps = [(op, bound) for op, bound in zip(("Max", "Min"), bounds, strict=True)
                 if bound is not None]
        if not steps:
            b.node("Identity", [x], out=y)
        for i, (op, bound) in enumerate(steps):
            t = b.node(op, [t, bound], out=y if i == len(steps) - 1 else None, dtype=dtype)

    return emit, ""


def retypes(op: str, type_name: str) -> bool:
    """Whether `RETYPES` has a planner for `op` on the table's type `type_name`
    (`TrtTarget.unlisted_type`'s names): an integer or BOOL one, or for ConstantOfShape
    also FP16 and BF16 (a fill; a float sum or NonZero computed wider would not be the
    same computation)."""
    if op not in RETYPES:
        return False
    return type_name.startswith(("INT", "UINT", "BOOL")) or (
        op == "ConstantOfShape" and type_name in FLOAT_FILLS)


def float_fill_refusal(target: TrtTarget, type_name: str) -> str:
    """Why `target` cannot take an FP16/BF16 (`type_name`) ConstantOfShape as an FP32 one
    and a Cast back, "" when it can: its ConstantOfShape row must list FP32 and its Cast
    row `type_name` (8.x lists Cast without BF16: BF16 came with 9.0, parser notes
    "BF16_FP8" in trt/onnx_trt_operators.json)."""
    if target.unlisted_type("ConstantOfShape", TensorProto.FLOAT) is not None:
        return f"{target.label()} lists ConstantOfShape without FP32 as well"
    if target.unlisted_type("Cast", FLOAT_FILLS[type_name]) is not None:
        return (f"{target.label()} lists Cast without {type_name}, so an FP32 fill cannot be "
                "cast back")
    return ""


RETYPES: dict[str, Callable[[gs.Node, Env], tuple[Emit, str] | str]] = {
    "ConstantOfShape": _constant_of_shape,
    "NonZero": _nonzero,
    "CumSum": _cumsum,
    "Clip": _clip,
    **{op: _reduce for op in ELEMENTWISE_OPS},
}
"""op type -> planner: (the emitting function, a note or "") or why it cannot."""
