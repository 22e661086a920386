"""Comparing detections, not NMS tensors.

Two NMS implementations that agree can still differ element by element: equal scores come
out in another order, one pads with zeros and the other with -1, one writes selected indices
and the other gathered boxes. So detections are read into one form per image
(`Detections`: corner boxes [k,4], scores [k], classes [k]) and matched:

    for each detection of A, best score first:
        its match is the unmatched detection of B with the highest IoU (same class first)
    matched = pairs with IoU >= min_iou

The verdict (`DetectionReport.ok`) asks for every detection matched both ways, the same
count in every image and the same class in every pair.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_MIN_IOU = 0.99


@dataclass(frozen=True)
class Detections:
    """One image's detections: corner boxes [k,4], scores [k], classes [k] (int64)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    @property
    def count(self) -> int:
        return int(len(self.scores))

    @classmethod
    def of(cls, boxes: Any, scores: Any, classes: Any) -> Detections:
        return cls(np.asarray(boxes, np.float64).reshape(-1, 4),
                   np.asarray(scores, np.float64).ravel(),
                   np.asarray(classes).astype(np.int64).ravel())


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one corner box with each of `boxes` (any diagonal pair; 0 for empty boxes)."""
    lo, hi = np.minimum(box[:2], box[2:]), np.maximum(box[:2], box[2:])
    los, his = np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:])
    inter = np.clip(np.minimum(hi, his) - np.maximum(lo, los), 0, None).prod(axis=1)
    union = (hi - lo).prod() + (his - los).prod(axis=1) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


@dataclass
class DetectionReport:
    """What matching two detection sets found, over every image compared."""

    min_iou: float
    count_a: int = 0
    count_b: int = 0
    matched: int = 0
    same_class: int = 0
    ious: list[float] = field(default_factory=list)
    max_score_diff: float = 0.0
    max_count_diff: int = 0
    images: int = 0
    inputs: str = ""  # what the images came from ("the run's check input and ..."), if said

    @property
    def matched_a(self) -> float:
        return self.matched / self.count_a if self.count_a else 1.0

    @property
    def matched_b(self) -> float:
        return self.matched / self.count_b if self.count_b else 1.0

    @property
    def class_agreement(self) -> float:
        return self.same_class / self.matched if self.matched else 1.0

    @property
    def mean_iou(self) -> float:
        return float(np.mean(self.ious)) if self.ious else 1.0

    @property
    def ok(self) -> bool:
        return (self.matched_a == 1.0 and self.matched_b == 1.0 and self.max_count_diff == 0
                and self.class_agreement == 1.0)

    def describe(self) -> str:
        verdict = "match" if self.ok else "DIFFER"
        where = f" on {self.inputs}" if self.inputs else ""
        return (f"detections {verdict}{where}: {self.images} image(s), {self.count_a} vs "
                f"{self.count_b} detections, matched {self.matched_a:.1%} / "
                f"{self.matched_b:.1%} at IoU >= {self.min_iou:g}, mean IoU "
                f"{self.mean_iou:.4f}, classes agree {self.class_agreement:.1%}, max score "
                f"difference {self.max_score_diff:.3g}, max count difference "
                f"{self.max_count_diff}")

    @property
    def passed(self) -> bool:
        """The check's verdict (`graphfix check --detections`): `ok`."""
        return self.ok

    def to_json(self) -> dict[str, Any]:
        return {"schema": "graphfix.detections/1", "ok": self.ok, "images": self.images,
                "count_a": self.count_a, "count_b": self.count_b, "matched_a": self.matched_a,
                "matched_b": self.matched_b, "min_iou": self.min_iou,
                "mean_iou": self.mean_iou, "class_agreement": self.class_agreement,
                "max_score_diff": self.max_score_diff, "max_count_diff": self.max_count_diff}


def compare_detections(a: Sequence[Detections], b: Sequence[Detections],
                       min_iou: float = DEFAULT_MIN_IOU,
                       report: DetectionReport | None = None) -> DetectionReport:
    """Match A's and B's detections image by image (module docstring); adds to `report`."""
    out = report or DetectionReport(min_iou)
    if len(a) != len(b):
        out.max_count_diff = max(out.max_count_diff, abs(len(a) - len(b)))
    for da, db in zip(a, b, strict=False):
        _match_image(da, db, out)
    return out


