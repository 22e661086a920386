"""Layer-wise check: a TopK that chooses differently among values tied to within
rounding, and what follows it, is not judged on that sample (`check._ties`)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphfix.check.layerwise import compare_layerwise
from graphfix.check.status import TensorStatus

F = TensorProto.FLOAT


def _select(shift: float = 0.0, largest: int = 1):
    """s = x + b; TopK(s, 1) -> v, i; y = Gather(table, i). The candidate adds `shift`
    to b[0] (an ulp: the two largest scores tie), or asks for the smallest value."""
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]),
             helper.make_node("TopK", ["s", "k"], ["v", "i"], axis=0, largest=largest,
                              name="topk"),
             helper.make_node("Gather", ["table", "i"], ["y"], axis=0)]
    bias = np.zeros(4, np.float32)
    bias[0] = shift
    inits = [numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array(np.array([1], np.int64), "k"),
             numpy_helper.from_array(np.array([10.0, 20.0, 30.0, 40.0], np.float32), "table")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("v", F, [1]),
                               helper.make_tensor_value_info("y", F, [1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds():
    ulp = np.spacing(np.float32(1.0))
    return [{"x": np.array([1.0, 1.0 + ulp, 0.0, 0.5], np.float32)},  # a tie, one ulp apart
            {"x": np.array([0.0, 3.0, 1.0, 0.5], np.float32)}]  # no tie


def test_a_flip_among_near_ties_and_what_follows_it_are_not_judged():
    ulp = float(np.spacing(np.float32(1.0)))
    report = compare_layerwise(_select(), _select(shift=ulp), _feeds())
    assert report.passed and report.first_divergence is None
    by_name = {t.name: t for t in report.tensors}
    assert by_name["v"].ok is True  # the values agree: that is the witness of a tie
    for name in ("i", "y"):
        assert by_name[name].status is TensorStatus.ILL_CONDITIONED
        assert by_name[name].ok is None
        assert "TopK 'topk' chose among values tied to within rounding on sample 0" in \
            by_name[name].detail
    assert any("2 tensor(s) not judged" in n for n in report.notes)


def test_a_selection_that_is_not_a_tie_still_fails():
    """Asking for the smallest value changes the values too: no tie, a divergence."""
    report = compare_layerwise(_select(), _select(largest=0), _feeds())
    assert not report.passed
    assert report.first_divergence.name == "v"
    assert not any(t.status is TensorStatus.ILL_CONDITIONED for t in report.tensors)


def test_a_flip_on_one_sample_leaves_a_failure_on_another_judged():
    """Sample 1 has no tie; a bug that shows there still fails the check, even though
    sample 0's flip would excuse the same tensor on sample 0."""
    ulp = float(np.spacing(np.float32(1.0)))
    bad = _select(shift=ulp)
    table = next(t for t in bad.graph.initializer if t.name == "table")
    table.CopyFrom(numpy_helper.from_array(np.array([10.0, 21.0, 30.0, 40.0], np.float32),
                                           "table"))
    report = compare_layerwise(_select(), bad, _feeds())
    assert not report.passed
    assert report.first_divergence.name == "y"


def _nms(shift: float = 0.0, threshold: float = 0.5):
    """s = x + b (scores of three disjoint boxes); NonMaxSuppression keeps those over
    `threshold`; y = Gather(boxes, their indices). The candidate adds `shift` to b[0]:
    x[0] sits a rounding below the threshold, so an ulp keeps one more box."""
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]),
             helper.make_node("Reshape", ["s", "shape"], ["scores"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "thr"],
                              ["sel"], name="nms"),
             helper.make_node("Gather", ["sel", "two"], ["idx"], axis=1),
             helper.make_node("Gather", ["flat", "idx"], ["y"], axis=0)]
    bias = np.zeros(3, np.float32)
    bias[0] = shift
    boxes = np.array([[[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]]], np.float32)
    inits = [numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array(np.array([1, 1, 3], np.int64), "shape"),
             numpy_helper.from_array(boxes, "boxes"),
             numpy_helper.from_array(boxes[0], "flat"),
             numpy_helper.from_array(np.array([10], np.int64), "most"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([threshold], np.float32), "thr"),
             numpy_helper.from_array(np.array(2, np.int64), "two")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info("y", F, [None, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _below_threshold():
    below = np.nextafter(np.float32(0.5), np.float32(0))
    return [{"x": np.array([below, 0.9, 0.1], np.float32)}]


def test_a_selection_witnessed_by_its_inputs_and_what_follows_it_are_not_judged():
    """Keypoint R-CNN's RPN NonMaxSuppression, in small: its scores agree, it keeps
    another number of boxes, and the tensors after it do not even compare by shape."""
    ulp = float(2 * np.spacing(np.float32(0.5)))
    report = compare_layerwise(_nms(), _nms(shift=ulp), _below_threshold())
    assert report.passed and report.first_divergence is None
    by_name = {t.name: t for t in report.tensors}
    assert by_name["scores"].ok is True
    for name in ("sel", "idx", "y"):
        assert by_name[name].status is TensorStatus.ILL_CONDITIONED, name
        assert "NonMaxSuppression 'nms' chose among values tied" in by_name[name].detail


def test_a_selection_with_another_threshold_is_not_a_tie():
    ulp = float(2 * np.spacing(np.float32(0.5)))
    report = compare_layerwise(_nms(), _nms(shift=ulp, threshold=0.4), _below_threshold())
    assert not report.passed
    assert not any(t.status is TensorStatus.ILL_CONDITIONED for t in report.tensors)
