"""Shared by fuse-conv-bias and fuse-conv-mul: match `Op(linear(x), c)`, read `c` per channel.

A constant c combined elementwise with a conv output y of rank r ([N, C, spatial...])
acts per output channel only when, after numpy-style broadcasting (which aligns
*trailing* axes), it varies along axis 1 at most and adds no axis of its own::

    c.ndim <= r  and  pad(c.shape, r)[i] == 1 for every i != 1
                 and  pad(c.shape, r)[1] in (1, C)

So [1, C, 1, 1], [C, 1, 1], [1] and scalars are per channel for a rank-4 output,
while [C] is not: it lines up with the last axis (W). [C] is per channel only for
a rank-2 output. A constant of higher rank than the output would make the
elementwise op's output larger than the conv's, so it never folds.

The helpers here never write into an array they read: new values are new arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    is_onnx,
    names_in_use,
    node_label,
    take_output,
)
from graphfix.passes._conv_copy import ConvCopies, counted, label
from graphfix.passes.base import LIMIT_REACHED, Note, PassContext, PassResult

CONV_OPS = ("Conv", "ConvTranspose")

# Why the linear op's output cannot be the second operand of a non-commutative op.
_SECOND_OPERAND = {
    "Sub": "the {p} output is subtracted from a constant (c - {p}), which would negate "
    "its weights; only {p} - c folds into the bias",
    "Div": "the {p} output is the divisor (c / {p}), which is not a per-channel scale",
}


@dataclass(frozen=True)
class Match:
    """An elementwise `node` reading `producer`'s output and a constant `value` (when the
    output has other readers, `_conv_copy` decides whether the fold goes into a copy)."""

    node: gs.Node
    producer: gs.Node
    value: np.ndarray


def match(
    node: gs.Node, producers: tuple[str, ...], node_ids: set[int]
) -> Match | str | None:
    """The match for `node`, why it cannot fold, or None when no input comes from `producers`.

    `node` is a binary elementwise op (Add, Sub, Mul, Div); for Sub and Div only the
    first operand may be the linear op's output. What makes the op something else than
    a per-channel constant (a non-constant operand) is checked before whether the linear
    op's output has other readers, so a note gives the first reason that applies.
    """
    if len(node.inputs) != 2:
        return None
    sides = [i for i, t in enumerate(node.inputs) if _produced_by(t, producers)]
    if not sides:
        return None
    side = sides[0]
    producer = node.inputs[side].inputs[0]
    if side == 1 and node.op in _SECOND_OPERAND:
        return _SECOND_OPERAND[node.op].format(p=producer.op)
    if id(producer) not in node_ids:
        return f"its {producer.op} input comes from an enclosing graph"
    other = node.inputs[1 - side]
    value = constant_value(other)
    if value is None:
        source = f" (it comes from {node_label(other.inputs[0])})" if other.inputs else ""
        return f"its other input '{other.name}' is not a constant{source}"
    if not np.issubdtype(value.dtype, np.floating):
        return f"its constant '{other.name}' is {value.dtype}, not floating point"
    return Match(node=node, producer=producer, value=value)


def _produced_by(tensor: gs.Tensor, producers: tuple[str, ...]) -> bool:
    if isinstance(tensor, gs.Constant) or len(tensor.inputs) != 1:
        return False
    producer = tensor.inputs[0]
    return is_onnx(producer, *producers) and producer.outputs[0] is tensor


def dtype_reason(m: Match, dtype: np.dtype | None) -> str | None:
    """Why the elementwise op does not compute in the linear op's dtype, if it does not."""
    if dtype is None:
        return None
    if m.value.dtype != dtype:
        return f"its constant is {m.value.dtype} but the {m.producer.op} computes {dtype}"
    out = tensor_dtype(m.node.outputs[0])
    if out is not None and out != dtype:
        return f"its output is {out} but the {m.producer.op} output is {dtype}"
    return None


def tensor_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """The numpy dtype of a tensor when known (constants: their values' dtype)."""
    if isinstance(tensor, gs.Constant):
        value = constant_value(tensor)
        return None if value is None else value.dtype
    try:
        return np.dtype(tensor.dtype) if tensor.dtype is not None else None
    except TypeError:  # an ONNX type numpy has no name for (bfloat16, float8)
        return None


# ----------------------------------------------------------------------------- conv weights


def conv_weights(node: gs.Node) -> tuple[np.ndarray, np.ndarray | None] | str:
    """A Conv/ConvTranspose's constant weights and bias (None when absent), or why not."""
    w = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None:
        return f"the {node.op} weights are not a constant"
    if not np.issubdtype(w.dtype, np.floating):
        return f"the {node.op} weights are {w.dtype}, not floating point"
    if w.ndim < 3:
        return f"the {node.op} weights have rank {w.ndim}, not 3 or more"
    if len(node.inputs) <= 2 or node.inputs[2].is_empty():
        return w, None
    b = constant_value(node.inputs[2])
    if b is None:
        return f"the {node.op} bias is not a constant"
    return w, b


def out_channels(node: gs.Node, w: np.ndarray) -> int | str:
    """Output channels: Conv weights are [Cout, Cin/g, k...], ConvTranspose [Cin, Cout/g, k...]."""
    if node.op == "Conv":
        return int(w.shape[0])
    groups = int(node.attrs.get("group", 1))
    if groups < 1 or w.shape[0] % groups:
        return f"the ConvTranspose has {w.shape[0]} input channels, not divisible by group={groups}"
    return groups * int(w.shape[1])


