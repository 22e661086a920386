"""migrate-plugins: the plugins a TensorRT target deprecates or removed become standard ONNX
computing what their reference forms compute; current plugins, plugins without a form and
nodes a form cannot express are left with a reason."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import apply, assert_idempotent, output_types
from onnx import TensorProto, helper, numpy_helper

from graphfix import api
from graphfix.doctor import diagnose
from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.migrate_plugins import MigratePlugins, MigratePluginsOptions
from graphfix.report import APPLIED
from graphfix.runtime import references
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target

F = TensorProto.FLOAT
C = 4
SHAPE = [2, C, 5, 6]
TRT_11 = parse_target("11.1")
STANDARD_OPS = {"Cast", "CastLike", "InstanceNormalization", "LeakyRelu", "Clip", "Reshape",
                "Shape", "Slice", "Concat", "Mul", "Add"}
COUNTS = {"migrated InstanceNormalization_TRT to InstanceNormalization": 1,
          "migrated Clip_TRT to Clip": 1,
          "migrated GroupNormalizationPlugin to GroupNormalization (its InstanceNormalization "
          "form below opset 21)": 1}


def plugins_model(opset_imports=(("", 17), ("trt.plugins", 1))):
    """x -> InstanceNormalization_TRT v1 (domain "") -> Clip_TRT -> GroupNormalizationPlugin
    (domain trt.plugins) -> y, with value_info for the plugin outputs."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("InstanceNormalization_TRT", ["x"], ["a"], name="in", epsilon=1e-5,
                         scales=(rng.random(C) + 0.5).tolist(), bias=rng.standard_normal(C)
                         .tolist(), relu=1, alpha=0.1, plugin_version="1", plugin_namespace=""),
        helper.make_node("Clip_TRT", ["a"], ["b"], name="clip", domain="trt.plugins",
                         clipMin=-0.5, clipMax=0.8),
        helper.make_node("GroupNormalizationPlugin", ["b", "gs", "gb"], ["y"], name="gn",
                         domain="trt.plugins", eps=1e-5, num_groups=2),
    ]
    inits = [numpy_helper.from_array((rng.random(C) + 0.5).astype(np.float32), "gs"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "gb")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, SHAPE)],
        [helper.make_tensor_value_info("y", F, SHAPE)], inits,
        value_info=[helper.make_tensor_value_info(n, F, SHAPE) for n in "ab"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                    for d, v in opset_imports])
    model.ir_version = 8
    return model


def feeds(seed=1):
    return {"x": (np.random.default_rng(seed).standard_normal(SHAPE) * 2).astype(np.float32)}


def expected(model, inputs):
    """The pre-migration model's outputs through its plugins' reference forms."""
    sub = references.substitute(model)
    assert len(sub.replaced) == len(model.graph.node) and not sub.not_checkable
    return references.run(sub, inputs)


def plugin_notes(diagnosis):
    return [f for f in diagnosis.findings if f.rule.startswith(("plugin-", "custom-op"))]


def test_target_11_1_migrates_every_plugin_to_standard_onnx():
    model = plugins_model()
    ctx = PassContext(trt=TRT_11)
    out, result = apply(MigratePlugins(), model, ctx)
    assert result.changed and dict(result.counts) == COUNTS and result.notes == []
    assert {n.op_type for n in out.graph.node} <= STANDARD_OPS
    assert all(n.domain == "" for n in out.graph.node)
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 17)]
    assert output_types(out) == output_types(model)
    assert {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info
            if v.name in "ab"} == {"a": F, "b": F}
    for seed in (1, 2):
        want, got = expected(model, feeds(seed)), run_model(out, feeds(seed))
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
    assert_idempotent(MigratePlugins(), out, ctx)


def test_doctor_names_migrate_plugins_before_and_finds_no_plugin_after():
    model = plugins_model()
    before = plugin_notes(diagnose(model, TRT_11))
    assert {(f.rule, f.op) for f in before} == {
        ("plugin-removed", "trt.plugins::Clip_TRT"),
        ("plugin-deprecated", "trt.plugins::GroupNormalizationPlugin"),
        ("plugin-deprecated", "InstanceNormalization_TRT")}
    command = "graphfix run model.onnx --trt 11.1 --passes migrate-plugins"
    assert all(command in f.fix for f in before)
    clip = next(f for f in before if f.rule == "plugin-removed")
    assert clip.fix == (f"{command} (standard ONNX: Clip); or replace it: "
                        "IActivationLayer kCLIP")
    norm = next(f for f in before if f.op == "InstanceNormalization_TRT")
    assert norm.fix.startswith('set the attribute plugin_version="3"')
    out, _ = apply(MigratePlugins(), model, PassContext(trt=TRT_11))
    assert plugin_notes(diagnose(out, TRT_11)) == []


