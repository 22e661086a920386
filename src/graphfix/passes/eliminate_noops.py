"""`eliminate-noops`: remove nodes that compute nothing, and cancel pairs that undo each other.

Each rule, with x the first input and y the output::

    Identity(x)                      -> x
    Dropout(x)        (inference)    -> x
    Cast(x, to=dtype(x))             -> x
    Reshape(x, s), Expand(x, s)      -> x          when the result has x's shape
    Transpose(x, perm=identity)      -> x
    Transpose(Transpose(x, p1), p2)  -> Transpose(x, p), p[i] = p1[p2[i]];  x if p is identity
    Reshape(Reshape(x, s1), s2)      -> Reshape(x, s2')   (0 entries of s2 resolved)
    Squeeze(Unsqueeze(x, a), a)      -> x
    Concat(x)                        -> x
    Slice(x, whole range, step 1)    -> x
    Pad(x, pads=0)                   -> x          (any mode)

These sit between a Conv and its activation in exported graphs and stop TensorRT
from fusing them (DESIGN.md, "TensorRT fuses Conv+bias+ReLU itself, but only when
nothing sits between them"); each also costs a kernel launch.

"Same shape" is decided from the constant target shape and the input shape when
that settles it (`Reshape(x[N, 3], [0, 3])` is a no-op for any N), and otherwise
from the gs tensor shapes of input and output, which must then be fully static;
when neither settles it the node stays with a note starting "shape unknown".

A removed node's readers read its input; when it wrote a graph output, the node
before it takes that output tensor (graphfix.graph.bypass), so graph output
names and dtypes are kept. The first node of a pair goes only when it feeds
nothing else and is not a graph output. Disconnected nodes are left for
`cleanup`. Sweeps repeat until nothing changes, so chains (three Transposes,
Reshape pairs that collapse to a no-op) reduce fully in one run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    bypass,
    constant_value,
    fresh_name,
    is_graph_output,
    is_onnx,
    node_label,
    opset_of,
)
from graphfix.passes._noop_shapes import (
    clamp_index,
    compose_perms,
    elem_type,
    expand_keeps,
    is_identity_perm,
    normalized_axes,
    perm_of,
    rank_of,
    reshape_keeps,
    shape_text,
    slice_params,
    squeeze_axes,
    static_shape,
    type_name,
)
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult

_INT64_MAX = 2**63 - 1
_CANDIDATES = (
    "Identity, inference Dropout, Cast, Reshape, Expand, Transpose, Unsqueeze-Squeeze pair, "
    "single-input Concat, Slice or Pad"
)


@dataclass
class _Plan:
    """A rewrite of one node: it goes (`remove`) or stays with new attributes/shape input.

    `source` replaces its first input; `drop` is the node before it that goes too.
    """

    count: str
    remove: bool = True
    source: gs.Tensor | None = None
    drop: gs.Node | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    shape: np.ndarray | None = None


@dataclass
class _View:
    """One graph being swept: its nodes, the model's opset, every tensor name in use."""

    g: gs.Graph
    opset: int
    node_ids: set[int]
    names: set[str]


class EliminateNoops(Pass):
    """Remove no-op nodes and cancel inverse pairs.

    Handles: Identity; Dropout in inference mode (no training_mode input or a
    constant false one; is_test=1 before opset 7; mask unused); Cast to its input's dtype
    (known from the tensor or the initializer); Reshape and Expand that keep the
    shape; Transpose with the identity permutation (or no perm on rank <= 1);
    two Transposes composed into one, both removed when they cancel (NHWC <-> NCHW
    around a Conv); two Reshapes collapsed into one, resolving the second's 0
    entries (allowzero=0) from the tensor between them; Squeeze of an Unsqueeze on
    the same axes (attributes before opset 13, inputs from 13; negative axes with
    a known rank; a Squeeze without axes when the input has no size-1 dimension);
    single-input Concat; Slice covering every sliced axis (opset < 10 attributes,
    inputs from 10); Pad whose pads are all 0 (attribute before opset 11, input
    from 11), any mode. Recurses into If/Loop/Scan bodies.

    Skips, with a note, every candidate it cannot prove a no-op (different dtype,
    shape, permutation, axes, range or pads; dtype or shape unknown; inputs that
    are not constants) and pairs whose first node feeds another node, writes a
    graph output or lives in an enclosing graph.
    """

    name = "eliminate-noops"
    summary = "Remove nodes that compute nothing (Identity, same-type Cast, ...) and inverse pairs."
    Options = NoOptions

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names = {name for g in all_graphs(graph) for name in g.tensors()}
        found = False
        for g in all_graphs(graph):
            view = _View(g, opset, {id(n) for n in g.nodes}, names)
            while True:  # each change disconnects a node, so this ends
                counts, notes, candidates = _sweep(view)
                result.counts.update(counts)
                found = found or candidates > 0
                if not counts:
                    break
            result.notes.extend(notes)
        result.changed = bool(result.counts)
        if not result.changed:
            why = "none of its candidates is a removable no-op" if found else f"no {_CANDIDATES}"
            result.notes.append(Note("graph", why))
        return result


