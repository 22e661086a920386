"""`nms-to-plugin`: ONNX NonMaxSuppression and its gather tail become EfficientNMS_TRT.

    sel = NonMaxSuppression(boxes [B,N,4], scores [B,C,N], M, iou, score) -> tail -> outputs
      -> EfficientNMS_TRT(boxes, Transpose(scores) [B,N,C]; box_coding = center_point_box,
                          iou_threshold = iou+, score_threshold = score+, max_output_boxes = max,
                          background_class = -1, score_activation = 0)
      -> num_detections [B,1] int32, detection_boxes [B,max,4], detection_scores [B,max],
         detection_classes [B,max] int32                       (the new graph outputs)

For TensorRT < 8.5, whose parser imports ONNX NonMaxSuppression only through the
experimental EfficientNMS_ONNX_TRT plugin (thresholds must be initializers; padding rows
repeat the last valid one, so a Gather tail yields duplicates; ../shared/trt/nms_notes.md).
A Transpose(perm=[0,2,1]) in front of the NMS is reused instead of adding a second one.

Semantic differences, and how they are handled:

- thresholds: ONNX keeps `score > t` and suppresses `IoU > u`; EfficientNMS_TRT keeps
  `score >= t` and suppresses `IoU >= u`. The plugin gets `t+ = nextafter(float32(t), +inf)`
  (likewise u), so `x >= t+` holds exactly when `x > t` for float32 x (the ulp trick of
  docs/nms-plugins.md, the other way). No score threshold: the lowest float32.
- cap: ONNX's `max_output_boxes_per_class` is per class, EfficientNMS's `max_output_boxes`
  is per image (the option `max`, default 100). They agree only when no class keeps more
  than its cap and no image more than `max`; the check below refuses otherwise.
- the class-offset trick (torchvision's batched_nms, YOLOv7's ORT end2end export): boxes
  moved apart by `label * span`, one-class scores [B,1,N]. It is undone (_class_offset):
  the plain boxes, and [B,N,C] scores holding each box's score in its ArgMax label's
  column and the lowest float in the others. ONNX's cap is per image there, so `max`
  defaults to it (at most the box count and 5000), and the rewrite is exact.
- candidates: EfficientNMS considers only the 5000 best (box, class) pairs per image (2000
  on SM 5.3/6.2); its reference form here does not model that limit.
- the result: fixed-shape, zero-padded outputs instead of `selected_indices [M,3]`; the
  tail that gathered boxes/labels from the indices is dropped with the outputs it made.
- EfficientNMS_TRT is deprecated from TensorRT 10.12 (trt_plugins.json); the pass says so
  in a note when the target (`--trt`, else the newest documented) is at or past it.

Refused, with a reason (nothing changes): an NMS inside If/Loop/Scan (SSDlite's; use
split-nms), inputs traced through a score filter, TopK or Concat (EfficientNMS would see
other candidates), a class offset whose labels are not an ArgMax with a static class count,
non-constant thresholds or cap, a tail that does
more than gather (arithmetic, control flow), more than one NMS, names already taken, and
any model whose detections differ. The check: the graph outputs change
(`changes_outputs`), so on the run's check input (`PassContext.samples`: --data,
--input-value) and three seeded inputs the original's NMS result, read with
`compare.from_onnx_nms` at the NMS, must match the new outputs (`from_efficient`, the
plugin run as its reference form) under the detection comparator: every detection matched
at IoU >= 0.99 both ways, same classes, same counts per image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import fresh_name, names_in_use
from graphfix.graph.convert import runnable_model
from graphfix.nms._trace import CLASS_OFFSET
from graphfix.nms.compare import from_onnx_nms, verify_rewrite
from graphfix.nms.parts import tensor_info
from graphfix.nms.regions import BoxFormat, Kind, NmsRegion, Where, find_regions
from graphfix.passes._class_offset import (
    ClassOffset,
    find_offset,
    lowest,
    per_class_inputs,
    shape_of,
)
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult
from graphfix.plugins.nodes import add_to_graph, plugin_gs_node
from graphfix.runtime.session import run_model
from graphfix.trt import TrtTarget

OUTPUTS = ("num_detections", "detection_boxes", "detection_scores", "detection_classes")
COUNT = "replaced ONNX NonMaxSuppression and its tail by EfficientNMS_TRT"
# What a tail may do and still be "gathering the detections".
TAIL_OPS = ("Gather", "GatherND", "GatherElements", "Squeeze", "Unsqueeze", "Reshape",
            "Flatten", "Slice", "Cast", "Identity", "Concat", "Transpose", "Split", "Shape")
DEFAULT_MAX = 100  # detections per image when `max` is 0 and ONNX caps per class
CANDIDATES = 5000  # EfficientNMS_TRT's numSelectedBoxes (trt_plugins.json, internals)


@dataclass(frozen=True)
class NmsToPluginOptions:
    """`max`: EfficientNMS_TRT's max_output_boxes, detections per image. 0 (the default):
    100 for a per-class NMS (ONNX caps per class, the plugin per image); for the
    class-offset trick, ONNX's own cap, which is per image there (at most the box count
    and 5000)."""

    max: int = 0


@dataclass(frozen=True)
class Plan:
    """One region's rewrite, by tensor names (it applies to a copy of the graph too)."""

    label: str
    node_name: str
    nms_outputs: tuple[str, ...]
    boxes: str  # the NMS's boxes input [B,N,4]
    scores: str  # [B,N,C] ([B,N,1] with a class offset) if not transpose, else the NMS's input
    transpose: bool
    nms_scores: str  # the NMS's own scores input [B,C,N], for reading the original
    drop: tuple[str, ...]  # graph outputs the tail makes
    attrs: dict
    cap: int  # ONNX's max_output_boxes_per_class
    offset: ClassOffset | None = None  # the class-offset trick, undone (_class_offset)


