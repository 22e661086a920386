"""A plain numpy NMS with EfficientNMS_TRT's semantics: what `add-nms` checks itself against.

Per image: a (box, class) pair is a candidate when its score >= the score threshold (not the
background class); candidates are taken best score first, and a candidate is dropped when its
IoU with an already kept box of the same class (any class when class-agnostic) is >= the
IoU threshold; the first `max_output` kept pairs are the detections. IoU is computed in
float32 as onnxruntime's NonMaxSuppression does (an empty box suppresses nothing).
"""

from __future__ import annotations

import numpy as np

from graphfix.nms.compare import Detections


def corners(boxes: np.ndarray) -> np.ndarray:
    """[cx, cy, w, h] -> [x1, y1, x2, y2] in float32, as the decomposition computes it."""
    boxes = np.asarray(boxes, np.float32)
    centre, half = boxes[..., :2], boxes[..., 2:] * np.float32(0.5)
    return np.concatenate([centre - half, centre + half], axis=-1)


def iou32(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one corner box with each of `boxes`, float32 throughout; -1 where a box is
    empty (never suppresses)."""
    lo, hi = np.minimum(box[:2], box[2:]), np.maximum(box[:2], box[2:])
    los, his = np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:])
    wh = np.maximum(np.minimum(hi, his) - np.maximum(lo, los), np.float32(0))
    inter = wh[:, 0] * wh[:, 1]
    area, areas = (hi - lo)[0] * (hi - lo)[1], (his - los)[:, 0] * (his - los)[:, 1]
    union = area + areas - inter
    ok = (inter > 0) & (area > 0) & (areas > 0) & (union > 0)
    return np.where(ok, inter / np.where(ok, union, np.float32(1)), np.float32(-1))


def nms_image(boxes: np.ndarray, scores: np.ndarray, max_output: int, score_threshold: float,
              iou_threshold: float, class_agnostic: bool = False,
              background: int = -1) -> Detections:
    """One image: boxes [N,4] corners, scores [N,C]; EfficientNMS semantics (module doc)."""
    boxes, scores = np.asarray(boxes, np.float32), np.asarray(scores, np.float32)
    n, c = np.nonzero(scores >= np.float32(score_threshold))
    keep_pair = c != background
    n, c = n[keep_pair], c[keep_pair]
    order = np.lexsort((n, c, -scores[n, c]))  # best score first; ties by class, then box
    kept: list[int] = []
    thr = np.float32(iou_threshold)
    for i in order:
        if len(kept) == max_output:
            break
        rivals = [j for j in kept if class_agnostic or c[j] == c[i]]
        if rivals and (iou32(boxes[n[i]], boxes[n[rivals]]) >= thr).any():
            continue
        kept.append(int(i))
    return Detections.of(boxes[n[kept]], scores[n[kept], c[kept]], c[kept])


def nms_batch(boxes: np.ndarray, scores: np.ndarray, max_output: int, score_threshold: float,
              iou_threshold: float, class_agnostic: bool = False,
              background: int = -1) -> list[Detections]:
    """`nms_image` for each image of boxes [B,N,4] and scores [B,N,C]."""
    return [nms_image(b, s, max_output, score_threshold, iou_threshold, class_agnostic,
                      background) for b, s in zip(boxes, scores, strict=True)]
