"""nms-strategy: what the target TensorRT does with each NMS node, and the pass for it."""

from __future__ import annotations

import numpy as np
import pytest
from doctorhelpers import model, one, vi
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor.findings import INFO, WARN


def _onnx_nms(cap: int | None):
    inits = [numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
    cap_name = ""
    nodes = []
    if cap is not None:
        inits.append(numpy_helper.from_array(np.array([cap], np.int64), "cap"))
        cap_name = "cap"
    else:
        nodes.append(helper.make_node("Shape", ["boxes"], ["cap"], start=1, end=2))
        cap_name = "cap"
    nodes.append(helper.make_node("NonMaxSuppression", ["boxes", "scores", cap_name, "iou"],
                                  ["sel"], name="nms"))
    return model(nodes, [vi("boxes", TensorProto.FLOAT, [1, 10, 4]),
                         vi("scores", TensorProto.FLOAT, [1, 2, 10])],
                 [vi("sel", TensorProto.INT64, ["m", 3])], inits)


def _plugin(op: str):
    node = helper.make_node(op, ["boxes", "scores"], ["n", "b", "s", "c"], name="p",
                            plugin_version="1")
    return model([node], [vi("boxes", TensorProto.FLOAT, [1, 10, 4]),
                          vi("scores", TensorProto.FLOAT, [1, 10, 2])],
                 [vi(x, TensorProto.FLOAT, None) for x in "nbsc"])


def test_old_tensorrt_imports_onnx_nms_as_an_experimental_plugin():
    f = one(_onnx_nms(100), "8.4", "nms-strategy", only=["nms"])
    assert f.severity == WARN and f.nodes == ("NonMaxSuppression 'nms'",)
    assert "experimental EfficientNMS_ONNX_TRT plugin" in f.message
    assert f.fact.startswith("parser notes 8.0-8.4: experimental; imported via plugin")


@pytest.mark.parametrize("cap, severity, says", [
    (100, INFO, ""),
    (np.iinfo(np.int64).max, WARN, "9223372036854775807, beyond INT32"),
    (None, WARN, "max_output_boxes_per_class is computed"),
])
def test_native_nms_names_bound_nms_when_the_cap_is_unbounded(cap, severity, says):
    f = one(_onnx_nms(cap), "10.8", "nms-strategy", only=["nms"])
    assert f.severity == severity
    assert f.message.startswith("TensorRT 10.8 builds NonMaxSuppression natively (INMSLayer)")
    assert says in f.message
    assert f.fix.startswith("bound-nms (a constant per-class cap)")


@pytest.mark.parametrize("op, trt, severity, status", [
    ("EfficientNMS_TRT", "10.8", INFO, "available"),
    ("EfficientNMS_TRT", "10.12", WARN, "deprecated"),
    ("BatchedNMS_TRT", "11.1", WARN, "removed"),
])
def test_nms_plugins_by_their_status(op, trt, severity, status):
    f = one(_plugin(op), trt, "nms-strategy", only=["nms"])
    assert f.severity == severity
    assert f.fact == f"trt_plugins.json: {op} {status}"
    if severity == WARN:
        assert f"{op} is {status} at TensorRT {trt}" in f.message
        assert "ONNX NonMaxSuppression" in f.fix


def test_each_finding_describes_its_traced_region(shared_model):
    import onnx

    f = one(_onnx_nms(100), "10.8", "nms-strategy", only=["nms"])
    assert f.message.endswith(
        "Region: boxes boxes, scores scores; layout [B,C,N], corner boxes; "
        "max_output_boxes_per_class: 100; iou_threshold: 0.5; score_threshold: not given; "
        "tail 0 nodes")
    assert f.tensors == ("boxes", "scores")
    ssd = onnx.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    f = one(ssd, "10.8", "nms-strategy", only=["nms"])
    assert "max_output_boxes_per_class: INT64_MAX; iou_threshold: 0.55" in f.message
    assert "traced through class offset, Concat, score filter, TopK; tail 20 nodes" in f.message
    assert f.tensors == ("/Reshape_output_0", "/Split_1_output_0")


def test_the_fix_names_only_passes_that_can_apply():
    """Before 8.5 a main-graph NMS can become EfficientNMS_TRT (nms-to-plugin); split-nms
    is named only where the region trace found a place to cut."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "nms"))
    import detectors as d

    f = one(d.top_level(), "8.4", "nms-strategy", only=["nms"])
    assert f.fix.startswith("nms-to-plugin (EfficientNMS_TRT instead), or split-nms")
    f = one(d.in_if(), "8.4", "nms-strategy", only=["nms"])
    assert f.fix.startswith("split-nms") and "nms-to-plugin" not in f.fix
    for trt in ("8.4", "10.8"):  # boxes from a Loop that does not hold the NMS: no cut
        f = one(d.boxes_from_loop(), trt, "nms-strategy", only=["nms"])
        assert "split-nms cannot cut before it" in f.message and "split-nms (" not in f.fix
