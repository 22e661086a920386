"""`eliminate-noops` rules for nodes that compute nothing on their own (private module).

A rule takes a node and the graph view and returns a `Plan`, a reason (str) to keep a
candidate, or None for a node that is not a candidate at all. Rules only decide;
`eliminate_noops._apply` edits the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import constant_value, fresh_name, is_onnx
from graphfix.graph.dtypes import computed_dtype
from graphfix.passes._noop_shapes import (
    broadcast_refusal,
    clamp_index,
    elem_type,
    expand_keeps,
    shape_text,
    slice_params,
    static_shape,
    type_name,
)
from graphfix.passes._shape_values import Value, evaluate

_INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class Plan:
    """A rewrite of one node: it goes (`remove`) or stays with new attributes, a new
    second input (`operand`, named after `operand_role`) or a new op type (`op`).

    `source` replaces its first input; `drop` is the node before it that goes too;
    `inputs` replaces all of its inputs (a node that stays); `rewire` points other nodes'
    inputs at `rewire_to`, whose shape the `reshaped` tensors take.
    """

    count: str
    remove: bool = True
    source: gs.Tensor | None = None
    drop: gs.Node | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    operand: np.ndarray | None = None
    operand_role: str = "shape"
    op: str | None = None
    inputs: list[gs.Tensor] | None = None
    # other nodes' inputs (node, index) that read `rewire_to` instead, and tensors that
    # take its shape (`_noop_pairs.around_elementwise`)
    rewire: list[tuple[gs.Node, int]] = field(default_factory=list)
    rewire_to: gs.Tensor | None = None
    reshaped: list[gs.Tensor] = field(default_factory=list)


@dataclass
class View:
    """One graph being swept: its nodes, the model's opset, every tensor name in use."""

    g: gs.Graph
    opset: int
    node_ids: set[int]
    names: set[str]


def identity(node: gs.Node, view: View) -> Plan:
    return Plan("removed Identity")


def dropout(node: gs.Node, view: View) -> Plan | str:
    """Dropout in inference mode, or with ratio 0 in any mode (it keeps every element and
    scales by 1/(1 - 0)), returns its input; its mask output must be unused."""
    training = _dropout_training(node, view)
    if training is None:
        return Plan("removed inference Dropout")
    ratio = _dropout_ratio(node, view)
    if ratio == 0:  # whatever the training mode
        return Plan("removed Dropout with ratio 0")
    return training if ratio is not None else f"{training}; its ratio input is not a constant"


def _dropout_training(node: gs.Node, view: View) -> str | None:
    """Why `node` is (or may be) in training mode, None in inference mode."""
    if len(node.inputs) >= 3 and not node.inputs[2].is_empty():
        mode = constant_value(node.inputs[2])
        if mode is None:
            return "its training_mode input is not a constant"
        if mode.size and bool(mode.reshape(-1)[0]):
            return "it is in training mode (training_mode is true)"
    if view.opset < 7 and int(node.attrs.get("is_test", 0)) == 0:  # 0 is the default there
        return "it is in training mode (is_test=0, the default before opset 7)"
    return None


def _dropout_ratio(node: gs.Node, view: View) -> float | None:
    """The drop ratio (an attribute before opset 12, an input from 12; 0.5 by default),
    None when it is not a constant."""
    if view.opset < 12:
        return float(node.attrs.get("ratio", 0.5))
    if len(node.inputs) < 2 or node.inputs[1].is_empty():
        return 0.5
    value = constant_value(node.inputs[1])
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def cast(node: gs.Node, view: View) -> Plan | str:
    source = elem_type(node.inputs[0])
    if source is None:
        return "its input dtype is unknown"
    target = int(node.attrs["to"])
    if source != target:
        return f"it casts {type_name(source)} to {type_name(target)}"
    computed = _computed_type(node.inputs[0])
    if computed is not None and computed != source:
        return (f"its input is declared {type_name(source)}, but the nodes computing it make "
                f"{type_name(computed)}: the model's value_info contradicts its nodes "
                "(onnxruntime cannot load it)")
    return Plan("removed Cast to the same type")


def _computed_type(tensor: gs.Tensor) -> int | None:
    """The ONNX element type the nodes computing `tensor` give it (`computed_dtype`: not a
    declared type, which a stale value_info can make wrong), or None."""
    dtype = computed_dtype(tensor)
    try:
        return None if dtype is None else int(helper.np_dtype_to_tensor_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return None


def expand(node: gs.Node, view: View) -> Plan | str:
    same = same_shape(node, expand_keeps)
    return Plan("removed Expand to the same shape") if same is True else same


def split(node: gs.Node, view: View) -> Plan | None:
    """A Split with one output returns its whole input (the split sizes must add up)."""
    return Plan("removed single-output Split") if len(node.outputs) == 1 else None


_NEUTRAL = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1}

