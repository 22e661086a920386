"""The dtype of a graphsurgeon tensor, found through its producer when it has none of its
own (onnxruntime's saved models carry no value_info, and passes run before inference):
`float_dtype` for float ops, `known_dtype` for any type; `computed_dtype` from the nodes
alone, never from a declared (possibly stale) type of a node's output."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph.protos import TYPE_NAMES, type_source
from graphfix.graph.walk import BODY_OPS, is_onnx


def float_dtype(tensor: gs.Tensor, memo: dict[int, Any] | None = None) -> np.dtype | None:
    """The floating dtype of a tensor: its own, else found through its producers.

    onnxruntime's saved models carry no value_info, so intermediate tensors have no
    dtype in gs. Walking back through producers finds the first floating input (a
    Cast gives its `to`), which is the tensor's type for every float op that keeps
    its input's type. Returns None when none is found.
    """
    memo = {} if memo is None else memo
    key = id(tensor)
    if key in memo:
        return memo[key]
    memo[key] = None  # guards against cycles through subgraph links
    found = _own_float_dtype(tensor)
    if found is None and len(tensor.inputs) == 1:
        producer = tensor.inputs[0]
        if producer.op == "Cast" and "to" in producer.attrs:
            found = _as_float(helper.tensor_dtype_to_np_dtype(int(producer.attrs["to"])))
        else:
            candidates = producer.inputs[1:2] if producer.op == "CastLike" else producer.inputs
            for inp in candidates:
                found = float_dtype(inp, memo) if not inp.is_empty() else None
                if found is not None:
                    break
    memo[key] = found
    return found


BOOL_OPS = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not",
                      "And", "Or", "Xor", "IsNaN", "IsInf"})
"""Ops whose output is BOOL whatever their inputs."""


def known_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """The tensor's dtype: its own, else BOOL where a comparison or logic op writes it, or
    a Cast's `to`; None otherwise."""
    if tensor.dtype is not None:
        return np.dtype(tensor.dtype)
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if producer is None:
        return None
    if producer.op in BOOL_OPS:
        return np.dtype(np.bool_)
    if producer.op == "Cast" and "to" in producer.attrs:
        return np_dtype(int(producer.attrs["to"]))
    return None


MAX_WALK = 1000
"""Producers `computed_dtype` follows back before it gives up (None)."""


def computed_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """The tensor's dtype as the nodes computing it fix it, never read from the declared
    type of a node's output (a value_info can contradict its node, and shape inference
    then carries the wrong type on downstream). From: a graph input's or a constant's
    own dtype; what a node writes whatever its inputs (Cast's `to`, a Constant's value,
    a comparison's BOOL, a type the op's schema fixes: Shape's INT64); through an op
    whose schema gives the output the type variable of an input (Relu, Add, Reshape,
    Conv, Concat, Split...), that input's. None when it cannot be told: a custom op, an
    If/Loop/Scan output, or more than `MAX_WALK` producers back."""
    for _ in range(MAX_WALK):
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if isinstance(tensor, gs.Constant) or producer is None:  # a graph input's is its own
            return _own_dtype(tensor)
        if not is_onnx(producer) or producer.op in BODY_OPS:
            return None
        if producer.op in BOOL_OPS:
            return np.dtype(np.bool_)
        if producer.op == "Cast" and "to" in producer.attrs:
            return _np_dtype(int(producer.attrs["to"]))
        if producer.op == "Constant":
            value = producer.attrs.get("value")
            return _own_dtype(value) if isinstance(value, gs.Constant) else None
        source = type_source(producer.op, producer.outputs.index(tensor))
        if isinstance(source, str):
            return _np_dtype(TYPE_NAMES.get(source))
        if source is None or source >= len(producer.inputs) or producer.inputs[source].is_empty():
            return None
        tensor = producer.inputs[source]
    return None



def _own_dtype(tensor: gs.Tensor) -> np.dtype | None:
    try:
        return _np_dtype(tensor.dtype)
    except Exception:  # a lazily loaded constant of a type numpy lacks
        return None


def np_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype gs uses for an ONNX element type; None when numpy has none."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _np_dtype(dtype: Any) -> np.dtype | None:
    """A numpy dtype from a numpy dtype or an ONNX element type; None when unknown."""
    if dtype is None or dtype == 0:
        return None
    if isinstance(dtype, int):
        return np_dtype(dtype)
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def _own_float_dtype(tensor: gs.Tensor) -> np.dtype | None:
    dtype = _own_dtype(tensor)
    return None if dtype is None else _as_float(dtype)


def _as_float(dtype: Any) -> np.dtype | None:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    return dtype if np.issubdtype(dtype, np.floating) else None