def _caps(plan: Plan) -> str:
    k = plan.attrs["max_output_boxes"]
    if plan.offset is not None:
        return (f"class-offset NMS: ONNX capped {plan.cap} boxes per image, EfficientNMS_TRT "
                f"caps {k} per image over {plan.offset.classes} classes")
    return f"ONNX capped {plan.cap} boxes per class; EfficientNMS_TRT caps {k} per image"


class NmsToPlugin(Pass):
    """Replaces a main-graph ONNX NonMaxSuppression and its gather tail by EfficientNMS_TRT
    (module docstring); verifies the detections on the check's and seeded inputs or changes
    nothing."""

    name = "nms-to-plugin"
    summary = ("ONNX NonMaxSuppression + its gather tail -> EfficientNMS_TRT (for TensorRT "
               "< 8.5); outputs num_detections/detection_boxes/detection_scores/"
               "detection_classes; option max (per image; default 100, or ONNX's cap for a "
               "class-offset NMS); checks its detections.")
    Options = NmsToPluginOptions
    counts_rewrites = True
    changes_outputs = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        if self.options.max < 0:
            result.notes.append(Note("graph", f"option max must be >= 0 (got {self.options.max})"))
            return result
        before = runnable_model(graph)
        regions = [r for r in find_regions(before) if r.kind is Kind.ONNX]
        if not regions:
            result.notes.append(Note("graph", "no ONNX NonMaxSuppression"))
            return result
        if len(regions) > 1:
            result.notes.append(Note("graph", (
                f"{len(regions)} NonMaxSuppression nodes: nms-to-plugin converts a model "
                "with one (their outputs would share EfficientNMS_TRT's names)")))
            return result
        region = regions[0]
        plan = plan_region(graph, before, region, self.options.max)
        if isinstance(plan, str):
            result.notes.append(Note(region.label, plan))
            return result
        trial = graph.copy()
        rewrite(trial, plan, ctx.trt)
        ok, verdict = _verify(before, runnable_model(trial), plan, region, ctx)
        if not ok:
            result.notes.append(Note(region.label, f"not converted: {verdict} ({_caps(plan)})"))
            return result
        if not ctx.allow_rewrite(self.name, region.label):
            result.notes.append(Note(region.label, LIMIT_REACHED))
            return result
        rewrite(graph, plan, ctx.trt)
        result.changed = True
        result.counts[COUNT] += 1
        result.notes.append(Note(region.label, f"{_caps(plan)} (detections equal on the "
                                               "checked inputs)"))
        if warning := deprecation(ctx.trt):
            result.notes.append(Note(region.label, warning))
        result.verified = f"detections equal the original NMS's ({verdict})"
        return result


def deprecation(target) -> str:
    """A warning when EfficientNMS_TRT is not "available" at the target (None: the newest
    documented TensorRT), else ""."""
    from graphfix.trt import documented_versions, parse_target, plugin_for

    target = target or parse_target(documented_versions()[-1])
    spec = plugin_for("EfficientNMS_TRT")
    status = spec.status_at(target) if spec is not None else "unavailable"
    if status == "available":
        return ""
    since = spec.deprecated_since if spec is not None else "?"
    return (f"EfficientNMS_TRT is {status} in {target.label()} (deprecated since {since}; "
            "TensorRT >= 8.5 imports ONNX NonMaxSuppression natively: bound-nms)")


