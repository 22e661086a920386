"""fold-reshape-targets: a Reshape target computed from Shape() becomes a constant.

Exporters write a flatten with a dynamic batch as shape arithmetic on the tensor
being reshaped (Paddle, PyTorch with dynamic axes)::

    Reshape(x, Concat(Cast(Slice(Shape(x), 0, 1)), [200]))  ->  Reshape(x, [0, 200])

The target is evaluated element by element: each entry is a known integer or
"dimension i of tensor T" (from Shape). It becomes a constant when every entry is

- a known integer (a literal, or a dimension whose size the shapes say),
- dimension i of the Reshape's own input at position i, or of a tensor whose
  dimension is that one by construction (`graph.dimorigin`: YOLOv8's dynamic-batch head
  reshapes each level by the batch of the first, a Conv of the same input): written 0,
  which copies that dimension (under allowzero=1, which torch's default exporter writes
  on every Reshape, only where the target has no literal 0; the Reshape then gets
  allowzero=0, which differs from 1 only in what a 0 entry means), or
- for exactly one entry, anything else, written -1, when every other entry is a
  positive integer: a dimension, or a value this pass does not evaluate (B * nW in
  Swin's window attention) of an integer tensor whose length the shapes say. The
  element count fixes that entry whatever it is; where the original Reshape succeeds,
  -1 gives the same shape (a 0 entry, copying a dim, would have to equal it too).

One more form: `[k * d, q..., -1]` where k * d (a Mul of a dimension and a positive
integer constant) stands at the position of the input's only dynamic dimension d, the
same by construction: the input has d * P elements, so the -1 was P / (k * q) for every
d, and the target becomes `[-1, q..., P / (k * q)]` (timm's BottleneckAttn,
`x.reshape(B * heads, dim_head, -1)`; with d = 0 the original fails, a -1 beside a zero
product).

When it cannot become a constant but every entry is dimension i of one tensor T at
position i, for all of T's dimensions, the target is T's shape: it becomes one
`Shape(T)` node (PyTorch's `x.reshape(y.shape)` with dynamic axes is exported as a
Gather + Unsqueeze per dimension and a Concat)::

    Reshape(x, Concat(Unsqueeze(Gather(Shape(t), 0)), ..., Unsqueeze(Gather(Shape(t), 2))))
        ->  Reshape(x, Shape(t))

TensorRT then sees a static reshape instead of a shape-tensor computation, the
Shape/Slice/Cast/Concat nodes go with the next cleanup, and the output rank is
known (so MatMul + Add can become a Gemm in `fuse-conv-bias`).

Shapes the model does not record are inferred first, and a folded Reshape's output
gets its static shape, so a chain of such Reshapes folds in one run.

Evaluated (`_shape_values.evaluate`, shared with `eliminate-noops`): initializers and
Constant nodes, Shape (start/end, opset 15+), Cast to an integer type, Identity, Concat,
Slice, Gather (axis 0), Unsqueeze/Squeeze of 0-D/1-D values, and `Where(Equal(v, k), a, v)`
entry by entry where the condition is known (PyTorch's `expand` writes its -1 entries so;
a dimension, or a sum or product of dimensions, never equals a negative k). Anything else
(Mul, Add, ...) is an unknown entry when its shape is known; a target with more than one
unknown entry stays, with a note.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    fresh_name,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
)
from graphfix.graph.dimorigin import DimOrigins
from graphfix.graph.shapes import infer_shapes, reshape_dims, static_count
from graphfix.passes._shape_values import Dim, Entry, Opaque, Value, entries_reader, evaluate
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult

MAX_ROUNDS = 8
"""Rounds of folding, with shape inference between them (see `run`)."""


class FoldReshapeTargets(Pass):
    """Make Reshape targets computed from Shape() constants (0 = copy, one -1).

    Handles any Reshape (opset 5+) whose target evaluates as the module docstring
    says, in every graph including If/Loop/Scan bodies. Skips, with a note, a
    target that uses an op it does not evaluate, a target that copies a dimension
    of another tensor (or of its input at another position) more than once, and
    allowzero=1 Reshapes that would need a 0 entry beside a literal 0.
    """

    name = "fold-reshape-targets"
    annotates_shapes = True  # its shape inference
    summary = "Make Reshape targets computed from Shape() constants (flatten with dynamic batch)."
    Options = NoOptions
    counts_rewrites = True  # each Reshape target made constant is one rewrite

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False, annotated=False)
        candidates = [node for g in all_graphs(graph) for node in g.nodes
                      if is_onnx(node, "Reshape") and len(node.inputs) >= 2
                      and constant_value(node.inputs[1]) is None]
        if not candidates:
            result.notes.append(Note("graph", "no Reshape with a computed target"))
            return result
        opset = opset_of(graph)
        names = names_in_use(graph)
        annotated = 0  # tensors inference gave a new shape or dtype
        owner = {id(node): g for g in all_graphs(graph) for node in g.nodes}
        if candidates and not ctx.shapes_inferred and any(
                is_onnx(n, "Shape") and n.inputs and n.inputs[0].shape is None
                for g in all_graphs(graph) for n in g.nodes):
            # exporters record no shapes for intermediates (a Reshape's output read by
            # the next Shape): without inference, a second run would fold what this one
            # could not see
            annotated += infer_shapes(graph)
        pending = list(candidates)
        for _ in range(MAX_ROUNDS):
            refused: list[tuple[gs.Node, str]] = []
            origins = DimOrigins(values=entries_reader(opset))  # new shapes each round
            for node in pending:
                target = _target(node, opset, origins)
                if isinstance(target, gs.Tensor):
                    if not ctx.allow_rewrite(self.name, f"{node_label(node)} target "
                                             f"Shape({target.name})"):
                        refused.append((node, LIMIT_REACHED))
                        continue
                    node.inputs[1] = _shape_of(target, owner[id(node)], owner, names)
                    result.counts["made Reshape targets the Shape of a tensor"] += 1
                    continue
                if isinstance(target, str):
                    refused.append((node, target))
                    continue
                if not ctx.allow_rewrite(self.name, f"{node_label(node)} target {target}"):
                    refused.append((node, LIMIT_REACHED))
                    continue
                name = fresh_name(f"{node.outputs[0].name}_shape", names)
                node.inputs[1] = gs.Constant(name, np.array(target.values, dtype=np.int64))
                if target.allowzero != int(node.attrs.get("allowzero", 0)):
                    node.attrs.pop("allowzero")  # 0, the default: its 0 entries copy
                result.counts["made Reshape targets computed from Shape constant"] += 1
                out = node.outputs[0]
                if out.shape is None:  # a later target may read it (nodes are in order)
                    out.shape = _reshaped(node.inputs[0].shape, target.values,
                                          bool(target.allowzero))
            if len(refused) == len(pending) or not refused:
                break
            # a folded target gives its Reshape a static output, and the ops after it
            # (an Add) theirs once inferred: a target left may read one of them
            pending = [node for node, _ in refused]
            annotated += infer_shapes(graph)
        result.notes += [Note(node_label(node), why) for node, why in refused]
        result.changed = bool(result.counts)
        result.annotated = annotated > 0
        return result


class _Constant(NamedTuple):
    """A constant target, and the allowzero it needs (`_target`)."""

    values: list[int]
    allowzero: int


def _target(node: gs.Node, opset: int, origins: DimOrigins) -> _Constant | gs.Tensor | str:
    """The constant target for `node`, the tensor whose shape it is, or why neither.

    allowzero=1 only changes what a 0 entry means (a zero, not a copy): where the target
    has no literal 0, a dim it copies is written 0 under allowzero=0, which copies the
    same dim (torch's default exporter writes allowzero=1 on every Reshape)."""
    value = evaluate(node.inputs[1], opset)
    if isinstance(value, str):
        return f"its target is not static: {value}"
    x = node.inputs[0]
    allowzero = int(node.attrs.get("allowzero", 0))
    copies = not allowzero or 0 not in value.entries
    target: list[int | None] = []
    copied = False
    for i, entry in enumerate(value.entries):
        if isinstance(entry, int):
            target.append(entry)
        elif (isinstance(entry, Dim) and copies
              and origins.same(entry.tensor, entry.axis, x, i)):
            target.append(0)
            copied = True
        else:
            target.append(None)
    free = [i for i, t in enumerate(target) if t is None]
    if not free or (len(free) == 1 and all(t > 0 for t in target if t is not None)):
        if free:
            target[free[0]] = -1
        return _Constant([int(t) for t in target], 0 if copied else allowzero)
    scaled = _scaled_batch(node, value, target, free, opset, origins)
    if scaled is not None:
        return _Constant(scaled, allowzero)
    whole = _whole_shape_of(value)
    if whole is not None:
        if _is_whole_shape(node.inputs[1]):
            return f"its target already is the shape of '{whole.name}'"
        return whole
    return (
        "its target has entries not known statically "
        f"({', '.join(_describe(value.entries[i]) for i in free)}) that neither 0 nor a "
        "single -1 can express"
    )


def _scaled_batch(node: gs.Node, value: Value, target: list[int | None], free: list[int],
                  opset: int, origins: DimOrigins) -> list[int] | None:
    """A target [k * d, q..., -1] whose k * d is at the position of the input's one
    dynamic dim d (by construction, `graph.dimorigin`), written [-1, q..., v]: the
    input has d * P elements (P its static dims), so the -1 was P / (k * q) whatever d is
    (timm's BottleneckAttn: `x.reshape(B * heads, dim_head, -1)` with a dynamic batch).
    With d = 0 the original fails (a -1 beside a zero product), so nothing that runs
    changes. None where the target is not of that form."""
    if len(free) != 1 or target.count(-1) != 1:
        return None
    i, minus = free[0], target.index(-1)
    others = [t for j, t in enumerate(target) if j not in (i, minus)]
    if any(t is None or t <= 0 for t in others):
        return None
    scaled = _scaled_dim(value.entries[i], opset)
    x = node.inputs[0]
    if scaled is None or x.shape is None or i >= len(x.shape):
        return None
    (dim, k), shape = scaled, x.shape
    if [a for a, d in enumerate(shape) if not (isinstance(d, int) and d >= 0)] != [i]:
        return None
    if not origins.same(dim.tensor, dim.axis, x, i):
        return None
    elements, known = math.prod(d for a, d in enumerate(shape) if a != i), k * math.prod(others)
    if elements % known or elements // known <= 0:
        return None
    out = list(target)
    out[i], out[minus] = -1, elements // known
    return [int(t) for t in out]


def _scaled_dim(entry: Entry, opset: int) -> tuple[Dim, int] | None:
    """(d, k) where `entry` is k * d: the element of a one-element Mul of a dimension and
    a positive integer constant; else None."""
    if not isinstance(entry, Opaque) or len(entry.tensor.inputs) != 1:
        return None
    mul = entry.tensor.inputs[0]
    if not is_onnx(mul, "Mul") or len(mul.inputs) != 2:
        return None
    for a, b in (mul.inputs, mul.inputs[::-1]):
        k = constant_value(b)
        if k is None or k.size != 1 or k.dtype.kind not in "iu" or int(k.reshape(-1)[0]) <= 0:
            continue
        v = evaluate(a, opset)
        if not isinstance(v, str) and len(v.entries) == 1 and isinstance(v.entries[0], Dim):
            return v.entries[0], int(k.reshape(-1)[0])
    return None


def _whole_shape_of(value: Value) -> gs.Tensor | None:
    """The tensor T when `value` is exactly T's shape (dimension i at position i, for
    every dimension of T, at least one of them not known statically)."""
    dims = [e for e in value.entries if isinstance(e, Dim)]
    if not dims or value.scalar:
        return None
    tensor = dims[0].tensor
    shape = tensor.shape
    if shape is None or len(shape) != len(value.entries):
        return None
    for i, entry in enumerate(value.entries):
        if isinstance(entry, Dim):
            if entry.tensor is not tensor or entry.axis != i:
                return None
        elif entry != shape[i]:
            return None
    return tensor


def _is_whole_shape(tensor: gs.Tensor) -> bool:
    """Whether `tensor` is written by Shape() of a whole tensor."""
    return (len(tensor.inputs) == 1 and is_onnx(tensor.inputs[0], "Shape")
            and not tensor.inputs[0].attrs.get("start")
            and tensor.inputs[0].attrs.get("end") is None)


def _shape_of(tensor: gs.Tensor, graph: gs.Graph, owner: dict[int, gs.Graph],
              names: set[str]) -> gs.Variable:
    """A Shape(tensor) output readable in `graph`: an existing whole-shape Shape node of
    that graph, or a new one placed there (the manager orders nodes before export)."""
    for node in tensor.outputs:
        if node.outputs and _is_whole_shape(node.outputs[0]) and owner.get(id(node)) is graph:
            return node.outputs[0]
    out = gs.Variable(fresh_name(f"{tensor.name}_shape", names), np.int64,
                      [len(tensor.shape)])
    node = gs.Node("Shape", fresh_name(f"{tensor.name}_Shape", names),
                   inputs=[tensor], outputs=[out])
    graph.nodes.append(node)
    owner[id(node)] = graph
    return out


def _reshaped(shape, target: list[int], allowzero: bool) -> list[int] | None:
    """The output shape of Reshape(x of `shape`, `target`) (`reshape_dims`), None unless
    `shape` is static and the target gives a whole shape of its elements."""
    if shape is None or static_count(shape) != len(shape):
        return None
    out = reshape_dims(list(shape), list(target), allowzero)
    if static_count(out) != len(out) or math.prod(out) != math.prod(shape):
        return None
    return out


def _describe(entry: Entry) -> str:
    if isinstance(entry, Dim):
        return f"dim {entry.axis} of '{entry.tensor.name}'"
    if isinstance(entry, Opaque):
        return f"element {entry.index} of '{entry.tensor.name}'"
    return str(entry)