def _match_image(a: Detections, b: Detections, out: DetectionReport) -> None:
    out.images += 1
    out.count_a += a.count
    out.count_b += b.count
    out.max_count_diff = max(out.max_count_diff, abs(a.count - b.count))
    free = np.ones(b.count, bool)
    for i in np.argsort(-a.scores, kind="stable"):
        if not free.any():
            break
        overlap = np.where(free, iou(a.boxes[i], b.boxes), -1.0)
        same = (b.classes == a.classes[i]) & free
        best = overlap.max()
        # prefer a same-class box among those as good as the best
        pick = int(np.argmax(np.where(same & (overlap >= best), 1, 0))) if (
            same & (overlap >= best)).any() else int(np.argmax(overlap))
        if overlap[pick] < out.min_iou:
            continue
        free[pick] = False
        out.matched += 1
        out.same_class += int(b.classes[pick] == a.classes[i])
        out.ious.append(float(overlap[pick]))
        out.max_score_diff = max(out.max_score_diff, float(abs(a.scores[i] - b.scores[pick])))


# ----------------------------------------------------------------------------- layouts


def from_efficient(num: Any, boxes: Any, scores: Any, classes: Any) -> list[Detections]:
    """EfficientNMS / YOLO end2end form: num [B,1] or [B], boxes [B,K,4], scores [B,K],
    classes [B,K], valid up to num per image."""
    counts = np.asarray(num).reshape(-1)
    boxes, scores, classes = np.asarray(boxes), np.asarray(scores), np.asarray(classes)
    return [Detections.of(boxes[i, :n], scores[i, :n], classes[i, :n])
            for i, n in enumerate(int(c) for c in counts)]


def from_onnx_nms(selected: Any, boxes: Any, scores: Any, center_point_box: int = 0,
                  labels: Any = None) -> list[Detections]:
    """ONNX NonMaxSuppression form: selected_indices [M,3] (batch, class, box) with the
    NMS inputs boxes [B,N,4] and scores [B,C,N]. `labels` [B,N]: each box's class when the
    NMS ran on one class with the class-offset trick (then `boxes` are the boxes without
    the offsets); the class column of the indices is 0 there."""
    sel = np.asarray(selected).astype(np.int64).reshape(-1, 3)
    boxes, scores = np.asarray(boxes, np.float64), np.asarray(scores, np.float64)
    if center_point_box:
        centre, half = boxes[..., :2], boxes[..., 2:] / 2
        boxes = np.concatenate([centre - half, centre + half], axis=-1)
    out = []
    for image in range(boxes.shape[0]):
        rows = sel[sel[:, 0] == image]
        classes = rows[:, 1] if labels is None else np.asarray(labels)[image, rows[:, 2]]
        out.append(Detections.of(boxes[image, rows[:, 2]], scores[image, rows[:, 1], rows[:, 2]],
                                 classes))
    return out


def from_torchvision(per_image: Sequence[tuple[Any, Any, Any]]) -> list[Detections]:
    """torchvision form: per image (boxes [k,4], scores [k], labels [k]), any length."""
    return [Detections.of(b, s, lab) for b, s, lab in per_image]


def from_outputs(outputs: Mapping[str, np.ndarray]) -> list[Detections]:
    """Detections from a model's graph outputs, by their shapes: the EfficientNMS form
    (an integer [B,1]/[B] count, [B,K,4], [B,K], [B,K]) or one image's torchvision form
    ([k,4], [k], [k]). ValueError names what was found when neither fits."""
    arrays = list(outputs.values())
    counts = [x for x in arrays if x.dtype.kind in "iu" and x.ndim in (1, 2)
              and (x.ndim == 1 or x.shape[1] == 1) and len(arrays) == 4]
    boxes = [x for x in arrays if x.ndim == 3 and x.shape[-1] == 4]
    if counts and boxes:
        b = boxes[0]
        rest = [x for x in arrays if x is not counts[0] and x is not b and x.shape == b.shape[:2]]
        if len(rest) == 2:
            scores, classes = sorted(rest, key=lambda x: x.dtype.kind in "iu")
            if scores.dtype.kind == "f" and classes.dtype.kind == "f":  # BatchedNMS classes
                scores, classes = _score_first(outputs, rest)
            return from_efficient(counts[0], b, scores, classes)
    flat = [x for x in arrays if x.ndim == 2 and x.shape[-1] == 4]
    if len(arrays) == 3 and flat:
        rest = [x for x in arrays if x is not flat[0] and x.ndim == 1]
        if len(rest) == 2:
            scores, labels = sorted(rest, key=lambda x: x.dtype.kind in "iu")
            return from_torchvision([(flat[0], scores, labels)])
    shapes = ", ".join(f"{k} {x.dtype}{list(x.shape)}" for k, x in outputs.items())
    raise ValueError(f"no known detection layout in the outputs ({shapes})")


