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
