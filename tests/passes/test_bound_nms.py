"""bound-nms: a constant per-class cap on ONNX NonMaxSuppression, in the main graph and in
If bodies; the notes on TensorRT's 5000-candidate limit; the skips and their reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, assert_skips, build_model, init
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.errors import GraphfixError
from graphfix.passes.bound_nms import INT64_MAX, BoundNms, BoundNmsOptions
from graphfix.report import APPLIED, ROLLED_BACK

N = 6


def _nms_model(cap=INT64_MAX, candidates: int | str = N, computed=False, absent=False):
    """boxes [1, N, 4] and scores [1, 2, N] in, selected indices out."""
    inputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, candidates, 4]),
              helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, candidates])]
    inits = [init("iou", np.array([0.5], np.float32)), init("thr", np.array([0.1], np.float32))]
    nodes = []
    if computed:
        nodes.append(helper.make_node("Shape", ["boxes"], ["shape"], start=1, end=2))
        cap_name = "shape"
    elif absent:
        cap_name = ""
    else:
        inits.append(init("cap", np.array([cap], np.int64)))
        cap_name = "cap"
    nodes.append(helper.make_node("NonMaxSuppression", ["boxes", "scores", cap_name, "iou",
                                                        "thr"], ["selected"], name="nms"))
    out = [helper.make_tensor_value_info("selected", TensorProto.INT64, ["m", 3])]
    return build_model(nodes, inputs, out, inits, checked=False)


def _feeds(survivors: int = 4):
    """N disjoint boxes (nothing suppresses anything); `survivors` of them score over 0.1
    in class 0, one in class 1."""
    boxes = np.array([[[i * 10, 0, i * 10 + 5, 5] for i in range(N)]], np.float32)
    scores = np.zeros((1, 2, N), np.float32)
    scores[0, 0, :survivors] = np.linspace(0.9, 0.5, survivors)
    scores[0, 1, N - 1] = 0.8
    return {"boxes": boxes, "scores": scores}


def _cap_of(model: onnx.ModelProto) -> int:
    nms = next(n for n in model.graph.node if n.op_type == "NonMaxSuppression")
    const = next(i for i in model.graph.initializer if i.name == nms.input[2])
    return int(numpy_helper.to_array(const)[0])


def test_an_int64_max_cap_becomes_the_constant_max():
    model = _nms_model()
    out, result = apply(BoundNms(BoundNmsOptions(max=100)), model)
    assert dict(result.counts) == {"capped max_output_boxes_per_class at 100": 1}
    assert result.notes == []  # 6 candidates: under TensorRT's 5000
    assert [n.op_type for n in out.graph.node] == ["NonMaxSuppression"]
    assert _cap_of(out) == 100
    assert_same_outputs(model, out, _feeds())
    assert_idempotent(BoundNms(BoundNmsOptions(max=100)), out)


def test_a_cap_below_the_survivors_changes_the_result_and_the_check_rolls_it_back(tmp_path):
    model = _nms_model()
    data = tmp_path / "nms.npz"
    np.savez(data, **_feeds(survivors=4))
    kept = graphfix.run(model, passes="bound-nms{max=4}", data=str(data))
    assert kept.report.passes[0].status == APPLIED
    cut = graphfix.run(model, passes="bound-nms{max=2}", data=str(data))
    (record,) = cut.report.passes
    assert record.status == ROLLED_BACK
    assert record.rollback_reason.startswith("outputs differ: selected: shape changed")


def test_inside_an_if_branch():
    inner = _nms_model().graph
    branch = helper.make_graph(list(inner.node), "then", [], list(inner.output),
                               list(inner.initializer))
    other = helper.make_graph([helper.make_node("Constant", [], ["selected_e"],
                                                value=numpy_helper.from_array(
                                                    np.zeros((0, 3), np.int64)))],
                              "else", [], [helper.make_tensor_value_info(
                                  "selected_e", TensorProto.INT64, ["m", 3])])
    model = build_model(
        [helper.make_node("If", ["c"], ["selected"], then_branch=branch, else_branch=other)],
        [*inner.input, helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, ["m", 3])], [],
        checked=False)
    out, result = apply(BoundNms(), model)
    assert dict(result.counts) == {"capped max_output_boxes_per_class at 100": 1}
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    nms = next(n for n in then.node if n.op_type == "NonMaxSuppression")
    cap = next(i for i in then.initializer if i.name == nms.input[2])
    assert numpy_helper.to_array(cap).tolist() == [100]
    feeds = {**_feeds(), "c": np.array(True)}
    assert_same_outputs(model, out, feeds)


@pytest.mark.parametrize("kwargs, reason", [
    ({"cap": 50}, "its max_output_boxes_per_class is already the constant 50"),
    ({"absent": True}, "no max_output_boxes_per_class: ONNX's default 0 selects nothing, "
                       "a bound"),
    ({"computed": True}, "its max_output_boxes_per_class is computed by the graph; "
                         "bound-nms{force=true} replaces it with the constant max"),
])
def test_skips_with_reasons(kwargs, reason):
    assert_skips(BoundNms(), _nms_model(**kwargs), "NonMaxSuppression 'nms'", reason)


def test_force_replaces_a_computed_cap():
    out, result = apply(BoundNms(BoundNmsOptions(max=3, force=True)), _nms_model(computed=True))
    assert result.counts["capped max_output_boxes_per_class at 3"] == 1
    assert _cap_of(out) == 3


@pytest.mark.parametrize("candidates, told", [(6000, "6000 candidate boxes"),
                                              ("n", "a candidate count the graph does not tell")])
def test_more_candidates_than_tensorrt_considers_are_noted(candidates, told):
    _, result = apply(BoundNms(), _nms_model(candidates=candidates))
    assert result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [(
        "NonMaxSuppression 'nms'", f"it gets {told}: TensorRT's NMS layer considers only the "
        "top 5000 per image (2000 on SM 5.3/6.2); keep the candidates below that with a TopK "
        "before it")]


def test_no_nms_and_bad_option():
    model = build_model([helper.make_node("Relu", ["x"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [])
    assert_skips(BoundNms(), model, "graph", "no ONNX NonMaxSuppression")
    with pytest.raises(GraphfixError, match="must be at least 1"):
        BoundNmsOptions(max=0)


def test_ssdlite_nms_in_its_if_branch_is_bounded(shared_model):
    """SSDlite keeps 300 boxes per image on random inputs (torchvision: 300 candidates per
    class, 300 detections per image): a cap of 100 drops some, and the check says so."""
    model = onnx.load(str(shared_model("ssdlite320_mobilenet_v3_large.onnx")))
    (dropped,) = graphfix.run(model, passes="bound-nms").report.passes
    assert dropped.status == ROLLED_BACK
    assert "boxes: shape changed (300, 4) -> (100, 4)" in dropped.rollback_reason
    (kept,) = graphfix.run(model, passes="bound-nms{max=300}").report.passes
    assert kept.status == APPLIED and kept.check == "passed (exact)"
    assert kept.counts == {"capped max_output_boxes_per_class at 300": 1}
