import json

import numpy as np
import onnx
from gfhelpers import parse
from typer.testing import CliRunner

import graphfix
from graphfix import samples
from graphfix.cli.app import app
from graphfix.explain import explain, explain_change

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
WEIGHTS = """<float[4,4,1,1] w = {1.0,0.0,0.0,0.0, 0.0,1.0,0.0,0.0, 0.0,0.0,1.0,0.0,
                                   0.0,0.0,0.0,1.0}, float[4,1,1] b = {1.0,2.0,3.0,4.0}>"""


def kinds(text):
    return {(c.conv, c.kind, c.blocker, c.fix) for c in explain(parse(HEADER + text)).chains}


def test_fusible_residual_and_no_activation():
    found = kinds("""
    g (float[1,4,3,3] x) => (float[1,4,3,3] y, float[1,4,1,1] z) """ + WEIGHTS + """ {
        c1 = Conv <kernel_shape = [1, 1]> (x, w)
        r1 = Relu(c1)
        c2 = Conv <kernel_shape = [1, 1]> (r1, w)
        y = Add(c2, r1)
        c3 = Conv <kernel_shape = [1, 1]> (x, w)
        z = GlobalMaxPool(c3)
    }""")
    assert found == {("Conv 'c1'", "fusible", "", ""), ("Conv 'c2'", "residual", "", ""),
                     ("Conv 'c3'", "no activation", "", "")}


def test_broken_chains_name_the_node_in_the_way_and_the_fix():
    found = kinds("""
    g (float[1,4,3,3] x, float[1] hi) => (float[1,4,3,3] y1, float[1,4,3,3] y2,
        float[1,4,3,3] y3, float[1,4,3,3] y4) """ + WEIGHTS + """ {
        c1 = Conv <kernel_shape = [1, 1]> (x, w)
        a1 = Add(c1, b)
        y1 = Relu(a1)
        c2 = Conv <kernel_shape = [1, 1]> (x, w)
        m2 = Mul(c2, b)
        y2 = Relu(m2)
        c3 = Conv <kernel_shape = [1, 1]> (x, w)
        i3 = Identity(c3)
        y3 = Relu(i3)
        c4 = Conv <kernel_shape = [1, 1]> (x, w)
        zero = Constant <value = float[1] {0.0}> ()
        y4 = Clip(c4, zero, hi)
    }""")
    assert found == {
        ("Conv 'c1'", "broken", "Add 'a1'", "fuse-conv-bias"),
        ("Conv 'c2'", "broken", "Mul 'm2'", "fuse-conv-mul"),
        ("Conv 'c3'", "broken", "Identity 'i3'", "eliminate-noops"),
        ("Conv 'c4'", "broken", "Clip 'y4'", ""),
    }


def test_second_reader_breaks_the_activation():
    (chain,) = explain(parse(HEADER + """
    g (float[1,4,3,3] x) => (float[1,4,3,3] y, float[1,4,3,3] z) """ + WEIGHTS + """ {
        c = Conv <kernel_shape = [1, 1]> (x, w)
        y = Relu(c)
        z = Neg(c)
    }""")).chains
    assert chain.kind == "broken" and "read by 2 nodes" in chain.reason


def test_chains_inside_if_branches_are_found():
    model = parse(HEADER + """
    g (bool cond, float[1,4,3,3] x) => (float[1,4,3,3] y) """ + WEIGHTS + """ {
        y = If(cond) <
            then_branch = t () => (float[1,4,3,3] ty) {
                c = Conv <kernel_shape = [1, 1]> (x, w)
                ty = Relu(c) },
            else_branch = e () => (float[1,4,3,3] ey) { ey = Neg(x) }
        >
    }""")
    assert [c.kind for c in explain(model).chains] == ["fusible"]