def test_through_the_api_the_checked_pass_is_kept():
    model = plugins_model()
    result = api.run(model, "migrate-plugins", trt="11.1")
    (record,) = result.report.passes
    assert record.status == APPLIED, record.rollback_reason
    assert record.check.startswith("passed")
    assert record.counts == COUNTS
    assert {n.op_type for n in result.model.graph.node} <= STANDARD_OPS
    got = run_model(result.model, feeds())
    np.testing.assert_allclose(got["y"], expected(model, feeds())["y"], rtol=1e-6, atol=1e-6)


def test_plugins_current_at_the_target_stay_with_a_note():
    model = plugins_model()
    graph = to_graph(model)
    before = fingerprint(graph)
    result = MigratePlugins().run(graph, PassContext(trt=parse_target("8.6")))
    assert not result.changed and not result.counts and fingerprint(graph) == before
    assert [str(n) for n in result.notes] == [
        f"{op} '{name}': {op} version 1 is available at TensorRT 8.6, not deprecated: left "
        "as it is (migrate-plugins{all=true} migrates it anyway)"
        for op, name in (("InstanceNormalization_TRT", "in"), ("Clip_TRT", "clip"),
                         ("GroupNormalizationPlugin", "gn"))]


def test_all_migrates_regardless_of_the_target():
    model = plugins_model()
    for trt in (parse_target("8.6"), None):
        out, result = apply(MigratePlugins(MigratePluginsOptions(all=True)), model,
                            PassContext(trt=trt))
        assert dict(result.counts) == COUNTS
        np.testing.assert_allclose(run_model(out, feeds())["y"], expected(model, feeds())["y"],
                                   rtol=1e-6, atol=1e-6)
    assert MigratePlugins.parse_options([("all", "true")]) == MigratePluginsOptions(all=True)


def test_without_target_or_all_nothing_changes_and_says_so():
    graph = to_graph(plugins_model())
    before = fingerprint(graph)
    result = MigratePlugins().run(graph, PassContext())
    assert not result.changed and fingerprint(graph) == before
    assert [n.subject for n in result.notes] == ["graph"]
    assert result.notes[0].reason.startswith("no TensorRT target: give one (--trt 11.1)")


def test_a_model_importing_only_plugin_domains_gets_the_default_domain():
    node = helper.make_node("Clip_TRT", ["x"], ["y"], name="clip", domain="trt.plugins",
                            clipMin=-1.0, clipMax=1.0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [3, 4])],
                              [helper.make_tensor_value_info("y", F, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("trt.plugins", 1)])
    model.ir_version = 8
    out, result = apply(MigratePlugins(), model, PassContext(trt=TRT_11))
    assert dict(result.counts) == {"migrated Clip_TRT to Clip": 1}
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 17)]
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(run_model(out, {"x": x})["y"], np.clip(x, -1, 1))


def test_refusals_leave_the_node_with_the_reason():
    nodes = [
        helper.make_node("ROIAlign_TRT", ["x", "rois", "bi"], ["r"], name="roi",
                         coordinate_transformation_mode=1, plugin_version="1"),
        helper.make_node("Region_TRT", ["x"], ["g"], name="region", num=5, coords=4,
                         classes=20),
        helper.make_node("LReLU_TRT", ["x"], ["l"], name="lrelu", negSlope=0.1),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 8, 8]),
              helper.make_tensor_value_info("rois", F, [2, 4]),
              helper.make_tensor_value_info("bi", TensorProto.INT32, [2])]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info(n, F, None) for n in "rgl"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    result = MigratePlugins().run(to_graph(model), PassContext(trt=TRT_11))
    assert dict(result.counts) == {"migrated LReLU_TRT to LeakyRelu": 1}
    assert [str(n) for n in result.notes] == [
        "ROIAlign_TRT 'roi': not migrated: RoiAlign with coordinate_transformation_mode=1 "
        "(half_pixel) needs ONNX opset >= 16, the model imports 13: convert it first "
        "(graphfix run --passes opset{version=16})",
        "Region_TRT 'region': graphfix has no standard ONNX form for Region_TRT version 1"]


