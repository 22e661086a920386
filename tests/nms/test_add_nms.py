"""add-nms on tiny detectors built in code, then plugin-to-nms on its EfficientNMS form."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from nmshelpers import apply
from onnx import helper, numpy_helper

from graphfix.graph import to_graph
from graphfix.nms.compare import compare_detections, from_efficient
from graphfix.nms.heads import find_head
from graphfix.nms.reference import corners, nms_batch
from graphfix.passes.add_nms import OUTPUTS, AddNms, AddNmsOptions, choose_form
from graphfix.passes.base import PassContext
from graphfix.passes.manager import run_passes
from graphfix.passes.plugin_to_nms import PluginToNms
from graphfix.plugins.nodes import problems
from graphfix.report import APPLIED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck, run_checkable
from graphfix.trt import parse_target, plugin_for

C, B, HW = 3, 2, 12
N = HW * HW


def detector(style: str = "yolov8") -> onnx.ModelProto:
    """A conv net whose head is [B, 4+C, N] (yolov8) or [B, N, 5+C] (yolov5): centres over a
    96-pixel image, sizes 8..40, sigmoid scores (about half above 0.25)."""
    rng = np.random.default_rng(0)
    ch = 4 + C + (style == "yolov5")
    v5 = style == "yolov5"  # box-major from the start: [B, N, ch], concatenated on axis 2
    w = (rng.standard_normal((ch, 3, 3, 3)) * 0.6).astype(np.float32)
    vec = (1, 1, 4) if v5 else (1, 4, 1)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([96, 96, 32, 32], np.float32).reshape(vec),
                                     "scale"),
             numpy_helper.from_array(np.array([0, 0, 8, 8], np.float32).reshape(vec), "offset"),
             numpy_helper.from_array(np.array([B, ch, N], np.int64), "flat")]
    axis = 2 if v5 else 1
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "flat"], ["r0"]),
             helper.make_node("Transpose" if v5 else "Identity", ["r0"], ["r"],
                              **({"perm": [0, 2, 1]} if v5 else {})),
             helper.make_node("Sigmoid", ["r"], ["s"]),
             helper.make_node("Split", ["s"], ["box", "cls"], axis=axis, split=[4, ch - 4]),
             helper.make_node("Mul", ["box", "scale"], ["bs"]),
             helper.make_node("Add", ["bs", "offset"], ["bo"]),
             helper.make_node("Concat", ["bo", "cls"], ["head"], axis=axis)]
    out_shape = [B, N, ch] if v5 else [B, ch, N]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", 1, [B, 3, HW, HW])],
                              [helper.make_tensor_value_info("head", 1, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def numpy_detections(model, feeds, style):
    raw = run_checkable(model, feeds)["head"]
    x = raw.transpose(0, 2, 1) if style == "yolov8" else raw
    scores = x[..., 5:] * x[..., 4:5] if style == "yolov5" else x[..., 4:]
    return nms_batch(corners(x[..., :4]), scores, 100, 0.25, 0.45)


def detections(model, feeds):
    out = run_checkable(model, feeds)
    return from_efficient(*(out[n] for n in OUTPUTS))


def random_images(seed):
    return {"x": np.random.default_rng(seed).standard_normal((B, 3, HW, HW)).astype(np.float32)}


def assert_same(a, b):
    report = compare_detections(a, b)
    assert report.ok, report.describe()
    assert report.count_a > 20


@pytest.mark.parametrize("style", ["yolov8", "yolov5"])
@pytest.mark.parametrize("trt, op", [("10.8", "EfficientNMS_TRT"), ("11.1", "NonMaxSuppression")])
def test_add_nms_matches_numpy_nms(style, trt, op):
    model = detector(style)
    out, result = apply(AddNms(), model, trt)
    assert result.changed and result.verified, result.notes
    assert op in [n.op_type for n in out.graph.node]
    assert [o.name for o in out.graph.output] == list(OUTPUTS)
    if op == "EfficientNMS_TRT":  # built by plugins.nodes: valid for the target
        node = next(n for n in out.graph.node if n.op_type == op)
        assert problems(node, plugin_for(op), parse_target(trt)) == []
    for seed in (10, 11, 12):
        feeds = random_images(seed)
        assert_same(detections(out, feeds), numpy_detections(model, feeds, style))
    if op == "EfficientNMS_TRT":  # round trip to a standard model with the same detections
        std, res2 = apply(PluginToNms(), out)
        assert res2.changed and "EfficientNMS_TRT" not in [n.op_type for n in std.graph.node]
        onnx.checker.check_model(std, full_check=True)
        for seed in (10, 11):
            feeds = random_images(seed)
            a, b = run_checkable(out, feeds), run_checkable(std, feeds)
            for name in OUTPUTS:
                np.testing.assert_array_equal(a[name], b[name])
            assert_same(detections(std, feeds), numpy_detections(model, feeds, style))
    again = AddNms().run(to_graph(out), PassContext())
    assert not again.changed and again.notes


def test_heads_are_recognised_with_reasons():
    head = find_head(to_graph(detector("yolov8")))
    assert head.style == "yolov8" and head.num_classes == C and not head.objectness
    head = find_head(to_graph(detector("yolov5")))
    assert head.style == "yolov5" and head.objectness and head.num_classes == C
    model = detector()
    model.graph.output[0].type.tensor_type.shape.dim[2].dim_param = "n"
    assert find_head(to_graph(model)).channel_major  # symbolic N: the Concat on axis 1 says
    model.graph.output.append(helper.make_tensor_value_info("c", 1, None))
    extra = to_graph(model)
    extra.outputs[1].shape = [B, 8, N]
    assert "exactly one" in find_head(extra)


def test_form_follows_the_trt_target():
    assert choose_form(parse_target("10.8"))[0] == "efficient"
    form, why = choose_form(parse_target("10.12"))
    assert form == "onnx" and "deprecated since 10.12" in why
    assert choose_form(None)[0] == "onnx"
    assert choose_form(parse_target("10.12"), "efficient")[0] == "efficient"


def test_refuses_when_its_check_fails(monkeypatch):
    import graphfix.nms.compare as compare

    monkeypatch.setattr(compare, "DEFAULT_MIN_IOU", 1.5)  # no box can match: the check fails
    out, result = apply(AddNms(AddNmsOptions(form="onnx")), detector())
    assert not result.changed and "not added" in str(result.notes[0])
    assert [o.name for o in out.graph.output] == ["head"]


def test_manager_accepts_it_as_a_pass_that_changes_outputs():
    model = detector()
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model), {}))
    out, report = run_passes(model, [("add-nms", AddNms(AddNmsOptions(form="onnx")))], check,
                             PassContext())
    assert report.passes[0].status == APPLIED, report.passes[0].rollback_reason
    assert [o.name for o in out.graph.output] == list(OUTPUTS)


def test_check_detections_from_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from graphfix.cli.app import app

    plugin, _ = apply(AddNms(), detector(), "10.8")
    std, _ = apply(PluginToNms(), plugin)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(std)
    iou = next(t for t in wrong.graph.initializer if t.data_type == 1 and t.dims == [1]
               and 0.4 < numpy_helper.to_array(t)[0] < 0.5)  # the IoU threshold, 0.45
    iou.CopyFrom(numpy_helper.from_array(np.array([0.2], np.float32), iou.name))
    paths = []
    for name, model in (("plugin", plugin), ("std", std), ("wrong", wrong)):
        paths.append(str(tmp_path / f"{name}.onnx"))
        onnx.save(model, paths[-1])
    runner = CliRunner()
    ok = runner.invoke(app, ["check", paths[0], paths[1], "--detections"])
    assert ok.exit_code == 0, ok.output
    assert "detections match" in ok.output and "matched 100.0% / 100.0%" in ok.output
    bad = runner.invoke(app, ["check", paths[1], paths[2], "--detections"])
    assert bad.exit_code == 1 and "DIFFER" in bad.output


def _ultralytics_head(extra: str | None) -> onnx.ModelProto:
    """ultralytics' head layout: Concat(boxes, Sigmoid(classes)[, extra]) on axis 1; with
    `extra` "keypoints" a raw Conv part follows the scores (pose: 51 keypoint channels,
    here 6), with "protos" the model also outputs [B, 32, H, W] mask prototypes."""
    rng = np.random.default_rng(0)
    ch = 4 + C + (6 if extra == "keypoints" else 0)
    inits = [numpy_helper.from_array((rng.standard_normal((ch, 3, 3, 3)) * 0.6).astype(
                 np.float32), "w"),
             numpy_helper.from_array(np.array([B, ch, N], np.int64), "flat")]
    parts = ["box", "cls"] + (["kpt"] if extra == "keypoints" else [])
    splits = [4, C] + ([6] if extra == "keypoints" else [])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "flat"], ["r"]),
             helper.make_node("Split", ["r"], ["box_raw", "cls_raw"] + parts[2:], axis=1,
                              split=splits),
             helper.make_node("Mul", ["box_raw", "box_raw"], ["box"]),
             helper.make_node("Sigmoid", ["cls_raw"], ["cls"]),
             helper.make_node("Concat", parts, ["head"], axis=1)]
    outputs = [helper.make_tensor_value_info("head", 1, [B, ch, N])]
    if extra == "protos":
        nodes.append(helper.make_node("Relu", ["c"], ["protos"]))
        outputs.append(helper.make_tensor_value_info("protos", 1, [B, ch, HW, HW]))
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", 1, [B, 3, HW, HW])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_plain_ultralytics_head_is_a_detection_head():
    head = find_head(to_graph(_ultralytics_head(None)))
    assert head.num_classes == C and head.channel_major


@pytest.mark.parametrize("extra, reason", [
    ("keypoints", "the head 'head' concatenates 'kpt' (Split) after its class scores (the "
                  "Sigmoid 'cls'): keypoints, mask coefficients or an angle (a pose, "
                  "segmentation or oriented-box head), which add-nms would score as classes "
                  "and drop from its outputs; not added"),
    ("protos", f"besides the head 'head', output 'protos' [{B}, {4 + C}, {HW}, {HW}] has rank "
               "4, like a segmentation model's mask prototypes: the head's channels after "
               "the class scores would then be mask coefficients, which add-nms would score "
               "as classes; not added"),
])
def test_pose_and_segmentation_heads_are_refused(extra, reason):
    """Probe 4: a YOLOv8-pose head's 51 keypoint channels were NMSed as classes, its
    scores were pixel coordinates, and the pass said it verified itself."""
    model = _ultralytics_head(extra)
    assert find_head(to_graph(model)) == reason
    graph = to_graph(model)
    result = AddNms().run(graph, PassContext())
    assert not result.changed and [n.reason for n in result.notes] == [reason]