def test_explain_change_counts_before_and_after():
    model = samples.conv_bn_relu_residual()
    result = graphfix.run(model, check=False)
    section = explain_change(model, result.model)
    assert section["before"]["broken"] == 3  # BN after each conv
    assert section["after"]["broken"] == 0
    assert section["after"]["fusible"] == 2 and section["after"]["residual"] == 1


def test_cli_explain_prints_and_reports(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    rep = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["run", str(src), "--explain", "--report", str(rep)])
    assert result.exit_code == 0, result.output
    assert "Conv chains" in result.stdout and "broken 3 → 0" in result.stdout
    data = json.loads(rep.read_text())
    assert data["explain"]["after"]["fusible"] == 2
    assert np.isfinite(data["seconds"])


def test_a_reshape_with_no_activation_after_it_is_not_in_the_way():
    found = kinds("""
    g (float[1,4,3,3] x) => (float[1,36] y, float[1,36] z) """ + WEIGHTS + """ {
        s = Constant <value = int64[2] {1, 36}> ()
        c1 = Conv <kernel_shape = [1, 1]> (x, w)
        y = Reshape(c1, s)
        c2 = Conv <kernel_shape = [1, 1]> (x, w)
        r2 = Reshape(c2, s)
        z = Relu(r2)
    }""")
    assert found == {("Conv 'c1'", "no activation", "", ""),
                     ("Conv 'c2'", "broken", "Reshape 'r2'",
                      "eliminate-noops, if it changes nothing")}


def test_nms_regions_with_the_pass_for_the_target():
    detectors = _detectors()
    from graphfix.explain import explain_nms
    from graphfix.trt import parse_target

    (old,) = explain_nms(detectors.top_level(), parse_target("8.4"))
    assert old["where"] == "NonMaxSuppression 'nms'" and old["kind"] == "onnx"
    assert old["boxes"] == ["boxes"] and old["scores"] == ["scores"]
    assert old["layout"] == "[B,N,C]" and old["box_format"] == "corner"
    assert old["thresholds"] == ["max_output_boxes_per_class: 4", "iou_threshold: 0.5",
                                 "score_threshold: 0.3"]
    assert old["tail"] == 3 and old["pass"].startswith("nms-to-plugin (TensorRT 8.4")
    (new,) = explain_nms(detectors.top_level())
    assert new["pass"].startswith("bound-nms (TensorRT 11.1")
    (inner,) = explain_nms(detectors.in_if(), parse_target("8.4"))
    assert inner["pass"].startswith("split-nms")
    (plugin,) = explain_nms(detectors.plugin(), parse_target("10.12"))
    assert plugin["pass"].startswith("plugin-to-nms (EfficientNMS_TRT is deprecated")


def test_cli_explain_prints_nms_regions(tmp_path):
    detectors = _detectors()
    src = tmp_path / "m.onnx"
    onnx.save(detectors.top_level(), src)
    result = CliRunner().invoke(app, ["run", str(src), "--passes", "cleanup", "--explain",
                                      "--trt", "8.4", "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert "NMS regions: 1" in text
    assert "NonMaxSuppression 'nms' (onnx): boxes boxes, scores scores; layout [B,N,C], " \
           "corner boxes; max_output_boxes_per_class: 4" in text
    assert "tail 3 nodes pass: nms-to-plugin (TensorRT 8.4" in text


def _detectors():
    """tests/nms/detectors.py (tiny detectors built in code)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "nms"))
    import detectors

    return detectors


def test_every_fix_explain_names_is_a_registered_pass():
    # fix texts are plain strings: a renamed pass would leave them pointing nowhere
    from graphfix import explain as explain_module
    from graphfix.passes.registry import REGISTRY

    fixes = [fix for _, fix in explain_module._IN_THE_WAY.values()]
    fixes += list(explain_module._SCALE_OPS.values())
    named = {fix.split(",")[0].split()[0] for fix in fixes}
    assert named <= set(REGISTRY), named - set(REGISTRY)
    assert named == {"fold-bn", "eliminate-noops", "fuse-conv-mul", "fuse-conv-bias"}