def test_efficient_nms_is_migrated_with_the_plugin_to_nms_form():
    node = helper.make_node("EfficientNMS_TRT", ["boxes", "scores"],
                            ["num", "det_boxes", "det_scores", "det_classes"], name="nms",
                            score_threshold=0.3, iou_threshold=0.5, max_output_boxes=10,
                            background_class=-1, score_activation=0, box_coding=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("boxes", F, [1, 30, 4]),
                      helper.make_tensor_value_info("scores", F, [1, 30, 3])],
        [helper.make_tensor_value_info("num", TensorProto.INT32, [1, 1]),
         helper.make_tensor_value_info("det_boxes", F, [1, 10, 4]),
         helper.make_tensor_value_info("det_scores", F, [1, 10]),
         helper.make_tensor_value_info("det_classes", TensorProto.INT32, [1, 10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert MigratePlugins().run(to_graph(model), PassContext(trt=parse_target("10.1"))).notes[
        0].reason.startswith("EfficientNMS_TRT version 1 is available at TensorRT 10.1")
    out, result = apply(MigratePlugins(), model, PassContext(trt=TRT_11))
    assert dict(result.counts) == {
        "migrated EfficientNMS_TRT to NonMaxSuppression (the plugin-to-nms form)": 1}
    assert "NonMaxSuppression" in {n.op_type for n in out.graph.node}
    rng = np.random.default_rng(0)
    corner = rng.random((1, 30, 2)).astype(np.float32) * 10
    inputs = {"boxes": np.concatenate([corner, corner + 1 + rng.random((1, 30, 2))
                                       .astype(np.float32) * 5], axis=2),
              "scores": rng.random((1, 30, 3)).astype(np.float32)}
    want = expected(model, inputs)
    for name, value in run_model(out, inputs).items():
        np.testing.assert_array_equal(value, want[name], err_msg=name)


def test_a_plugin_in_an_if_branch_is_migrated():
    clip = helper.make_node("Clip_TRT", ["x"], ["t"], name="clip", domain="trt.plugins",
                            clipMin=0.0, clipMax=0.5)
    then = helper.make_graph([clip], "then", [], [helper.make_tensor_value_info("t", F, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [4])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [4]),
                                            helper.make_tensor_value_info("cond",
                                                                          TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("trt.plugins", 1)])
    model.ir_version = 8
    out, result = apply(MigratePlugins(), model, PassContext(trt=TRT_11))
    assert dict(result.counts) == {"migrated Clip_TRT to Clip": 1}
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["CastLike", "CastLike", "Clip"]
    assert [o.domain for o in out.opset_import] == [""]
    x = np.array([-1, 0.25, 0.75, 2], np.float32)
    got = run_model(out, {"x": x, "cond": np.array(True)})["y"]
    np.testing.assert_array_equal(got, [0, 0.25, 0.5, 0.5])
    onnx.checker.check_model(out, full_check=True)


def test_tensor_attributes_reach_the_form():
    scales = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "scales")
    bias = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "bias")
    node = helper.make_node("InstanceNormalization_TRT", ["x"], ["y"], name="in",
                            epsilon=1e-5, scales=scales, bias=bias, plugin_version="2")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [1, 3, 2, 2])],
                              [helper.make_tensor_value_info("y", F, [1, 3, 2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out, result = apply(MigratePlugins(), model, PassContext(trt=TRT_11))  # v2: 10.12
    assert dict(result.counts) == {"migrated InstanceNormalization_TRT to InstanceNormalization": 1}
    x = np.random.default_rng(3).standard_normal((1, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(run_model(out, {"x": x})["y"], expected(model, {"x": x})["y"],
                               rtol=1e-6, atol=1e-6)
    norm = (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(run_model(out, {"x": x})["y"],
                               norm * [[[[1.0]], [[2.0]], [[3.0]]]] + [[[[0.1]], [[0.2]], [[0.3]]]],
                               rtol=1e-4, atol=1e-4)