def _sweep(view: _View) -> tuple[Counter[str], list[Note], int]:
    """One pass over the graph in order: (what was done, why things were kept, candidates)."""
    counts: Counter[str] = Counter()
    notes: list[Note] = []
    candidates = 0
    for node in list(view.g.nodes):
        rule = _RULES.get(node.op)
        if rule is None or not node.outputs or not is_onnx(node):
            continue
        checked = rule(node, view)
        if checked is None:
            continue
        candidates += 1
        label = node_label(node)
        why = checked if isinstance(checked, str) else _apply(view, node, checked)
        if why:
            notes.append(Note(label, why))
        else:
            counts[checked.count] += 1
    return counts, notes, candidates


def _apply(view: _View, node: gs.Node, plan: _Plan) -> str | None:
    """Carry out `plan` on `node`; None when done, or why the node had to stay (unchanged)."""
    old = node.inputs[0]
    if plan.source is not None:
        node.inputs[0] = plan.source
    if plan.remove:
        why = bypass(view.g, node)  # changes nothing when it refuses
        if why:
            if plan.source is not None:
                node.inputs[0] = old
            return f"it computes nothing but cannot be removed: {why}"
    else:
        for key, value in plan.attrs.items():
            node.attrs[key] = value
        if plan.shape is not None:
            name = fresh_name(f"{node.outputs[0].name}_shape", view.names)
            node.inputs[1] = gs.Constant(name, plan.shape)
    if plan.drop is not None:
        plan.drop.inputs.clear()
        plan.drop.outputs.clear()
    return None


# ----------------------------------------------------------------------------- rules
# A rule returns a _Plan, a reason (str) to keep a candidate, or None for a node
# that is not a candidate at all.


def _identity(node: gs.Node, view: _View) -> _Plan:
    return _Plan("removed Identity")


def _dropout(node: gs.Node, view: _View) -> _Plan | str:
    if len(node.inputs) >= 3 and not node.inputs[2].is_empty():
        mode = constant_value(node.inputs[2])
        if mode is None:
            return "its training_mode input is not a constant"
        if mode.size and bool(mode.reshape(-1)[0]):
            return "it is in training mode (training_mode is true)"
    if view.opset < 7 and int(node.attrs.get("is_test", 0)) == 0:  # 0 is the default there
        return "it is in training mode (is_test=0, the default before opset 7)"
    return _Plan("removed inference Dropout")


def _cast(node: gs.Node, view: _View) -> _Plan | str:
    source = elem_type(node.inputs[0])
    if source is None:
        return "its input dtype is unknown"
    target = int(node.attrs["to"])
    if source != target:
        return f"it casts {type_name(source)} to {type_name(target)}"
    return _Plan("removed Cast to the same type")


def _reshape(node: gs.Node, view: _View) -> _Plan | str:
    allowzero = int(node.attrs.get("allowzero", 0))
    same = _same_shape(node, lambda dims, target: reshape_keeps(dims, target, allowzero))
    if same is True:
        return _Plan("removed Reshape to the same shape")
    first = _lone_producer(view, node.inputs[0], "Reshape")
    if first is None:
        return same
    plan = first if isinstance(first, str) else _collapse(first, node)
    return plan if isinstance(plan, _Plan) else f"{same}; {plan}"


def _expand(node: gs.Node, view: _View) -> _Plan | str:
    same = _same_shape(node, expand_keeps)
    return _Plan("removed Expand to the same shape") if same is True else same


def _transpose(node: gs.Node, view: _View) -> _Plan | str:
    perm = perm_of(node)
    if is_identity_perm(perm, rank_of(node.inputs[0])):
        return _Plan("removed identity Transpose")
    own = f"its permutation {tuple(perm)} is not the identity" if perm else "it reverses the axes"
    first = _lone_producer(view, node.inputs[0], "Transpose")
    if first is None:
        return own
    if isinstance(first, str):
        return f"{own}; {first}"
    composed = compose_perms(perm_of(first), perm)
    if composed is None:
        return _Plan("removed Transpose pairs that cancel", source=first.inputs[0], drop=first)
    return _Plan(
        "composed Transpose pairs into one",
        remove=False,
        source=first.inputs[0],
        drop=first,
        attrs={"perm": composed},
    )


