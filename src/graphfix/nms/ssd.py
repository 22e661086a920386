"""Standard-ONNX decomposition of TensorRT's SSD DetectionOutput plugin (NMS_TRT,
NMSDynamic_TRT): prior decoding, then BatchedNMS with the plugin's output layout.

    loc, conf, prior = inputs[inputOrder[0]], inputs[inputOrder[1]], inputs[inputOrder[2]]
    p, v   = prior[:, 0], prior[:, 1]              [B|1, N, 4]  priors (x1,y1,x2,y2), variances
    boxes  = decode_codeType(loc, p, v)            [B, N, L, 4] (L = 1 if shareLocation else C)
    s      = sigmoid?(conf)                        [B, N, C]    as exp(x) / (1 + exp(x))
    s      = s if s > confidenceThreshold else -inf; the background class -inf
    n, b, s, c = emit_nms(boxes, s, topK per class before NMS, IoU > nmsThreshold, keepTopK)
    detections = [image, c (-1 past n), s (0 past n), saturate(b) (0 past n)]  [B,1,keepTopK,7]
    keep_count = n, as the plugin writes it (below)                             [B,1,1,1]

Semantics read in NVIDIA/TensorRT v10.16 (52399f55; identical in v8.6.1 a25ca8bb; the plugin
was removed in 11.0), paths under plugin/:

- nmsPlugin/nmsPlugin.cpp: NMS_TRT passes `isBatchAgnostic` (attribute, default 1: every image
  uses image 0's priors), NMSDynamic_TRT always passes false (image b uses prior_data[b]).
  createPlugin resets only codeType (TF_CENTER = 3) and inputOrder ([0, 2, 1]); every other
  field keeps whatever the creator held, so those attributes are required here.
  The CodeTypeSSD values are CORNER=0, CENTER_SIZE=1, CORNER_SIZE=2, TF_CENTER=3
  (include/NvInferPluginUtils.h). keep_count's type is kFLOAT ("same sizeof"), but it holds
  int32 counts: the float32 whose bits are the count, n * 2**-149 (exact for n < 2**24).
- common/kernels/decodeBBoxes.cu (clipBBox=false in detectionForward.cu: no clipping before NMS),
  loc [B, N, L, 4], priors in corners, w = x2 - x1, centre = (x1 + x2) / 2:
  CORNER       p + loc            (varianceEncodedInTarget)  else p + loc * v
  CORNER_SIZE  p + loc * [w,h,w,h]                            else p + (loc * v) * [w,h,w,h]
  CENTER_SIZE  t = loc (tx, ty, tw, th); t = v * t unless varianceEncodedInTarget;
               c = t[:2] * [w,h] + centre, size = exp(t[2:]) * [w,h]; c -/+ size / 2
  TF_CENTER    as CENTER_SIZE with loc = (ty, tx, th, tw) and variances always applied
               (v0 scales tx, v1 ty, v2 tw, v3 th); varianceEncodedInTarget is ignored.
- common/kernels/permuteData.cu: conf [B, N, C] -> [B, C, N]; confSigmoid as exp(x)/(1+exp(x))
  (NaN for x > ~88.7, which the threshold then drops; reproduced, unlike a Sigmoid op).
- common/kernels/sortScoresPerClass.cu: a score is kept when `score > confidenceThreshold`
  (strict, as ONNX); the background class and dropped scores become 0 with index -1; a stable
  descending radix sort per (image, class): equal scores keep the lower prior first.
- common/kernels/allClassNMS.cu: the first min(topK, N) sorted entries of each class enter a
  greedy NMS that suppresses `IoU > nmsThreshold` (strict, as ONNX); detectionForward.cu passes
  caffeSemantics=true, so with isNormalized=0 the IoU adds 1 to widths and heights (refused);
  normalized IoU = inter / (a1 + a2 - inter), 0 without overlap, as onnxruntime computes it.
  The kernel table holds topK <= 4096.
- common/kernels/sortScoresPerImage.cu + gatherTopDetections.cu: the [C, topK] kept scores of
  an image sorted stably (class-major on ties) and the first keepTopK written as (image id,
  label = class index, score, __saturatef(x1, y1, x2, y2)): boxes clamped to [0, 1], NaN to 0,
  whatever isNormalized. Padding rows are (image id, -1, 0, 0, 0, 0, 0); keep_count counts the
  real rows. With keepTopK > topK the kernel writes nothing (refused).

`emit_nms` (efficient.py) reproduces the topK cut and the per-image order exactly: TopK breaks
ties by the lower index, as the stable radix sorts do. Not reproduced: the order in which
onnxruntime's NonMaxSuppression visits equal scores of one class (a priority queue), which
decides between two overlapping boxes of equal score; last-bit differences of exp and of
nvcc's fused multiply-adds in the decoding and IoU; the fp16 plugin (it decodes in half and,
with 0 < scoreBits <= 10, sorts on a truncated mantissa shifted by 1): this form computes in
float32 and casts the detections back. A confidenceThreshold below 0 (dropped scores, set to 0,
would sort above kept negative ones) and a negative nmsThreshold are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from graphfix.nms.efficient import (
    NmsSpec,
    NmsTensors,
    check_opset,
    emit_nms,
    emitter_for,
    need_attributes,
    plugin_attrs,
)
from graphfix.nms.onnxops import Emitter
from graphfix.runtime.references import (
    PLUGIN_DOMAIN,
    Decompose,
    Decomposition,
    Registration,
    Unavailable,
)

FLOAT = onnx.TensorProto.FLOAT

SSD_PLUGINS = ("NMS_TRT", "NMSDynamic_TRT")
CORNER, CENTER_SIZE, CORNER_SIZE, TF_CENTER = 0, 1, 2, 3  # CodeTypeSSD
CODE_NAMES = {CORNER: "CORNER", CENTER_SIZE: "CENTER_SIZE", CORNER_SIZE: "CORNER_SIZE",
              TF_CENTER: "TF_CENTER"}
DEFAULT_CODE_TYPE = TF_CENTER  # what createPlugin sets before reading the attributes
DEFAULT_INPUT_ORDER = (0, 2, 1)
MAX_TOP_K = 4096  # allClassNMS launches one of 8 kernels of 512 threads per class
SSD_REQUIRED = ("shareLocation", "backgroundLabelId", "numClasses", "topK", "keepTopK",
                "confidenceThreshold", "nmsThreshold", "confSigmoid", "isNormalized")
COUNT_BITS = float(np.float32(2.0 ** -149))  # the float32 whose bits are the int32 1


@dataclass(frozen=True)
class SsdSpec:
    """What the decomposition computes: the decoding, the scores, and the NMS (`nms`)."""

    nms: NmsSpec
    code_type: int
    variance_in_target: bool
    share_location: bool
    num_classes: int
    input_order: tuple[int, int, int]
    sigmoid: bool
    batch_agnostic: bool
    confidence: float


def ssd_spec(attrs: dict[str, Any], op_type: str) -> SsdSpec:
    """SsdSpec of an NMS(Dynamic)_TRT node's attributes; Unavailable says what is not
    reproduced."""
    code = int(attrs.get("codeType", DEFAULT_CODE_TYPE))
    if code not in CODE_NAMES:
        raise Unavailable(f"codeType {code} is not a CodeTypeSSD (CORNER=0, CENTER_SIZE=1, "
                          "CORNER_SIZE=2, TF_CENTER=3)")
    needed = SSD_REQUIRED + (("varianceEncodedInTarget",) if code != TF_CENTER else ())
    need_attributes(attrs, needed, op_type)
    if not bool(attrs["isNormalized"]):
        raise Unavailable("isNormalized=0: the plugin's IoU adds 1 to widths and heights "
                          "(caffe semantics), which ONNX NonMaxSuppression cannot")
    top_k, keep = int(attrs["topK"]), int(attrs["keepTopK"])
    if not 0 < top_k <= MAX_TOP_K:
        raise Unavailable(f"topK {top_k} must be in 1..{MAX_TOP_K} (the plugin's NMS kernels)")
    if not 0 < keep <= top_k:
        raise Unavailable(f"keepTopK {keep} must be in 1..topK ({top_k}); the plugin "
                          "writes no detections otherwise")
    confidence = float(np.float32(attrs["confidenceThreshold"]))
    if confidence < 0:
        raise Unavailable(f"confidenceThreshold {confidence} is below 0: the plugin sorts "
                          "dropped scores (set to 0) above kept negative ones")
    classes = int(attrs["numClasses"])
    if classes < 1:
        raise Unavailable(f"numClasses {classes} must be at least 1")
    return SsdSpec(
        nms=NmsSpec(max_output=keep, score_threshold=confidence,
                    iou_threshold=min(float(np.float32(attrs["nmsThreshold"])), 1.0),
                    background=int(attrs["backgroundLabelId"]), pre_nms_top_k=top_k,
                    pad_class=-1),
        code_type=code, variance_in_target=bool(attrs.get("varianceEncodedInTarget", 0)),
        share_location=bool(attrs["shareLocation"]), num_classes=classes,
        input_order=_input_order(attrs), sigmoid=bool(attrs["confSigmoid"]),
        batch_agnostic=op_type == "NMS_TRT" and bool(attrs.get("isBatchAgnostic", 1)),
        confidence=confidence)


def _input_order(attrs: dict[str, Any]) -> tuple[int, int, int]:
    order = np.asarray(attrs.get("inputOrder", DEFAULT_INPUT_ORDER)).ravel().tolist()
    if sorted(order) != [0, 1, 2]:
        raise Unavailable(f"inputOrder {order} is not a permutation of [0, 1, 2]")
    return order[0], order[1], order[2]


def detection_output(node: onnx.NodeProto, opset: int) -> Decomposition:
    """NMS(Dynamic)_TRT(loc_data, conf_data, prior_data in inputOrder) -> detections
    [B,1,keepTopK,7] (the conf input's float type), keep_count [B,1,1,1] float32."""
    check_opset(opset, node)
    spec = ssd_spec(plugin_attrs(node), node.op_type)
    if len(node.input) != 3 or not all(node.input) or len(node.output) != 2:
        raise Unavailable(f"{node.op_type} takes 3 inputs and has 2 outputs, this node "
                          f"{len(node.input)} and {len(node.output)}")
    loc, conf, prior = (node.input[i] for i in spec.input_order)
    em = emitter_for(node, opset)
    boxes = decode(em, loc, prior, spec)
    t = emit_nms(em, boxes, _scores(em, conf, spec), spec.nms)
    _write(em, node, t, conf)
    return em.decomposition()


# ----------------------------------------------------------------------------- decoding


def decode(em: Emitter, loc: str, prior: str, spec: SsdSpec) -> str:
    """Corner boxes [B, N, L, 4] float32 of loc [B, N*L*4, 1, 1] and prior [B|1, 2, N*4, 1]."""
    width = 1 if spec.share_location else spec.num_classes
    d = em.op("Reshape", [em.op("Cast", [loc], to=FLOAT), em.const([0, -1, width, 4])])
    p, v = _priors(em, prior, spec.batch_agnostic)
    if spec.code_type == CORNER:
        return em.op("Add", [p, d if spec.variance_in_target else em.op("Mul", [d, v])])
    if spec.code_type == CORNER_SIZE:
        size = em.op("Sub", [_cols(em, p, 2, 4), _cols(em, p, 0, 2)])  # [w, h]
        size = em.op("Concat", [size, size], axis=-1)
        scaled = d if spec.variance_in_target else em.op("Mul", [d, v])
        return em.op("Add", [p, em.op("Mul", [scaled, size])])
    if spec.code_type == TF_CENTER:  # loc is (ty, tx, th, tw)
        d = em.op("Gather", [d, em.const([1, 0, 3, 2])], axis=-1)
    if spec.code_type == TF_CENTER or not spec.variance_in_target:
        d = em.op("Mul", [v, d])
    return _center_size(em, d, p)


def _priors(em: Emitter, prior: str, batch_agnostic: bool) -> tuple[str, str]:
    """(priors, variances) [B|1, N, 1, 4] of prior_data [B|1, 2, N*4, 1]."""
    pv = em.op("Reshape", [em.op("Cast", [prior], to=FLOAT), em.const([0, 2, -1, 1, 4])])
    if batch_agnostic:
        pv = em.op("Slice", [pv, em.const([0]), em.const([1]), em.const([0])])
    channel = [em.op("Slice", [pv, em.const([k]), em.const([k + 1]), em.const([1])])
               for k in (0, 1)]
    return tuple(em.op("Reshape", [c, em.const([0, -1, 1, 4])]) for c in channel)


def _center_size(em: Emitter, t: str, p: str) -> str:
    """Corners of offsets t = (tx, ty, tw, th) (variances applied) against corner priors p."""
    low, high = _cols(em, p, 0, 2), _cols(em, p, 2, 4)
    size = em.op("Sub", [high, low])
    two = em.const(2.0, np.float32, "two")
    centre = em.op("Div", [em.op("Add", [low, high]), two])
    c = em.op("Add", [em.op("Mul", [_cols(em, t, 0, 2), size]), centre])
    half = em.op("Div", [em.op("Mul", [em.op("Exp", [_cols(em, t, 2, 4)]), size]), two])
    return em.op("Concat", [em.op("Sub", [c, half]), em.op("Add", [c, half])], axis=-1)


def _cols(em: Emitter, x: str, start: int, end: int) -> str:
    """x[..., start:end]."""
    return em.op("Slice", [x, em.const([start]), em.const([end]), em.const([-1])])


# ----------------------------------------------------------------------------- scores, outputs


def _scores(em: Emitter, conf: str, spec: SsdSpec) -> str:
    """Scores [B, N, C] float32, -inf where the plugin drops them (`s > threshold` fails)."""
    s = em.op("Reshape", [em.op("Cast", [conf], to=FLOAT), em.const([0, -1, spec.num_classes])])
    if spec.sigmoid:
        e = em.op("Exp", [s])
        s = em.op("Div", [e, em.op("Add", [em.const(1.0, np.float32, "one"), e])])
    keep = em.op("Greater", [s, em.const(spec.confidence, np.float32, "threshold")])
    return em.op("Where", [keep, s, em.const(-np.inf, np.float32, "ninf")])


def _write(em: Emitter, node: onnx.NodeProto, t: NmsTensors, conf: str) -> None:
    """detections = [image, label, score, saturated box] rows; keep_count as int32 bits."""
    detections, keep_count = node.output
    if detections:
        shape = em.op("Shape", [t.scores])
        image = em.op("Range", [em.const(0.0, np.float32, "zero"),
                                em.op("Cast", [em.op("Gather", [shape, em.const(0)], axis=0)],
                                      to=FLOAT),
                                em.const(1.0, np.float32, "one")])
        image = em.op("Expand", [em.op("Reshape", [image, em.const([-1, 1, 1])]),
                                 em.op("Concat", [shape, em.const([1])], axis=0)])
        label = em.unsqueeze(em.op("Cast", [t.classes], to=FLOAT), [2])
        score = em.unsqueeze(t.scores, [2])
        rows = em.op("Concat", [image, label, score, _saturate(em, t.boxes)], axis=2)
        em.cast_like(em.unsqueeze(rows, [1]), conf, detections)
    if keep_count:
        count = em.op("Mul", [em.op("Cast", [t.num], to=FLOAT),
                              em.const(COUNT_BITS, np.float32, "bits")])
        em.op("Reshape", [count, em.const([-1, 1, 1, 1])], keep_count)


def _saturate(em: Emitter, x: str) -> str:
    """CUDA's __saturatef: clamp to [0, 1], NaN to 0."""
    zero = em.const(0.0, np.float32, "zero")
    clipped = em.op("Clip", [x, zero, em.const(1.0, np.float32, "one")])
    return em.op("Where", [em.op("IsNaN", [x]), zero, clipped])


REFERENCES: tuple[Registration, ...] = tuple(
    Registration(PLUGIN_DOMAIN, op, Decompose(detection_output), ("1",)) for op in SSD_PLUGINS)
