"""`eliminate-noops` rules for pairs of nodes that undo or repeat each other (private module).

Same contract as `_noop_single`: a rule returns a `Plan`, a reason to keep the
candidate, or None when the node is not a candidate.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import constant_value, fresh_name, is_graph_output, is_onnx
from graphfix.passes import _noop_single as single
from graphfix.passes._noop_shapes import (
    compose_perms,
    is_identity_perm,
    normalized_axes,
    perm_of,
    rank_of,
    reshape_keeps,
    slice_params,
    squeeze_axes,
)
from graphfix.passes._noop_single import Plan, View, same_shape


def reshape(node: gs.Node, view: View) -> Plan | str:
    allowzero = int(node.attrs.get("allowzero", 0))
    same = same_shape(node, lambda dims, target: reshape_keeps(dims, target, allowzero))
    if same is True:
        return Plan("removed Reshape to the same shape")
    first = _lone_producer(view, node.inputs[0], "Reshape")
    if first is None:
        return around_elementwise(node, view) or same
    plan = first if isinstance(first, str) else _collapse(first, node)
    return plan if isinstance(plan, Plan) else f"{same}; {plan}"


_ELEMENTWISE = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu",
    "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Softplus", "Softsign", "Elu", "Selu",
    "Celu", "Mish", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Cast", "Clip",
    "ThresholdedRelu", "Not", "IsNaN", "IsInf", "Identity",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "And", "Or", "Xor",
})
"""Ops that compute each output element from the elements at the same position of their
inputs (with one-element constants broadcast): the data's layout does not matter to them."""
AROUND_MAX_NODES = 64
"""The most elementwise nodes between two Reshapes `around_elementwise` looks through."""


def around_elementwise(node: gs.Node, view: View) -> Plan | None:
    """Reshape(f(Reshape(x, t1)), t2) as f(x), where f is a region of elementwise ops
    (`_ELEMENTWISE`) whose other operands are one-element constants and which reads the
    first Reshape's output and nothing else, no tensor of it read outside it, and t2 (a
    constant without 0 entries) gives x's shape back: elementwise ops do the same to each
    element whatever the shape, and a Reshape moves no element, so f(x) has the same
    elements in the same order. GPT-2 from torch's default exporter: [b*s, 4d] ->
    Reshape [b, s, 4d] -> GELU's eight ops -> Reshape [-1, 4d] between two Gemms, per
    layer. None when `node` is not such a second Reshape."""
    target = constant_value(node.inputs[1])
    if target is None:
        return None
    t2 = [int(v) for v in target.reshape(-1)]
    if 0 in t2:
        return None
    region: dict[int, gs.Node] = {}
    first: gs.Node | None = None
    stack, seen = [node.inputs[0]], set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, gs.Constant) or len(t.inputs) != 1 or is_graph_output(view.g, t):
            return None
        producer = t.inputs[0]
        if id(producer) not in view.node_ids or not is_onnx(producer):
            return None
        if producer.op == "Reshape":
            if first is not None and producer is not first:
                return None
            first = producer
            continue
        if producer.op not in _ELEMENTWISE or len(producer.outputs) != 1:
            return None
        region[id(producer)] = producer
        if len(region) > AROUND_MAX_NODES:
            return None
        stack.extend(i for i in producer.inputs if not isinstance(i, gs.Constant) and i.name)
    if first is None or not region:
        return None
    x, middle = first.inputs[0], first.outputs[0]
    if x.shape is None or reshape_keeps(list(x.shape), t2, 1) is not True:
        return None
    rank = min(len(x.shape), _rank_of_target(first))
    rewire = []
    for n in region.values():
        for i, t in enumerate(n.inputs):
            if isinstance(t, gs.Constant):
                if t.shape is None or math.prod(t.shape) != 1 or len(t.shape) > rank:
                    return None  # a larger operand broadcasts by the middle shape
            elif t is middle:
                rewire.append((n, i))
        out = n.outputs[0]
        if any(id(r) not in region and r is not node for r in out.outputs):
            return None
    if any(id(r) not in region for r in middle.outputs) or is_graph_output(view.g, middle):
        return None
    return Plan("removed Reshape pairs around elementwise ops", drop=first, rewire=rewire,
                rewire_to=x, reshaped=[n.outputs[0] for n in region.values()])


def slice_(node: gs.Node, view: View) -> Plan | str:
    """A Slice of the whole tensor goes (`_noop_single.slice_`); a Slice of a Slice on
    other axes becomes one Slice of both (`_merged_slices`)."""
    own = single.slice_(node, view)
    if isinstance(own, Plan) or view.opset < 10:
        return own
    first = _lone_producer(view, node.inputs[0], "Slice")
    if first is None or isinstance(first, str):
        return own
    merged = _merged_slices(first, node, view)
    return merged if isinstance(merged, Plan) else f"{own}; {merged}"


