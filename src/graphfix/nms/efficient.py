"""Standard-ONNX decompositions of TensorRT's NMS plugins (reference forms and `plugin-to-nms`).

One graph serves every form. Candidates are (box, class) pairs; `f = c*N + n` numbers them
per image:

    s  = sigmoid?(scores) with the background class at -inf           [B,N,C]
    b  = corners(boxes) broadcast to one box per class                 [B,N,C,4]
    per-class:  NonMaxSuppression over groups (image, class)          boxes [B*C,N,4]
    agnostic:   NonMaxSuppression over groups (image)                  boxes [B,C*N,4]
    kept = ScatterND(-inf, selected, GatherND(s, selected))            [B, C*N]
    v, f = TopK(Concat(kept, -inf[B,K]), K)     valid = v > -inf
    num = sum(valid); boxes = b[f]; scores = v; classes = f // N       (0 past num)

EfficientNMS_TRT keeps `score >= t` and suppresses `IoU >= u`; ONNX keeps `score > t` and
suppresses `IoU > u`. For float32 values `x >= t` is `x > nextafter(t, -inf)`, so the
decomposition passes ONNX the thresholds one float32 ulp lower (`onnx_threshold`), which is
exact for the same float32 score and IoU. BatchedNMS(Dynamic)_TRT already uses `>` for both
(sortScoresPerClass.cu, allClassNMS.cu) and keeps its thresholds. What is not reproduced:
the plugins' candidate limits (EfficientNMS: 5000 best pairs per image; INMSLayer likewise),
the order of equal scores, and last-bit IoU differences (docs/nms-plugins.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from graphfix.nms.onnxops import MIN_OPSET, Emitter
from graphfix.runtime.references import (
    PLUGIN_DOMAIN,
    Decompose,
    Decomposition,
    Registration,
    Unavailable,
    attributes,
)

FLOAT = onnx.TensorProto.FLOAT
INT32 = onnx.TensorProto.INT32


@dataclass(frozen=True)
class NmsSpec:
    """What the decomposition computes, with ONNX's strict thresholds (already nudged for
    a plugin that uses `>=`). `max_output` is per image; `pre_nms_top_k` (BatchedNMS's
    topK) keeps only the best k candidates of each class before NMS; `pad_class` fills
    the classes past the count (BatchedNMS writes -1)."""

    max_output: int
    score_threshold: float
    iou_threshold: float
    background: int = -1
    sigmoid: bool = False
    class_agnostic: bool = False
    center_size: bool = False
    pre_nms_top_k: int = 0
    pad_class: int = 0


@dataclass(frozen=True)
class NmsTensors:
    """Names of the four float32/int64 results of `emit_nms`."""

    num: str  # [B,1] int32
    boxes: str  # [B,K,4] float32 corners
    scores: str  # [B,K] float32
    classes: str  # [B,K] int64


def onnx_threshold(value: float) -> float:
    """The threshold that makes ONNX's `x > t'` mean `x >= value` for float32 x."""
    with np.errstate(over="ignore"):  # below the lowest float32 is -inf, as meant
        return float(np.nextafter(np.float32(value), np.float32(-np.inf)))


def emit_nms(em: Emitter, boxes: str, scores: str, spec: NmsSpec) -> NmsTensors:
    """The decomposition of the module docstring; boxes [B,N,4] or [B,N,C|1,4], scores
    [B,N,C], any float type."""
    if not 0.0 <= spec.iou_threshold:
        raise Unavailable(f"the IoU threshold {spec.iou_threshold} is below 0")
    shape = em.op("Shape", [scores])
    count = em.dim(shape, 1)
    s = em.op("Cast", [scores], to=FLOAT)
    if spec.sigmoid:
        s = em.op("Sigmoid", [s])
    neg_inf = em.const(-np.inf, np.float32, "ninf")
    if spec.background >= 0:
        classes = em.op("Range", [em.const(0), em.op("Gather", [shape, em.const(2)], axis=0),
                                  em.const(1)])
        is_bg = em.op("Equal", [classes, em.const(spec.background)])
        s = em.op("Where", [is_bg, neg_inf, s])
    b = em.op("Reshape", [em.op("Cast", [boxes], to=FLOAT), em.const([0, 0, -1, 4])])
    if spec.center_size:
        b = corners(em, b)
    b = em.op("Expand", [b, em.op("Concat", [shape, em.const([4])], axis=0)])
    b = em.op("Transpose", [b], perm=[0, 2, 1, 3])  # [B,C,N,4]
    s = em.op("Transpose", [s], perm=[0, 2, 1])  # [B,C,N]
    if spec.class_agnostic:
        gb = em.op("Reshape", [b, em.const([0, -1, 4])])
        gs_ = em.op("Reshape", [s, em.const([0, 1, -1])])
    else:
        gb = em.op("Reshape", [b, em.op("Concat", [em.const([-1]), count, em.const([4])],
                                        axis=0)])
        gs_ = em.op("Reshape", [s, em.op("Concat", [em.const([-1, 1]), count], axis=0)])
    fill = em.op("Expand", [neg_inf, em.op("Shape", [gs_])])
    if spec.pre_nms_top_k > 0:
        k = em.op("Min", [em.const([spec.pre_nms_top_k]), em.dim(em.op("Shape", [gs_]), 2)])
        top, idx = em.ops("TopK", [gs_, k], 2, axis=2, largest=1, sorted=1)
        gs_ = em.op("ScatterElements", [fill, idx, top], axis=2)
    selected = em.op("NonMaxSuppression", [
        gb, gs_, em.const([spec.max_output]),
        em.const([min(spec.iou_threshold, 1.0)], np.float32),
        em.const([spec.score_threshold], np.float32)], center_point_box=0)
    kept = em.op("ScatterND", [fill, selected, em.op("GatherND", [gs_, selected])])
    return _top(em, kept, b, (em.dim(shape, 0), count), spec, neg_inf)


def _top(em: Emitter, kept: str, b: str, dims: tuple[str, str], spec: NmsSpec,
         neg_inf: str) -> NmsTensors:
    """The K best kept pairs per image, padded: kept [G,1,L] scores (-inf: not kept), boxes
    b [B,C,N,4], dims = (B, N) as [1] tensors."""
    batch, count = dims
    flat = em.op("Reshape", [kept, em.op("Concat", [batch, em.const([-1])], axis=0)])
    k_shape = em.op("Concat", [batch, em.const([spec.max_output])], axis=0)
    padded = em.op("Concat", [flat, em.op("Expand", [neg_inf, k_shape])], axis=1)
    values, index = em.ops("TopK", [padded, em.const([spec.max_output])], 2,
                           axis=1, largest=1, sorted=1)
    valid = em.op("Greater", [values, neg_inf])
    index = em.op("Where", [valid, index, em.const(0)])
    flat_boxes = em.op("Reshape", [b, em.const([0, -1, 4])])
    gather_at = em.op("Expand", [em.unsqueeze(index, [2]),
                                 em.op("Concat", [k_shape, em.const([4])], axis=0)])
    out_boxes = em.op("GatherElements", [flat_boxes, gather_at], axis=1)
    zero = em.const(0.0, np.float32, "zero")
    out_boxes = em.op("Where", [em.unsqueeze(valid, [2]), out_boxes, zero])
    out_scores = em.op("Where", [valid, values, zero])
    out_classes = em.op("Where", [valid, em.op("Div", [index, count]),
                                  em.const(spec.pad_class)])
    num = em.reduce_sum(em.op("Cast", [valid], to=INT32), [1], keepdims=1)
    return NmsTensors(num, out_boxes, out_scores, out_classes)


def corners(em: Emitter, b: str, last: int = 3) -> str:
    """[cx, cy, w, h] -> [cx - w/2, cy - h/2, cx + w/2, cy + h/2] on axis `last` (the last)."""
    axis = em.const([last])
    centre = em.op("Slice", [b, em.const([0]), em.const([2]), axis])
    half = em.op("Mul", [em.op("Slice", [b, em.const([2]), em.const([4]), axis]),
                         em.const(0.5, np.float32, "half")])
    return em.op("Concat", [em.op("Sub", [centre, half]), em.op("Add", [centre, half])], axis=last)


# ----------------------------------------------------------------------------- plugins


def scalar(value: Any) -> Any:
    """An attribute as a scalar: the yolov6/yolov7 exports write `box_coding = (1,)` as
    INTS [1]; a one-element list reads as its element."""
    if isinstance(value, (list, tuple, np.ndarray)) and np.size(value) == 1:
        return np.asarray(value).ravel()[0].item()
    return value


def plugin_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {k: scalar(v) for k, v in attributes(node).items()}


def need_attributes(attrs: dict[str, Any], names: Sequence[str], plugin: str) -> None:
    if missing := [n for n in names if n not in attrs]:
        raise Unavailable(f"{plugin} needs the attributes {', '.join(missing)}")


EFFICIENT_REQUIRED = ("score_threshold", "iou_threshold", "max_output_boxes",
                      "background_class", "score_activation", "box_coding")


def efficient_spec(attrs: dict[str, Any], n_inputs: int) -> NmsSpec:
    """NmsSpec of an EfficientNMS_TRT node's (scalar) attributes; Unavailable says why not."""
    need_attributes(attrs, EFFICIENT_REQUIRED, "EfficientNMS_TRT")
    if n_inputs > 2:
        raise Unavailable("the fused box decoder (third input, anchors) is not reproduced")
    coding, k = int(attrs["box_coding"]), int(attrs["max_output_boxes"])
    if coding not in (0, 1) or k <= 0:
        raise Unavailable(f"box_coding {coding} / max_output_boxes {k} are out of range")
    iou = float(attrs["iou_threshold"])
    if iou <= 0:
        raise Unavailable(f"iou_threshold {iou} must be > 0 (the plugin requires it)")
    return NmsSpec(max_output=k, score_threshold=onnx_threshold(attrs["score_threshold"]),
                   iou_threshold=onnx_threshold(iou) if iou <= 1 else 1.0,
                   background=int(attrs["background_class"]),
                   sigmoid=bool(attrs["score_activation"]),
                   class_agnostic=bool(attrs.get("class_agnostic", 0)),
                   center_size=coding == 1)


def efficient_nms(node: onnx.NodeProto, opset: int) -> Decomposition:
    """EfficientNMS_TRT(boxes, scores) -> num_detections [B,1] int32, detection_boxes,
    detection_scores (the input's float type), detection_classes [B,K] int32."""
    check_opset(opset, node)
    inputs = [i for i in node.input if i]
    spec = efficient_spec(plugin_attrs(node), len(inputs))
    if len(node.output) != 4:
        raise Unavailable(f"EfficientNMS_TRT has 4 outputs, this node {len(node.output)}")
    em = emitter_for(node, opset)
    t = emit_nms(em, inputs[0], inputs[1], spec)
    _finish(em, node, t, inputs, num_keepdims=True, class_type=INT32)
    return em.decomposition()


BATCHED_REQUIRED = ("shareLocation", "backgroundLabelId", "numClasses", "topK", "keepTopK",
                    "scoreThreshold", "iouThreshold", "isNormalized")


def batched_spec(attrs: dict[str, Any]) -> NmsSpec:
    """NmsSpec of a BatchedNMS(Dynamic)_TRT node; Unavailable for what is not reproduced."""
    need_attributes(attrs, BATCHED_REQUIRED, "BatchedNMS_TRT")
    normalized = bool(attrs["isNormalized"])
    if not normalized and bool(attrs.get("caffeSemantics", 1)):
        raise Unavailable("isNormalized=0 with caffeSemantics=1 computes IoU with +1 on "
                          "width and height, which ONNX NonMaxSuppression cannot")
    if normalized and bool(attrs.get("clipBoxes", 1)):
        raise Unavailable("clipBoxes=1 (with isNormalized=1) is not reproduced")
    top_k, keep = int(attrs["topK"]), int(attrs["keepTopK"])
    if not 0 < keep <= top_k:
        raise Unavailable(f"keepTopK {keep} must be in 1..topK ({top_k}); the plugin "
                          "writes nothing otherwise")
    iou = float(attrs["iouThreshold"])
    return NmsSpec(max_output=keep, score_threshold=float(np.float32(attrs["scoreThreshold"])),
                   iou_threshold=min(max(iou, 0.0), 1.0),
                   background=int(attrs["backgroundLabelId"]), pre_nms_top_k=top_k,
                   pad_class=-1)


def batched_nms(node: onnx.NodeProto, opset: int) -> Decomposition:
    """BatchedNMS(Dynamic)_TRT(boxes [B,N,1|C,4], scores [B,N,C]) -> num_detections
    ([B] for BatchedNMS_TRT, [B,1] for the Dynamic one) int32, nmsed_boxes, nmsed_scores,
    nmsed_classes (float, -1 past the count)."""
    check_opset(opset, node)
    inputs = [i for i in node.input if i]
    spec = batched_spec(plugin_attrs(node))
    if len(inputs) != 2 or len(node.output) != 4:
        raise Unavailable("BatchedNMS_TRT takes 2 inputs and has 4 outputs")
    em = emitter_for(node, opset)
    t = emit_nms(em, inputs[0], inputs[1], spec)
    dynamic = node.op_type == "BatchedNMSDynamic_TRT"
    _finish(em, node, t, inputs, num_keepdims=dynamic, class_type=FLOAT)
    return em.decomposition()


def _finish(em: Emitter, node: onnx.NodeProto, t: NmsTensors, inputs: list[str],
            num_keepdims: bool, class_type: int) -> None:
    """Write the node's four outputs from the float32/int64 results."""
    num, boxes, scores, classes = node.output
    if num:
        if num_keepdims:
            em.op("Identity", [t.num], num)
        else:
            em.op("Reshape", [t.num, em.const([-1])], num)
    if boxes:
        em.cast_like(t.boxes, inputs[0], boxes)
    if scores:
        em.cast_like(t.scores, inputs[1], scores)
    if classes:
        if class_type == FLOAT:
            em.cast_like(em.op("Cast", [t.classes], to=FLOAT), inputs[1], classes)
        else:
            em.op("Cast", [t.classes], classes, to=class_type)


def emitter_for(node: onnx.NodeProto, opset: int) -> Emitter:
    prefix = next((o for o in node.output if o), node.name or "nms")
    return Emitter(prefix, opset, node.name or prefix)


def check_opset(opset: int, node: onnx.NodeProto) -> None:
    if opset < MIN_OPSET:
        raise Unavailable(f"the decomposition of {node.op_type} needs ONNX opset "
                          f">= {MIN_OPSET} (the model has {opset})")


NMS_PLUGINS = ("EfficientNMS_TRT", "BatchedNMS_TRT", "BatchedNMSDynamic_TRT")

REFERENCES: tuple[Registration, ...] = (
    Registration(PLUGIN_DOMAIN, "EfficientNMS_TRT", Decompose(efficient_nms), ("1",)),
    Registration(PLUGIN_DOMAIN, "BatchedNMS_TRT", Decompose(batched_nms), ("1",)),
    Registration(PLUGIN_DOMAIN, "BatchedNMSDynamic_TRT", Decompose(batched_nms), ("1",)),
)
