"""`graphfix run --explain`: which Conv -> (bias) -> activation chains TensorRT can fuse.

TensorRT fuses a convolution with its bias and activation into one kernel, but only
when nothing sits between them: a bias `Add`, a `Mul` from a decomposed BatchNorm,
an `Identity`, a second reader of the conv output (../shared/DESIGN.md, "TensorRT
facts"). This module walks every Conv / ConvTranspose of a model (subgraphs too)
and classifies what follows it:

- `fusible`: the conv feeds exactly one activation;
- `residual`: the conv feeds an `Add` with a non-constant operand (a skip
  connection, which TensorRT handles as Conv+Add(+activation) per
  ../shared/trt/calibration_notes.md, placement rule 4);
- `no activation`: nothing activation-like follows (pooling, concat, an output);
- `broken`: something is in the way of an activation, or of the bias — the node in
  the way, why, and the graphfix pass that removes it when there is one. A per-channel
  op (BatchNormalization, a constant Mul/Add) on a conv output that is also read
  elsewhere is in the way too: the reason is the cost model's verdict on folding it
  into a copy of the conv (`graphfix.passes._conv_copy`), with the fold pass as the
  fix when the copy is cheaper, and the other readers and the numbers when not.

Which activation ops TensorRT fuses is not in ../shared/trt/ data and was not
checked on TensorRT here; the list below is ONNX's activation ops that the parser
maps to activation layers, and the report says "activation" rather than
promising a fusion for each one.

The section also lists every NMS region (`graphfix.nms.find_regions`) of the result: where
it is, its kind, the pre-NMS boxes/scores tensors, score layout, box format, thresholds,
tail size, and the NMS pass that applies for the run's TensorRT target (`nms_pass`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import onnx
import onnx_graphsurgeon as gs

from graphfix.graph import all_graphs, constant_value, is_graph_output, is_onnx, node_label
from graphfix.graph.convert import to_graph
from graphfix.passes._conv_copy import Into, ShapeBook, decide

CONVS = ("Conv", "ConvTranspose")
ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish",
               "Elu", "Selu", "Softplus", "ThresholdedRelu", "PRelu")
_IF_NOOP = "eliminate-noops, if it changes nothing"
# What sits in the way, and the pass that removes it.
_IN_THE_WAY = {
    "BatchNormalization": ("a BatchNormalization between the conv and what follows", "fold-bn"),
    "Identity": ("an Identity does nothing but stops the fusion", "eliminate-noops"),
    "Dropout": ("an inference Dropout does nothing but stops the fusion", "eliminate-noops"),
    "Cast": ("a Cast sits between the conv and the activation", _IF_NOOP),
    "Reshape": ("a Reshape sits between the conv and the activation", _IF_NOOP),
    "Transpose": ("a Transpose sits between the conv and the activation", _IF_NOOP),
}
_SCALE_OPS = {"Mul": "fuse-conv-mul", "Div": "fuse-conv-mul",
              "Add": "fuse-conv-bias", "Sub": "fuse-conv-bias"}


@dataclass(frozen=True)
class Chain:
    """One conv and what follows it."""

    conv: str
    kind: str  # fusible | residual | no activation | broken
    path: tuple[str, ...]
    blocker: str = ""
    reason: str = ""
    fix: str = ""


@dataclass
class Explanation:
    chains: list[Chain]

    def counts(self) -> dict[str, int]:
        counts = Counter(c.kind for c in self.chains)
        return {k: counts.get(k, 0) for k in ("fusible", "residual", "no activation", "broken")}

    def broken(self) -> list[Chain]:
        return [c for c in self.chains if c.kind == "broken"]

    def to_json(self) -> dict:
        return {"counts": self.counts(), "broken": [asdict(c) for c in self.broken()]}


def explain_change(before: onnx.ModelProto, after: onnx.ModelProto, trt=None,
                   input_shapes: dict[str, tuple[int, ...]] | None = None) -> dict:
    """The report section: chain counts before and after a run, what is still broken, and
    the NMS regions of the result with the pass for the TensorRT target `trt` (a
    graphfix.trt.TrtTarget; None: the newest documented). `input_shapes` size the convs
    for the copy cost (see `explain`)."""
    old, new = explain(before, input_shapes), explain(after, input_shapes)
    return {"before": old.counts(), "after": new.counts(),
            "broken": new.to_json()["broken"], "nms": explain_nms(after, trt)}


def explain_nms(model: onnx.ModelProto, trt=None) -> list[dict]:
    """One entry per NMS region: where, kind, boxes/scores, layout, box format,
    thresholds, tail size, and the pass that applies for the target."""
    from graphfix.nms.regions import find_regions

    return [{"where": r.label, "kind": r.kind.value, "boxes": list(r.boxes),
             "scores": list(r.scores), "layout": r.layout.value,
             "box_format": r.box_format.value,
             "thresholds": [t.describe() for t in r.thresholds], "tail": len(r.tail),
             "steps": list(r.steps), "region": r.describe(),
             "pass": nms_pass(r, trt)} for r in find_regions(model)]


def nms_pass(region, trt=None) -> str:
    """The NMS pass for a region at the target, with why."""
    from graphfix.nms.regions import Kind, Where
    from graphfix.passes.nms_for_trt import choose
    from graphfix.passes.plugin_to_nms import CONVERTS
    from graphfix.trt import documented_versions, parse_target, plugin_for

    target = trt or parse_target(documented_versions()[-1])
    if region.kind is Kind.PLUGIN:
        spec = plugin_for(region.op_type)
        status = spec.status_at(target) if spec is not None else "unknown"
        if status != "available" and region.op_type in CONVERTS:
            return f"plugin-to-nms ({region.op_type} is {status} in {target.label()})"
        return f"none ({region.op_type} is {status} in {target.label()})"
    chosen, why = choose(target)
    if chosen == "nms-to-plugin" and region.where is not Where.MAIN:
        return f"split-nms (nms-to-plugin needs a main-graph NMS; {why})"
    return f"{chosen} ({why})"


def explain(model: onnx.ModelProto | gs.Graph,
            input_shapes: dict[str, tuple[int, ...]] | None = None) -> Explanation:
    """Classify every Conv/ConvTranspose chain of the model (see the module docstring).
    `input_shapes` (the run's, e.g. --input-shape) size the convs whose copy is costed;
    without them only static shapes do."""
    graph = model if isinstance(model, gs.Graph) else to_graph(model)
    shapes = ShapeBook(graph, dict(input_shapes or {}))
    chains = []
    for g in all_graphs(graph):
        for node in g.nodes:
            if is_onnx(node, *CONVS) and node.outputs:
                chains.append(_classify(g, node, shapes))
    return Explanation(chains)


def _classify(g: gs.Graph, conv: gs.Node, shapes: ShapeBook) -> Chain:
    label = node_label(conv)
    out = conv.outputs[0]
    readers = list(out.outputs)
    if len(readers) > 1 or (readers and is_graph_output(g, out)):
        scaled = next((r for r in readers if _per_channel(conv, r)), None)
        if scaled is not None:
            return _shared(g, label, conv, scaled, shapes)
    if is_graph_output(g, out) or not readers:
        return Chain(label, "no activation", (conv.op,))
    if len(readers) > 1:
        acts = [r for r in readers if is_onnx(r, *ACTIVATIONS)]
        if acts:
            return Chain(label, "broken", (conv.op, acts[0].op), node_label(acts[0]),
                         f"the conv output is read by {len(readers)} nodes, so it must stay "
                         "a tensor of its own and the activation cannot be fused", "")
        return Chain(label, "no activation", (conv.op,))
    nxt = readers[0]
    path = (conv.op, nxt.op)
    if is_onnx(nxt, *ACTIVATIONS):
        reason = _activation_problem(nxt)
        if reason:
            return Chain(label, "broken", path, node_label(nxt), reason, "")
        return Chain(label, "fusible", path)
    if is_onnx(nxt, *_SCALE_OPS):
        return _elementwise(label, conv, nxt, path)
    if is_onnx(nxt, "BatchNormalization"):
        reason, fix = _IN_THE_WAY[nxt.op]
        return Chain(label, "broken", path, node_label(nxt), reason, fix)
    if is_onnx(nxt, *_IN_THE_WAY):
        # A pass-through op is in the way only when an activation comes after it.
        after = _after_pass_through(nxt)
        if after is not None:
            reason, fix = _IN_THE_WAY[nxt.op]
            return Chain(label, "broken", (*path, after.op), node_label(nxt), reason, fix)
    return Chain(label, "no activation", path)


def _per_channel(conv: gs.Node, node: gs.Node) -> bool:
    """Whether `node` is a BatchNormalization or a constant Mul/Div/Add/Sub of the conv
    output (its first operand, for Sub and Div)."""
    out = conv.outputs[0]
    if is_onnx(node, "BatchNormalization"):
        return node.inputs[0] is out
    if not is_onnx(node, *_SCALE_OPS) or len(node.inputs) != 2:
        return False
    sides = [i for i, t in enumerate(node.inputs) if t is out]
    if len(sides) != 1 or (sides[0] == 1 and node.op in ("Sub", "Div")):
        return False
    return constant_value(node.inputs[1 - sides[0]]) is not None


def _shared(g: gs.Graph, label: str, conv: gs.Node, node: gs.Node, shapes: ShapeBook
            ) -> Chain:
    """A per-channel op on a conv output that is also read elsewhere: broken, with the
    copy's cost verdict as the reason (and the fold pass as the fix when a copy pays)."""
    into = decide(g, conv, node, shapes)
    fix = _IN_THE_WAY[node.op][1] if node.op == "BatchNormalization" else _SCALE_OPS[node.op]
    path = (conv.op, node.op)
    if into is Into.COPY:
        return Chain(label, "broken", path, node_label(node),
                     f"the conv output is also read elsewhere, and a copy of the conv to fold "
                     f"the {node.op} into costs less than the {node.op} layer (cost model)", fix)
    return Chain(label, "broken", path, node_label(node), str(into), "")


def _after_pass_through(node: gs.Node, hops: int = 3) -> gs.Node | None:
    """The activation reached through a short chain of single-reader pass-through ops."""
    for _ in range(hops):
        readers = node.outputs[0].outputs if node.outputs else []
        if len(readers) != 1:
            return None
        node = readers[0]
        if is_onnx(node, *ACTIVATIONS):
            return node
        if not is_onnx(node, *_IN_THE_WAY):
            return None
    return None


def _elementwise(label: str, conv: gs.Node, node: gs.Node, path: tuple[str, ...]) -> Chain:
    other = [t for t in node.inputs if t is not conv.outputs[0]]
    if not other:
        return Chain(label, "no activation", path)
    if constant_value(other[0]) is None:
        if node.op == "Add":
            return Chain(label, "residual", path)
        return Chain(label, "broken", path, node_label(node),
                     f"a {node.op} by a non-constant tensor sits between the conv and what "
                     "follows", "")
    if node.op in ("Add", "Sub"):
        reason = f"the bias is a separate {node.op} of a constant, not the conv's bias input"
    else:
        reason = (f"a {node.op} by a constant (e.g. a decomposed BatchNorm) sits after the "
                  "conv instead of being folded into its weights")
    return Chain(label, "broken", path, node_label(node), reason, _SCALE_OPS[node.op])


def _activation_problem(act: gs.Node) -> str:
    if act.op == "Clip":
        bounds = [t for t in act.inputs[1:] if t.name]
        if any(constant_value(t) is None for t in bounds):
            return "the Clip's bounds are not constants"
    if act.op == "PRelu" and constant_value(act.inputs[1]) is None:
        return "the PRelu slope is not a constant"
    return ""