def _merged_slices(first: gs.Node, node: gs.Node, view: View) -> Plan | str:
    """Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2) as Slice(x, s1 + s2, e1 + e2,
    a1 + a2, p1 + p2) when a1 and a2 share no axis: each axis is sliced once, clamped to
    x's size either way (the other Slice leaves it whole). TorchScript and torch's default
    exporter write `x[:, a:b, c:d]` as one Slice per axis."""
    params = [slice_params(n, view.opset) for n in (first, node)]
    for p in params:
        if isinstance(p, str):
            return p
    rank = rank_of(first.inputs[0])
    axes = []
    for _, _, a, _ in params:
        normalized = normalized_axes(a, rank)
        if normalized is None:
            return "rank unknown: the Slices have negative axes and their input rank is unknown"
        axes.append(normalized)
    both = sorted(set(axes[0]) & set(axes[1]))
    if both:
        return f"it slices axes {both} the Slice before it slices too"
    values = [params[0][k] + params[1][k] for k in (0, 1)] + [axes[0] + axes[1],
                                                              params[0][3] + params[1][3]]
    inputs = [first.inputs[0]]
    for what, value in zip(("starts", "ends", "axes", "steps"), values, strict=True):
        name = fresh_name(f"{node.outputs[0].name}_{what}", view.names)
        inputs.append(gs.Constant(name, np.array(value, dtype=np.int64)))
    return Plan("merged Slices on different axes into one", remove=False, drop=first,
                inputs=inputs)


def _rank_of_target(reshape: gs.Node) -> int:
    """The rank of a Reshape's output: its recorded shape's, else its target's length;
    0 where neither is known (then only 0-D constants count as one element)."""
    if reshape.outputs[0].shape is not None:
        return len(reshape.outputs[0].shape)
    length = reshape.inputs[1].shape
    return length[0] if length and isinstance(length[0], int) else 0


def transpose(node: gs.Node, view: View) -> Plan | str:
    perm = perm_of(node)
    if is_identity_perm(perm, rank_of(node.inputs[0])):
        return Plan("removed identity Transpose")
    own = f"its permutation {tuple(perm)} is not the identity" if perm else "it reverses the axes"
    first = _lone_producer(view, node.inputs[0], "Transpose")
    if first is None:
        return _as_reshape(node, view) or own
    if isinstance(first, str):
        return f"{own}; {first}"
    composed = compose_perms(perm_of(first), perm)
    if composed is None:
        return Plan("removed Transpose pairs that cancel", source=first.inputs[0], drop=first)
    return Plan(
        "composed Transpose pairs into one",
        remove=False,
        source=first.inputs[0],
        drop=first,
        attrs={"perm": composed},
    )


def _as_reshape(node: gs.Node, view: View) -> Plan | None:
    """A Transpose that moves only size-1 axes keeps the data order: it is a Reshape.
    Done only when a Reshape writes its input or is its one reader, so the two collapse."""
    perm, dims = perm_of(node), node.inputs[0].shape
    if perm is None or dims is None or len(perm) != len(dims):
        return None
    moved = [p for p in perm if dims[p] != 1]  # unknown dims count as not 1
    if moved != sorted(moved):
        return None
    target = [dims[p] if isinstance(dims[p], int) else -1 for p in perm]
    if target.count(-1) > 1:
        return None
    readers = node.outputs[0].outputs
    near = _lone_producer(view, node.inputs[0], "Reshape") is not None or (
        len(readers) == 1 and is_onnx(readers[0], "Reshape") and not is_graph_output(
            view.g, node.outputs[0]))
    if not near:
        return None
    return Plan("turned Transposes of size-1 axes into Reshapes", remove=False, op="Reshape",
                operand=np.array(target, dtype=np.int64))


def squeeze(node: gs.Node, view: View) -> Plan | str | None:
    first = _lone_producer(view, node.inputs[0], "Unsqueeze")
    if first is None:
        return _into_reshape(node, view)
    if isinstance(first, str):
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
    return Plan("removed Unsqueeze-Squeeze pairs", source=x, drop=first)


