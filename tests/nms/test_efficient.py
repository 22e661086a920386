"""EfficientNMS_TRT / BatchedNMS(Dynamic)_TRT decompositions against a plain numpy NMS."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from nmshelpers import efficient_attrs, numpy_efficient_nms, plugin_model, random_inputs
from onnx import helper

from graphfix.nms.efficient import efficient_nms, onnx_threshold, scalar
from graphfix.runtime import references
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck, run_checkable
from graphfix.runtime.references import Unavailable
from graphfix.runtime.session import run_model


def _run(model, feeds):
    sub = references.substitute(model)
    assert not sub.not_checkable, sub.not_checkable
    onnx.checker.check_model(sub.model, full_check=True)
    return list(run_model(sub.model, feeds).values())


def _assert_equal(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


CASES = [
    dict(),
    dict(background_class=1),
    dict(class_agnostic=1),
    dict(box_coding=1),
    dict(score_activation=1, score_threshold=0.6),
    dict(max_output_boxes=4),
    dict(max_output_boxes=200),  # more than C*N candidates: padded
]


@pytest.mark.parametrize("extra", CASES, ids=[str(c) or "default" for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_efficient_nms_matches_numpy(extra, seed):
    attrs = efficient_attrs(**extra)
    k = attrs["max_output_boxes"]
    model = plugin_model(b=3, k=k, **attrs)
    feeds = random_inputs(3, 40, 3, seed, centre_size=attrs["box_coding"] == 1,
                          ties=attrs["score_threshold"])
    want = numpy_efficient_nms(feeds["boxes"], feeds["scores"], k, attrs["score_threshold"],
                               attrs["iou_threshold"], attrs["background_class"],
                               bool(attrs.get("class_agnostic", 0)), attrs["box_coding"],
                               bool(attrs["score_activation"]))
    got = _run(model, feeds)
    if attrs["score_activation"]:  # sigmoid in float64 (numpy) vs float32 (onnxruntime)
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=0)
        got[2], want = want[2], want
    _assert_equal(got, want)
    assert (got[0] > 0).all()


def test_ties_at_both_thresholds_are_kept_and_suppressed():
    """score == threshold is kept, IoU == threshold suppresses (>=, unlike ONNX's >)."""
    boxes = np.array([[[0, 0, 2, 1], [0, 0, 1, 1], [5, 5, 6, 6]]], np.float32)  # IoU(0,1)=0.5
    scores = np.array([[[0.9], [0.8], [0.5]]], np.float32)
    model = plugin_model(b=1, n=3, c=1, k=3, **efficient_attrs(k=3, score=0.5, iou=0.5))
    num, out_boxes, out_scores, _ = _run(model, {"boxes": boxes, "scores": scores})
    assert num.tolist() == [[2]]
    np.testing.assert_array_equal(out_scores, np.array([[0.9, 0.5, 0.0]], np.float32))
    np.testing.assert_array_equal(out_boxes[0, 1], [5, 5, 6, 6])
    assert onnx_threshold(0.5) == float(np.nextafter(np.float32(0.5), np.float32(-1)))


def test_list_attributes_read_as_scalars_and_old_opsets():
    """yolov7's INTS [1] attributes; opset 12 (Unsqueeze/ReduceSum axes as attributes)."""
    attrs = efficient_attrs(box_coding=[1], background_class=[-1])
    model = plugin_model(opset=12, domain="TRT", **attrs)
    feeds = random_inputs(2, 40, 3, 3, centre_size=True)
    want = numpy_efficient_nms(feeds["boxes"], feeds["scores"], 10, 0.3, 0.5, box_coding=1)
    _assert_equal(_run(model, feeds), want)
    assert scalar([7]) == 7 and scalar(0.5) == 0.5


@pytest.mark.parametrize("attrs, why", [
    (efficient_attrs(iou=0.0), "must be > 0"),
    ({"score_threshold": 0.5}, "needs the attributes"),
])
def test_refusals_have_reasons(attrs, why):
    node = helper.make_node("EfficientNMS_TRT", ["b", "s"], ["n", "bx", "sc", "cl"], **attrs)
    with pytest.raises(Unavailable, match=why):
        efficient_nms(node, 17)
    node = helper.make_node("EfficientNMS_TRT", ["b", "s", "a"], ["n", "bx", "sc", "cl"],
                            **efficient_attrs())
    with pytest.raises(Unavailable, match="anchors"):
        efficient_nms(node, 17)
    with pytest.raises(Unavailable, match="opset"):
        efficient_nms(helper.make_node("EfficientNMS_TRT", ["b", "s"], ["n", "bx", "sc", "cl"],
                                       **efficient_attrs()), 10)


def _batched_attrs(**extra):
    attrs = dict(shareLocation=1, backgroundLabelId=-1, numClasses=3, topK=100, keepTopK=10,
                 scoreThreshold=0.3, iouThreshold=0.5, isNormalized=1, clipBoxes=0)
    attrs.update(extra)
    return attrs


@pytest.mark.parametrize("op", ["BatchedNMS_TRT", "BatchedNMSDynamic_TRT"])
@pytest.mark.parametrize("top_k", [100, 5])
def test_batched_nms_matches_numpy(op, top_k):
    model = plugin_model(op, box_rank=4, **_batched_attrs(topK=top_k, keepTopK=min(top_k, 10)))
    feeds = random_inputs(2, 40, 3, 5, ties=0.3)
    feeds["boxes"] = feeds["boxes"][:, :, None, :]
    scores = feeds["scores"].copy()
    if top_k < 40:  # only each class's top_k best boxes take part
        order = np.argsort(-scores, axis=1, kind="stable")
        np.put_along_axis(scores, order[:, top_k:], 0.0, axis=1)
    strict = float(np.nextafter(np.float32(0.3), np.float32(1)))  # x > t  is  x >= next(t)
    iou = float(np.nextafter(np.float32(0.5), np.float32(2)))
    num, boxes, out_scores, classes = numpy_efficient_nms(
        feeds["boxes"][:, :, 0], scores, min(top_k, 10), strict, iou)
    classes = np.where(np.arange(classes.shape[1]) < num, classes, -1).astype(np.float32)
    want = [num.reshape(-1) if op == "BatchedNMS_TRT" else num, boxes, out_scores, classes]
    _assert_equal(_run(model, feeds), want)


@pytest.mark.parametrize("extra, why", [
    (dict(isNormalized=0), "caffeSemantics"),
    (dict(clipBoxes=1), "clipBoxes"),
    (dict(keepTopK=200), "keepTopK"),
])
def test_batched_refusals(extra, why):
    model = plugin_model("BatchedNMSDynamic_TRT", box_rank=4, **_batched_attrs(**extra))
    sub = references.substitute(model)
    assert len(sub.not_checkable) == 1 and why in sub.not_checkable[0]


def test_output_check_runs_a_model_with_efficient_nms():
    model = plugin_model(**efficient_attrs())
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model), {}))
    assert check.enabled, check.skipped_reason
    assert check.verify(model).ok
    feeds = random_inputs(2, 40, 3, 0)
    assert list(run_checkable(model, feeds)) == [o.name for o in model.graph.output]


def test_providers_are_in_the_default_registry():
    keys = {(r.domain, r.op_type) for r in references.registered()}
    assert {("trt.plugins", "EfficientNMS_TRT"), ("trt.plugins", "BatchedNMS_TRT"),
            ("trt.plugins", "BatchedNMSDynamic_TRT")} <= keys
