"""Exposing a model's tensors as graph outputs, and sizing them for a memory budget.

onnxruntime returns graph outputs only; to read an intermediate tensor, a copy of the
model lists it as an output (`exposed_model`, `exposed_session`). `activation_bytes`
estimates each tensor's size for one batch from shape inference, and
`chunk_tensors` splits the tensors into chunks that fit a budget, so that
`graphfix check` and `graphfix calibrate` bound the memory of what they expose.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from graphfix.graph.protos import infer_shapes
from graphfix.graph.skeleton import skeleton
from graphfix.runtime.session import make_session


def infer_tensor_info(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> dict[str, tuple[int, list]]:
    """name -> (ONNX elem type, dims) from shape inference on the weightless
    skeleton with the graph inputs fixed to the shapes of `feeds`."""
    sk = skeleton(model)
    for vi in sk.graph.input:
        if vi.name in feeds and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.shape(feeds[vi.name]):
                shape.dim.add().dim_value = int(size)
    try:
        inferred = infer_shapes(sk)
    except Exception:  # inference fails on some custom ops: keep what the model declares
        inferred = sk
    info: dict[str, tuple[int, list]] = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        info[vi.name] = (tt.elem_type, dims if tt.HasField("shape") else None)
    for t in model.graph.initializer:
        info[t.name] = (t.data_type, list(t.dims))
    return info


def _bytes(elem_type: int, dims: list | None) -> int | None:
    if dims is None or any(d is None or d < 0 for d in dims):
        return None
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return itemsize * math.prod(dims)


def activation_bytes(
    model: onnx.ModelProto, tensors: Sequence[str], data_first_batch: dict[str, np.ndarray],
    info: dict[str, tuple[int, list]] | None = None,
) -> dict[str, int]:
    """Estimated bytes of each tensor for one batch shaped like `data_first_batch`.

    Graph inputs are measured from the batch itself; other tensors come from
    ONNX shape inference with the inputs fixed to that batch's shapes. A tensor
    whose size inference cannot tell (data-dependent shapes, custom ops) is
    assumed as large as the largest known tensor of the model, or, when none is
    known, as the whole batch: a conservative guess for chunking. `info` is
    `infer_tensor_info(model, data_first_batch)` when the caller has it already.
    """
    if info is None:
        info = infer_tensor_info(model, data_first_batch)
    sizes = {name: _bytes(et, dims) for name, (et, dims) in info.items()}
    for name, arr in data_first_batch.items():
        sizes[name] = int(np.asarray(arr).nbytes)
    known = [s for s in sizes.values() if s is not None]
    fallback = max(known) if known else sum(int(np.asarray(a).nbytes)
                                            for a in data_first_batch.values())
    return {t: sizes[t] if sizes.get(t) is not None else fallback for t in tensors}


def chunk_tensors(tensors, sizes, budget) -> tuple[list[list[str]], list[str]]:
    """Greedy chunks (in the given order) whose summed sizes fit `budget`."""
    if budget is None:
        return ([list(tensors)] if tensors else []), []
    chunks: list[list[str]] = []
    notes: list[str] = []
    current: list[str] = []
    used = 0
    for t in tensors:
        if sizes[t] > budget:
            notes.append(f"'{t}' needs about {sizes[t]:,} bytes per batch, more than the memory "
                         f"budget of {budget:,}: it runs alone")
            chunks.append([t])
            continue
        if current and used + sizes[t] > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(t)
        used += sizes[t]
    if current:
        chunks.append(current)
    return chunks, notes


def exposed_model(model: onnx.ModelProto, names: Sequence[str], info=None) -> onnx.ModelProto:
    """A copy of the model whose graph outputs are exactly `names`, typed from `info`
    (`infer_tensor_info`) where given, else left to onnxruntime (so tensors shape
    inference cannot type can still be read)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(
        helper.make_tensor_value_info(n, info[n][0], None) if info is not None
        else helper.make_empty_tensor_value_info(n) for n in names)
    return out


def exposed_session(model: onnx.ModelProto, names: Sequence[str], providers: Sequence[str]):
    """An onnxruntime session whose outputs are exactly `names`."""
    return make_session(exposed_model(model, names), providers)
