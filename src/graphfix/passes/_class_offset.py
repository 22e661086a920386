"""Undoing the class-offset trick of batched NMS for nms-to-plugin.

torchvision's `batched_nms` (while exporting) and YOLOv7's ONNX_ORT end2end export run
one-class NMS on boxes moved apart by class, so boxes of different classes never overlap:

    labels = ArgMax(class_scores, axis)                    [.., N] or [.., N, 1], C classes
    offset = Mul(Cast(labels), span)                       span: a constant or max(boxes)+1
    NonMaxSuppression(layout(Add(boxes, offset)), scores [B,1,N], cap, iou, score)

That is per-class NMS where every box belongs to its one label, with `cap` per image.
EfficientNMS_TRT does per-class NMS on [B,N,C] scores, so it gets

    boxes      = layout(boxes)                   the same layout ops, replayed without offset
    scores_bnc = Where(Equal(labels [B,N,1], 0..C-1), scores [B,N,1], lowest float32)

Only the label's column holds the score; the others hold the lowest finite value of the
score type, which no score threshold keeps (nms-to-plugin raises "no threshold" to one
float32 ulp above it). The labels are reshaped to the scores' [B,N,1], which assumes they
are in (image, box) order, as an elementwise offset on the boxes implies; the pass's
detection check catches a model where that does not hold.

Recognised: an Add (or a Sub with the offset second) on the NMS's boxes path, reached
through layout ops; an offset that is a Mul reached through Unsqueeze/Cast/Expand/Reshape/
Squeeze/Identity; one Mul operand that is an ArgMax's output (through Cast and reshaping
ops) whose input has a static size on the reduced axis (C). Anything else: a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.graph import fresh_name, names_in_use

# Ops between the offset Add and the NMS that are replayed on the plain boxes.
_BOX_LAYOUT = ("Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Cast", "Transpose")
_OFFSET_CHAIN = ("Unsqueeze", "Squeeze", "Reshape", "Cast", "Expand", "Identity")
_LABEL_CHAIN = ("Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity")


def lowest(dtype) -> float:
    """The lowest finite value of a float score type (float32 when unknown)."""
    try:
        return float(np.finfo(np.dtype(dtype) if dtype is not None else np.float32).min)
    except (TypeError, ValueError):
        return float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class ClassOffset:
    """What the rewrite needs, by tensor names: the boxes before the offset, the outputs of
    the layout nodes from the offset Add to the NMS (in order), the labels and the class
    count."""

    boxes: str
    layout: tuple[str, ...]
    labels: str
    classes: int


Info = Mapping[str, tuple[int, list | None]]  # nms.parts.tensor_info: name -> (type, dims)


def shape_of(tensor: gs.Tensor, info: Info) -> list | None:
    """The tensor's shape in the graph, else from shape inference (`info`)."""
    if tensor.shape is not None and all(isinstance(d, (int, np.integer)) for d in tensor.shape):
        return list(tensor.shape)
    return info.get(tensor.name, (0, None))[1] or tensor.shape


def find_offset(nms: gs.Node, info: Info) -> ClassOffset | str:
    """The class offset on `nms`'s boxes, or why it is not one this module undoes."""
    layout: list[gs.Node] = []
    tensor = nms.inputs[0]
    while True:
        producer = tensor.inputs[0] if tensor.inputs else None
        if producer is None:
            return f"no class-offset Add found on the path of the NMS's boxes '{tensor.name}'"
        if producer.op in ("Add", "Sub"):
            break
        if producer.op not in _BOX_LAYOUT:
            return (f"the NMS's boxes pass through {producer.op} '{producer.name}' after the "
                    "class offset, which is not a layout op replayed on the plain boxes")
        layout.append(producer)
        tensor = producer.inputs[0]
    add = producer
    muls = [(k, m) for k in (0, 1) if (m := _offset_mul(add.inputs[k])) is not None]
    if len(muls) != 1 or (add.op == "Sub" and muls[0][0] != 1):
        return f"{add.op} '{add.name}' does not add one class offset (a Mul) to the boxes"
    side, mul = muls[0]
    found = [a for a in (_argmax_behind(t) for t in mul.inputs) if a is not None]
    if len(found) != 1:
        return (f"the class offset Mul '{mul.name}' does not multiply one ArgMax's labels "
                "(the labels must come from ArgMax over the class scores)")
    argmax = found[0]
    classes = _class_count(argmax, shape_of(argmax.inputs[0], info))
    if isinstance(classes, str):
        return classes
    return ClassOffset(add.inputs[1 - side].name,
                       tuple(n.outputs[0].name for n in reversed(layout)),
                       argmax.outputs[0].name, classes)


