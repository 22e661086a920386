"""Inputs a model accepts, from the command line: `run` and `check` on a VAD-like model
(an integer sample rate, recurrent state), --input-value, --data in every form."""

import json
import re
import subprocess
import sys

import numpy as np
import onnx
from gfhelpers import parse
from typer.testing import CliRunner

from graphfix.cli.app import app
from vadhelpers import vad_model

runner = CliRunner()
DYNAMIC = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,T] x) => (float[N,T] y) { r = Relu(x)
    y = Identity(r) }""")
ORT_LOG = re.compile(r"^(\x1b\[[0-9;]*m)?(\[[EWIV]:onnxruntime|\d{4}-\d\d-\d\d )", re.M)


def _save(tmp_path, model, name="model.onnx"):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_run_checks_a_vad_model_with_the_rate_it_compares(tmp_path):
    src = _save(tmp_path, vad_model())
    result = runner.invoke(app, ["run", str(src), "-p", "cleanup", "--report",
                                 str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "numerical check skipped" not in result.output
    check = json.loads((tmp_path / "r.json").read_text())["check"]
    assert check["enabled"] and check["skipped_reason"] == ""
    assert check["inputs"] == {"input": "float32[1x512]", "state": "float32[2x1x128]",
                               "sr": "int64[]"}


def test_run_refuses_a_rate_nothing_tells_and_input_value_fixes_it(tmp_path):
    src = _save(tmp_path, vad_model(constants=False))
    result = runner.invoke(app, ["run", str(src), "-p", "cleanup"])
    assert result.exit_code == 2
    assert "Input 'sr' is an integer scalar" in result.stderr
    assert "--input-value sr=VALUE" in result.stderr
    report = tmp_path / "r.json"
    result = runner.invoke(app, ["run", str(src), "-p", "cleanup", "--input-value", "sr=8000",
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["check"]["enabled"]


def test_run_input_value_errors_exit_2(tmp_path):
    src = _save(tmp_path, vad_model())
    bad = runner.invoke(app, ["run", str(src), "--input-value", "sr=fast"])
    assert bad.exit_code == 2 and "Cannot read the input value 'sr=fast'" in bad.stderr
    unknown = runner.invoke(app, ["run", str(src), "--input-value", "rate=8000"])
    assert unknown.exit_code == 2 and "'rate', which is not an input" in unknown.stderr


def test_check_takes_input_value_and_refuses_without_it(tmp_path):
    src = _save(tmp_path, vad_model(constants=False))
    refused = runner.invoke(app, ["check", str(src), str(src)])
    assert refused.exit_code == 2 and "--input-value sr=VALUE" in refused.stderr
    assert "--batch-size" not in refused.stderr
    ok = runner.invoke(app, ["check", str(src), str(src), "--input-value", "sr=8000"])
    assert ok.exit_code == 0, ok.output
    assert "check passed" in ok.output


def test_run_data_is_read_like_check_data_and_fixes_the_shapes(tmp_path):
    """float64 arrays are cast (as in calibrate and check), and a dynamic T needs no
    --input-shape: the data has it."""
    src = _save(tmp_path, DYNAMIC)
    np.savez(tmp_path / "x.npz", x=np.linspace(-1, 1, 14).reshape(2, 7))  # float64
    no_data = runner.invoke(app, ["run", str(src), "-p", "cleanup"])
    assert no_data.exit_code == 2 and "--input-shape x:" in no_data.stderr
    report = tmp_path / "r.json"
    result = runner.invoke(app, ["run", str(src), "-p", "cleanup", "--data",
                                 str(tmp_path / "x.npz"), "--report", str(report)])
    assert result.exit_code == 0, result.output
    check = json.loads(report.read_text())["check"]
    assert check["enabled"] and check["inputs"] == {"x": "float32[2x7]"}
    assert check["data"].endswith("x.npz")
    checked = runner.invoke(app, ["check", str(src), str(src), "--data",
                                  str(tmp_path / "x.npz")])
    assert checked.exit_code == 0, checked.output
    assert "over 2 sample(s)" in checked.output


def test_run_takes_data_key_where_its_error_asks_for_it(tmp_path):
    src = _save(tmp_path, DYNAMIC)
    data = tmp_path / "x.npz"
    np.savez(data, calib=np.zeros((2, 7), np.float32), test=np.ones((3, 7), np.float32))
    base = ["run", str(src), "-p", "cleanup", "--data", str(data)]
    unkeyed = runner.invoke(app, base)
    assert unkeyed.exit_code == 2 and "--data-key" in unkeyed.stderr
    report = tmp_path / "r.json"
    keyed = runner.invoke(app, [*base, "--data-key", "test", "--report", str(report)])
    assert keyed.exit_code == 0, keyed.output
    assert json.loads(report.read_text())["check"]["inputs"] == {"x": "float32[3x7]"}
    wrong = runner.invoke(app, [*base, "--data-key", "nope"])
    assert wrong.exit_code == 2 and "has no array 'nope'" in " ".join(wrong.stderr.split())
    bisected = runner.invoke(app, [*base, "--data-key", "test", "--bisect"])
    assert bisected.exit_code == 0, bisected.output


def test_data_for_a_model_with_state_whose_axis_0_is_not_a_batch(tmp_path):
    """state [2, 1, 128] beside input [1, 512]: one sample is the whole state array (the
    loader used to ask for a --batch-size 2 that `check` does not have)."""
    src = _save(tmp_path, vad_model())
    np.savez(tmp_path / "d.npz", input=np.ones((1, 512), np.float32),
             state=np.zeros((2, 1, 128), np.float32), sr=np.array(8000))
    checked = runner.invoke(app, ["check", str(src), str(src), "--data",
                                  str(tmp_path / "d.npz")])
    assert checked.exit_code == 0, checked.output
    report = tmp_path / "r.json"
    ran = runner.invoke(app, ["run", str(src), "-p", "cleanup", "--data",
                              str(tmp_path / "d.npz"), "--report", str(report)])
    assert ran.exit_code == 0, ran.output
    assert json.loads(report.read_text())["check"]["inputs"]["state"] == "float32[2x1x128]"


def test_run_says_why_the_model_cannot_run_and_ort_logs_stay_off_the_terminal(tmp_path):
    src = _save(tmp_path, vad_model())
    out = tmp_path / "out.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "graphfix", "run", str(src), "-p", "cleanup",
         "--input-value", "sr=3", "-o", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # rich wraps long lines
    assert "warning: numerical check skipped: onnxruntime cannot run the input model" in text
    assert "computed from input 'sr', which was [3]" in text
    assert "--input-value sr=VALUE" in text
    assert not ORT_LOG.search(proc.stderr), proc.stderr
    assert not ORT_LOG.search(proc.stdout), proc.stdout


def test_check_says_which_input_breaks_the_reference(tmp_path):
    src = _save(tmp_path, vad_model())
    proc = subprocess.run(
        [sys.executable, "-m", "graphfix", "check", str(src), str(src), "--input-value",
         "sr=3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "onnxruntime cannot run the reference model" in proc.stderr
    assert "input 'sr', which was [3]" in proc.stderr
    assert not ORT_LOG.search(proc.stderr), proc.stderr


def test_api_run_takes_input_values():
    import graphfix

    model = vad_model(constants=False)
    result = graphfix.run(model, passes="cleanup", input_values={"sr": 8000})
    assert result.report.check.enabled
    assert result.report.check.inputs["sr"] == "int64[]"
    try:
        graphfix.run(model, passes="cleanup")
    except graphfix.GraphfixError as err:
        assert "Input 'sr' is an integer scalar" in str(err)
    else:
        raise AssertionError("an integer scalar nothing compares was not refused")
