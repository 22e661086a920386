"""Doctor's plugin rules: known TensorRT plugins and their status per version, their
attributes, and custom ops nothing implements."""

from __future__ import annotations

from doctorhelpers import findings, model, vi
from onnx import TensorProto as TP
from onnx import helper

from graphfix.doctor.rules_plugins import handles
from graphfix.doctor.view import ModelView
from graphfix.trt import parse_target

F = TP.FLOAT
ONLY = ["plugins"]
NMS_ATTRS = {"score_threshold": 0.25, "iou_threshold": 0.45, "max_output_boxes": 100,
             "background_class": -1, "score_activation": 0, "box_coding": 0}


def custom(op, domain="", inputs=("x",), outputs=("y",), name="p", **attrs):
    node = helper.make_node(op, list(inputs), list(outputs), name=name, domain=domain, **attrs)
    return model([node], [vi(i, F, [1, 4]) for i in inputs], [vi(o, F, None) for o in outputs],
                 domains=[domain] if domain else ())


def nms(domain="", **attrs):
    return custom("EfficientNMS_TRT", domain, ("boxes", "scores"),
                  ("num", "det_boxes", "det_scores", "det_classes"), name="nms",
                  **{**NMS_ATTRS, **attrs})


def rules(m, trt):
    return [(f.rule, f.severity) for f in findings(m, trt, ONLY)]


def one(m, trt, rule):
    found = [f for f in findings(m, trt, ONLY) if f.rule == rule]
    assert len(found) == 1, findings(m, trt, ONLY)
    return found[0]


def test_efficient_nms_is_available_before_10_12_and_deprecated_from_it():
    m = nms()
    f = one(m, "10.1", "plugin-available")
    assert (f.severity, f.nodes, f.op) == ("info", ("EfficientNMS_TRT 'nms'",), "EfficientNMS_TRT")
    assert "plugin versions 1" in f.fact and "libnvinfer_plugin" in f.fact
    assert rules(m, "10.1") == [("plugin-available", "info")]
    d = one(m, "10.12", "plugin-deprecated")
    assert (d.severity, d.nodes) == ("warn", ("EfficientNMS_TRT 'nms'",))
    assert "deprecated since TensorRT 10.12" in d.message
    assert d.fix.startswith("replace it: INMSLayer")
    assert rules(nms("trt.plugins"), "10.16") == [("plugin-deprecated", "warn")]


def test_batched_nms_is_available_deprecated_then_removed():
    m = custom("BatchedNMS_TRT", "", ("boxes", "scores"), ("n",), name="bnms",
               shareLocation=1, backgroundLabelId=-1, numClasses=80, topK=100, keepTopK=100,
               scoreThreshold=0.25, iouThreshold=0.5)
    assert rules(m, "8.6") == [("plugin-available", "info")]
    assert rules(m, "10.16") == [("plugin-deprecated", "warn")]
    f = one(m, "11.1", "plugin-removed")
    assert (f.severity, f.nodes) == ("error", ("BatchedNMS_TRT 'bnms'",))
    assert "removed in 11.0" in f.fact and f.fix == "replace it: INMSLayer"


def test_plugin_input_count_is_checked_against_the_spec():
    m = custom("ROIAlign_TRT", "", ("x", "rois"), ("y",), name="roi", output_height=7,
               output_width=7, sampling_ratio=0, spatial_scale=0.25, mode=1,
               coordinate_transformation_mode=1)
    f = one(m, "10.1", "plugin-attribute")
    assert "2 inputs where the plugin takes 3 (X, rois, batch_indices)" in f.message
    ok = custom("ROIAlign_TRT", "", ("x", "rois", "idx"), ("y",), name="roi", output_height=7)
    assert "plugin-attribute" not in {r for r, _ in rules(ok, "10.1")}


def test_plugin_attributes_one_finding_listing_every_problem():
    m = nms(score_threshold=0, plugin_version="2")
    del m.graph.node[0].attribute[[a.name for a in m.graph.node[0].attribute].index(
        "iou_threshold")]
    f = one(m, "10.1", "plugin-attribute")
    assert (f.severity, f.nodes) == ("error", ("EfficientNMS_TRT 'nms'",))
    assert 'plugin_version "2" is not one of the plugin\'s versions (1)' in f.message
    assert "required iou_threshold (float32 (ONNX FLOAT)) is missing" in f.message
    assert "score_threshold is INT (the parser passes kINT32)" in f.message
    assert "INT->kINT32" in f.fact
    assert f.fix.startswith("give the node the plugin's inputs, set each listed attribute")
    assert one(nms(), "10.1", "plugin-available")  # and no plugin-attribute
    assert "plugin-attribute" not in {r for r, _ in rules(nms(), "10.1")}


def test_a_field_newer_than_the_target_is_reported():
    m = nms(class_agnostic=1)
    f = one(m, "8.5", "plugin-attribute")
    assert "class_agnostic is a field only from TensorRT 8.6" in f.message
    assert "plugin-attribute" not in {r for r, _ in rules(m, "8.6")}


def test_array_field_length_and_tensor_dtype():
    m = custom("ModulatedDeformConv2d", "", name="dcn", plugin_version="2",
               stride=[1, 1, 1], group=1)
    f = one(m, "10.16", "plugin-attribute")
    assert f.message.endswith("stride has 3 values; the field is int32[2]")
    t = helper.make_tensor("t", TP.INT64, [1], [3])
    bad = custom("ModulatedDeformConv2d", "", name="dcn", plugin_version="2", group=t)
    assert "group is a INT64 TENSOR, which the parser rejects" in one(
        bad, "10.16", "plugin-attribute").message