def scale_out_channels(node: gs.Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """W scaled by s[o] along output channel o (float64 math, W's dtype back).

    ConvTranspose output channel o = group * (Cout/g) + j sits at W[group*Cin/g + i, j].
    """
    w64 = w.astype(np.float64)
    if node.op == "Conv":
        return (w64 * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    groups, per_group, kernel = int(node.attrs.get("group", 1)), w.shape[1], w.shape[2:]
    grouped = w64.reshape((groups, w.shape[0] // groups, per_group) + kernel)
    scaled = grouped * s.reshape((groups, 1, per_group) + (1,) * len(kernel))
    return scaled.reshape(w.shape).astype(w.dtype)


def channel_vector(
    value: np.ndarray, rank: int, channels: int, where: str
) -> np.ndarray | str:
    """`value` as one float64 number per output channel, or why it is not per channel.

    `where` names the output in reasons ("Conv output").
    """
    if value.ndim > rank:
        return (
            f"the constant has rank {value.ndim}, higher than the rank-{rank} {where}, "
            "so the result would broadcast to a larger output"
        )
    padded = (1,) * (rank - value.ndim) + tuple(value.shape)
    axis = next((i for i, size in enumerate(padded) if i != 1 and size != 1), None)
    if axis is not None:
        hint = _per_channel_shapes(rank, channels)
        if value.ndim == 1 and rank > 2:
            return (
                f"the constant of shape {list(value.shape)} lines up with the last axis of "
                f"the rank-{rank} {where} (broadcasting aligns trailing axes), not with the "
                f"channel axis 1; {hint}"
            )
        return (
            f"the constant of shape {list(value.shape)} varies along axis {axis} of the "
            f"rank-{rank} {where}, not only along the channel axis 1; {hint}"
        )
    if padded[1] not in (1, channels):
        return (
            f"the constant has {padded[1]} values along the channel axis "
            f"but the {where} has {channels} channel{'s' if channels != 1 else ''}"
        )
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,)).copy()


def _per_channel_shapes(rank: int, channels: int) -> str:
    tail = [1] * (rank - 2)
    return f"a per-channel constant has shape {[channels] + tail} or {[1, channels] + tail}"


# ----------------------------------------------------------------------------- rewrite


def set_input(node: gs.Node, index: int, tensor: gs.Tensor) -> None:
    """Put `tensor` at input `index`, appending when the optional input is absent."""
    if len(node.inputs) > index:
        node.inputs[index] = tensor
    else:
        node.inputs.append(tensor)


def absorb(m: Match) -> None:
    """The producer takes the elementwise op's output tensor (name, dtype); the op is cut off."""
    y, out = m.producer.outputs[0], m.node.outputs[0]
    m.node.inputs.clear()
    m.node.outputs.clear()
    take_output(m.producer, y, out)


def conv_operands(m: Match) -> tuple[np.ndarray, np.ndarray | None, np.ndarray] | str:
    """The conv's weights, its bias (None when absent) and the constant as one float64
    value per output channel, or why the constant does not fold into this conv."""
    weights = conv_weights(m.producer)
    if isinstance(weights, str):
        return weights
    w, b = weights
    reason = dtype_reason(m, w.dtype)
    if reason:
        return reason
    channels = out_channels(m.producer, w)
    if isinstance(channels, str):
        return channels
    vector = channel_vector(m.value, w.ndim, channels, f"{m.producer.op} output")
    if isinstance(vector, str):
        return vector
    if b is not None and b.size != channels:
        return f"the {m.producer.op} bias has {b.size} values for {channels} output channels"
    return w, b, vector


def fold_elementwise(
    graph: gs.Graph,
    ctx: PassContext,
    pass_name: str,
    ops: tuple[str, ...],
    producers: tuple[str, ...],
    plan: Callable[[Match], Any],
    rewrite: Callable[[Match, Any, set[str]], None],
    what: Callable[[Match], str],
    nothing: str,
) -> PassResult:
    """The loop both fuse passes share: every `ops` node reading a `producers` output and
    a constant is matched, planned (`plan` returns the new values or why not), rewritten
    (one rewrite for `ctx.allow_rewrite`), and counted under `what(match)`; `nothing` is
    the note when no candidate exists. A match whose producer output has other readers
    folds into a copy of the producer when `_conv_copy` finds that cheaper."""
    result = PassResult(changed=False)
    names = names_in_use(graph)
    copies = ConvCopies(graph, ctx.input_shapes, names, ctx.static_shapes)
    found = 0
    for g in all_graphs(graph):
        node_ids = {id(n) for n in g.nodes}
        for node in [n for n in g.nodes if is_onnx(n, *ops)]:
            if not node.outputs:  # already folded and disconnected
                continue
            checked = match(node, producers, node_ids)
            if checked is None:
                continue
            found += 1
            planned = plan(checked) if isinstance(checked, Match) else checked
            into = planned if isinstance(planned, str) else copies.decide(
                g, checked.producer, node)
            if isinstance(into, str):
                result.notes.append(Note(subject=node_label(node), reason=into))
                continue
            if not ctx.allow_rewrite(pass_name, label(node, checked.producer, into)):
                result.notes.append(Note(subject=node_label(node), reason=LIMIT_REACHED))
                continue
            result.counts[counted(what(checked), checked.producer, into)] += 1
            target = copies.target(g, checked.producer, node, into, node_ids)
            rewrite(replace(checked, producer=target), planned, names)
            result.changed = True
    if not found:
        result.notes.append(Note(subject="graph", reason=nothing))
    return result
