"""Cutting a detector in two (nms.split, nms.parts) and chaining the parts (nms.chain)."""

import json

import detectors as d
import numpy as np
import onnx
import pytest

from graphfix.errors import GraphfixError
from graphfix.nms.chain import SplitModel, load_manifest, run_split, save_split, split_paths
from graphfix.nms.parts import build_parts, tensor_info
from graphfix.nms.split import plan_split
from graphfix.runtime.session import run_model

DATA_DEPENDENT = {"NonMaxSuppression", "NonZero", "If", "Loop", "TopK"}


def split(model):
    plan = plan_split(model)
    assert not isinstance(plan, str), plan
    backbone, nms, manifest = build_parts(model, plan, tensor_info(model), {})
    onnx.checker.check_model(backbone, full_check=True)
    onnx.checker.check_model(nms, full_check=True)
    return plan, SplitModel(nms, manifest, backbone)


def assert_chained_equal(model, parts, feeds, min_rows=2):
    ref, got = run_model(model, feeds), run_split(parts, feeds)
    assert list(got) == [o.name for o in model.graph.output]
    for name, value in ref.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    first = next(iter(ref.values()))
    assert first.shape[0] >= min_rows, "NMS must keep boxes for the test to mean something"


def test_top_level_split_ends_the_backbone_at_boxes_and_scores():
    model = d.top_level()
    plan, parts = split(model)
    assert (plan.cut, plan.passthrough, plan.nms_outputs) == (
        ["boxes", "scores"], [], ["det_boxes", "labels"])
    assert [n.op_type for n in parts.backbone.graph.node if n.op_type != "Constant"] == [
        "MatMul", "Slice", "Slice", "Sigmoid"]
    assert [o.name for o in parts.backbone.graph.output] == ["boxes", "scores"]
    assert {n.op_type for n in parts.nms.graph.node} >= {"Transpose", "NonMaxSuppression"}
    m = parts.manifest
    assert [(t.name, t.dtype, t.shape) for t in m.cut] == [
        ("boxes", "float32", [1, d.N, 4]), ("scores", "float32", [1, d.N, d.C])]
    assert m.outputs == [("det_boxes", "nms"), ("labels", "nms")]
    for seed in range(3):
        assert_chained_equal(model, parts, d.controlled_feeds(seed=seed))


@pytest.mark.parametrize("build", [d.in_if, d.in_loop, d.no_tail, d.two_regions])
def test_split_reproduces_outputs(build):
    model = build()
    plan, parts = split(model)
    assert plan.cut == ["boxes", "scores"]
    ops = {n.op_type for n in parts.backbone.graph.node}
    assert not ops & DATA_DEPENDENT
    b = 2 if build is d.in_loop else 1
    assert_chained_equal(model, parts, d.controlled_feeds(b))


def test_two_regions_cut_before_both():
    plan, parts = split(d.two_regions())
    nms_ops = [n.op_type for n in parts.nms.graph.node]
    assert nms_ops.count("NonMaxSuppression") == 2
    assert len(plan.regions) == 2


def test_non_constant_thresholds_go_to_the_nms_part():
    model = d.input_thresholds()
    plan, parts = split(model)
    assert plan.passthrough == ["iou_in", "score_in"]
    assert parts.manifest.nms_inputs == ["boxes", "scores", "iou_in", "score_in"]
    assert [i.name for i in parts.nms.graph.input] == parts.manifest.nms_inputs
    feeds = {**d.controlled_feeds(), "iou_in": np.array([0.5], np.float32),
             "score_in": np.array([0.2], np.float32)}
    assert_chained_equal(model, parts, feeds)


@pytest.mark.parametrize("build, reason", [
    (d.two_stage, "the post-processing would hold 1 MatMul: a later stage reads an NMS result "
                  "(a two-stage detector), and cutting before the NMS would take it out of "
                  "the backbone"),
    (d.boxes_from_loop, "NonMaxSuppression 'nms': the boxes come from Loop 'box_loop', which "
                        "does not hold this NMS: the cut would have to go before it"),
    (d.plugin, "the NMS is a TensorRT plugin (EfficientNMS_TRT): it runs inside TensorRT, and "
               "split-nms cuts only ONNX NonMaxSuppression"),
])
def test_refusals_say_why(build, reason):
    assert plan_split(build()) == reason


def test_no_nms_is_refused():
    model = d.top_level()
    keep = [n for n in model.graph.node if n.op_type != "NonMaxSuppression"]
    model.graph.ClearField("node")
    model.graph.node.extend(keep)
    assert plan_split(model) == "no NonMaxSuppression in the graph"


def test_save_and_run_from_the_manifest(tmp_path):
    from graphfix import io

    model = d.top_level()
    _, parts = split(model)
    out = tmp_path / "det.onnx"
    io.save(parts.backbone, out)
    paths = save_split(parts, out)
    assert paths == split_paths(out)
    assert (paths.nms.name, paths.manifest.name) == ("det.nms.onnx", "det.split.json")
    data = json.loads(paths.manifest.read_text())
    assert data["schema"] == "graphfix.split/1"
    assert (data["backbone"], data["nms"]) == ("det.onnx", "det.nms.onnx")
    assert data["outputs"] == [{"name": "det_boxes", "from": "nms"},
                               {"name": "labels", "from": "nms"}]
    feeds = d.controlled_feeds()
    ref = run_model(model, feeds)
    for got in (run_split(paths.manifest, feeds), run_split(load_manifest(paths.manifest),
                                                             feeds)):
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name])


def test_a_bad_manifest_is_a_user_error(tmp_path):
    path = tmp_path / "x.split.json"
    path.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(GraphfixError, match="Not a graphfix split manifest"):
        run_split(path, {})
    path.write_text(json.dumps({"schema": "graphfix.split/1"}))
    with pytest.raises(GraphfixError, match="incomplete"):
        load_manifest(path)


def test_ssdlite_split(shared_model):
    model = onnx.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    plan, parts = split(model)
    assert plan.cut == ["/Reshape_output_0", "/Split_1_output_0"]
    assert not {n.op_type for n in parts.backbone.graph.node} & DATA_DEPENDENT
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 320, 320)).astype(np.float32)
    ref, got = run_model(model, {"images": x}), run_split(parts, {"images": x})
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])
