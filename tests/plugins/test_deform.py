"""Deformable convolution in the forms real exporters write: the numpy kernel against
onnxruntime's DeformConv, the mmcv and torchvision custom ops checked through their
reference forms and substituted by ModulatedDeformConv2d, and doctor's advice.

The exports in data/ were made by mmcv 2.2.0's and torchvision 0.28's own export code
(data/export_deform.py says how); the two torchvision exports with "mask" in their name hold
the same seeded weights, one as the custom op (TorchScript exporter), one as DeformConv
(dynamo exporter)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper
from typer.testing import CliRunner

from graphfix import api
from graphfix.cli.app import app
from graphfix.plugins.deform import deform_conv2d
from graphfix.plugins.nodes import problems
from graphfix.runtime import references
from graphfix.trt import parse_target, plugin_for

DATA = pathlib.Path(__file__).parent / "data"
TARGET = "10.16"


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("strides, pads, dilations, group, offset_group, mask, bias, n", [
    ((1, 1), (1, 1, 1, 1), (1, 1), 1, 1, True, True, 1),
    ((2, 1), (0, 1, 2, 1), (1, 2), 2, 2, False, True, 2),
    ((1, 2), (2, 0, 1, 1), (2, 1), 1, 2, True, False, 1),
    ((2, 2), (1, 1, 1, 1), (1, 1), 2, 1, True, True, 1),
])
def test_kernel_matches_onnxruntime_deformconv(strides, pads, dilations, group, offset_group,
                                               mask, bias, n):
    rng = np.random.default_rng(7)
    c, m, h, w, kh, kw = 4, 6, 7, 9, 3, 2
    oh = (h + pads[0] + pads[2] - (dilations[0] * (kh - 1) + 1)) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - (dilations[1] * (kw - 1) + 1)) // strides[1] + 1
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32),
             "w": rng.standard_normal((m, c // group, kh, kw)).astype(np.float32),
             "off": (rng.standard_normal((n, offset_group * kh * kw * 2, oh, ow)) * 2
                     ).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(m).astype(np.float32)
    if mask:
        feeds["mask"] = rng.random((n, offset_group * kh * kw, oh, ow)).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "off", "b" if bias else "",
                                           "mask" if mask else ""], ["y"],
                            strides=list(strides), pads=list(pads), dilations=list(dilations),
                            group=group, offset_group=offset_group)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, TP.FLOAT, v.shape)
                      for k, v in feeds.items()], [helper.make_tensor_value_info("y", TP.FLOAT,
                                                                                 None)])
    want = _ort(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), feeds)[0]
    got = deform_conv2d(feeds["x"], feeds["w"], feeds["off"], feeds.get("mask"),
                        feeds.get("b"), strides=strides, pads=pads, dilations=dilations,
                        group=group, offset_group=offset_group)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


EXPORTS = {  # file: (custom op, rule)
    "mmcv_modulated": ("mmcv::MMCVModulatedDeformConv2d", "mmcv-deformconv-to-plugin"),
    "mmcv_modulated_s2_nobias": ("mmcv::MMCVModulatedDeformConv2d",
                                 "mmcv-deformconv-to-plugin"),
    "mmcv_plain": ("mmcv::MMCVDeformConv2d", "mmcv-dcnv1-to-plugin"),
    "tv_fallthrough_mask": ("torchvision::deform_conv2d", "torchvision-deformconv-to-plugin"),
    "tv_fallthrough_nomask": ("torchvision::deform_conv2d", "torchvision-deformconv-to-plugin"),
}


SLICE = ["Constant"] * 4 + ["Slice"]
TV_KEPT = {"tv_fallthrough_mask": ["Conv", *SLICE, *SLICE, "Sigmoid"],
           "tv_fallthrough_nomask": ["Conv"]}


def _custom(model: onnx.ModelProto) -> list[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node
            if n.domain or n.op_type == "ModulatedDeformConv2d"]


@pytest.mark.parametrize("name", list(EXPORTS))
def test_real_export_is_substituted_checked_and_stable(name):
    model = onnx.load(DATA / f"{name}.onnx")
    op, rule = EXPORTS[name]
    assert _custom(model) == [op]
    result = api.run(model, "substitute-plugins", trt=TARGET)
    record = result.report.passes[0]
    assert record.status == "applied", record.to_json()
    assert record.check.startswith("passed"), record.to_json()
    assert [k.split(":")[0] for k in record.counts] == [rule]
    out = result.model
    assert _custom(out) == ["ModulatedDeformConv2d"]
    # the same ops around it, less the Constants only the torchvision op read (its scalars
    # and, without use_mask, the mask it ignored)
    kept = [n.op_type for n in model.graph.node if not n.domain]
    kept = TV_KEPT.get(name, kept)
    assert [n.op_type for n in out.graph.node] == kept + ["ModulatedDeformConv2d"]
    plugin = next(n for n in out.graph.node if n.op_type == "ModulatedDeformConv2d")
    assert plugin.domain == ""  # the check's copy moves it, never the output
    assert problems(plugin, plugin_for(plugin.op_type), parse_target(TARGET)) == []
    sub = references.substitute(out)
    assert sub.not_checkable == [] and len(sub.kernels) == 1  # opset 17: the numpy kernel
    onnx.checker.check_model(references.schema_free(sub), full_check=True)
    feeds = _feeds(model)
    want = references.run(references.substitute(model), feeds)
    got = references.run(sub, feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)
    assert np.abs(want["y"]).max() > 0.1  # the export's numbers are not all zeros
    again = api.run(out, "substitute-plugins", trt=TARGET)
    assert again.report.passes[0].status == "unchanged"


def test_custom_op_reference_agrees_with_onnxruntime_deformconv_of_the_same_layer():
    """One seeded torchvision layer exported twice: as torchvision::deform_conv2d (numpy
    kernel) and as ONNX DeformConv (onnxruntime); independent implementations agree."""
    custom = onnx.load(DATA / "tv_fallthrough_mask.onnx")
    standard = onnx.load(DATA / "tv_dynamo_mask.onnx")
    assert [n.op_type for n in standard.graph.node][-1] == "DeformConv"
    feeds = _feeds(custom, seed=3)
    got = references.run(references.substitute(custom), feeds)["y"]
    want = _ort(standard, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mmcv_reference_is_onnxruntime_deformconv_from_opset_19():
    """At opset 19 the mmcv op decomposes to DeformConv, which onnxruntime runs; it agrees
    with the numpy kernel that computes it at the export's opset 17."""
    model = onnx.load(DATA / "mmcv_modulated.onnx")
    newer = onnx.ModelProto()
    newer.CopyFrom(model)
    next(o for o in newer.opset_import if o.domain == "").version = 19  # same ops at 19
    sub17, sub19 = references.substitute(model), references.substitute(newer)
    assert len(sub17.kernels) == 1
    assert sub19.kernels == [] and "DeformConv" in sub19.replaced[0]
    feeds = _feeds(model, seed=5)
    np.testing.assert_allclose(references.run(sub17, feeds)["y"],
                               references.run(sub19, feeds)["y"], rtol=1e-5, atol=1e-5)


