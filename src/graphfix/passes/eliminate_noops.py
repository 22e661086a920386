"""`eliminate-noops`: remove nodes that compute nothing, and cancel pairs that undo each other.

Each rule, with x the first input and y the output::

    Identity(x)                      -> x
    Dropout(x)        (inference)    -> x
    Dropout(x, ratio=0)  (any mode)  -> x          (its mask output unused)
    Cast(x, to=dtype(x))             -> x
    Reshape(x, s), Expand(x, s)      -> x          when the result has x's shape
    Transpose(x, perm=identity)      -> x
    Transpose(Transpose(x, p1), p2)  -> Transpose(x, p), p[i] = p1[p2[i]];  x if p is identity
    Reshape(Reshape(x, s1), s2)      -> Reshape(x, s2')   (0 entries of s2 resolved)
    Reshape(f(Reshape(x, s1)), s2)   -> f(x)       f elementwise (one-element constants),
                                                   read only there; s2 gives x's shape
    Squeeze(Unsqueeze(x, a), a)      -> x
    Unsqueeze(Squeeze(x, a), a)      -> x          (the Squeeze stays if read elsewhere)
    Unsqueeze(Unsqueeze(x, a1), a2)  -> Unsqueeze(x, a)    (the axes combined)
    Transpose(x, p)                  -> Reshape(x, s)      when p moves only size-1 axes
                                                          and a Reshape is next to it
    Slice(Slice(x, ..a1..), ..a2..) -> Slice(x, ..a1 + a2..)   axes a1, a2 disjoint
    Concat(x), Split(x) (one output) -> x
    Concat(..., e, ...)              -> Concat(...)   e of size 0 along the axis (static);
                                                      x when one input is left
    Concat(a, Concat(b, c), d)       -> Concat(a, b, c, d)   same axis, inner read only here
    Where(Equal(v, k), a, b)         -> the entries it selects: b, a, a constant, or a
                                        Concat of a's and b's Concat parts and constants, when v
                                        and k are shape values and every entry of the
                                        condition is known (`Where(Equal(shape, -1), 1,
                                        shape)`, PyTorch's `expand(n, -1, s)`: a size, or
                                        a sum or product of sizes, is never negative)
    Slice(x, whole range, step 1)    -> x
    Pad(x, pads=0)                   -> x          (any mode)
    x + 0, x - 0, x * 1, x / 1       -> x          when every element of the constant (at
                                                  most 65,536) is 0 (1) and it cannot
                                                  broadcast x to a larger shape: no more
                                                  dimensions than x, each 1 or x's size

These sit between a Conv and its activation in exported graphs and stop TensorRT
from fusing them (DESIGN.md, "TensorRT fuses Conv+bias+ReLU itself, but only when
nothing sits between them"); each also costs a kernel launch. The shape-code rules
(nested Concats, Where on a shape comparison) leave TensorRT fewer shape-tensor layers.

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

Each rule applied to a node (a pair counts once) is one rewrite for a rewrite
budget (`PassContext.allow_rewrite`); every one leaves a valid graph on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    fresh_name,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
)
from graphfix.graph.rewire import bypass, bypass_refusal
from graphfix.passes import _noop_pairs as pairs
from graphfix.passes import _noop_single as single
from graphfix.passes._noop_single import Plan, View
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult

_CANDIDATES = (
    "Identity, inference Dropout, Cast, Reshape, Expand, Transpose, Unsqueeze or Squeeze pair, "
    "Concat, Split, Slice, Pad, Add/Sub/Mul/Div of a constant or Where on a shape comparison"
)


class EliminateNoops(Pass):
    """Remove no-op nodes and cancel inverse pairs.

    Handles: Identity; Dropout in inference mode (no training_mode input or a
    constant false one; is_test=1 before opset 7; mask unused), and Dropout with a
    constant ratio 0 in any mode (mask unused); Cast to its input's dtype
    (known from the tensor or the initializer; kept when the nodes computing the input
    make another type, a stale value_info: `graph.dtypes.computed_dtype`); Reshape and
    Expand that keep the shape; Transpose with the identity permutation (or no perm on rank <= 1);
    two Transposes composed into one, both removed when they cancel (NHWC <-> NCHW
    around a Conv); two Reshapes collapsed into one, resolving the second's 0
    entries (allowzero=0) from the tensor between them; two Reshapes around a region of
    elementwise ops both removed where the second gives the first's input shape back
    (`_noop_pairs.around_elementwise`: GPT-2's MLP from torch's default exporter);
    Squeeze of an Unsqueeze on the same axes (attributes before opset 13, inputs from
    13; negative axes with a known rank; a Squeeze without axes when the input has no
    size-1 dimension); an Unsqueeze of the axes a Squeeze just removed (a Squeeze
    without axes when all its input's dims are known); two Unsqueezes merged into one;
    a Transpose that moves only size-1 axes (so the data order is unchanged) and reads
    from or feeds a Reshape, turned into a Reshape so the pair collapses (static shape
    with at most one unknown dim);
    single-input Concat, and Concat inputs empty along its axis (a static 0);
    a Concat read only by a Concat on the same axis merged into it (negative axes
    normalized with a known rank); a Where whose condition is an Equal of small
    integer shape values known entry by entry (`_shape_values`), replaced by the
    entries it selects (the branch itself, a constant, or a Concat of the branches'
    Concat inputs and constants); single-output Split; two Slices on disjoint axes merged
    into one (opset 10+, constant parameters, the first read only by the second); Slice
    covering every sliced axis
    (opset < 10 attributes, inputs from 10); Pad whose pads are all 0 (attribute
    before opset 11, input from 11), any mode; Add/Sub of 0 and Mul/Div by 1 (one
    element constant, not adding dimensions; the constant may come first for Add
    and Mul). Recurses into If/Loop/Scan bodies.

    Skips, with a note, every candidate it cannot prove a no-op (different dtype,
    shape, permutation, axes, range or pads; dtype or shape unknown; inputs that
    are not constants; a training Dropout whose ratio is not 0; a Where condition
    with an entry not known, such as a value that may be negative) and pairs whose
    first node feeds another node, writes a graph output or lives in an enclosing
    graph.
    """

    name = "eliminate-noops"
    summary = "Remove nodes that compute nothing (Identity, same-type Cast, ...) and inverse pairs."
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names = names_in_use(graph)
        found = False
        for g in all_graphs(graph):
            view = View(g, opset, {id(n) for n in g.nodes}, names)
            while True:  # each change disconnects a node, so this ends
                counts, notes, candidates = _sweep(view, ctx, self.name)
                result.counts.update(counts)
                found = found or candidates > 0
                if not counts:
                    break
            result.notes.extend(notes)
        result.changed = bool(result.counts)
        if not result.changed and not any(n.reason == LIMIT_REACHED for n in result.notes):
            why = "none of its candidates is a removable no-op" if found else f"no {_CANDIDATES}"
            result.notes.append(Note("graph", why))
        return result


def _sweep(view: View, ctx: PassContext, pass_name: str) -> tuple[Counter[str], list[Note], int]:
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
        if isinstance(checked, str):
            why = checked
        else:
            allow = partial(ctx.allow_rewrite, pass_name, f"{checked.count}: {label}")
            why = _apply(view, node, checked, allow)
        if why:
            notes.append(Note(label, why))
        else:
            counts[checked.count] += 1
    return counts, notes, candidates


def _apply(view: View, node: gs.Node, plan: Plan, allow: Callable[[], bool]) -> str | None:
    """Carry out `plan` on `node`; None when done, or why the node had to stay (unchanged).

    `allow` asks the rewrite budget, once the plan is known to be doable."""
    old = node.inputs[0]
    if plan.source is not None:
        node.inputs[0] = plan.source
    refused = bypass_refusal(view.g, node) if plan.remove else None
    why = f"it computes nothing but cannot be removed: {refused}" if refused else None
    if why is None and not allow():
        why = LIMIT_REACHED
    if why:
        if plan.source is not None:
            node.inputs[0] = old
        return why
    for reader, index in plan.rewire:
        reader.inputs[index] = plan.rewire_to
    for tensor in plan.reshaped:
        shape = plan.rewire_to.shape
        tensor.shape = list(shape) if shape is not None else None
    if plan.remove:
        bypass(view.g, node)
    else:
        if plan.inputs is not None:
            node.inputs.clear()
            node.inputs.extend(plan.inputs)
        if plan.op is not None:
            node.op = plan.op
            node.attrs.clear()
        for key, value in plan.attrs.items():
            node.attrs[key] = value
        if plan.operand is not None:
            name = fresh_name(f"{node.outputs[0].name}_{plan.operand_role}", view.names)
            operand = gs.Constant(name, plan.operand)
            if len(node.inputs) > 1:
                node.inputs[1] = operand
            else:
                node.inputs.append(operand)
    if plan.drop is not None:
        plan.drop.inputs.clear()
        plan.drop.outputs.clear()
    return None


_RULES: dict[str, Callable[[gs.Node, View], Plan | str | None]] = {
    "Identity": single.identity,
    "Dropout": single.dropout,
    "Cast": single.cast,
    "Reshape": pairs.reshape,
    "Expand": single.expand,
    "Transpose": pairs.transpose,
    "Squeeze": pairs.squeeze,
    "Unsqueeze": pairs.unsqueeze,
    "Concat": pairs.concat,
    "Split": single.split,
    "Slice": pairs.slice_,
    "Pad": single.pad,
    "Add": single.arithmetic,
    "Sub": single.arithmetic,
    "Mul": single.arithmetic,
    "Div": single.arithmetic,
    "Where": single.where,
}