def plan_region(graph: gs.Graph, model: onnx.ModelProto, region: NmsRegion, k: int
                ) -> Plan | str:
    """The rewrite of `region` with `k` detections per image (0: the default of
    NmsToPluginOptions), or why it cannot be done; `model` is `graph` exported (for shape
    inference)."""
    if region.where is not Where.MAIN:
        return (f"the NMS sits in an If/Loop/Scan body ({region.where.value}): nms-to-plugin "
                "replaces only a main-graph NMS and its tail; use split-nms to run the "
                "post-processing outside TensorRT, or bound-nms for TensorRT >= 8.5")
    if region.reasons:
        return "its inputs cannot be traced: " + "; ".join(region.reasons)
    if other := [s for s in region.steps if s != CLASS_OFFSET]:
        return (f"its candidates pass through {', '.join(other)} before the NMS: "
                "EfficientNMS_TRT on the raw boxes would see other candidates")
    tensors = graph.tensors()
    nms = tensors[region.outputs[0]].inputs[0]
    offset, info = None, {}
    if CLASS_OFFSET in region.steps:
        info = tensor_info(model)
        offset = find_offset(nms, info)
        if isinstance(offset, str):
            return f"its boxes use the class-offset trick, not undone here: {offset}"
    limits = _limits(region, lowest(nms.inputs[1].dtype) if offset else None)
    if isinstance(limits, str):
        return limits
    drop, problem = _tail(graph, nms)
    if problem:
        return problem
    boxes, scores = nms.inputs[0], nms.inputs[1]
    if boxes.shape is not None and len(boxes.shape) != 3:
        return f"its boxes '{boxes.name}' are not [B,N,4] (shape {boxes.shape})"
    score_shape = shape_of(scores, info)
    if offset is not None and score_shape is not None and \
            (len(score_shape) != 3 or score_shape[1] != 1):
        return (f"its scores '{scores.name}' are not one class [B,1,N] (shape {score_shape}), "
                "as the class-offset trick gives")
    cap = int(region.threshold("max_output_boxes_per_class").value)
    k = k or (_offset_max(cap, shape_of(boxes, info)) if offset else DEFAULT_MAX)
    transpose = True
    producer = scores.inputs[0] if scores.inputs else None
    if producer is not None and producer.op == "Transpose" and \
            list(producer.attrs.get("perm", [])) == [0, 2, 1]:
        scores_in, transpose = producer.inputs[0].name, False
    else:
        scores_in = scores.name
    if taken := sorted(set(OUTPUTS) & set(tensors)):
        return f"the output names {taken} are taken in the graph"
    iou, score = limits
    attrs = dict(score_threshold=score, iou_threshold=iou, max_output_boxes=int(k),
                 background_class=-1, score_activation=0,
                 box_coding=int(region.box_format is BoxFormat.CENTER))
    return Plan(region.label, nms.name or "nms", region.outputs, boxes.name, scores_in,
                transpose, scores.name, tuple(drop), attrs, cap, offset)


def _offset_max(cap: int, shape: list | None) -> int:
    """ONNX's one-class cap as a per-image count: at most the boxes ([B,N,4] `shape`) and
    the candidates the plugin considers."""
    n = shape[1] if shape is not None and len(shape) == 3 else None
    bound = min(int(n), CANDIDATES) if isinstance(n, (int, np.integer)) and n > 0 else CANDIDATES
    return max(1, min(cap, bound))


def _limits(region: NmsRegion, floor: float | None) -> tuple[float, float] | str:
    """(iou, score) for the plugin (one float32 ulp up: `>=` means ONNX's `>`), or why not.
    `floor`: the value the class-offset rewrite puts in the other classes' columns; with no
    score threshold, the plugin's is one ulp above it instead of the lowest float32."""
    cap = region.threshold("max_output_boxes_per_class")
    if cap is None or not cap.given:
        return "no max_output_boxes_per_class: ONNX's default 0 selects nothing"
    out = []
    for t in (cap, region.threshold("iou_threshold"), region.threshold("score_threshold")):
        if t is not None and t.given and t.value is None:
            return (f"its {t.name} ('{t.source}') is not constant: EfficientNMS_TRT takes "
                    "it as an attribute (fold-constants may make it one)")
        out.append(t)
    _, iou, score = out
    iou_v = _up(iou.value) if iou is not None and iou.given else _up(0.0)
    if score is not None and score.given:
        score_v = _up(score.value)
    else:
        score_v = _up(floor) if floor is not None else float(np.finfo(np.float32).min)
    return iou_v, score_v


