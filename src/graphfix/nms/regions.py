"""NMS regions: every NMS in a model, what feeds it and what reads its result.

A region is one NMS node — ONNX `NonMaxSuppression` in the main graph or in an If
branch / Loop or Scan body (torchvision puts it in an If, Ultralytics' `nms=True`
export in a per-image Loop), or a TensorRT NMS plugin node (EfficientNMS_TRT,
EfficientNMS_ONNX_TRT, BatchedNMS_TRT, BatchedNMSDynamic_TRT, NMS_TRT,
NMSDynamic_TRT; any domain) — with:

- the pre-NMS boxes and scores: its inputs traced back (`_trace`) through layout ops,
  the score-threshold filter (Greater + NonZero + Gather), TopK, Concat and the
  class-offset trick of batched NMS, to the first tensor computed without any
  data-dependent op (the cut);
- its thresholds, each a constant value or "not constant";
- the score layout at the cut: [B,C,N] as NonMaxSuppression takes it, [B,N,C] when a
  Transpose(perm=[0,2,1]) sits between, "flat" when the walk added the batch/class
  axes (torchvision's per-image [N] scores); the box format (corner or centre);
- the tail: every node from the selected indices to the graph outputs;
- reasons it cannot be split, when any.

Plugin attributes written as one-element lists by the yolov6/yolov7 exporters
(`max_output_boxes: [100]`, a Python tuple in the exporter) are read as scalars
(`nms.efficient.plugin_attrs`, which the decompositions read them with too).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphfix.graph.protos import proto_label
from graphfix.nms._flow import Flow, scalar
from graphfix.nms._trace import Scope, Trace, trace_back, trace_tail
from graphfix.nms.efficient import plugin_attrs
from graphfix.nms.ssd import (
    CENTER_SIZE,
    CORNER,
    CORNER_SIZE,
    DEFAULT_CODE_TYPE,
    DEFAULT_INPUT_ORDER,
    SSD_PLUGINS,
    TF_CENTER,
)
from graphfix.trt import is_nms_plugin

_ONNX_DOMAINS = ("", "ai.onnx")


class Kind(str, enum.Enum):
    ONNX = "onnx"
    PLUGIN = "plugin"


class Where(str, enum.Enum):
    MAIN = "main graph"
    IF = "If branch"
    LOOP = "Loop body"
    SCAN = "Scan body"


class Layout(str, enum.Enum):
    BCN = "[B,C,N]"
    BNC = "[B,N,C]"
    FLAT = "flat"
    UNKNOWN = "unknown"


class BoxFormat(str, enum.Enum):
    CORNER = "corner"
    CENTER = "center"
    OTHER = "other"


@dataclass(frozen=True)
class Threshold:
    """One NMS limit: the tensor or attribute it comes from and its constant value
    (None: not constant, or not given — then `given` is False)."""

    name: str
    source: str
    value: float | int | None
    given: bool = True

    @property
    def constant(self) -> bool:
        return self.value is not None or not self.given

    def describe(self) -> str:
        if not self.given:
            return f"{self.name}: not given"
        if self.value is None:
            shown = "not constant"
        elif isinstance(self.value, (int, np.integer)):
            shown = "INT64_MAX" if self.value == np.iinfo(np.int64).max else str(self.value)
        else:
            shown = f"{self.value:g}"
        return f"{self.name}: {shown}"


@dataclass(frozen=True)
class NmsRegion:
    """One NMS node and what surrounds it (see the module docstring)."""

    label: str
    op_type: str
    kind: Kind
    where: Where
    boxes: tuple[str, ...]
    scores: tuple[str, ...]
    nms_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layout: Layout
    box_format: BoxFormat
    thresholds: tuple[Threshold, ...]
    steps: tuple[str, ...]
    tail: tuple[str, ...]
    reaches_output: bool
    reasons: tuple[str, ...] = ()
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def splittable(self) -> bool:
        return not self.reasons

    def threshold(self, name: str) -> Threshold | None:
        return next((t for t in self.thresholds if t.name == name), None)

    def describe(self) -> str:
        """One line: the pre-NMS tensors, layout, box format, thresholds, steps, tail and
        whether split-nms can cut before it (doctor and --explain print it)."""
        parts = [f"boxes {', '.join(self.boxes) or '?'}, scores {', '.join(self.scores) or '?'}",
                 f"layout {self.layout.value}, {self.box_format.value} boxes",
                 "; ".join(t.describe() for t in self.thresholds) or "no thresholds"]
        if self.steps:
            parts.append("traced through " + ", ".join(self.steps))
        parts.append(f"tail {len(self.tail)} node{'s' * (len(self.tail) != 1)}"
                     + ("" if self.reaches_output else " reaching no graph output"))
        if self.reasons:
            parts.append("split-nms cannot cut before it: " + "; ".join(self.reasons))
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "op_type": self.op_type, "kind": self.kind.value,
            "where": self.where.value, "boxes": list(self.boxes), "scores": list(self.scores),
            "layout": self.layout.value, "box_format": self.box_format.value,
            "thresholds": {t.name: (t.value if t.given else "not given") if t.constant
                           else "not constant" for t in self.thresholds},
            "steps": list(self.steps), "tail": list(self.tail),
            "reaches_output": self.reaches_output, "reasons": list(self.reasons),
        }


def is_nms(node: onnx.NodeProto) -> Kind | None:
    """The kind of NMS node `node` is, or None."""
    if node.op_type == "NonMaxSuppression" and node.domain in _ONNX_DOMAINS:
        return Kind.ONNX
    if is_nms_plugin(node.op_type):  # no NMS plugin shares its name with an ONNX op
        return Kind.PLUGIN
    return None


def find_regions(model: onnx.ModelProto | onnx.GraphProto) -> list[NmsRegion]:
    """Every NMS region of the model, main graph first, bodies depth first."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    found: list[NmsRegion] = []
    _walk(Scope((Flow(graph),)), found)
    return found