def unsqueeze(node: gs.Node, view: View) -> Plan | str | None:
    """Unsqueeze(Unsqueeze(x, a1), a2) -> Unsqueeze(x, a): one node inserts both sets;
    Unsqueeze(Squeeze(x, a), a) -> x (`_squeeze_undone`)."""
    first = _lone_producer(view, node.inputs[0], "Unsqueeze")
    if first is None:
        squeezed = _producer(view, node.inputs[0], "Squeeze")
        if squeezed is not None:
            return squeezed if isinstance(squeezed, str) else _squeeze_undone(
                squeezed, node, view)
        return _into_reshape(node, view)
    if isinstance(first, str):
        return first
    inner, outer = squeeze_axes(first, view.opset), squeeze_axes(node, view.opset)
    for what, axes in (("first", inner), ("second", outer)):
        if axes is None or isinstance(axes, str):
            return f"the {what} Unsqueeze's axes {axes or 'are missing'}"
    rank = rank_of(first.inputs[0])
    mid_rank = rank + len(inner) if rank is not None else None
    inner = normalized_axes(inner, mid_rank)
    outer = normalized_axes(outer, mid_rank + len(outer) if mid_rank is not None else None)
    if inner is None or outer is None:
        return "rank unknown: negative axes and the input rank is unknown"
    kept = [i for i in range(len(inner) + len(outer) + 64) if i not in outer]
    # the middle tensor's dim j lands at the j-th position the second Unsqueeze leaves free
    combined = sorted(set(outer) | {kept[a] for a in inner})
    plan = Plan("merged Unsqueeze pairs into one", remove=False, source=first.inputs[0],
                drop=first)
    if view.opset < 13:
        plan.attrs = {"axes": combined}
    else:
        plan.operand, plan.operand_role = np.array(combined, dtype=np.int64), "axes"
    return plan


def _squeeze_undone(first: gs.Node, node: gs.Node, view: View) -> Plan | str:
    """Unsqueeze(Squeeze(x, a), a) as x. A Squeeze of axes fails unless x has 1 at each
    of them, and the Unsqueeze puts 1s back at the same axes: both count axes in x's
    rank (the Squeeze's input and the Unsqueeze's output have the same rank), so equal
    axes, negative ones too, are the same positions. A Squeeze without axes removes
    every 1 of x: known only when every dim of x is. The Squeeze goes too when nothing
    else reads it (paddle2onnx writes `x[0:1]` then squeeze and unsqueeze of the same
    axis, feeding a Concat of shape entries: PP-OCRv6's recognizer)."""
    x = first.inputs[0]
    squeezed, inserted = squeeze_axes(first, view.opset), squeeze_axes(node, view.opset)
    if isinstance(squeezed, str) or isinstance(inserted, str) or inserted is None:
        return (f"the Squeeze before it removes axes that {squeezed}"
                if isinstance(squeezed, str) else f"its axes {inserted or 'are missing'}")
    rank = rank_of(x)
    if squeezed is None:
        dims = x.shape
        if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
            return "the Squeeze before it has no axes and x's dims are not all known"
        squeezed = [i for i, d in enumerate(dims) if d == 1]
    if sorted(squeezed) != sorted(inserted):
        a, b = normalized_axes(squeezed, rank), normalized_axes(inserted, rank)
        if a is None or b is None:
            return "rank unknown: negative axes and the Squeeze's input rank is unknown"
        if sorted(a) != sorted(b):
            return f"it inserts axes {sorted(b)}, the Squeeze before it removed {sorted(a)}"
    lone = len(first.outputs[0].outputs) == 1
    return Plan("removed Squeeze-Unsqueeze pairs", source=x, drop=first if lone else None)


def _into_reshape(node: gs.Node, view: View) -> Plan | str | None:
    """Unsqueeze(Reshape(x, t), a) and Squeeze(Reshape(x, t), a) as one Reshape(x, t'):
    t with 1 inserted at the axes a, or with its 1 entries at a removed. A Reshape and an
    Unsqueeze or Squeeze only relabel dims, so the data order is the same (torch's default
    exporter writes `x.view(...)[None]` so: 12 of them in ViT-B/16). The target must be a
    constant without 0 entries (a copied dim would move) and the axes known; a Squeeze
    without axes, or of an entry that is not 1, stays. None when no lone Reshape with a
    constant target writes the input."""
    first = _lone_producer(view, node.inputs[0], "Reshape")
    if first is None or isinstance(first, str):
        return first
    target = constant_value(first.inputs[1]) if len(first.inputs) > 1 else None
    if target is None:
        return None  # a computed target: not a candidate
    shape = [int(v) for v in target.reshape(-1)]
    if 0 in shape:
        return "the Reshape before it copies dims (0 entries)"
    axes = squeeze_axes(node, view.opset)
    if axes is None or isinstance(axes, str):
        return f"its axes {axes or 'are missing'}"
    if node.op == "Unsqueeze":
        out_rank = len(shape) + len(axes)
        axes = normalized_axes(axes, out_rank)
        if axes is None or len(set(axes)) != len(axes):
            return "its axes are out of range or repeated"
        rest = iter(shape)
        merged = [1 if i in axes else next(rest) for i in range(out_rank)]
    else:
        axes = normalized_axes(axes, len(shape))
        if axes is None or any(shape[a] != 1 for a in axes):
            return "it squeezes an entry of the Reshape's target that is not 1"
        merged = [d for i, d in enumerate(shape) if i not in axes]
    return Plan(f"merged {node.op} into the Reshape before it", remove=False,
                source=first.inputs[0], drop=first, op="Reshape",
                operand=np.array(merged, dtype=np.int64))


