"""Helpers for the NMS tests: applying a pass for a target, models with one NMS plugin
node, seeded boxes and scores, and a plain numpy EfficientNMS written here (independent of
graphfix.nms.reference)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

FLOAT, INT32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32


def apply(pass_, model: onnx.ModelProto, trt: str | None = None):
    """Run one pass as the manager does (cleanup + toposort after) for a TensorRT target;
    no onnx.checker, which has no schema for the plugin nodes these passes write."""
    from graphfix.graph import to_graph, to_model
    from graphfix.passes.base import PassContext
    from graphfix.trt import parse_target

    graph = to_graph(model)
    result = pass_.run(graph, PassContext(trt=parse_target(trt) if trt else None))
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    return to_model(graph, model), result


def plugin_model(op: str = "EfficientNMS_TRT", b: int = 2, n: int = 40, c: int = 3, k: int = 10,
                 box_rank: int = 3, opset: int = 17, domain: str = "", **attrs) -> onnx.ModelProto:
    """boxes [b,n,4] (or [b,n,1,4]) and scores [b,n,c] -> the plugin's four outputs."""
    box_shape = [b, n, 4] if box_rank == 3 else [b, n, 1, 4]
    if op == "EfficientNMS_TRT":
        names = ["num_detections", "detection_boxes", "detection_scores", "detection_classes"]
        types = [INT32, FLOAT, FLOAT, INT32]
        num_shape = [b, 1]
    else:
        names = ["num_detections", "nmsed_boxes", "nmsed_scores", "nmsed_classes"]
        types = [INT32, FLOAT, FLOAT, FLOAT]
        num_shape = [b, 1] if op == "BatchedNMSDynamic_TRT" else [b]
    shapes = [num_shape, [b, k, 4], [b, k], [b, k]]
    node = helper.make_node(op, ["boxes", "scores"], names, name="nms", domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("boxes", FLOAT, box_shape),
         helper.make_tensor_value_info("scores", FLOAT, [b, n, c])],
        [helper.make_tensor_value_info(nm, t, s)
         for nm, t, s in zip(names, types, shapes, strict=True)])
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def efficient_attrs(k: int = 10, score: float = 0.3, iou: float = 0.5, **extra) -> dict:
    attrs = dict(score_threshold=score, iou_threshold=iou, max_output_boxes=k,
                 background_class=-1, score_activation=0, box_coding=0, plugin_version="1")
    attrs.update(extra)
    return attrs


def random_inputs(b: int, n: int, c: int, seed: int, centre_size: bool = False,
                  ties: float | None = None) -> dict[str, np.ndarray]:
    """Clustered boxes (so NMS suppresses), uniform scores; `ties` sets some scores to it."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 100, (b, n // 4 + 1, 2))[:, rng.integers(0, n // 4 + 1, n)]
    xy = (centres + rng.normal(0, 4, (b, n, 2))).astype(np.float32)
    wh = rng.uniform(10, 30, (b, n, 2)).astype(np.float32)
    boxes = np.concatenate([xy, wh], -1) if centre_size else np.concatenate([xy, xy + wh], -1)
    scores = rng.uniform(0, 1, (b, n, c)).astype(np.float32)
    if ties is not None:
        scores[rng.uniform(size=scores.shape) < 0.05] = np.float32(ties)
    return {"boxes": boxes.astype(np.float32), "scores": scores}


def _iou(a: np.ndarray, b: np.ndarray) -> np.float32:
    lo, hi = np.minimum(a[:2], a[2:]), np.maximum(a[:2], a[2:])
    lo2, hi2 = np.minimum(b[:2], b[2:]), np.maximum(b[:2], b[2:])
    w = max(np.float32(0), min(hi[0], hi2[0]) - max(lo[0], lo2[0]))
    h = max(np.float32(0), min(hi[1], hi2[1]) - max(lo[1], lo2[1]))
    inter = np.float32(w) * np.float32(h)
    area1 = (hi[0] - lo[0]) * (hi[1] - lo[1])
    area2 = (hi2[0] - lo2[0]) * (hi2[1] - lo2[1])
    union = area1 + area2 - inter
    if inter <= 0 or area1 <= 0 or area2 <= 0 or union <= 0:
        return np.float32(-1)
    return np.float32(inter / union)


def numpy_efficient_nms(boxes, scores, k, score_thr, iou_thr, background=-1, agnostic=False,
                        box_coding=0, activation=False):
    """EfficientNMS_TRT semantics: (num [B,1], boxes [B,K,4], scores [B,K], classes [B,K])."""
    boxes, scores = np.asarray(boxes, np.float32), np.asarray(scores, np.float32)
    if box_coding == 1:
        half = boxes[..., 2:] * np.float32(0.5)
        boxes = np.concatenate([boxes[..., :2] - half, boxes[..., :2] + half], -1)
    if activation:
        scores = (1 / (1 + np.exp(-scores.astype(np.float64)))).astype(np.float32)
    bsz = boxes.shape[0]
    num = np.zeros((bsz, 1), np.int32)
    out_b = np.zeros((bsz, k, 4), np.float32)
    out_s = np.zeros((bsz, k), np.float32)
    out_c = np.zeros((bsz, k), np.int32)
    for i in range(bsz):
        pairs = [(float(scores[i, n, c]), c, n) for n in range(scores.shape[1])
                 for c in range(scores.shape[2])
                 if scores[i, n, c] >= np.float32(score_thr) and c != background]
        pairs.sort(key=lambda p: (-p[0], p[1], p[2]))
        kept: list[tuple[float, int, int]] = []
        for s, c, n in pairs:
            if len(kept) == k:
                break
            if any((agnostic or kc == c) and _iou(boxes[i, kn], boxes[i, n]) >= np.float32(iou_thr)
                   for _, kc, kn in kept):
                continue
            kept.append((s, c, n))
        num[i, 0] = len(kept)
        for j, (s, c, n) in enumerate(kept):
            out_b[i, j], out_s[i, j], out_c[i, j] = boxes[i, n], s, c
    return num, out_b, out_s, out_c