def _walk(scope: Scope, found: list[NmsRegion]) -> None:
    flow = scope.flows[-1]
    for i, node in enumerate(flow.nodes):
        kind = is_nms(node)
        if kind is not None:
            found.append(_region(scope, i, kind))
        for attr in node.attribute:
            bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for body in bodies:
                inner = f"{proto_label(node)}.{attr.name}"
                _walk(Scope((*scope.flows, Flow(body, flow)),
                            (*scope.containers, (i, attr.name)), (*scope.path, inner)), found)


def _where(scope: Scope) -> Where:
    if not scope.containers:
        return Where.MAIN
    index, _ = scope.containers[0]
    op = scope.flows[0].nodes[index].op_type
    return {"If": Where.IF, "Loop": Where.LOOP}.get(op, Where.SCAN)


def _region(scope: Scope, i: int, kind: Kind) -> NmsRegion:
    flow = scope.flows[-1]
    node = flow.nodes[i]
    attrs = plugin_attrs(node)
    level = len(scope.flows) - 1
    boxes_in, scores_in = _box_score_inputs(node, attrs, kind)
    boxes = trace_back(scope, boxes_in, "boxes") if boxes_in else Trace()
    scores = trace_back(scope, scores_in, "scores") if scores_in else Trace()
    outputs = [o for o in node.output if o]
    tail, reached, _ = trace_tail(scope, outputs)
    reasons = [*boxes.problems, *scores.problems]
    if kind is Kind.PLUGIN:
        reasons.append(f"{node.op_type} is a TensorRT plugin: it runs inside TensorRT, "
                       "and split-nms cuts only ONNX NonMaxSuppression")
    if not reached:
        reasons.append("its result reaches no graph output")
    if not boxes.cut or not scores.cut:
        reasons.append("its boxes or scores input is missing")
    steps = list(dict.fromkeys([*boxes.steps, *scores.steps]))
    return NmsRegion(
        label=scope.label(level, i), op_type=node.op_type, kind=kind, where=_where(scope),
        boxes=tuple(boxes.cut), scores=tuple(scores.cut),
        nms_inputs=tuple(node.input), outputs=tuple(outputs),
        layout=_layout(kind, node, scores), box_format=_box_format(kind, node, attrs),
        thresholds=_thresholds(flow, node, kind, attrs), steps=tuple(steps),
        tail=tuple(tail), reaches_output=reached, reasons=tuple(dict.fromkeys(reasons)),
        attributes=attrs,
    )


