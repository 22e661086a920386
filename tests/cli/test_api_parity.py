"""The CLI is the API and printing: for each command, `--json` prints exactly
`to_json()` of the API's result for the same inputs (timings aside), and the API
writes the same files."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

import graphfix
from graphfix import samples
from graphfix.cli.app import app

runner = CliRunner()
_TIMINGS = {"seconds", "stats_seconds"}


def _steady(value):
    """The JSON without timings (the only thing two identical runs may differ in)."""
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in _TIMINGS}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def _cli_json(args: list[str], code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def _api_json(result) -> dict:
    return json.loads(json.dumps(result.to_json(), default=str))


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(samples.conv_bn_relu_residual(), path)
    return path


def test_run(model_path, tmp_path):
    out = tmp_path / "out.onnx"
    args = dict(passes="cleanup,fold-bn", trt="10", explain=True)
    cli = _cli_json(["run", str(model_path), "-o", str(out), "--passes", args["passes"],
                     "--trt", "10", "--explain"])
    written = out.read_bytes()
    api = graphfix.run(model_path, output=out, **args)
    assert _steady(_api_json(api)) == _steady(cli)
    assert out.read_bytes() == written and cli["output"]["path"] == str(out)
    assert cli["explain"] and cli["doctor"]["schema"] == "graphfix.doctor/1"
    assert api.diagnosis is not None and api.diagnosis.to_json()["verdict"] == \
        cli["doctor"]["verdict"]


def test_doctor(model_path, tmp_path):
    cli = _cli_json(["doctor", str(model_path), "--trt", "8.6"])
    api = graphfix.doctor(model_path, trt="8.6")
    assert _steady(_api_json(api)) == _steady(cli)
    saved = tmp_path / "d.json"
    graphfix.doctor(model_path, trt="8.6", json_out=saved)
    assert _steady(json.loads(saved.read_text())) == _steady(cli)


def _perturbed(tmp_path, model_path):
    model = onnx.load(model_path)
    weight = next(i for i in model.graph.initializer if i.name == "block.0.weight")
    values = numpy_helper.to_array(weight).copy()
    values[0] *= 1.5
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    return path


def test_check(model_path, tmp_path):
    bad = _perturbed(tmp_path, model_path)
    cli = _cli_json(["check", str(model_path), str(bad), "--samples", "2", "--trt", "10"],
                    code=1)
    api = graphfix.check(model_path, bad, samples=2, trt="10")
    assert not api.passed and api.first_divergence is not None
    assert _steady(_api_json(api)) == _steady(cli)
    assert cli["doctor"]["target"]["label"].startswith("TensorRT 10")


def test_calibrate(tmp_path, model_path):
    data = tmp_path / "calib.npz"
    rng = np.random.default_rng(0)
    np.savez(data, input=rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    out, ranges = tmp_path / "q.onnx", tmp_path / "r.json"
    cli = _cli_json(["calibrate", str(model_path), "--data", str(data), "--method",
                     "minmax,percentile", "-o", str(out), "--ranges", str(ranges)])
    api = graphfix.calibrate(model_path, data=data, method="minmax,percentile",
                             output=out, ranges=ranges)
    assert _steady(_api_json(api)) == _steady(cli)
    assert api.method == cli["recommended"] and api.details is not None
    onnx.checker.check_model(api.model)


def test_the_packages_are_the_commands():
    """`graphfix.doctor` / `graphfix.check` are packages and calls at once; importing a
    submodule does not replace the function (the reason for `_command_module`)."""
    import graphfix.check.layerwise  # noqa: F401
    import graphfix.doctor.engine  # noqa: F401

    model = samples.conv_bn_relu_residual()
    assert graphfix.doctor(model, trt="10").parses()
    assert graphfix.check(model, model).passed
    assert {"run", "doctor", "calibrate", "check"} <= set(graphfix.__all__)


def test_plugins(tmp_path):
    cli = _cli_json(["plugins", "list", "--trt", "8.4"])
    assert _api_json(graphfix.api.plugins_list("8.4")) == cli
    roi = onnx.helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="roi",
                                output_height=2, output_width=2)
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [roi], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8]),
         onnx.helper.make_tensor_value_info("rois", onnx.TensorProto.FLOAT, [3, 4]),
         onnx.helper.make_tensor_value_info("idx", onnx.TensorProto.INT64, [3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4, 2, 2])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    path, plan_path = tmp_path / "roi.onnx", tmp_path / "plan.yaml"
    onnx.save(model, path)
    result = runner.invoke(app, ["plugins", "match", str(path), "--trt", "8.4", "-o",
                                 str(plan_path)])
    assert result.exit_code == 0, result.output
    plan = graphfix.api.plugins_match(path, trt="8.4")
    assert [e["plugin"] for e in plan.entries] == ["ROIAlign_TRT"]
    assert plan.to_yaml() == plan_path.read_text()
    applied = graphfix.api.plugins_apply(path, plan, trt="8.4")
    assert [n.op_type for n in applied.model.graph.node] == ["ROIAlign_TRT"]
    assert len(applied.done) == 1
