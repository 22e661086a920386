"""`graphfix doctor` from the command line: table, verdict, exit codes, JSON."""

from __future__ import annotations

import json

import onnx
from onnx import TensorProto as TP
from onnx import helper
from typer.testing import CliRunner

from graphfix import samples
from graphfix.cli.app import app

runner = CliRunner()


def write(tmp_path, m, name="m.onnx"):
    path = tmp_path / name
    onnx.save(m, path)
    return path


def hardmax_model():
    graph = helper.make_graph([helper.make_node("Hardmax", ["x"], ["y"], name="hm")], "g",
                              [helper.make_tensor_value_info("x", TP.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 5])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_blocking_finding_exits_1_with_verdict(tmp_path):
    path = write(tmp_path, hardmax_model())
    before = path.read_bytes()
    result = runner.invoke(app, ["doctor", str(path), "--trt", "8.6", "--no-parser"])
    assert result.exit_code == 1, result.output
    assert "op-unsupported" in result.stdout and "Hardmax 'hm'" in result.stdout
    assert "TensorRT 8.6 will parse this model: no — 1 blocking node" in result.stdout
    assert path.read_bytes() == before


def test_finding_on_many_nodes_says_how_many_and_names_the_first_three(tmp_path):
    nodes = [helper.make_node("Hardmax", [f"h{i}"], [f"h{i + 1}"], name=f"hm{i}")
             for i in range(5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("h0", TP.FLOAT, [2])],
                              [helper.make_tensor_value_info("h5", TP.FLOAT, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    result = runner.invoke(app, ["doctor", str(write(tmp_path, m)), "--trt", "8.6",
                                 "--no-parser"])
    where = [line.split("│")[2].strip() for line in result.stdout.splitlines()
             if line.startswith("│")]
    assert [w for w in where if w] == ["5 nodes", "Hardmax 'hm0'", "Hardmax 'hm1'",
                                       "Hardmax 'hm2'", "... and 2 more"]
    assert "error (1 finding on 5 nodes)" in result.stdout
    assert "will parse this model: no — 5 blocking nodes" in result.stdout


def test_clean_model_exits_0_and_fail_on_never(tmp_path):
    path = write(tmp_path, hardmax_model())
    ok = runner.invoke(app, ["doctor", str(path), "--trt", "10.16", "--no-parser"])
    assert ok.exit_code == 0, ok.output
    assert "will parse this model: yes" in ok.stdout
    never = runner.invoke(app, ["doctor", str(path), "--trt", "8.6", "--fail-on", "never",
                                "--no-parser"])
    assert never.exit_code == 0


def test_fail_on_warn_counts_warnings(tmp_path):
    path = write(tmp_path, samples.conv_bn_relu_residual())  # dynamic batch: a warning
    result = runner.invoke(app, ["doctor", str(path), "--trt", "10", "--fail-on", "warn",
                                 "--no-parser"])
    assert result.exit_code == 1, result.output
    assert "dynamic-input" in result.stdout


def test_json_output(tmp_path):
    path = write(tmp_path, hardmax_model())
    result = runner.invoke(app, ["doctor", str(path), "--trt", "10.12", "--json", "--no-parser"])
    data = json.loads(result.stdout)
    assert data["schema"] == "graphfix.doctor/1" and data["parses"] is True
    assert "10.1" in data["target"]["note"]


def test_bad_inputs_exit_2(tmp_path):
    path = write(tmp_path, hardmax_model())
    bad_version = runner.invoke(app, ["doctor", str(path), "--trt", "7.1"])
    assert bad_version.exit_code == 2 and "error:" in bad_version.stderr
    bad_fail_on = runner.invoke(app, ["doctor", str(path), "--fail-on", "sometimes"])
    assert bad_fail_on.exit_code == 2 and "--fail-on" in bad_fail_on.stderr
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert runner.invoke(app, ["doctor", str(junk)]).exit_code == 2