def test_deprecated_plugin_version_by_default():
    m = custom("ROIAlign_TRT", "", ("x", "rois", "idx"), name="roi")  # plugin_version "1"
    f = one(m, "10.16", "plugin-deprecated")
    assert (f.severity, f.nodes) == ("warn", ("ROIAlign_TRT 'roi'",))
    assert f.fix.startswith('set the attribute plugin_version="2"')
    assert rules(m, "10.1") == [("plugin-available", "info")]
    assert rules(custom("ROIAlign_TRT", "", ("x", "r", "i"), plugin_version="2"), "10.16") == [
        ("plugin-available", "info")]
    norm = custom("InstanceNormalization_TRT", "", name="inorm")  # v1 10.3, v2 10.12
    assert one(norm, "10.5", "plugin-deprecated").message.endswith("current: 2, 3")
    assert one(norm, "10.16", "plugin-deprecated").message.endswith("current: 3")


def test_unknown_custom_op_needs_a_plugin():
    m = custom("FancyOp", "my.ops", name="fancy", plugin_namespace="acme")
    f = one(m, "10.16", "custom-op-unknown")
    assert (f.severity, f.nodes, f.op) == ("error", ("FancyOp 'fancy'",), "my.ops::FancyOp")
    assert "creator is named 'FancyOp', version '1', namespace 'acme'" in f.fix
    assert "domain 'my.ops'" in f.fix
    assert "plugin_version" in f.fact
    assert "domain" not in one(m, "8.6", "custom-op-unknown").fix


def test_standard_domain_custom_op_and_onnx_ops_named_like_plugins():
    f = one(custom("MyCustomThing", name="thing"), "10.16", "custom-op-unknown")
    assert f.nodes == ("MyCustomThing 'thing'",) and f.op == "MyCustomThing"
    split = model([helper.make_node("Split", ["x"], ["a", "b"], name="s", axis=1,
                                    num_outputs=2)],
                  [vi("x", F, [1, 4])], [vi("a", F, [1, 2]), vi("b", F, [1, 2])], opset=18)
    assert findings(split, "10.16", ONLY) == []  # the ONNX op, not the legacy plugin
    legacy = custom("Split", "legacy", name="s")
    assert rules(legacy, "10.16") == [("plugin-deprecated", "warn")]
    assert rules(legacy, "11.1") == [("plugin-removed", "error")]


def test_handles_is_what_op_support_should_skip():
    m = model([helper.make_node("EfficientNMS_TRT", ["x"], ["y"], name="a"),
               helper.make_node("Relu", ["x"], ["z"], name="b"),
               helper.make_node("ScaledTanh", ["x"], ["w"], name="c"),
               helper.make_node("Gelu", ["x"], ["v"], name="d", domain="com.microsoft")],
              [vi("x", F, [2])], [vi("y", F, None)], domains=["com.microsoft"])
    target = parse_target("10.16")
    assert [handles(r, target) for r in ModelView.of(m).nodes] == [True, False, False, False]
    found = findings(m, "10.16", ONLY)  # no attributes: the six required ones are missing
    assert [(f.rule, f.nodes) for f in found] == [
        ("plugin-attribute", ("EfficientNMS_TRT 'a'",)),
        ("plugin-deprecated", ("EfficientNMS_TRT 'a'",))]


def test_trt_11_custom_ops_exist_only_from_11_1():
    m = custom("TRT_Attention", "trt", ("q", "k", "v"), name="attn")
    assert rules(m, "11.1") == [("plugin-available", "info")]
    f = one(m, "10.16", "custom-op-unknown")
    assert f.fix.startswith("target TensorRT 11.1 or newer")


def test_local_functions_are_inlined_from_9_0():
    body = helper.make_function("pkg", "Block", ["a"], ["b"],
                                [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 17)])
    m = custom("Block", "pkg", name="blk")
    m.functions.append(body)
    assert findings(m, "10.16", ONLY) == []
    f = one(m, "8.6", "custom-op-unknown")
    assert f.nodes == ("Block 'blk'",) and "local_functions" in f.fact
    assert f.fix.startswith("inline-functions")


def test_node_inside_an_if_branch_is_named_with_its_path():
    inner = helper.make_node("FancyOp", ["x"], ["t"], name="inner", domain="my.ops")
    then = helper.make_graph([inner], "then", [], [vi("t", F, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")],
                              "else", [], [vi("e", F, [2])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then,
                            else_branch=other)
    m = model([node], [vi("c", TP.BOOL, []), vi("x", F, [2])], [vi("y", F, [2])],
              domains=["my.ops"])
    f = one(m, "10.16", "custom-op-unknown")
    assert f.nodes == ("If 'branch'.then_branch > FancyOp 'inner'",)


def test_models_without_plugins_have_no_findings():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r"),
               helper.make_node("Gelu", ["y"], ["z"], name="g", domain="com.microsoft")],
              [vi("x", F, [2])], [vi("z", F, [2])], domains=["com.microsoft"])
    for trt in ("8.6", "10.16", "11.1"):
        assert findings(m, trt, ONLY) == []
