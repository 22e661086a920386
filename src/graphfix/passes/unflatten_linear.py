"""unflatten-linear: a linear layer written on a flattened tensor, written on the tensor.

onnxsim rewrites every MatMul + Add of a 3-D activation into Gemm, which is 2-D only, so
it flattens the activation first and restores its shape after (a BERT through onnxsim:
20 of these, each with a Shape -> Slice -> Concat computing the second target)::

    Reshape(x, [-1, K]) -> Gemm(., B, C; alpha, beta, transB) -> Reshape(., t2)
        -> MatMul(x, alpha * B (transposed when transB)) -> Add(., beta * C)
    Reshape(x, [-1, K]) -> MatMul(., B) -> Reshape(., t2)  -> MatMul(x, B)

MatMul multiplies the last axis of x by B whatever x's leading axes are, row by row as
the flattened Gemm does, so the elements and their order are the same. Conditions: x
has rank 3 or more and a known last dim K; the first target is [-1, K] (or the product
of x's leading dims, then K); t2 is x's leading dims then N, entry by entry, as
constants that equal x's static dims, dims read from x's own shape (`Shape(x)` sliced,
gathered, concatenated), or one -1 among them; no 0 entry; Gemm with transA=0, B a
constant (B not constant: alpha 1 and transB 0 only), C absent, a scalar or a constant
of N elements; the flattened tensor and the 2-D result read by nothing else and not
graph outputs. Every reader of the flattened tensor must be such a layer (a Q, K, V
projection reads one flatten three times): the Reshape goes once all of them are
rewritten. The Add writes the second Reshape's output, so names survive; the old nodes
are left for `cleanup`.
"""

from __future__ import annotations

import math
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
)
from graphfix.passes._shape_values import Dim, evaluate
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult, may_rewrite

_MIDDLE = ("Gemm", "MatMul")


@dataclass(frozen=True)
class _Plan:
    first: gs.Node  # Reshape(x, [-1, K])
    middle: gs.Node  # Gemm or MatMul
    last: gs.Node  # Reshape(., t2)
    weight: gs.Tensor  # what MatMul multiplies x by
    bias: np.ndarray | None  # what the Add adds (beta * C), None for none


class UnflattenLinear(Pass):
    """Write a Gemm/MatMul between a flattening Reshape and its inverse on the unflattened
    tensor (module docstring). Every flattening Reshape a Gemm or MatMul reads that stays
    gets a note."""

    name = "unflatten-linear"
    summary = ("Write a Gemm/MatMul between a flattening Reshape and its inverse as a "
               "MatMul (+ Add) on the tensor itself")
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names: set[str] | None = None
        found = 0
        for g in list(all_graphs(graph)):
            for first in [n for n in g.nodes if _flattening(n)]:
                readers = list(first.outputs[0].outputs)
                if not any(r.op in _MIDDLE for r in readers):
                    continue
                found += 1
                plans = _plans(g, first, readers, opset)
                if not may_rewrite(result, ctx, self.name, node_label(first), plans):
                    continue
                names = names if names is not None else names_in_use(graph)
                for plan in plans:
                    _rewrite(g, plan, names)
                    result.counts[f"wrote {plan.middle.op} on the unflattened tensor"] += 1
                first.inputs.clear()
                first.outputs.clear()
                result.changed = True
        if not found:
            result.notes.append(Note("graph", "no Gemm or MatMul reads a flattening Reshape"))
        return result


def _plans(g: gs.Graph, first: gs.Node, readers: list[gs.Node], opset: int
           ) -> list[_Plan] | str:
    """One plan per reader of the flattened tensor (a Q, K, V projection shares one), or
    why the Reshape stays: every reader must be a linear layer that can be unflattened."""
    if is_graph_output(g, first.outputs[0]):
        return "its output is a graph output"
    plans = []
    for reader in readers:
        if reader.op not in _MIDDLE or not is_onnx(reader) or reader.inputs[0] is not (
                first.outputs[0]):
            return f"{node_label(reader)} reads the flattened tensor too"
        plan = _plan(g, first, reader, opset)
        if isinstance(plan, str):
            return f"{node_label(reader)}: {plan}"
        plans.append(plan)
    return plans


def _flattening(node: gs.Node) -> bool:
    """Whether `node` is a Reshape to a constant 2-D target (a candidate)."""
    if not is_onnx(node, "Reshape") or len(node.inputs) < 2 or not node.outputs:
        return False
    target = constant_value(node.inputs[1])
    return target is not None and target.size == 2