def _with_attribute(model: onnx.ModelProto, name: str, value) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = next(n for n in out.graph.node if n.domain)
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])
    return out


@pytest.mark.parametrize("name, attribute, value, why", [
    ("mmcv_modulated", "stride", [2, 1], "differ between height and width"),
    ("mmcv_modulated", "padding", [1, 0], "differ between height and width"),
    ("mmcv_plain", "bias", 1, "bias=1: mmcv's DeformConv2d has no bias input"),
])
def test_what_the_plugin_cannot_take_is_left_with_the_reason(name, attribute, value, why):
    model = _with_attribute(onnx.load(DATA / f"{name}.onnx"), attribute, value)
    result = api.run(model, "substitute-plugins", trt=TARGET, check=False)
    record = result.report.passes[0]
    assert record.status == "unchanged"
    assert any(why in str(note) for note in record.notes), record.notes


def test_torchvision_op_with_a_computed_stride_is_not_matched():
    model = onnx.load(DATA / "tv_fallthrough_nomask.onnx")
    node = next(n for n in model.graph.node if n.domain == "torchvision")
    model.graph.input.append(helper.make_tensor_value_info("s", TP.INT64, []))
    node.input[5] = "s"  # stride_h from a graph input: unknown until run time
    result = api.run(model, "substitute-plugins", trt=TARGET, check=False)
    assert result.report.passes[0].status == "unchanged"
    assert _custom(result.model) == ["torchvision::deform_conv2d"]


@pytest.mark.parametrize("name, rule, trt, finding", [
    ("mmcv_plain", "mmcv-dcnv1-to-plugin", TARGET, "custom-op-unknown"),
    ("tv_fallthrough_mask", "torchvision-deformconv-to-plugin", TARGET, "custom-op-unknown"),
    # DeformConv parses from 10.1; 10.0 parses this export's opset 20 (8.x stops at 17)
    ("tv_dynamo_mask", "deformconv-to-plugin", "10.0", "op-unsupported"),
    # 8.6 reads opsets up to 17: the run also converts 20 -> 17, the plugin node held out
    ("tv_dynamo_mask", "deformconv-to-plugin", "8.6", "op-unsupported"),
])
def test_doctor_names_the_rule_and_run_trt_makes_the_model_parse(name, rule, trt, finding,
                                                                 tmp_path):
    runner = CliRunner()
    src = DATA / f"{name}.onnx"
    res = runner.invoke(app, ["doctor", str(src), "--trt", trt, "--no-parser", "--json"])
    assert res.exit_code == 1, res.output
    fixes = [f["fix"] for f in json.loads(res.output)["findings"] if f["rule"] == finding]
    assert len(fixes) == 1 and f"rule {rule}" in fixes[0], fixes
    out = tmp_path / "o.onnx"
    res = runner.invoke(app, ["run", str(src), "-o", str(out), "--trt", trt])
    assert res.exit_code == 0, res.output
    assert "ModulatedDeformConv2d" in _custom(onnx.load(out))
    res = runner.invoke(app, ["doctor", str(out), "--trt", trt, "--no-parser"])
    assert res.exit_code == 0, res.output
