"""normalize-activations: write activations in the plain form of their ONNX op.

Exporters spell common activations as general arithmetic; this pass gives them
their own op, so that a Conv is followed by one recognisable activation::

    Clip(x, 0, +inf)                    -> Relu(x)       (max absent, +inf or >= the dtype's max)
    Max(x, 0) = Max(0, x)               -> Relu(x)       (0: an all-zero constant, x's dtype)
    Mul(x, HardSigmoid(x; 1/6, 1/2))    -> HardSwish(x)  (either Mul order; opset >= 14)
    Clip(x + 3, 0, 6) / 6               -> HardSigmoid(x; 1/6, 1/2)   (or * 1/6)
    x * Clip(x + 3, 0, 6) / 6           -> HardSwish(x)  (or * 1/6; opset >= 14;
                                           x * HardSigmoid(x; 1/6, 1/2) below)

The last two are how Paddle and PyTorch below opset 14 write MobileNetV3's
activations (`_hard_activations`); x * (Clip(x + 3, 0, 6) / 6) becomes a HardSigmoid
and then a HardSwish in the same run.

HardSwish(x) is defined by ONNX as x * max(0, min(1, x / 6 + 1/2)), which is
x * HardSigmoid(x) with alpha = 1/6 and beta = 1/2 exactly. HardSwish entered the
default ONNX domain in opset 14, so older models keep the pair. The TensorRT
ONNX parser lists HardSwish from 8.4 on and not in 8.0 or 8.2
(../shared/trt/onnx_trt_operators.json, `support_by_op`).

Left as they are: a Clip with other constant bounds (Clip(0, 6) is ReLU6, already
an activation op), and `x * Sigmoid(x)` (SiLU), which is only reported: ONNX has
no SiLU op, and its `Swish` needs opset 24. A Clip whose bounds are not constants
is reported: TensorRT 8.0's parser requires Clip's min and max to be
initializers (../shared/trt/upstream/onnx-tensorrt-operators/operators_8.0-GA.md).

The new node takes the replaced node's name and output tensor, so output names
and dtypes are kept; the disconnected nodes and bounds are left for `cleanup`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    fresh_name,
    is_graph_output,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
    replace_in,
)
from graphfix.graph.walk import producer_in
from graphfix.passes._hard_activations import hard_sigmoid, hard_swish
from graphfix.passes._noop_shapes import broadcast_refusal
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult

_FLT_MAX = float(np.finfo(np.float32).max)  # Clip-6's default max
_ATTR_TOL = 1e-6
# Opset from which Relu takes each element type (Relu-6: floats; 13: bfloat16; 14: ints).
_RELU_SINCE = {
    "float16": 1, "float32": 1, "float64": 1, "bfloat16": 13,
    "int8": 14, "int16": 14, "int32": 14, "int64": 14,
}
_HARDSWISH_OPSET = 14
_HARD_SIGMOID_ATTRS = (("alpha", 1.0 / 6.0), ("beta", 0.5))  # HardSwish's HardSigmoid
_NO_HARDSWISH = (
    "hardswish=false: left as x * HardSigmoid(x) "
    "(TensorRT 8.0 and 8.2 do not parse HardSwish)"
)


@dataclass(frozen=True)
class NormalizeActivationsOptions:
    """`hardswish`: fuse x * HardSigmoid(x) into HardSwish (turn off for TensorRT < 8.4)."""

    hardswish: bool = True
_CLIP = "rewrote Clip(x, 0, inf) as Relu"
_MAX = "rewrote Max(x, 0) as Relu"
_HARDSWISH = "fused x * HardSigmoid(x) into HardSwish"
_HARDSWISH_DECOMPOSED = "rewrote x * Clip(x + 3, 0, 6) / 6 as HardSwish"
_HARDSIGMOID_DECOMPOSED = "rewrote Clip(x + 3, 0, 6) / 6 as HardSigmoid"
_HARDSWISH_BELOW_14 = (
    "rewrote x * Clip(x + 3, 0, 6) / 6 as x * HardSigmoid(x) (HardSwish needs opset 14)")
NON_CONSTANT_BOUNDS = "bounds are not constants: TensorRT cannot fuse it as an activation"
SILU = (
    "x * Sigmoid(x) is a SiLU chain; reported only and left as Sigmoid and Mul "
    "(ONNX has no SiLU op, and Swish needs opset 24)"
)


@dataclass(frozen=True)
class _Plan:
    """Replace the node by `op(x)`; `drop` are producers that go with it."""

    op: str
    x: gs.Tensor
    count: str
    drop: tuple[gs.Node, ...] = ()
    attrs: tuple[tuple[str, float], ...] = ()
    gated: gs.Node | None = None  # Mul(x, gate) kept, writing the node's output


class NormalizeActivations(Pass):
    """Rewrite Clip(x, 0, inf) and Max(x, 0) as Relu, x * HardSigmoid(x) as HardSwish.

    Handles: Clip with optional constant min/max inputs (opset >= 11) and with
    min/max attributes (opset < 11, max defaulting to the float32 maximum), max
    absent, +inf or at least the largest value of the dtype; Max with exactly two
    inputs, one an all-zero constant (scalar or any shape that does not broadcast x
    to a larger shape), in either order; Mul(x, HardSigmoid(x)) and
    Mul(HardSigmoid(x), x) with alpha within 1e-6 of 1/6 and beta 0.5, when the
    HardSigmoid has no other reader. Integer Clip/Max become Relu from opset 14
    (Relu's integer types). Recurses into If/Loop/Scan bodies.

    Notes: a Clip with non-constant bounds; a Max whose constant is not zero, has
    another dtype, or would broadcast x; HardSigmoid with other alpha/beta, another
    reader or a graph output; HardSwish below opset 14; Relu not taking the dtype
    at the model's opset; and every x * Sigmoid(x) (SiLU), which is never changed.
    """

    name = "normalize-activations"
    summary = ("Rewrite Clip(x,0,inf) and Max(x,0) as Relu, x*HardSigmoid(x) and "
               "x*Clip(x+3,0,6)/6 as HardSwish, Clip(x+3,0,6)/6 as HardSigmoid")
    Options = NormalizeActivationsOptions
    counts_rewrites = True  # each node rewritten is one rewrite

    def _hardswish_allowed(self, ctx: PassContext) -> str | None:
        """Why HardSwish must not be emitted (option off, or the run's TensorRT target's
        matrix does not list it as supported), else None."""
        if not self.options.hardswish:
            return _NO_HARDSWISH
        row = ctx.trt.op("HardSwish") if ctx.trt is not None else None
        if ctx.trt is not None and (row is None or not row.supported):
            return (f"left as x * HardSigmoid(x): the TensorRT {ctx.trt.version} operator "
                    "table does not list HardSwish as supported")
        return None

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names = names_in_use(graph)
        for g in list(all_graphs(graph)):
            node_ids = {id(n) for n in g.nodes}
            for node in list(g.nodes):
                if not node.outputs or not is_onnx(node, "Clip", "Max", "Mul", "Div"):
                    continue
                checked = _check(g, node, opset, node_ids)
                if isinstance(checked, _Plan) and checked.op == "HardSwish":
                    checked = self._hardswish_allowed(ctx) or checked
                if isinstance(checked, str):
                    result.notes.append(Note(node_label(node), checked))
                elif checked is None:
                    continue
                elif not ctx.allow_rewrite(self.name, f"{node_label(node)} as {checked.op}"):
                    result.notes.append(Note(node_label(node), LIMIT_REACHED))
                else:
                    node_ids.add(id(_rewrite(g, node, checked, names)))  # x * it may fold next
                    result.counts[checked.count] += 1
                    result.changed = True
        if not result.changed and not result.notes:
            result.notes.append(
                Note("graph", "no Clip(x, 0, inf), Max(x, 0), x * HardSigmoid(x) or "
                     "Clip(x + 3, 0, 6) / 6 to rewrite")
            )
        return result


def _check(g: gs.Graph, node: gs.Node, opset: int, node_ids: set[int]) -> _Plan | str | None:
    """The rewrite, a reason to report, or None for a node that is not a candidate."""
    if node.op == "Clip":
        return _check_clip(node, opset)
    if node.op == "Max":
        return _check_max(node, opset)
    swish = hard_swish(g, node, opset, node_ids)
    if swish is not None:
        if opset >= _HARDSWISH_OPSET:
            return _Plan("HardSwish", swish.x, _HARDSWISH_DECOMPOSED, drop=swish.nodes[1:])
        return _Plan("HardSigmoid", swish.x, _HARDSWISH_BELOW_14, drop=swish.nodes[2:],
                     attrs=_HARD_SIGMOID_ATTRS, gated=swish.nodes[1])
    sigmoid = hard_sigmoid(g, node, opset, node_ids)
    if sigmoid is not None:
        return _Plan("HardSigmoid", sigmoid.x, _HARDSIGMOID_DECOMPOSED, drop=sigmoid.nodes[1:],
                     attrs=_HARD_SIGMOID_ATTRS)
    return _check_mul(g, node, opset, node_ids) if node.op == "Mul" else None


# ----------------------------------------------------------------------------- Clip


def _check_clip(node: gs.Node, opset: int) -> _Plan | str | None:
    x = node.inputs[0]
    if opset < 11:
        lo, hi = node.attrs.get("min"), float(node.attrs.get("max", _FLT_MAX))
        dtype = _dtype(x)
        dtype = np.dtype(np.float32) if dtype is None else dtype
    else:
        bounds = [_optional(node, i) for i in (1, 2)]
        values = [None if t is None else constant_value(t) for t in bounds]
        if any(t is not None and v is None for t, v in zip(bounds, values, strict=True)):
            return NON_CONSTANT_BOUNDS
        lo, hi = values
        present = [v for v in values if v is not None]
        dtype = present[0].dtype if present else _dtype(x)
    if lo is None or np.size(lo) != 1 or float(np.reshape(lo, -1)[0]) != 0.0:
        return None  # no lower bound, or not 0: a Clip TensorRT takes as it is
    if hi is not None and (np.size(hi) != 1 or float(np.reshape(hi, -1)[0]) < _max_of(dtype)):
        return None
    return _relu_unsupported(dtype, opset) or _Plan("Relu", x, _CLIP)


def _optional(node: gs.Node, index: int) -> gs.Tensor | None:
    if len(node.inputs) <= index or node.inputs[index].is_empty():
        return None
    return node.inputs[index]


def _dtype(tensor: gs.Tensor) -> np.dtype | None:
    try:
        return np.dtype(tensor.dtype) if tensor.dtype is not None else None
    except TypeError:  # an ONNX type numpy does not know
        return None


def _max_of(dtype: np.dtype | None) -> float:
    """The largest finite value of `dtype` (float32's when unknown)."""
    if dtype is None:
        return _FLT_MAX
    if np.issubdtype(dtype, np.integer):
        return float(np.iinfo(dtype).max)
    if dtype.name == "bfloat16":
        return 3.3895313892515355e38
    return float(np.finfo(dtype).max)


def _relu_unsupported(dtype: np.dtype | None, opset: int) -> str | None:
    if dtype is None:
        return None
    since = _RELU_SINCE.get(dtype.name)
    if since is None:
        return f"Relu does not take {dtype.name}"
    if opset < since:
        return f"Relu takes {dtype.name} only from opset {since}; the model imports opset {opset}"
    return None


# ----------------------------------------------------------------------------- Max


def _check_max(node: gs.Node, opset: int) -> _Plan | str | None:
    values = [constant_value(t) for t in node.inputs]
    constant = [i for i, v in enumerate(values) if v is not None]
    if len(constant) != 1:
        return None  # no constant operand, or all constant (fold-constants' work)
    if len(node.inputs) != 2:
        return f"it has {len(node.inputs)} inputs; only Max(x, 0) with two inputs is Relu"
    zero, x = values[constant[0]], node.inputs[1 - constant[0]]
    if np.any(zero != 0):
        return "its constant operand is not all zeros, so it is not Relu"
    dtype = _dtype(x)
    if dtype is not None and dtype != zero.dtype:
        return f"its zero is {zero.dtype.name} but x is {dtype.name}"
    if broadcast_refusal(x, list(zero.shape)) is not None:
        return "its zero constant may broadcast x to a larger shape, which Relu would not"
    return _relu_unsupported(zero.dtype, opset) or _Plan("Relu", x, _MAX)


# ----------------------------------------------------------------------------- Mul


def _check_mul(g: gs.Graph, node: gs.Node, opset: int, node_ids: set[int]) -> _Plan | str | None:
    if len(node.inputs) != 2:
        return None
    for i in (0, 1):
        gate, x = node.inputs[i], node.inputs[1 - i]
        producer = producer_in(gate, node_ids)
        if producer is None or not producer.inputs or producer.inputs[0] is not x:
            continue
        if is_onnx(producer, "HardSigmoid"):
            return _check_hardswish(g, producer, x, opset)
        if is_onnx(producer, "Sigmoid"):
            return SILU
    return None


def _check_hardswish(g: gs.Graph, hsig: gs.Node, x: gs.Tensor, opset: int) -> _Plan | str:
    alpha = float(hsig.attrs.get("alpha", 0.2))
    beta = float(hsig.attrs.get("beta", 0.5))
    if abs(alpha - 1.0 / 6.0) > _ATTR_TOL or abs(beta - 0.5) > _ATTR_TOL:
        return (
            f"its HardSigmoid has alpha={alpha:g}, beta={beta:g}, not alpha=1/6, beta=0.5, "
            "so x * HardSigmoid(x) is not HardSwish"
        )
    gate = hsig.outputs[0]
    if is_graph_output(g, gate):
        return "the HardSigmoid output is a graph output, so the HardSigmoid must stay"
    if len(gate.outputs) > 1:
        return "the HardSigmoid output is also read by another node, so the HardSigmoid must stay"
    if opset < _HARDSWISH_OPSET:
        return f"HardSwish needs opset {_HARDSWISH_OPSET}; the model imports opset {opset}"
    return _Plan("HardSwish", x, _HARDSWISH, drop=(hsig,))


# ----------------------------------------------------------------------------- rewrite


def _rewrite(g: gs.Graph, node: gs.Node, plan: _Plan, names: set[str]) -> gs.Node:
    """Put `plan.op(x)` where `node` was; it writes the node's output tensor. With
    `plan.gated`, that Mul(x, gate) writes the node's output instead, and `plan.op(x)`
    a new gate tensor where the gate's producer was (a new name: the old gate held
    Clip(x + 3, 0, 6), six times the HardSigmoid, and `graphfix check` compares tensors
    by name)."""
    y = node.outputs[0]
    if plan.gated is not None:
        gate = next(t for t in plan.gated.inputs if t is not plan.x)
        node.inputs.clear()
        node.outputs.clear()
        plan.gated.outputs[0] = y
        node = gate.inputs[0]
        y = gs.Variable(fresh_name(f"{gate.name}_hardsigmoid", names), gate.dtype, gate.shape)
        replace_in(plan.gated.inputs, gate, y)
    for old in (node, *plan.drop):
        old.inputs.clear()
        old.outputs.clear()
    new = gs.Node(plan.op, name=node.name, attrs=dict(plan.attrs), inputs=[plan.x], outputs=[y])
    index = next(i for i, n in enumerate(g.nodes) if n is node)
    g.nodes[index] = new
    return new