def _plan(g: gs.Graph, first: gs.Node, middle: gs.Node, opset: int) -> _Plan | str:
    x = first.inputs[0]
    rank = len(x.shape) if x.shape is not None else None
    if rank is None or rank < 3:
        return "the flattened tensor's rank is unknown or below 3"
    k = x.shape[-1]
    if not isinstance(k, int):
        return "the flattened tensor's last dim is not static"
    t1 = [int(v) for v in constant_value(first.inputs[1]).reshape(-1)]
    leading = x.shape[:-1]
    rows = math.prod(leading) if all(isinstance(d, int) for d in leading) else None
    if t1[1] != k or t1[0] not in (-1, rows) or int(first.attrs.get("allowzero", 0)) and 0 in t1:
        return f"the first Reshape's target {t1} does not flatten the leading dims of x"
    y = middle.outputs[0]
    if len(y.outputs) != 1 or is_graph_output(g, y) or not is_onnx(y.outputs[0], "Reshape"):
        return "its output is not read by one Reshape alone"
    last = y.outputs[0]
    if last.inputs[0] is not y:
        return "its output is the second Reshape's target, not its data"
    operands = _operands(middle)
    if isinstance(operands, str):
        return operands
    weight, bias = operands
    if weight.shape is None or len(weight.shape) != 2 or weight.shape[0] != k:
        return f"its weight is not a {k} x N matrix"
    n = weight.shape[-1]
    if not isinstance(n, int):
        return "its weight's output width is not static"
    restored = _restores(last, x, n, opset)
    if restored:
        return restored
    return _Plan(first, middle, last, weight, bias)


def _operands(middle: gs.Node) -> tuple[gs.Tensor, np.ndarray | None] | str:
    """What MatMul multiplies by and what the Add adds, or why the Gemm does not split."""
    if middle.op == "MatMul":
        return middle.inputs[1], None
    if int(middle.attrs.get("transA", 0)):
        return "it transposes its first input (transA)"
    alpha, beta = (float(middle.attrs.get(k, 1.0)) for k in ("alpha", "beta"))
    trans_b = bool(int(middle.attrs.get("transB", 0)))
    b = middle.inputs[1]
    value = constant_value(b)
    if value is None:
        if alpha != 1.0 or trans_b:
            return "its B is not a constant, and alpha or transB would change it"
        weight: gs.Tensor = b
    else:
        scaled = (value.T if trans_b else value)
        if alpha != 1.0:
            scaled = (scaled * alpha).astype(value.dtype)
        weight = gs.Constant(b.name, np.ascontiguousarray(scaled)) if (
            trans_b or alpha != 1.0) else b
    bias = None
    if len(middle.inputs) > 2 and not middle.inputs[2].is_empty():
        c = constant_value(middle.inputs[2])
        n = weight.shape[-1] if weight.shape is not None else None
        if c is None or c.size not in (1, n) or c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
            return "its C is not a constant of one row"
        bias = (c.reshape(-1) * beta).astype(c.dtype) if beta != 1.0 else c.reshape(-1)
    return weight, bias


def _restores(last: gs.Node, x: gs.Tensor, n: int, opset: int) -> str | None:
    """Why the second Reshape's target is not x's leading dims then `n`, or None."""
    value = evaluate(last.inputs[1], opset)
    if isinstance(value, str):
        return f"the second Reshape's target cannot be read: {value}"
    entries = list(value.entries)
    rank = len(x.shape)
    if len(entries) != rank or entries[-1] not in (n, -1):
        return "the second Reshape's target is not x's leading dims then the output width"
    if 0 in entries or int(last.attrs.get("allowzero", 0)):
        return "the second Reshape's target copies dims (0 entries)"
    unknown = [i for i, e in enumerate(entries) if e == -1]
    if len(unknown) > 1:
        return "the second Reshape's target has more than one -1"
    for i, entry in enumerate(entries[:-1]):
        if entry == -1:
            continue
        dim = x.shape[i]
        if isinstance(entry, Dim) and entry.tensor is x and entry.axis in (i, i - rank):
            continue
        if isinstance(entry, int) and entry == dim:
            continue
        return f"entry {i} of the second Reshape's target is not dim {i} of x"
    if entries[-1] == -1 and unknown != [rank - 1]:
        return "the second Reshape's target has more than one -1"
    return None


def _rewrite(g: gs.Graph, plan: _Plan, names: set[str]) -> None:
    x = plan.first.inputs[0]
    out = plan.last.outputs[0]
    weight = plan.weight
    if isinstance(weight, gs.Constant) and weight is not plan.middle.inputs[1]:
        weight = gs.Constant(fresh_name(f"{weight.name}_unflattened", names), weight.values)
    for node in (plan.middle, plan.last):  # the first Reshape goes after all its readers
        node.inputs.clear()
        node.outputs.clear()
    base = plan.middle.name or out.name
    if plan.bias is None:
        g.nodes.append(gs.Node("MatMul", fresh_name(base, names), inputs=[x, weight],
                               outputs=[out]))
        return
    product = gs.Variable(fresh_name(f"{base}_matmul", names), dtype=out.dtype)
    g.nodes.append(gs.Node("MatMul", fresh_name(base, names), inputs=[x, weight],
                           outputs=[product]))
    bias = gs.Constant(fresh_name(f"{base}_bias", names), plan.bias)
    g.nodes.append(gs.Node("Add", fresh_name(f"{base}_add", names), inputs=[product, bias],
                           outputs=[out]))
