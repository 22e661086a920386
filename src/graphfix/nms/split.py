"""Where to cut a detector in two: a backbone for TensorRT, the NMS post-processing after.

The rule, on the main graph:

1. The *post-processing* starts at the data-dependent nodes (`_flow`: NonZero,
   NonMaxSuppression, Unique, Compress, If, Loop, Scan, TopK with a non-constant K)
   that an NMS depends on, or that hold an NMS in a body, and holds every node that
   reads their results, directly or not. Data-dependent nodes that feed no NMS stay
   in the backbone.
2. The *cut* is the set of non-constant tensors the post-processing reads from the
   rest. It is then moved up past nodes that only the post-processing reads when
   that makes the cut smaller (SSDlite's 90 per-class `Greater(Gather(scores, c))`
   filters become one `scores` tensor), or keeps its size through a layout op, a
   Gather/Reshape with constant indices or a comparison with a constant (so the backbone ends at the
   raw pre-NMS boxes and scores, not at a Transpose of them).
3. Constant-only nodes go to whichever part needs them (both, if both do).

Refused, with the reason: no ONNX NonMaxSuppression; a region that `regions` cannot
split (its boxes come from an If/Loop that does not hold it, ...); a post-processing
that would hold convolutions or matrix products (a two-stage detector whose second
stage reads the first NMS's result: the cut would move the second stage out of
TensorRT); no cut tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from graphfix.graph.protos import all_nodes, proto_label
from graphfix.nms._flow import CONTROL_FLOW, Flow
from graphfix.nms.regions import Kind, NmsRegion, find_regions, is_nms

_HEAVY = ("Conv", "ConvTranspose", "MatMul", "Gemm", "RoiAlign", "MaxRoiPool", "LSTM", "GRU",
          "RNN", "Attention", "MatMulInteger", "QLinearConv", "QLinearMatMul", "ConvInteger")
_LAYOUT = ("Unsqueeze", "Squeeze", "Transpose", "Flatten", "Cast", "Identity")
_CONSTANT_OPERAND = ("Reshape", "Gather", "Greater", "Less", "GreaterOrEqual",
                     "LessOrEqual", "Equal")


@dataclass
class SplitPlan:
    """How to cut the main graph: node indices of the post-processing, the cut tensors
    (from the backbone), original inputs the post-processing reads too, and which part
    makes each original output."""

    post: set[int]
    cut: list[str]
    passthrough: list[str]
    backbone_outputs: list[str]
    nms_outputs: list[str]
    regions: list[NmsRegion] = field(default_factory=list)
    sunk: int = 0


def plan_split(model: onnx.ModelProto) -> SplitPlan | str:
    """The plan, or why the model cannot be split."""
    regions = find_regions(model)
    onnx_regions = [r for r in regions if r.kind is Kind.ONNX]
    if not onnx_regions:
        plugins = sorted({r.op_type for r in regions})
        if plugins:
            return (f"the NMS is a TensorRT plugin ({', '.join(plugins)}): it runs inside "
                    "TensorRT, and split-nms cuts only ONNX NonMaxSuppression")
        return "no NonMaxSuppression in the graph"
    for region in onnx_regions:
        if region.reasons:
            return f"{region.label}: {region.reasons[0]}"
    flow = Flow(model.graph)
    carriers = [i for i, n in enumerate(flow.nodes) if _holds_nms(n)]
    related = flow.ancestors(n for i in carriers for n in flow.reads[i]) | set(carriers)
    roots = sorted(i for i in related if flow.is_data_dependent(i))
    for i in roots:
        node = flow.nodes[i]
        if node.op_type in CONTROL_FLOW and i not in carriers:
            return (f"an NMS reads the result of {proto_label(node)}, which holds no NMS: "
                    "the cut would have to go before it")
    post = flow.descendants(roots)
    cut, sunk = _move_up(flow, post)
    heavy = _heavy(flow, post)
    if heavy:
        return (f"the post-processing would hold {heavy}: a later stage reads an NMS result "
                "(a two-stage detector), and cutting before the NMS would take it out of "
                "the backbone")
    if not cut:
        return "the post-processing reads nothing from the rest of the model"
    outputs = flow.outputs
    made_by_post = {o for i in post for o in flow.nodes[i].output}
    return SplitPlan(
        post=post,
        cut=[c for c in cut if c not in flow.inputs],
        passthrough=[c for c in cut if c in flow.inputs],
        backbone_outputs=[o for o in outputs if o not in made_by_post],
        nms_outputs=[o for o in outputs if o in made_by_post],
        regions=onnx_regions, sunk=sunk,
    )


def _holds_nms(node: onnx.NodeProto) -> bool:
    return is_nms(node) is Kind.ONNX or any(
        is_nms(n) is Kind.ONNX for n in all_nodes(onnx.helper.make_graph([node], "", [], [])))


def _frontier(flow: Flow, post: set[int]) -> set[str]:
    made = {o for i in post for o in flow.nodes[i].output}
    return {n for i in post for n in flow.reads[i] if n not in made and not flow.is_constant(n)}


def _move_up(flow: Flow, post: set[int]) -> tuple[list[str], int]:
    """Move nodes into the post-processing while the cut gets smaller (or keeps its
    size through a layout op / constant selection); returns (cut, nodes moved)."""
    cut = _frontier(flow, post)
    moved = 0
    changed = True
    while changed:
        changed = False
        for name in sorted(cut):
            i = flow.producer.get(name)
            if i is None or i in post or not _movable(flow, i, post):
                continue
            node = flow.nodes[i]
            reads = {n for n in flow.reads[i] if not flow.is_constant(n)}
            after = (cut - set(node.output)) | reads
            if len(after) < len(cut) or (len(after) == len(cut) and _cheap(flow, node)):
                post.add(i)
                cut = after
                moved += 1
                changed = True
                break
    return sorted(cut), moved


def _movable(flow: Flow, i: int, post: set[int]) -> bool:
    node = flow.nodes[i]
    if flow.is_data_dependent(i) or any(True for _ in _bodies(node)):
        return False
    for out in node.output:
        if out in flow.outputs or any(r not in post for r in flow.readers.get(out, ())):
            return False
    return True


def _bodies(node: onnx.NodeProto):
    return (a for a in node.attribute
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS))


def _cheap(flow: Flow, node: onnx.NodeProto) -> bool:
    """A layout op, or a selection/comparison whose other operands are constants."""
    if node.op_type in _LAYOUT:
        return True
    return node.op_type in _CONSTANT_OPERAND and all(
        flow.is_constant(n) for n in node.input[1:] if n)


def _heavy(flow: Flow, post: set[int]) -> str:
    counts: dict[str, int] = {}
    for i in post:
        graph = onnx.helper.make_graph([flow.nodes[i]], "", [], [])
        for node in all_nodes(graph):
            if node.op_type in _HEAVY:
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))
