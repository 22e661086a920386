"""`graphfix run` from the command line."""

import json

import numpy as np
import onnx
from gfhelpers import assert_same_outputs, feeds_for, unrunnable_model
from typer.testing import CliRunner

from graphfix import samples
from graphfix.cli.app import app
from graphfix.passes.manager import NOT_RERUN

runner = CliRunner()


def write_sample(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(samples.conv_bn_relu_residual(), path)
    return path


def test_run_default_pipeline_writes_output_beside_input(tmp_path):
    src = write_sample(tmp_path)
    before = src.read_bytes()
    result = runner.invoke(app, ["run", str(src)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "model.graphfix.onnx"
    model = onnx.load(out)
    assert {n.op_type for n in model.graph.node} == {
        "Conv", "Relu", "Add", "GlobalAveragePool", "Reshape", "Gemm"}
    assert "fold-bn" in result.stdout and "passed" in result.stdout
    assert src.read_bytes() == before
    original = samples.conv_bn_relu_residual()
    assert_same_outputs(original, model, feeds_for(original, input=(2, 3, 32, 32)), rtol=1e-4)


def test_report_json_has_hashes_pipeline_and_passes(tmp_path):
    src = write_sample(tmp_path)
    rep = tmp_path / "report.json"
    out = tmp_path / "o.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--passes", "cleanup,fold-bn",
                                 "--report", str(rep)])
    assert result.exit_code == 0, result.output
    data = json.loads(rep.read_text())
    assert data["pipeline"] == "cleanup,fold-bn"
    assert [p["status"] for p in data["passes"]] == ["applied", "applied"]
    assert data["passes"][1]["counts"] == {"folded BatchNormalization into Conv": 3}
    assert len(data["input"]["sha256"]) == 64 and len(data["output"]["sha256"]) == 64
    assert data["input"]["sha256"] != data["output"]["sha256"]
    assert data["check"]["inputs"] == {"input": "float32[1x3x32x32]"}


def test_json_flag_prints_the_report(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--json", "--passes", "cleanup"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["pipeline"] == "cleanup"


def test_dump_after_writes_the_model_after_that_pass(tmp_path):
    src = write_sample(tmp_path)
    out = tmp_path / "o.onnx"
    pipeline = ["--passes", "cleanup,fold-constants,fold-bn,cleanup"]
    result = runner.invoke(app, ["run", str(src), "-o", str(out), *pipeline,
                                 "--dump-after", "fold-bn"])
    assert result.exit_code == 0, result.output
    dumped = tmp_path / "o.after-03-fold-bn.onnx"
    ops = [n.op_type for n in onnx.load(dumped).graph.node]
    assert "BatchNormalization" not in ops
    assert not (tmp_path / "o.after-01-cleanup.onnx").exists()
    result = runner.invoke(app, ["run", str(src), "-o", str(out), *pipeline,
                                 "--dump-after", "all"])
    assert len(list(tmp_path.glob("o.after-*.onnx"))) == 4


def test_dump_after_a_pass_not_in_the_pipeline_is_a_user_error(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--dump-after", "fix-shapes"])
    assert result.exit_code == 2
    assert "not in the pipeline" in result.stderr


def test_strict_exits_1_when_a_pass_is_rolled_back(tmp_path, monkeypatch):
    from graphfix.passes import fold_bn

    def broken(self, graph, ctx):
        raise RuntimeError("deliberately broken")

    monkeypatch.setattr(fold_bn.FoldBatchNorm, "run", broken)
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--passes", "cleanup,fold-bn"])
    assert result.exit_code == 0, result.output
    assert "rolled back" in result.stdout and "deliberately broken" in result.stdout
    result = runner.invoke(app, ["run", str(src), "--passes", "cleanup,fold-bn", "--strict"])
    assert result.exit_code == 1
    model = onnx.load(tmp_path / "model.graphfix.onnx")
    assert "BatchNormalization" in [n.op_type for n in model.graph.node]


def test_no_check_skips_the_check(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--no-check", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert not data["check"]["enabled"]
    assert {p["check"] for p in data["passes"]} <= {"skipped", "unchanged", NOT_RERUN}


def test_input_shape_and_data_options(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--json", "--input-shape", "input:3x3x32x32"])
    assert json.loads(result.stdout)["check"]["inputs"] == {"input": "float32[3x3x32x32]"}
    np.savez(tmp_path / "d.npz", input=np.ones((2, 3, 32, 32), np.float32))
    result = runner.invoke(app, ["run", str(src), "--json", "--data", str(tmp_path / "d.npz")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["check"]["inputs"] == {"input": "float32[2x3x32x32]"}
    assert data["check"]["data"].endswith("d.npz") and data["check"]["seed"] is None


def test_dynamic_dim_that_cannot_be_resolved_says_how_to_pass_it(tmp_path):
    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[N,3,H,W] x) => (float[N,3,H,W] y) { y = Relu(x) }""")
    src = tmp_path / "dyn.onnx"
    onnx.save(model, src)
    result = runner.invoke(app, ["run", str(src)])
    assert result.exit_code == 2
    assert "Input 'x' dim 2 ('H')" in result.stderr and "--input-shape x:" in result.stderr
    result = runner.invoke(app, ["run", str(src), "--input-shape", "x:1x3x8x8"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["run", str(src), "--no-check"])
    assert result.exit_code == 0, result.output


def test_fix_shapes_in_the_pipeline(tmp_path):
    src = write_sample(tmp_path)
    out = tmp_path / "fixed.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out),
                                 "--passes", "fix-shapes{input=4x3x32x32},fold-constants"])
    assert result.exit_code == 0, result.output
    model = onnx.load(out)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [4, 3, 32, 32]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [4, 10]


def test_default_pipeline_is_trt_prep_and_reports_its_rounds(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pipeline"] == "trt-prep"
    rounds = data["rounds"]["trt-prep"]
    assert 2 <= rounds <= 4
    last_round = [p for p in data["passes"] if p["round"] == rounds]
    assert all(p["status"] == "unchanged" for p in last_round)
    assert {p["preset"] for p in data["passes"]} == {"trt-prep"}


def corrupt_fold_of(monkeypatch, bn_name: str) -> None:
    """fold-bn folds `bn_name` with a bias off by 0.5; every other fold stays right."""
    from graphfix.passes import fold_bn

    right = fold_bn._fold_conv

    def corrupt(node, bn, affine):
        plan = right(node, bn, affine)
        if bn.name == bn_name:
            plan.bias = plan.bias + 0.5
        return plan

    monkeypatch.setitem(fold_bn._FOLDERS, "Conv", corrupt)


def bn_names(model) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type == "BatchNormalization"]


def test_dump_after_writes_the_rejected_model_of_a_rolled_back_pass(tmp_path, monkeypatch):
    from graphfix.runtime.session import run_model

    original = samples.conv_bn_relu_residual()
    corrupt_fold_of(monkeypatch, "block.0.bn")
    src, out = write_sample(tmp_path), tmp_path / "o.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--passes", "cleanup,fold-bn",
                                 "--dump-after", "fold-bn"])
    assert result.exit_code == 0, result.output
    rejected = tmp_path / "o.after-02-fold-bn.REJECTED.onnx"
    assert f"wrote{rejected}:themodelfold-bnproduced" in "".join(result.stdout.split())
    assert bn_names(onnx.load(tmp_path / "o.after-02-fold-bn.onnx")) == bn_names(original)
    model = onnx.load(rejected)
    onnx.checker.check_model(model)
    assert bn_names(model) == []  # every fold, the wrong one included
    feeds = feeds_for(original, input=(1, 3, 32, 32))
    ref, got = run_model(original, feeds)["logits"], run_model(model, feeds)["logits"]
    assert np.abs(ref - got).max() > 0.1


def test_dump_after_a_pass_that_raised_says_there_is_no_rejected_model(tmp_path, monkeypatch):
    from graphfix.passes import fold_bn

    def broken(self, graph, ctx):
        raise RuntimeError("deliberately broken")

    monkeypatch.setattr(fold_bn.FoldBatchNorm, "run", broken)
    src, out = write_sample(tmp_path), tmp_path / "o.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--passes", "cleanup,fold-bn",
                                 "--dump-after", "all"])
    assert result.exit_code == 0, result.output
    assert "fold-bn was rolled back before it produced a model" in " ".join(result.stdout.split())
    assert not list(tmp_path.glob("*.REJECTED.onnx"))
    assert len(list(tmp_path.glob("o.after-*.onnx"))) == 2


def test_max_rewrites_applies_only_the_first_n(tmp_path):
    src, out = write_sample(tmp_path), tmp_path / "o.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--passes", "cleanup,fold-bn",
                                 "--max-rewrites", "2"])
    assert result.exit_code == 0, result.output
    assert bn_names(onnx.load(out)) == ["block.0.bn", "block.1.bn"]  # cleanup, then stem.bn
    text = " ".join(result.stdout.split())
    assert ("--max-rewrites 2: 2 rewrite(s) allowed; the last: rewrite #2 (fold-bn: "
            "BatchNormalization 'stem.bn' into Conv 'stem.conv')") in text
    original = samples.conv_bn_relu_residual()
    feeds = feeds_for(original, input=(1, 3, 32, 32))
    assert_same_outputs(original, onnx.load(out), feeds, rtol=1e-4, atol=1e-5)


def test_bisect_names_the_wrong_fold_and_writes_the_model_before_it(tmp_path, monkeypatch):
    corrupt_fold_of(monkeypatch, "block.1.bn")
    src, out = write_sample(tmp_path), tmp_path / "o.onnx"
    args = ["run", str(src), "--passes", "cleanup,fold-bn", "--bisect"]
    result = runner.invoke(app, [*args, "-o", str(out)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.stdout.split())
    assert ("rewrite #4 (fold-bn: BatchNormalization 'block.1.bn' into Conv 'block.1.conv') "
            "breaks the numbers: outputs differ: logits") in text
    assert "--max-rewrites 4 --dump-after fold-bn" in text
    assert bn_names(onnx.load(out)) == ["block.1.bn"]
    result = runner.invoke(app, [*args, "--json"])
    data = json.loads(result.stdout)
    assert (data["schema"], data["culprit"]["index"], data["applied"]) == ("graphfix.bisect/1",
                                                                           4, 3)


def test_bisect_exits_0_when_no_rewrite_breaks_the_numbers(tmp_path):
    src = write_sample(tmp_path)
    result = runner.invoke(app, ["run", str(src), "--passes", "cleanup,fold-bn", "--bisect"])
    assert result.exit_code == 0, result.output
    assert "no rewrite breaks the numbers: all 4 rewrites" in " ".join(result.stdout.split())
    result = runner.invoke(app, ["run", str(src), "--bisect", "--no-check"])
    assert result.exit_code == 2 and "without the output check" in result.stderr


def test_split_nms_writes_backbone_nms_part_and_manifest(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nms"))
    import detectors

    from graphfix.nms import run_split
    from graphfix.runtime.session import run_model

    src = tmp_path / "det.onnx"
    onnx.save(detectors.top_level(), src)
    out = tmp_path / "out.onnx"
    result = runner.invoke(app, ["run", str(src), "--passes", "cleanup,split-nms", "-o",
                                 str(out)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())  # rich wraps long lines
    for what in ("out.onnx: the backbone, for TensorRT",
                 "out.nms.onnx: the NMS post-processing, for onnxruntime",
                 "out.split.json: how to chain them (graphfix.nms.run_split)"):
        assert what in said
    backbone = onnx.load(out)
    assert "NonMaxSuppression" not in {n.op_type for n in backbone.graph.node}
    manifest = json.loads((tmp_path / "out.split.json").read_text())
    assert (manifest["backbone"], manifest["nms"]) == ("out.onnx", "out.nms.onnx")
    feeds = detectors.controlled_feeds()
    ref = run_model(detectors.top_level(), feeds)
    got = run_split(tmp_path / "out.split.json", feeds)
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])


def test_strict_exits_1_when_the_check_could_not_run(tmp_path):
    """A Hugging Face BERT given random token type ids that overflow its table had its
    check skipped, and --strict said nothing: it now fails, and the model is written."""
    src = tmp_path / "acme.onnx"
    onnx.save(unrunnable_model(), src)
    out = tmp_path / "out.onnx"
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--strict"])
    assert result.exit_code == 1, result.output
    assert "--strict: the numerical check did not run (not checkable: Frobnicate" in (
        " ".join(result.output.split()))
    assert out.exists()
    result = runner.invoke(app, ["run", str(src), "-o", str(out), "--strict", "--no-check"])
    assert result.exit_code == 0, result.output