def _up(value: float) -> float:
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def _tail(graph: gs.Graph, nms: gs.Node) -> tuple[list[str], str]:
    """(graph outputs the NMS's result reaches, a reason the tail is not a gather tail)."""
    outputs = {t.name for t in graph.outputs}
    reached, seen, todo = [], set(), list(nms.outputs)
    while todo:
        tensor = todo.pop()
        if tensor.name in seen:
            continue
        seen.add(tensor.name)
        if tensor.name in outputs:
            reached.append(tensor.name)
        for reader in tensor.outputs:
            if reader.op not in TAIL_OPS or reader.domain not in (None, "", "ai.onnx"):
                return [], (f"its tail holds {reader.op} '{reader.name}': it does more than "
                            "gather the detections, and the new outputs would drop that")
            todo.extend(reader.outputs)
    if not reached:
        return [], "its result reaches no graph output"
    return sorted(reached), ""


def rewrite(graph: gs.Graph, plan: Plan, target: TrtTarget | None = None) -> None:
    """Add the EfficientNMS_TRT node (typed and validated by `plugins.nodes`, its
    plugin_version the target's), make its outputs the graph's, drop the tail's."""
    tensors = graph.tensors()
    boxes, scores = tensors[plan.boxes], tensors[plan.scores]
    if plan.transpose:
        bnc = gs.Variable(fresh_name(f"{plan.scores}_bnc", names_in_use(graph)), scores.dtype)
        graph.nodes.append(gs.Node("Transpose", f"{plan.scores}_bnc", {"perm": [0, 2, 1]},
                                   [scores], [bnc]))
        scores = bnc
    if plan.offset is not None:  # scores is the one class's [B,N,1]
        boxes, scores = per_class_inputs(graph, plan.offset, scores)
    batch = boxes.shape[0] if boxes.shape else "batch"
    k = plan.attrs["max_output_boxes"]
    kinds = ((np.int32, [batch, 1]), (boxes.dtype or np.float32, [batch, k, 4]),
             (scores.dtype or np.float32, [batch, k]), (np.int32, [batch, k]))
    outs = [gs.Variable(n, dtype, shape) for n, (dtype, shape) in zip(OUTPUTS, kinds, strict=True)]
    name = fresh_name(f"{plan.node_name}_efficient", {n.name for n in graph.nodes})
    add_to_graph(graph, plugin_gs_node("EfficientNMS_TRT", [boxes, scores], outs, plan.attrs,
                                       name=name, target=target))
    graph.outputs = [t for t in graph.outputs if t.name not in plan.drop] + outs
    graph.cleanup(remove_unused_graph_inputs=False)


def _verify(before: onnx.ModelProto, after: onnx.ModelProto, plan: Plan, region: NmsRegion,
            ctx: PassContext) -> tuple[bool, str]:
    """Whether the new outputs' detections equal the original NMS's on every checked input,
    and the comparison (or why it could not run)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(before)
    offset = plan.offset
    wanted = (plan.nms_outputs[0], plan.boxes, plan.nms_scores)
    if offset is not None:  # the boxes without offsets, and each box's class
        wanted = (plan.nms_outputs[0], offset.boxes, plan.nms_scores, offset.labels)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in wanted
                              if n not in have)
    center = int(region.box_format is BoxFormat.CENTER)

    def expected(feeds):
        ref = run_model(probe, feeds)
        selected, boxes, scores = (ref[n] for n in wanted[:3])
        labels = None
        if offset is not None:  # (image, box) order, as the rewrite assumes
            batch, count = scores.shape[0], scores.shape[-1]
            boxes = boxes.reshape(batch, count, 4)
            labels = ref[offset.labels].reshape(batch, count)
        return from_onnx_nms(selected, boxes, scores, center, labels)

    try:
        report = verify_rewrite(before, after, OUTPUTS, expected, ctx.input_shapes, ctx.samples)
    except Exception as err:  # onnxruntime raises many types; all mean "cannot check"
        return False, f"the models cannot be run to check the NMS ({type(err).__name__}: {err})"
    if report.count_a == 0:
        return False, ("no detections on the checked inputs, so the check proves nothing; "
                       "give inputs with --data")
    return report.ok, report.describe()
