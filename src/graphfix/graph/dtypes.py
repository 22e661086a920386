"""The dtype of a graphsurgeon tensor, found through its producer when it has none of its
own (onnxruntime's saved models carry no value_info, and passes run before inference):
`float_dtype` for float ops, `known_dtype` for any type."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper


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
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(int(producer.attrs["to"])))
        except (KeyError, TypeError, ValueError):
            return None
    return None


def _own_float_dtype(tensor: gs.Tensor) -> np.dtype | None:
    try:
        dtype = tensor.dtype
    except Exception:  # a lazily loaded constant of a type numpy lacks
        return None
    if dtype is None:
        return None
    if isinstance(dtype, int):
        try:
            dtype = helper.tensor_dtype_to_np_dtype(dtype)
        except Exception:
            return None
    return _as_float(dtype)


def _as_float(dtype: Any) -> np.dtype | None:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    return dtype if np.issubdtype(dtype, np.floating) else None