def _score_first(outputs: Mapping[str, np.ndarray], pair: list[np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Two float [B,K] outputs: the one named like classes/labels is the classes."""
    names = {id(x): k.lower() for k, x in outputs.items()}
    first, second = pair
    if any(w in names[id(first)] for w in ("class", "label")):
        return second, first
    return first, second


VERIFY_SEEDS = (0, 1, 2)


GIVEN = "the run's check input"


def verify_inputs(model: Any, input_shapes: Mapping[str, tuple[int, ...]],
                  samples: Sequence[Mapping[str, np.ndarray]] = (), seeds: Sequence[int] =
                  VERIFY_SEEDS) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The inputs an NMS pass checks itself on, each with what it is: the run's check
    inputs (`samples`, cast to what `model` declares), then seeded inputs for `model` (one
    per seed) unless equal to a sample (the check's own seeded input often is)."""
    from graphfix.runtime.feeds import graph_inputs, model_feeds, resolve_shapes
    from graphfix.runtime.outputs import feeds_as_declared

    shapes = resolve_shapes(graph_inputs(model), input_shapes)
    out = [(GIVEN, feeds_as_declared(model, dict(s))) for s in samples]
    for k, seed in enumerate(seeds):
        feeds = model_feeds(model, shapes, seed)
        if not any(_same(feeds, given) for _, given in out[:len(samples)]):
            out.append((f"seeded input {k + 1}", feeds))
    return out


def inputs_said(inputs: Sequence[tuple[str, Any]]) -> str:
    """"the run's check input and 2 seeded inputs": `verify_inputs`' list in words."""
    given = sum(label == GIVEN for label, _ in inputs)
    seeded = len(inputs) - given
    parts = ([f"{GIVEN}{'s' * (given != 1)}"] if given else []) + \
        ([f"{seeded} seeded input{'s' * (seeded != 1)}"] if seeded else [])
    return " and ".join(parts) or "no inputs"


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).shape == np.asarray(b[k]).shape and np.array_equal(a[k], b[k])
        for k in a)


def verify_rewrite(before: Any, after: Any, outputs: Sequence[str],
                   expected: Any, input_shapes: Mapping[str, tuple[int, ...]],
                   samples: Sequence[Mapping[str, np.ndarray]] = ()) -> DetectionReport:
    """How an NMS rewrite checks itself: on `samples` (the run's check inputs,
    `PassContext.samples`) and seeded inputs made for `before` (seeds `VERIFY_SEEDS`), the
    detections `expected(feeds)` says the rewrite must reproduce (A) against `after`'s
    EfficientNMS-layout `outputs` (B). Raises what onnxruntime raises; the caller says
    the check could not run."""
    from graphfix.runtime.outputs import feeds_as_declared, run_checkable

    report = DetectionReport(DEFAULT_MIN_IOU)
    inputs = verify_inputs(before, input_shapes, samples)
    report.inputs = inputs_said(inputs)
    for _, feeds in inputs:
        got = run_checkable(after, feeds_as_declared(after, dict(feeds)))
        compare_detections(expected(feeds), from_efficient(*(got[n] for n in outputs)),
                           report=report)
    return report


def compare_models(reference: Any, candidate: Any, samples: Sequence[Mapping[str, np.ndarray]],
                   min_iou: float = DEFAULT_MIN_IOU,
                   providers: Sequence[str] = ("cpu",)) -> DetectionReport:
    """Run both ONNX models on every sample (plugin nodes as their reference forms) and
    match their graph outputs read as detections (`from_outputs`). `graphfix check
    --detections` is this."""
    from graphfix.errors import GraphfixError
    from graphfix.runtime.outputs import feeds_as_declared, run_checkable

    report = DetectionReport(min_iou)
    for feeds in samples:
        sets = []
        for model in (reference, candidate):
            outputs = run_checkable(model, feeds_as_declared(model, dict(feeds)), providers)
            try:
                sets.append(from_outputs(outputs))
            except ValueError as err:
                raise GraphfixError("The model's outputs are not detections", str(err),
                                    "give models whose outputs are NMS results (num, boxes, "
                                    "scores, classes), or drop --detections") from None
        compare_detections(sets[0], sets[1], min_iou, report)
    return report