def _squeeze(node: gs.Node, view: _View) -> _Plan | str | None:
    first = _lone_producer(view, node.inputs[0], "Unsqueeze")
    if first is None or isinstance(first, str):
        return first
    x = first.inputs[0]
    inserted, squeezed = squeeze_axes(first, view.opset), squeeze_axes(node, view.opset)
    for what, axes in (("Unsqueeze", inserted), ("Squeeze", squeezed)):
        if isinstance(axes, str):
            return f"the {what} axes {axes}"
    if inserted is None:
        return "the Unsqueeze has no axes"
    rank = rank_of(x)
    out_rank = rank + len(inserted) if rank is not None else None
    inserted = normalized_axes(inserted, out_rank)
    if inserted is None:
        return "rank unknown: the Unsqueeze has negative axes and its input rank is unknown"
    if squeezed is None:
        dims = x.shape
        if dims is None or any(not isinstance(d, int) or d == 1 for d in dims):
            return "the Squeeze has no axes and may remove size-1 dimensions of x too"
    else:
        squeezed = normalized_axes(squeezed, out_rank)
        if squeezed is None:
            return "rank unknown: the Squeeze has negative axes and its input rank is unknown"
        if sorted(squeezed) != sorted(inserted):
            return (
                f"it squeezes axes {sorted(squeezed)} "
                f"but the Unsqueeze inserted {sorted(inserted)}"
            )
    return _Plan("removed Unsqueeze-Squeeze pairs", source=x, drop=first)


def _concat(node: gs.Node, view: _View) -> _Plan | None:
    return _Plan("removed single-input Concat") if len(node.inputs) == 1 else None


def _slice(node: gs.Node, view: _View) -> _Plan | str:
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
    return _Plan("removed Slice of the whole tensor")


def _pad(node: gs.Node, view: _View) -> _Plan | str:
    if view.opset >= 11:
        value = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
        if value is None:
            return "its pads input is not a constant"
        pads = value.reshape(-1).tolist()
    else:
        pads = list(node.attrs.get("pads", node.attrs.get("paddings", [])))
    if any(pads):
        return f"it pads by {tuple(int(p) for p in pads)}"
    return _Plan("removed all-zero Pad")


_RULES: dict[str, Callable[[gs.Node, _View], _Plan | str | None]] = {
    "Identity": _identity,
    "Dropout": _dropout,
    "Cast": _cast,
    "Reshape": _reshape,
    "Expand": _expand,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Pad": _pad,
}


# ----------------------------------------------------------------------------- helpers


def _lone_producer(view: _View, tensor: gs.Tensor, op: str) -> gs.Node | str | None:
    """The `op` node writing `tensor` when it feeds only the node at hand; a reason when
    an `op` writes it but cannot go; None when no `op` writes it."""
    if isinstance(tensor, gs.Constant) or len(tensor.inputs) != 1:
        return None
    producer = tensor.inputs[0]
    if not is_onnx(producer, op):
        return None
    if id(producer) not in view.node_ids:
        return f"the {op} before it is in an enclosing graph"
    if is_graph_output(view.g, tensor):
        return f"the {op} before it writes a graph output"
    if len(tensor.outputs) > 1:
        return f"the {op} before it also feeds another node"
    return producer


def _same_shape(node: gs.Node, keeps: Callable[[list, list[int]], bool | None]) -> bool | str:
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


def _collapse(first: gs.Node, node: gs.Node) -> _Plan | str:
    """Reshape(Reshape(x, s1), s2) as Reshape(x, s2'), or why it cannot be collapsed."""
    x = first.inputs[0]
    plan = _Plan("collapsed Reshape pairs into one", remove=False, source=x, drop=first)
    if int(node.attrs.get("allowzero", 0)):
        return plan  # its 0 entries mean 0, whatever the tensor between the Reshapes
    target = constant_value(node.inputs[1])
    if target is None:
        return "its target shape is not a constant"
    shape = [int(v) for v in target.reshape(-1)]
    resolved = list(shape)
    if 0 in shape:
        mid = first.outputs[0].shape
        before = constant_value(first.inputs[1])
        s1 = [int(v) for v in before.reshape(-1)] if before is not None else []
        copies_x = not int(first.attrs.get("allowzero", 0))
        for i in (i for i, v in enumerate(shape) if v == 0):  # 0 copies the middle tensor's dim
            dim = mid[i] if mid is not None and i < len(mid) else None
            if isinstance(dim, int) and dim > 0:
                resolved[i] = dim
            elif i < len(s1) and s1[i] > 0:
                resolved[i] = s1[i]
            elif not (i < len(s1) and s1[i] == 0 and copies_x):  # else both copy x's dim i
                return (
                    f"its target copies dimension {i} of the tensor between the Reshapes, "
                    "which is not known"
                )
    if resolved != shape:
        plan.shape = np.array(resolved, dtype=np.int64)
    return plan

