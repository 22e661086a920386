"""merge-parallel-convs: Convs of one input that are added together, as one Conv.

RepVGG, MobileOne, RepGhost and their kin train with parallel branches on one input and
are meant to be re-parameterized into a single Conv before deployment; exported as
trained (timm's models, `torch.onnx.export` of the training form) each block is two to
five Convs and a BatchNormalization summed by Adds, and TensorRT runs every one of them.
Convolution is linear in its kernel, so::

    Add(Conv(x, W1, b1), Conv(x, W2, b2))  -> Conv(x, W1' + W2', b1 + b2)
    Add(..., BatchNormalization(x))        -> the identity kernel scaled by the BN's
                                              per-channel scale, its shift into the bias
    Add(..., x)                            -> the identity kernel

where W' is W zero-padded to the largest kernel (centred) and an Add tree of any size
is one sum (an inner Add read only by the next). Conditions: every branch reads the
same x, every Conv has constant weights (and bias), the same group count, strides and
dilations, no auto_pad, and "same" padding for an odd kernel on every axis (pads
(k - 1) / 2 * dilation at both ends), so that a centred smaller kernel sees the same
window; an identity branch needs stride 1 and as many output channels as input ones;
at least one Conv; each branch's output read only by the sum and not a graph output.
Float32 and float64 weights, summed in float64 and cast back once: the merged Conv
adds the branches' products in another order, so the output moves by rounding, as
after fold-bn (the run's check judges it). Recurses into If/Loop/Scan bodies.

fold-bn runs first in trt-prep, so a branch's Conv + BatchNormalization is one Conv by
then; the merged Conv takes the last Add's output tensor, so names survive, and the
old nodes are left for cleanup.
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
)
from graphfix.graph.walk import producer_in
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult, may_rewrite

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class _Branch:
    """One term of the sum: a Conv (`weight`, `bias`) or a per-channel affine identity
    (`scale`, `shift`: a BatchNormalization of x, or x itself)."""

    node: gs.Node | None  # what writes the term (None: x itself)
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    scale: np.ndarray | None = None
    shift: np.ndarray | None = None


class MergeParallelConvs(Pass):
    """Sum Convs of one input (and a BatchNormalization of it, or the input itself) that
    are added together into one Conv: the re-parameterization of RepVGG-style blocks
    (module docstring). A sum with a Conv branch that does not qualify gets a note."""

    name = "merge-parallel-convs"
    summary = ("Merge Convs of one input that are added together (and a BatchNorm or "
               "identity of it) into one Conv: RepVGG/MobileOne re-parameterization")
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        names: set[str] | None = None
        found = 0
        for g in list(all_graphs(graph)):
            node_ids = {id(n) for n in g.nodes}
            for add in [n for n in g.nodes if is_onnx(n, "Add") and _is_root(n, g)]:
                terms = _terms(add, g, node_ids)
                if not _of_one_input(terms, node_ids):
                    continue
                found += 1
                plan = _plan(terms, g, node_ids)
                if not may_rewrite(result, ctx, self.name, node_label(add), plan):
                    continue
                names = names if names is not None else names_in_use(graph)
                _rewrite(g, add, plan, names)
                result.counts["merged sums of parallel branches into one Conv"] += 1
                result.changed = True
        if not found:
            result.notes.append(Note("graph", "no Add sums Convs of one input"))
        return result


def _is_root(add: gs.Node, g: gs.Graph) -> bool:
    """Whether `add` is the last Add of its sum: not read by one Add alone."""
    out = add.outputs[0]
    readers = out.outputs
    return is_graph_output(g, out) or not (len(readers) == 1 and is_onnx(readers[0], "Add"))


def _terms(add: gs.Node, g: gs.Graph, node_ids: set[int]) -> list[gs.Tensor]:
    """The summed tensors of the Add tree ending at `add` (inner Adds read only by the
    next one, in this graph, not graph outputs)."""
    terms = []
    for t in add.inputs:
        inner = _writer(t, "Add", node_ids)
        if inner is not None and len(t.outputs) == 1 and not is_graph_output(g, t):
            terms += _terms(inner, g, node_ids)
        else:
            terms.append(t)
    return terms


def _of_one_input(terms: list[gs.Tensor], node_ids: set[int]) -> bool:
    """Whether the terms are Convs of one x (at least one), BatchNormalizations of it, or
    x itself: a sum this pass is about (others, a ResNet's residual Add, are not)."""
    convs = [c for t in terms if (c := _writer(t, "Conv", node_ids)) is not None]
    if not convs or len(terms) < 2:
        return False
    x = convs[0].inputs[0]
    for t in terms:
        writer = _writer(t, "Conv", node_ids) or _writer(t, "BatchNormalization", node_ids)
        if t is not x and (writer is None or writer.inputs[0] is not x):
            return False
    return True


def _writer(t: gs.Tensor, op: str, node_ids: set[int]) -> gs.Node | None:
    """The `op` node of this graph that writes `t`, if any."""
    node = producer_in(t, node_ids)
    return node if node is not None and is_onnx(node, op) else None


def _plan(terms: list[gs.Tensor], g: gs.Graph, node_ids: set[int]
          ) -> tuple[gs.Tensor, list[_Branch], dict] | str:
    """(x, the branches, the merged Conv's attributes), or why the sum stays."""
    convs = [_writer(t, "Conv", node_ids) for t in terms]
    x = next(c.inputs[0] for c in convs if c is not None)
    branches, attrs = [], None
    for t, conv in zip(terms, convs, strict=True):
        if t is x:
            branches.append(_Branch(None))
            continue
        if len(t.outputs) != 1 or is_graph_output(g, t):
            return f"{t.name} is read elsewhere too"
        if conv is not None:
            branch = _conv_branch(conv, x)
            if isinstance(branch, str):
                return f"{node_label(conv)}: {branch}"
            mine = _conv_attrs(conv)
            if isinstance(mine, str):
                return f"{node_label(conv)}: {mine}"
            if attrs is not None and mine != attrs:
                return "its Convs differ in group, strides or dilations"
            attrs = mine
        else:
            bn = _writer(t, "BatchNormalization", node_ids)
            branch = _bn_branch(bn, x) if bn is not None else (
                f"{t.name} is not a Conv or BatchNormalization of the same input")
            if isinstance(branch, str):
                return branch
        branches.append(branch)
    assert attrs is not None
    weights = [b.weight for b in branches if b.weight is not None]
    dtype = weights[0].dtype
    if dtype not in _FLOATS or any(w.dtype != dtype for w in weights):
        return f"its Conv weights are not all float32 or all float64 ({dtype})"
    if any(w.ndim != weights[0].ndim or w.shape[:2] != weights[0].shape[:2]
           for w in weights):
        return "its Convs differ in rank or in channels"
    identity = [b for b in branches if b.weight is None]
    if identity:
        if any(s != 1 for s in attrs["strides"]):
            return "an identity branch needs stride 1"
        channels_in = weights[0].shape[1] * attrs["group"]
        if any(w.shape[0] != channels_in for w in weights):
            return "an identity branch needs as many output channels as input channels"
        for b in identity:
            if b.scale is not None and b.scale.size != channels_in:
                return "the BatchNormalization's statistics are not one per channel"
    return x, branches, attrs


def _conv_branch(conv: gs.Node, x: gs.Tensor) -> _Branch | str:
    if conv.inputs[0] is not x:
        return "it reads another input than the other branches"
    w = constant_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None:
        return "its weights are not a constant"
    b = None
    if len(conv.inputs) > 2 and not conv.inputs[2].is_empty():
        b = constant_value(conv.inputs[2])
        if b is None:
            return "its bias is not a constant"
    return _Branch(conv, weight=np.asarray(w), bias=None if b is None else np.asarray(b))


def _conv_attrs(conv: gs.Node) -> dict | str:
    """group, strides, dilations; why not, where the padding is not centred "same"."""
    w = constant_value(conv.inputs[1])
    spatial = list(w.shape[2:])
    if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "it uses auto_pad"
    rank = len(spatial)
    strides = list(conv.attrs.get("strides", [1] * rank))
    dilations = list(conv.attrs.get("dilations", [1] * rank))
    pads = list(conv.attrs.get("pads", [0] * 2 * rank))
    for i, k in enumerate(spatial):
        if k % 2 == 0:
            return f"its kernel is even ({k}) on axis {i}"
        same = dilations[i] * (k - 1) // 2
        if pads[i] != same or pads[i + rank] != same:
            return f"its padding {pads} is not centred on its {spatial} kernel"
    return {"group": int(conv.attrs.get("group", 1)), "strides": strides,
            "dilations": dilations}


def _bn_branch(bn: gs.Node, x: gs.Tensor) -> _Branch | str:
    if bn.inputs[0] is not x:
        return f"{node_label(bn)} reads another input than the Convs"
    if len(bn.outputs) != 1 or int(bn.attrs.get("training_mode", 0)):
        return f"{node_label(bn)} is in training mode"
    values = [constant_value(t) for t in bn.inputs[1:5]]
    if any(v is None for v in values):
        return f"{node_label(bn)}: its scale, B, mean and var are not all constants"
    scale, bias, mean, var = (np.asarray(v, np.float64).reshape(-1) for v in values)
    eps = float(bn.attrs.get("epsilon", 1e-5))
    if np.any(var + eps <= 0):
        return f"{node_label(bn)}: its var + epsilon is not positive everywhere"
    s = scale / np.sqrt(var + eps)
    return _Branch(bn, scale=s, shift=bias - mean * s)


def _rewrite(g: gs.Graph, add: gs.Node, plan: tuple, names: set[str]) -> None:
    x, branches, attrs = plan
    weights = [b.weight for b in branches if b.weight is not None]
    dtype, out_channels = weights[0].dtype, weights[0].shape[0]
    kernel = [max(w.shape[2 + i] for w in weights) for i in range(weights[0].ndim - 2)]
    total = np.zeros((out_channels, weights[0].shape[1], *kernel), np.float64)
    bias = np.zeros(out_channels, np.float64)
    for b in branches:
        if b.weight is not None:
            offsets = [(k - s) // 2 for k, s in zip(kernel, b.weight.shape[2:], strict=True)]
            window = tuple(slice(o, o + s) for o, s in zip(offsets, b.weight.shape[2:],
                                                           strict=True))
            total[(slice(None), slice(None), *window)] += b.weight.astype(np.float64)
            if b.bias is not None:
                bias += b.bias.astype(np.float64).reshape(-1)
            continue
        scale = np.ones(out_channels) if b.scale is None else b.scale
        per_group = total.shape[1]
        centre = tuple(k // 2 for k in kernel)
        for o in range(out_channels):
            total[(o, o % per_group, *centre)] += scale[o]
        if b.shift is not None:
            bias += b.shift
    out = add.outputs[0]
    base = add.name or out.name
    w = gs.Constant(fresh_name(f"{base}_merged_weight", names), total.astype(dtype))
    c = gs.Constant(fresh_name(f"{base}_merged_bias", names), bias.astype(dtype))
    rank = len(kernel)
    conv_attrs = {"group": attrs["group"], "kernel_shape": kernel,
                  "pads": [k // 2 * d for k, d in zip(kernel, attrs["dilations"],
                                                     strict=True)] * 2,
                  "strides": attrs["strides"], "dilations": attrs["dilations"]}
    assert len(conv_attrs["pads"]) == 2 * rank
    add.outputs.clear()
    g.nodes.append(gs.Node("Conv", fresh_name(f"{base}_merged", names), conv_attrs,
                           inputs=[x, w, c], outputs=[out]))