MAX_NEUTRAL_ELEMENTS = 1 << 20
"""Largest constant read to see whether every element is neutral (a bias vector, a
LayerScale, an attention bias table: a zero-initialized one in an export with random
weights is common; EfficientFormerV2's is 8 x 49 x 196). Read without caching, so
at most 4 MiB (float32) in memory at a time."""


def arithmetic(node: gs.Node, view: View) -> Plan | str | None:
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 -> x, every element of the constant neutral,
    when the constant cannot broadcast x to a larger shape. (x + 0 turns -0.0 into +0.0:
    equal as numbers; onnxruntime's own NoopElimination makes the same trade.)"""
    if len(node.inputs) != 2:
        return None
    neutral = _NEUTRAL[node.op]
    orders = [(0, 1), (1, 0)] if node.op in ("Add", "Mul") else [(0, 1)]
    found = [(node.inputs[i], node.inputs[j], shape) for i, j in orders
             if (shape := _small_constant_shape(node.inputs[j])) is not None]
    if not found:
        return None  # no small constant: not a candidate
    x, c, shape = found[0]
    value = constant_value(c)
    if value is None or not np.all(value == neutral):
        return None
    return broadcast_refusal(x, shape) or Plan(
        f"removed {node.op} of the neutral constant {neutral}", source=x)


def _small_constant_shape(tensor: gs.Tensor) -> list[int] | None:
    """The shape of a constant of at most MAX_NEUTRAL_ELEMENTS elements, else None
    (loads nothing to find out)."""
    if isinstance(tensor, gs.Constant):
        shape = list(tensor.shape)
    else:
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None or producer.op not in ("Constant", "Identity"):
            return None
        value = constant_value(tensor)
        if value is None:
            return None
        shape = list(value.shape)
    return shape if int(np.prod(shape, dtype=np.int64)) <= MAX_NEUTRAL_ELEMENTS else None


def concat(node: gs.Node, view: View) -> Plan | None:
    """A single-input Concat returns it; inputs of size 0 along the axis add nothing
    (exporters leave them where a head has no mask coefficients or keypoints, and
    TensorRT handles empty tensors poorly): they go, and with one input left so does
    the Concat. An input counts as empty only where its shape says so statically."""
    if len(node.inputs) == 1:
        return Plan("removed single-input Concat")
    ranks = {len(t.shape) for t in node.inputs if t.shape is not None}
    if len(ranks) != 1:
        return None
    rank = ranks.pop()
    axis = int(node.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return None
    kept = [t for t in node.inputs if not (t.shape is not None and t.shape[axis] == 0)]
    if len(kept) == len(node.inputs) or not kept:
        return None  # nothing empty, or all of it (the output is empty too)
    if len(kept) == 1:
        return Plan("removed Concat whose other inputs are empty", source=kept[0])
    return Plan("dropped empty Concat inputs", remove=False, inputs=kept)


def slice_(node: gs.Node, view: View) -> Plan | str:
    params = slice_params(node, view.opset)
    if isinstance(params, str):
        return params
    starts, ends, axes, steps = params
    dims = node.inputs[0].shape
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        if step != 1:
            return f"it steps by {step} on axis {axis}"
        if start == 0 and end >= _INT64_MAX:
            continue  # the whole axis, whatever its size
        if axis < 0:
            axis += len(dims) if dims is not None else 0
        dim = dims[axis] if dims is not None and 0 <= axis < len(dims) else None
        if not isinstance(dim, int) or dim < 0:
            return f"shape unknown: the size of sliced axis {axis} is not static"
        kept = (clamp_index(start, dim), clamp_index(end, dim))
        if kept != (0, dim):
            return f"it keeps [{kept[0]}, {kept[1]}) of {dim} on axis {axis}"
    return Plan("removed Slice of the whole tensor")


def pad(node: gs.Node, view: View) -> Plan | str:
    if view.opset >= 11:
        value = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
        if value is None:
            return "its pads input is not a constant"
        pads = value.reshape(-1).tolist()
    else:
        pads = list(node.attrs.get("pads", node.attrs.get("paddings", [])))
    if any(pads):
        return f"it pads by {tuple(int(p) for p in pads)}"
    return Plan("removed all-zero Pad")


def same_shape(node: gs.Node, keeps: Callable[[list, list[int]], bool | None]) -> bool | str:
    """True when `node` keeps its input's shape; else why not, or why it is not known.

    `keeps(dims, target)` decides from the constant target when it can.
    """
    x, y = node.inputs[0], node.outputs[0]
    target = constant_value(node.inputs[1])
    if x.shape is not None and target is not None:
        flat = [int(v) for v in target.reshape(-1)]
        verdict = keeps(list(x.shape), flat)
        if verdict is not None:
            changes = f"its target shape {tuple(flat)} changes the input shape {shape_text(x)}"
            return verdict or changes
    before, after = static_shape(x.shape), static_shape(y.shape)
    if before is None or after is None:
        return "shape unknown: its input or output shape is not fully static"
    return before == after or f"its output shape {after} differs from its input shape {before}"


def where(node: gs.Node, view: View) -> Plan | str | None:
    """Where(Equal(v, k), a, b) on small integer shape values (`_shape_values.evaluate`)
    whose condition is known entry by entry: the entries it selects, as the branch itself,
    a constant, or a Concat of the branches' Concat parts and constants. PyTorch writes
    `expand(n, -1, s)` as Where(Equal(shape, -1), 1, shape) (a size is never negative)."""
    cond = node.inputs[0] if len(node.inputs) == 3 else None
    if cond is None or len(cond.inputs) != 1 or not is_onnx(cond.inputs[0], "Equal"):
        return None
    values = [evaluate(t, view.opset) for t in node.inputs]
    if isinstance(values[0], str):
        return None  # not a comparison of shape values
    unknown = [i for i, c in enumerate(values[0].entries) if not isinstance(c, int)]
    if unknown:
        return (f"its condition is not known statically at entries {unknown} (values not "
                "evaluated, or that may be negative)")
    sizes = [_size(t, v) for t, v in zip(node.inputs, values, strict=True)]
    if any(size is None for size in sizes):
        return "shape unknown: the length of one of its inputs is not known"
    length, scalar = max(n for n, _ in sizes), all(z for _, z in sizes)
    if any(n not in (1, length) for n, _ in sizes):
        return None  # it does not broadcast: the model is wrong
    picks = [2 - bool(values[0].entries[i if sizes[0][0] > 1 else 0]) for i in range(length)]
    for k in set(picks):
        if isinstance(values[k], str):
            return f"the input it selects is not known: {values[k]}"
    chosen = [values[k].entries[i if sizes[k][0] > 1 else 0] for i, k in enumerate(picks)]
    if len(set(picks)) == 1 and sizes[picks[0]] == (length, scalar):
        return Plan("removed Where with a known condition", source=node.inputs[picks[0]])
    parts = {k: _parts(node.inputs[k], sizes[k], (length, scalar), view.opset) for k in (1, 2)}
    pieces: list[gs.Tensor | list[int]] = []
    i = 0
    while i < length:
        part = parts[picks[i]].get(i)
        if part is not None and set(picks[i:i + part[1]]) == {picks[i]}:
            pieces.append(part[0])
            i += part[1]
        elif isinstance(chosen[i], int):
            if not pieces or not isinstance(pieces[-1], list):
                pieces.append([])
            pieces[-1].append(chosen[i])
            i += 1
        else:
            return (f"entry {i} it selects is not a constant and not a whole input of the "
                    "Concat that computes that input")
    return _where_plan(node, view, pieces, scalar)


def _size(tensor: gs.Tensor, value: Value | str) -> tuple[int, bool] | None:
    """(length, 0-D) of a 0-D/1-D value: evaluated, or from the tensor's static shape."""
    if not isinstance(value, str):
        return len(value.entries), value.scalar
    shape = static_shape(tensor.shape)
    if shape is None or len(shape) > 1:
        return None
    return (shape[0] if shape else 1), not shape


def _parts(tensor: gs.Tensor, size: tuple[int, bool], out: tuple[int, bool],
           opset: int) -> dict[int, tuple[gs.Tensor, int]]:
    """Where each piece of `tensor` starts in Where's output -> (piece, length): the inputs
    of the Concat writing it, or else the whole tensor; none unless it has the output's
    shape."""
    if size != out:
        return {}
    producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
    if (producer is None or not is_onnx(producer, "Concat")
            or int(producer.attrs.get("axis", 0)) not in (0, -1)):
        return {0: (tensor, size[0])}
    found, start = {}, 0
    for inp in producer.inputs:
        value = evaluate(inp, opset)
        if isinstance(value, str) or value.scalar:
            return {0: (tensor, size[0])}
        found[start] = (inp, len(value.entries))  # an empty one is overwritten
        start += len(value.entries)
    return found if start == size[0] else {0: (tensor, size[0])}


def _where_plan(node: gs.Node, view: View, pieces: list, scalar: bool) -> Plan | str:
    """The Plan that makes `node` give `pieces` (tensors and runs of constant entries)."""
    dtype = next((t for t in (elem_type(x) for x in (*node.outputs, *node.inputs[1:]))
                  if t is not None), None)
    if dtype is None and any(isinstance(p, list) for p in pieces):
        return "its output dtype is not known"
    inputs = [p if isinstance(p, gs.Tensor) else gs.Constant(
        fresh_name(f"{node.outputs[0].name}_entries", view.names),
        np.array(p if not scalar else p[0], dtype=helper.tensor_dtype_to_np_dtype(dtype)))
        for p in pieces]
    if len(inputs) == 1:
        return Plan("removed Where with a known condition", source=inputs[0])
    return Plan("turned Where with a known condition into a Concat", remove=False,
                op="Concat", inputs=inputs, attrs={"axis": 0})