def _offset_mul(tensor: gs.Tensor) -> gs.Node | None:
    return _behind(tensor, "Mul", _OFFSET_CHAIN)


def _argmax_behind(tensor: gs.Tensor) -> gs.Node | None:
    return _behind(tensor, "ArgMax", _LABEL_CHAIN)


def _behind(tensor: gs.Tensor, op: str, chain: tuple[str, ...]) -> gs.Node | None:
    """The `op` node that produces `tensor` through at most 8 nodes of `chain`, else None."""
    for _ in range(8):
        producer = tensor.inputs[0] if tensor.inputs else None
        if producer is None:
            return None
        if producer.op == op:
            return producer
        if producer.op not in chain:
            return None
        tensor = producer.inputs[0]
    return None


def _class_count(argmax: gs.Node, shape: list | None) -> int | str:
    axis = int(argmax.attrs.get("axis", 0))
    if shape is None or not -len(shape) <= axis < len(shape) or \
            not isinstance(shape[axis], (int, np.integer)) or shape[axis] < 1:
        return (f"the number of classes (axis {axis} of '{argmax.inputs[0].name}', shape "
                f"{shape}) is not static; EfficientNMS_TRT's scores need a fixed C")
    return int(shape[axis])


def per_class_inputs(graph: gs.Graph, offset: ClassOffset, scores: gs.Tensor
                     ) -> tuple[gs.Tensor, gs.Tensor]:
    """Add the nodes of the module docstring: (boxes [B,N,4], scores [B,N,C]) of the NMS's
    one-class `scores` in [B,N,1] (nms-to-plugin's Transpose of its [B,1,N])."""
    tensors = graph.tensors()
    taken = names_in_use(graph)
    node_names = {n.name for n in graph.nodes}

    def add(op: str, inputs: list, attrs: dict | None = None, dtype=None,
            hint: str = "") -> gs.Tensor:
        out = gs.Variable(fresh_name(f"{offset.labels}_{hint or op.lower()}", taken), dtype)
        taken.add(out.name)
        name = fresh_name(f"{offset.labels}_{hint or op.lower()}", node_names)
        node_names.add(name)
        graph.nodes.append(gs.Node(op, name, attrs or {}, inputs, [out]))
        return out

    boxes = tensors[offset.boxes]
    for made in offset.layout:
        node = tensors[made].inputs[0]
        boxes = add(node.op, [boxes, *node.inputs[1:]], dict(node.attrs), node.outputs[0].dtype,
                    "plain_boxes")
    labels = add("Cast", [tensors[offset.labels]], {"to": onnx.TensorProto.INT32}, np.int32,
                 "labels32")
    labels = add("Reshape", [labels, add("Shape", [scores], dtype=np.int64)], dtype=np.int32,
                 hint="labels_bn1")
    ids = gs.Constant(fresh_name(f"{offset.labels}_class_ids", taken),
                      np.arange(offset.classes, dtype=np.int32).reshape(1, 1, -1))
    taken.add(ids.name)
    dtype = scores.dtype if scores.dtype is not None else np.float32
    floor = gs.Constant(fresh_name(f"{offset.labels}_lowest", taken),
                        np.array(lowest(dtype), dtype=dtype))
    mine = add("Equal", [labels, ids], dtype=np.bool_, hint="is_label")
    return boxes, add("Where", [mine, scores, floor], dtype=scores.dtype, hint="scores_bnc")
