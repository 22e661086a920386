"""`graphfix check` from the command line: verdicts, exit codes, provenance, INT8 mode."""

from __future__ import annotations

import json

import onnx
from onnx import numpy_helper
from typer.testing import CliRunner

from graphfix import samples
from graphfix.api import run
from graphfix.cli.app import app

runner = CliRunner()


def _write(tmp_path, name, model):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_rewrite_passes_and_a_perturbed_conv_fails(tmp_path):
    model = samples.conv_bn_relu_residual()
    ref = _write(tmp_path, "ref.onnx", model)
    fixed = _write(tmp_path, "fixed.onnx", run(model, check=False).model)
    ok = runner.invoke(app, ["check", str(ref), str(fixed)])
    assert ok.exit_code == 0, ok.output
    text = " ".join(ok.stdout.split())
    assert "check passed" in text and "5 merged by graphfix passes" in text

    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    conv = [n for n in broken.graph.node if n.op_type == "Conv"][-1]
    weight = next(t for t in broken.graph.initializer if t.name == conv.input[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    bad = _write(tmp_path, "bad.onnx", broken)
    failed = runner.invoke(app, ["check", str(ref), str(bad), "--json"])
    assert failed.exit_code == 1, failed.output
    data = json.loads(failed.stdout)
    assert data["schema"] == "graphfix.check/2" and data["passed"] is False
    assert data["first_divergence"]["name"] == conv.output[0]
    assert data["origins"][0]["name"] == conv.output[0]


def test_int8_mode_suggests_nodes_calibrate_accepts(shared_model, tmp_path):
    from graphfix.calibration.qdq import plan
    from graphfix.calibration.runner import calibrate
    from graphfix.runtime.data import open_data

    data = shared_model("digits_dev_data.npz")
    fp32 = onnx.load(shared_model("digits_dev.onnx"))
    result = calibrate(fp32, open_data(data, fp32, data_key="calib", batch_size=50),
                       ("entropy",))
    ref = _write(tmp_path, "fp32.onnx", fp32)
    int8 = _write(tmp_path, "int8.onnx", result.outcome().model)
    args = ["check", str(ref), str(int8), "--data", str(data), "--data-key", "test",
            "--samples", "8", "--sqnr-threshold", "35"]
    table = runner.invoke(app, args)
    assert "quantization sensitivity" in table.stdout
    assert "merged by graphfix passes" in " ".join(table.stdout.split())
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert data["mode"] == "sqnr" and data["sensitivity"]
    names = data["exclude_nodes"]
    assert names and plan(result.fp32, exclude_nodes=names)  # names calibrate knows


def test_bad_input_exits_2(tmp_path):
    ref = _write(tmp_path, "ref.onnx", samples.conv_bn_relu_residual())
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"nope")
    result = runner.invoke(app, ["check", str(ref), str(junk)])
    assert result.exit_code == 2 and "error:" in result.stderr
    assert runner.invoke(app, ["check", str(ref), str(ref), "--mode", "fuzzy"]).exit_code == 2


def _relu_then(out: str, op: str = "Relu", shape=(2,)) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    nodes.append(helper.make_node("Concat", ["r", "r"], [out], axis=0) if op == "Concat"
                 else helper.make_node(op, ["r"], [out]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info(
            out, TensorProto.FLOAT, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_check_that_compares_no_graph_output_fails_and_says_why(tmp_path):
    ref = _write(tmp_path, "ref.onnx", _relu_then("y", "Abs"))
    cases = {"renamed.onnx": (_relu_then("z", "Abs"), "'y' (only in reference)"),
             "reshaped.onnx": (_relu_then("y", "Concat", (4,)), "'y' (not comparable")}
    for name, (model, why) in cases.items():
        cand = _write(tmp_path, name, model)
        result = runner.invoke(app, ["check", str(ref), str(cand)])
        assert result.exit_code == 1, result.output
        text = " ".join(result.stdout.split())
        assert f"graph output(s) not compared: {why}" in text
        assert "check FAILED: graph output(s) not compared: y" in text
        data = json.loads(runner.invoke(app, ["check", str(ref), str(cand), "--json"]).stdout)
        assert data["passed"] is False and data["first_divergence"] is None
    same = _write(tmp_path, "same.onnx", _relu_then("y", "Abs"))
    assert runner.invoke(app, ["check", str(ref), str(same)]).exit_code == 0
