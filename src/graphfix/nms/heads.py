"""Raw detector heads: graph outputs that hold every candidate box, before any NMS.

- YOLOv8/YOLO11 style: `[B, 4+C, N]`, channel-major: cx, cy, w, h, then C class scores
  (already sigmoid-ed, no objectness).
- YOLOv5/YOLOv7 style: `[B, N, 5+C]`: cx, cy, w, h, objectness, C class scores.

Both are told apart by the output's shape: the channel axis is the short one. When the
dims are symbolic, the producing node decides: a Concat on axis 1 (channels of [B,C,N]) is
YOLOv8's, on axis 2/-1 YOLOv5's; a Transpose(perm [0,2,1]) of a channel-major tensor makes a
box-major YOLOv8 head ([B, N, 4+C], no objectness). `find_head` returns the head or the
reason there is none; `head=` forces a style when the shape cannot tell (an [B, N, 85]
head is YOLOv5 with 80 classes or a transposed YOLOv8 with 81).

Pose, segmentation and oriented-box heads have the same layout with more channels after
the class scores (keypoints, mask coefficients, an angle): ultralytics writes them as
`Concat(boxes, Sigmoid(classes), extra)` on the channel axis. A head whose channel Concat
has parts after its last Sigmoid part, or a model with a rank-4 float output beside the
head (a segmentation model's mask prototypes), is refused with that reason: its extra
channels would be scored as classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import onnx_graphsurgeon as gs

Style = Literal["yolov8", "yolov5"]
STYLES = ("auto", "yolov8", "yolov5")


@dataclass(frozen=True)
class RawHead:
    """A raw head: its output tensor, style, class count, whether it has an objectness
    column, and whether channels are on axis 1 (`channel_major`). Boxes are cx, cy, w, h."""

    output: str
    style: Style
    num_classes: int
    objectness: bool
    channel_major: bool

    def describe(self) -> str:
        layout = "[B, 4+C, N]" if self.channel_major else (
            "[B, N, 5+C]" if self.objectness else "[B, N, 4+C]")
        return (f"{self.style} head '{self.output}' {layout}, C={self.num_classes}, boxes "
                f"cx,cy,w,h{', objectness' if self.objectness else ''}")


def find_head(graph: gs.Graph, style: str = "auto") -> RawHead | str:
    """The graph's raw head (its one float rank-3 output), or why there is none."""
    candidates = [t for t in graph.outputs if t.shape is not None and len(t.shape) == 3
                  and (t.dtype is None or str(t.dtype).startswith("float"))]
    if len(candidates) != 1:
        shapes = ", ".join(f"{t.name} {t.shape}" for t in graph.outputs)
        return (f"needs exactly one float output of rank 3 (a raw head), found "
                f"{len(candidates)} among: {shapes}")
    t = candidates[0]
    channel_major = _channel_major(t)
    if isinstance(channel_major, str):
        return channel_major
    channels = t.shape[1] if channel_major else t.shape[2]
    if not isinstance(channels, int):
        return f"the channel dim of '{t.name}' {t.shape} is not static"
    if style == "auto":
        style = "yolov8" if channel_major or _transposed(t) else "yolov5"
    objectness = style == "yolov5"
    classes = channels - (5 if objectness else 4)
    if classes < 1:
        return f"'{t.name}' {t.shape} has {channels} channels: too few for a {style} head"
    if objectness and channel_major:
        return f"'{t.name}' {t.shape} is channel-major, which YOLOv5 heads are not"
    extra = _extra_channels(graph, t, channel_major)
    if extra:
        return extra
    return RawHead(t.name, style, classes, objectness, channel_major)  # type: ignore[arg-type]


def _extra_channels(graph: gs.Graph, t: gs.Tensor, channel_major: bool) -> str | None:
    """Why the head carries channels that are not boxes or class scores, or None."""
    for other in graph.outputs:
        if other is not t and other.shape is not None and len(other.shape) == 4 and (
                other.dtype is None or str(other.dtype).startswith("float")):
            return (f"besides the head '{t.name}', output '{other.name}' {other.shape} has "
                    "rank 4, like a segmentation model's mask prototypes: the head's channels "
                    "after the class scores would then be mask coefficients, which add-nms "
                    "would score as classes; not added")
    source = t
    if not channel_major and _transposed(t):
        source, channel_major = t.inputs[0].inputs[0], True
    concat = source.inputs[0] if len(source.inputs) == 1 else None
    if concat is None or concat.op != "Concat" or source.shape is None:
        return None
    axis = int(concat.attrs.get("axis", 0))
    axis = axis + len(source.shape) if axis < 0 else axis
    if axis != (1 if channel_major else 2):
        return None
    producers = [p.inputs[0].op if len(p.inputs) == 1 else None for p in concat.inputs]
    sigmoids = [i for i, op in enumerate(producers) if op == "Sigmoid"]
    if not sigmoids or sigmoids[-1] == len(producers) - 1:
        return None
    after = concat.inputs[sigmoids[-1] + 1:]
    described = ", ".join(f"'{p.name}' ({p.inputs[0].op})" for p in after)
    return (f"the head '{t.name}' concatenates {described} after its class scores (the "
            f"Sigmoid '{concat.inputs[sigmoids[-1]].name}'): keypoints, mask coefficients "
            "or an angle (a pose, segmentation or oriented-box head), which add-nms would "
            "score as classes and drop from its outputs; not added")


def _channel_major(t: gs.Tensor) -> bool | str:
    _, d1, d2 = t.shape
    if isinstance(d1, int) and isinstance(d2, int):
        if d1 == d2:
            return f"'{t.name}' {t.shape} is square: the channel axis is ambiguous"
        return d1 < d2
    if isinstance(d1, int) != isinstance(d2, int):
        return isinstance(d1, int)
    producer = t.inputs[0] if t.inputs else None
    if producer is not None and producer.op == "Concat":
        axis = int(producer.attrs.get("axis", 0))
        if axis in (1, -2):
            return True
        if axis in (2, -1):
            return False
    if producer is not None and _transposed(t):
        return False
    return (f"'{t.name}' {t.shape} has symbolic dims and is made by "
            f"{producer.op if producer is not None else 'no node'}, which does not say "
            "where its channels are")


def _transposed(t: gs.Tensor) -> bool:
    producer = t.inputs[0] if t.inputs else None
    return (producer is not None and producer.op == "Transpose"
            and list(producer.attrs.get("perm", [])) == [0, 2, 1])