def concat(node: gs.Node, view: View) -> Plan | str | None:
    """The single-node Concat rules (`_noop_single.concat`) first; then
    Concat(a, Concat(b, c), d) -> Concat(a, b, c, d) on the same axis, one inner Concat
    per rewrite (the sweeps repeat, so deeper nesting flattens fully). An inner Concat
    that other Concats read too is flattened into each of them when every one of them
    joins on its axis (RAFT's refinement loop: twelve inner Concats, each read by two);
    it goes with the last. One that any other node reads stays, and so does its
    readers' nesting: flattening would copy its inputs twice."""
    plan = single.concat(node, view)
    if plan is not None or "axis" not in node.attrs:
        return plan
    why = None
    for tensor in node.inputs:
        inner = _lone_producer(view, tensor, "Concat")
        shared = isinstance(inner, str) and _only_concats_read(view, tensor)
        if shared:
            inner = tensor.inputs[0]
        if inner is not None and not isinstance(inner, str):
            inner = _axis_refusal(node, inner) or inner
        if isinstance(inner, str):
            why = why or inner
        elif inner is not None:
            inputs = [t for outer in node.inputs
                      for t in (list(inner.inputs) if outer is tensor else [outer])]
            last = all(reader is node for reader in tensor.outputs)
            return Plan("flattened nested Concats", remove=False, inputs=inputs,
                        drop=inner if last else None)
    return why


def _only_concats_read(view: View, tensor: gs.Tensor) -> bool:
    """Whether `tensor` is a Concat's output in this graph, not a graph output, read by
    Concats only, each joining on that Concat's axis."""
    inner = _producer(view, tensor, "Concat")
    if not isinstance(inner, gs.Node):
        return False
    return all(is_onnx(reader, "Concat") and "axis" in reader.attrs
               and id(reader) in view.node_ids and _axis_refusal(reader, inner) is None
               for reader in tensor.outputs)


def _axis_refusal(node: gs.Node, inner: gs.Node) -> str | None:
    """Why the Concat `inner` does not join on `node`'s axis, or None when it does."""
    axis, inner_axis = int(node.attrs["axis"]), inner.attrs.get("axis")
    if inner_axis is None:
        return "the Concat before it has no axis"
    inner_axis = int(inner_axis)
    if (axis < 0) != (inner_axis < 0):
        ranks = [len(t.shape) for t in [*node.inputs, *node.outputs, *inner.inputs]
                 if t.shape is not None]
        if not ranks:
            return ("rank unknown: the Concat before it joins on axis "
                    f"{inner_axis}, this one on {axis}")
        axis, inner_axis = (a + ranks[0] if a < 0 else a for a in (axis, inner_axis))
    if axis != inner_axis:
        return f"the Concat before it joins on axis {inner_axis}, this one on {axis}"
    return None


def _lone_producer(view: View, tensor: gs.Tensor, op: str) -> gs.Node | str | None:
    """The `op` node writing `tensor` when it feeds only the node at hand; a reason when
    an `op` writes it but cannot go; None when no `op` writes it."""
    producer = _producer(view, tensor, op)
    if isinstance(producer, gs.Node) and len(tensor.outputs) > 1:
        return f"the {op} before it also feeds another node"
    return producer


def _producer(view: View, tensor: gs.Tensor, op: str) -> gs.Node | str | None:
    """The `op` node writing `tensor` in this graph, not as a graph output; a reason when
    an `op` writes it elsewhere or as a graph output; None when no `op` writes it."""
    if isinstance(tensor, gs.Constant) or len(tensor.inputs) != 1:
        return None
    producer = tensor.inputs[0]
    if not is_onnx(producer, op):
        return None
    if id(producer) not in view.node_ids:
        return f"the {op} before it is in an enclosing graph"
    if is_graph_output(view.g, tensor):
        return f"the {op} before it writes a graph output"
    return producer


def _collapse(first: gs.Node, node: gs.Node) -> Plan | str:
    """Reshape(Reshape(x, s1), s2) as Reshape(x, s2'), or why it cannot be collapsed."""
    x = first.inputs[0]
    plan = Plan("collapsed Reshape pairs into one", remove=False, source=x, drop=first)
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
        plan.operand = np.array(resolved, dtype=np.int64)
    return plan
