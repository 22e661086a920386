"""The detection comparator and its layout readers."""

from __future__ import annotations

import numpy as np

from graphfix.nms.compare import (
    Detections,
    compare_detections,
    from_efficient,
    from_onnx_nms,
    from_outputs,
    from_torchvision,
)

BOXES = np.array([[0, 0, 10, 10], [20, 20, 30, 35], [50, 5, 60, 15]], np.float32)
SCORES = np.array([0.9, 0.7, 0.7], np.float32)  # a tie
CLASSES = np.array([1, 0, 2])


def _one(order=(0, 1, 2), boxes=BOXES, classes=CLASSES):
    order = list(order)
    return [Detections.of(boxes[order], SCORES[order], classes[order])]


def test_reordered_ties_match():
    report = compare_detections(_one(), _one((0, 2, 1)))
    assert report.ok and report.matched_a == report.matched_b == 1.0
    assert report.mean_iou == 1.0 and report.max_score_diff == 0.0


def test_a_shifted_box_fails():
    moved = BOXES.copy()
    moved[1] += [0, 0, 1, 0]  # IoU 10*15 / 11*15 = 0.909
    report = compare_detections(_one(), _one(boxes=moved))
    assert not report.ok and report.matched_a == 2 / 3
    assert "DIFFER" in report.describe()


def test_a_dropped_box_is_a_count_difference():
    report = compare_detections(_one(), _one((0, 1)))
    assert not report.ok and report.max_count_diff == 1
    assert report.matched_a == 2 / 3 and report.matched_b == 1.0


def test_class_mismatch_fails():
    report = compare_detections(_one(), _one(classes=np.array([1, 0, 0])))
    assert not report.ok and report.class_agreement == 2 / 3 and report.matched_a == 1.0


def test_layouts_read_the_same_detections():
    k = 5
    num = np.array([[3]], np.int32)
    boxes = np.zeros((1, k, 4), np.float32)
    boxes[0, :3] = BOXES
    scores = np.zeros((1, k), np.float32)
    scores[0, :3] = SCORES
    classes = np.zeros((1, k), np.int32)
    classes[0, :3] = CLASSES
    efficient = from_efficient(num, boxes, scores, classes)
    assert compare_detections(efficient, _one()).ok
    outputs = {"num_dets": num, "boxes": boxes, "scores": scores, "labels": classes}
    assert compare_detections(from_outputs(outputs), _one()).ok
    as_float = dict(outputs, labels=classes.astype(np.float32))  # BatchedNMS: float classes
    assert compare_detections(from_outputs(as_float), _one()).ok
    # ONNX NonMaxSuppression: indices into boxes [B,N,4] and scores [B,C,N]
    all_scores = np.zeros((1, 3, 3), np.float32)
    all_scores[0, CLASSES, [0, 1, 2]] = SCORES
    selected = np.array([[0, 1, 0], [0, 2, 2], [0, 0, 1]], np.int64)
    assert compare_detections(from_onnx_nms(selected, BOXES[None], all_scores), _one()).ok
    tv = from_torchvision([(BOXES, SCORES, CLASSES)])
    assert compare_detections(tv, _one()).ok
    assert compare_detections(from_outputs({"b": BOXES, "s": SCORES, "l": CLASSES}), _one()).ok
