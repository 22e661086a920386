"""`add-nms`: append NMS to a raw detector head, giving the YOLO "end2end" outputs.

    head [B,4+C,N] (YOLOv8) or [B,N,5+C] (YOLOv5)
      -> boxes = corners(cx,cy,w,h)  [B,N,4],  scores = cls (* obj)  [B,N,C]
      -> EfficientNMS_TRT(boxes, scores)                  where the target TensorRT has it
         NonMaxSuppression + TopK(max) + zero padding     otherwise (graphfix.nms.efficient)
      -> num_dets [B,1] int32, boxes [B,max,4], scores [B,max], labels [B,max] int32

Both forms keep `score >= score` and suppress `IoU >= iou` (EfficientNMS's semantics; the
ONNX form passes thresholds one float32 ulp lower). The form follows the target (`--trt`,
ctx.trt; none: the newest documented TensorRT): EfficientNMS_TRT while
`plugin_for("EfficientNMS_TRT").status_at(target)` is "available" (trt_plugins.json: it is
deprecated since 10.12), else ONNX NonMaxSuppression, which TensorRT >= 8.5 imports natively
(INMSLayer). `form=efficient|onnx` overrides it.

The graph outputs change (the raw head is replaced), so the manager's output comparison
cannot judge the pass (`changes_outputs`); it checks itself: on the run's check input
(`PassContext.samples`: --data, --input-value) and three seeded inputs the new
model's detections (plugin nodes run as their reference forms) must match a plain numpy NMS
of the raw head (`graphfix.nms.reference`) — every box matched at IoU >= 0.99 both ways,
same classes, same count — or the pass changes nothing and says why. Pose, segmentation
and oriented-box heads are refused (`graphfix.nms.heads`: their keypoints, mask
coefficients or angle would be scored as classes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.graph.convert import runnable_model
from graphfix.nms.compare import verify_rewrite
from graphfix.nms.efficient import NmsSpec, corners, emit_nms, onnx_threshold
from graphfix.nms.heads import STYLES, RawHead, find_head
from graphfix.nms.onnxops import MIN_OPSET, Emitter, clashes, insert
from graphfix.nms.reference import corners as np_corners
from graphfix.nms.reference import nms_batch
from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.plugins.nodes import plugin_node
from graphfix.runtime.session import run_model
from graphfix.trt import TrtTarget

OUTPUTS = ("num_dets", "boxes", "scores", "labels")
FORMS = ("auto", "efficient", "onnx")


@dataclass(frozen=True)
class AddNmsOptions:
    """max: detections per image; iou / score: thresholds (>=); head: auto|yolov8|yolov5;
    form: auto (from the TensorRT target) | efficient | onnx."""

    max: int = 100
    iou: float = 0.45
    score: float = 0.25
    head: str = "auto"
    form: str = "auto"


class AddNms(Pass):
    """Appends decode + NMS to a YOLOv8/YOLOv5-style raw head; checks itself against numpy."""

    name = "add-nms"
    summary = ("Append box decoding + NMS (EfficientNMS_TRT or ONNX NonMaxSuppression, by "
               "--trt) to a raw YOLOv8/YOLOv5 head; outputs num_dets/boxes/scores/labels.")
    Options = AddNmsOptions
    changes_outputs = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opts = self.options
        problem = _check_options(opts, graph)
        head = find_head(graph, opts.head) if not problem else problem
        if isinstance(head, str):
            result.notes.append(Note("graph", head))
            return result
        form, why = choose_form(ctx.trt, opts.form)
        trial = graph.copy()
        before = runnable_model(trial)
        dec = _appendix(head, opts, form, trial.opset, ctx.trt)
        if taken := clashes(trial, dec, set()):
            result.notes.append(Note(head.output, f"names {taken[:4]} are taken in the graph"))
            return result
        _append(trial, head, dec, opts.max)
        ok, verdict = _verify(before, runnable_model(trial), head, opts, ctx)
        if not ok:
            result.notes.append(Note(head.output, f"not added: {verdict}"))
            return result
        _append(graph, head, _appendix(head, opts, form, graph.opset, ctx.trt), opts.max)
        result.changed = True
        result.counts[f"added NMS ({form} form) to a {head.style} head"] += 1
        result.notes.append(Note(head.output, f"{head.describe()}; {why}"))
        result.verified = f"detections equal a numpy NMS of the raw head ({verdict})"
        return result


def _check_options(opts: AddNmsOptions, graph: gs.Graph) -> str:
    if opts.max < 1 or not 0 < opts.iou <= 1 or opts.head not in STYLES or \
            opts.form not in FORMS:
        return (f"options out of range: max >= 1, 0 < iou <= 1, head in {STYLES}, form in "
                f"{FORMS} (got {opts})")
    if (graph.opset or 0) < MIN_OPSET:
        return f"needs ONNX opset >= {MIN_OPSET} (the model has {graph.opset})"
    return ""


def choose_form(target, asked: str = "auto") -> tuple[str, str]:
    """("efficient" | "onnx", why) for a graphfix.trt.TrtTarget (None: newest documented)."""
    from graphfix.trt import documented_versions, parse_target, plugin_for

    if asked != "auto":
        return asked, f"form={asked} as asked"
    target = target or parse_target(documented_versions()[-1])
    spec = plugin_for("EfficientNMS_TRT")
    status = spec.status_at(target) if spec is not None else "unavailable"
    if status == "available":
        return "efficient", f"EfficientNMS_TRT is available in {target.label()}"
    return "onnx", (f"EfficientNMS_TRT is {status} in {target.label()} (trt_plugins.json: "
                    f"deprecated since {spec.deprecated_since if spec else '?'}), so ONNX "
                    "NonMaxSuppression (TensorRT's INMSLayer)")


def _appendix(head: RawHead, opts: AddNmsOptions, form: str, opset: int,
              target: TrtTarget | None):
    """The nodes from the raw head to the four outputs (a Decomposition)."""
    em = Emitter(f"{head.output}_nms", opset, f"{head.output}/add_nms")
    x = head.output
    if head.channel_major:
        x = em.op("Transpose", [x], perm=[0, 2, 1])
    axis, big = em.const([2]), em.const([np.iinfo(np.int64).max])
    boxes = corners(em, em.op("Slice", [x, em.const([0]), em.const([4]), axis]), last=2)
    first = 5 if head.objectness else 4
    scores = em.op("Slice", [x, em.const([first]), big, axis])
    if head.objectness:
        scores = em.op("Mul", [scores, em.op("Slice", [x, em.const([4]), em.const([5]), axis])])
    if form == "efficient":  # typed and validated by plugins.nodes, the target's version
        em.nodes.append(plugin_node(
            "EfficientNMS_TRT", [boxes, scores], list(OUTPUTS),
            {"score_threshold": opts.score, "iou_threshold": opts.iou,
             "max_output_boxes": opts.max, "background_class": -1, "score_activation": 0,
             "box_coding": 0}, name=f"{em.node_name}/EfficientNMS_TRT_{len(em.nodes)}",
            target=target))
        return em.decomposition()
    spec = NmsSpec(max_output=opts.max, score_threshold=onnx_threshold(opts.score),
                   iou_threshold=onnx_threshold(opts.iou))
    t = emit_nms(em, boxes, scores, spec)
    em.op("Identity", [t.num], OUTPUTS[0])
    em.op("Identity", [t.boxes], OUTPUTS[1])
    em.op("Identity", [t.scores], OUTPUTS[2])
    em.op("Cast", [t.classes], OUTPUTS[3], to=onnx.TensorProto.INT32)
    return em.decomposition()


def _append(graph: gs.Graph, head: RawHead, dec, k: int) -> None:
    raw = graph.tensors()[head.output]
    insert(graph, dec)
    tensors = graph.tensors()
    batch = raw.shape[0]
    kinds = ((np.int32, [batch, 1]), (np.float32, [batch, k, 4]), (np.float32, [batch, k]),
             (np.int32, [batch, k]))
    new = []
    for name, (dtype, shape) in zip(OUTPUTS, kinds, strict=True):
        t = tensors[name]
        t.dtype, t.shape = dtype, shape
        new.append(t)
    graph.outputs = [t for t in graph.outputs if t is not raw] + new


def _verify(before: onnx.ModelProto, after: onnx.ModelProto, head: RawHead,
            opts: AddNmsOptions, ctx: PassContext) -> tuple[bool, str]:
    """Whether the new model's detections equal numpy NMS of the raw head on every checked
    input, and the comparison (or why the model could not run)."""
    def expected(feeds):
        raw = np.asarray(run_model(before, feeds)[head.output], np.float32)
        x = raw.transpose(0, 2, 1) if head.channel_major else raw
        scores = x[..., 5:] * x[..., 4:5] if head.objectness else x[..., 4:]
        return nms_batch(np_corners(x[..., :4]), scores, opts.max, opts.score, opts.iou)

    try:
        report = verify_rewrite(before, after, OUTPUTS, expected, ctx.input_shapes, ctx.samples)
    except Exception as err:  # onnxruntime raises many types; all mean "cannot check"
        return False, f"the model cannot be run to check the NMS ({type(err).__name__}: {err})"
    return report.ok, report.describe()