def _box_score_inputs(node: onnx.NodeProto, attrs: dict[str, Any], kind: Kind
                      ) -> tuple[str, str]:
    inputs = list(node.input) + ["", ""]
    if node.op_type in SSD_PLUGINS:  # loc, conf = inputs[inputOrder[0]], [inputOrder[1]]
        order = attrs.get("inputOrder", DEFAULT_INPUT_ORDER)
        order = list(order) if isinstance(order, (list, tuple)) else list(DEFAULT_INPUT_ORDER)
        return inputs[order[0]] if len(order) > 1 else inputs[0], \
            inputs[order[1]] if len(order) > 1 else inputs[1]
    return inputs[0], inputs[1]


def _layout(kind: Kind, node: onnx.NodeProto, scores: Trace) -> Layout:
    if kind is Kind.PLUGIN:
        return Layout.FLAT if node.op_type in SSD_PLUGINS else Layout.BNC
    if not scores.cut:
        return Layout.UNKNOWN
    if scores.transposed:
        return Layout.BNC
    return Layout.FLAT if scores.reshaped else Layout.BCN


def _box_format(kind: Kind, node: onnx.NodeProto, attrs: dict[str, Any]) -> BoxFormat:
    if kind is Kind.ONNX or node.op_type == "EfficientNMS_ONNX_TRT":
        return BoxFormat.CENTER if attrs.get("center_point_box", 0) == 1 else BoxFormat.CORNER
    if node.op_type == "EfficientNMS_TRT":
        return BoxFormat.CENTER if attrs.get("box_coding", 0) == 1 else BoxFormat.CORNER
    if node.op_type in SSD_PLUGINS:  # loc encodes offsets from priors (CodeTypeSSD)
        code = attrs.get("codeType", DEFAULT_CODE_TYPE)
        return {CORNER: BoxFormat.CORNER, CORNER_SIZE: BoxFormat.CORNER,
                CENTER_SIZE: BoxFormat.CENTER, TF_CENTER: BoxFormat.CENTER
                }.get(code, BoxFormat.OTHER)
    return BoxFormat.CORNER  # BatchedNMS: [x1, y1, x2, y2]


_ONNX_LIMITS = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")
_PLUGIN_LIMITS = {
    "EfficientNMS_TRT": ("max_output_boxes", "iou_threshold", "score_threshold"),
    "EfficientNMS_ONNX_TRT": _ONNX_LIMITS,
    "BatchedNMS_TRT": ("keepTopK", "iouThreshold", "scoreThreshold"),
    "BatchedNMSDynamic_TRT": ("keepTopK", "iouThreshold", "scoreThreshold"),
    "NMS_TRT": ("keepTopK", "nmsThreshold", "confidenceThreshold"),
    "NMSDynamic_TRT": ("keepTopK", "nmsThreshold", "confidenceThreshold"),
}


def _thresholds(flow: Flow, node: onnx.NodeProto, kind: Kind, attrs: dict[str, Any]
                ) -> tuple[Threshold, ...]:
    if kind is Kind.PLUGIN:
        names = _PLUGIN_LIMITS.get(node.op_type, ())
        return tuple(Threshold(n, "attribute", _number(attrs.get(n)), n in attrs)
                     for n in names)
    out = []
    for k, name in enumerate(_ONNX_LIMITS, start=2):
        tensor = node.input[k] if k < len(node.input) else ""
        if not tensor:
            out.append(Threshold(name, "", None, given=False))
            continue
        out.append(Threshold(name, tensor, scalar(flow.constant_value(tensor))))
    return tuple(out)


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
