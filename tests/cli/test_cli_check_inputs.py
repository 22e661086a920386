"""`graphfix check A B` where B's inputs are not A's: exit 2 naming the inputs only one
model has; a candidate that only lacks an unused input, or whose input graphfix renamed,
is compared as before."""

from __future__ import annotations

import json

import onnx
from gfhelpers import build_model, value
from onnx import helper
from typer.testing import CliRunner

from graphfix.cli.app import app

runner = CliRunner()


def _relu(tmp_path, name: str, inputs: list[str]):
    """y[1,4] = Relu(first input); the other inputs are unused."""
    model = build_model([helper.make_node("Relu", [inputs[0]], ["y"], name="relu")],
                        [value(n, [1, 4]) for n in inputs], [value("y", [1, 4])], [])
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_candidate_with_other_inputs_names_them(tmp_path):
    ref = _relu(tmp_path, "image.onnx", ["input"])
    cand = _relu(tmp_path, "text.onnx", ["input_ids", "attention_mask"])
    result = runner.invoke(app, ["check", str(ref), str(cand)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert ("the candidate's inputs are not the reference's: only the candidate has "
            "'input_ids', 'attention_mask'; only the reference has 'input'") in said
    assert "same samples" in said and "the one it was made from" in said
    assert "No data for input" not in said


def test_candidate_without_an_unused_input_is_still_compared(tmp_path):
    ref = _relu(tmp_path, "two.onnx", ["x", "unused"])
    cand = _relu(tmp_path, "one.onnx", ["x"])
    result = runner.invoke(app, ["check", str(ref), str(cand)])
    assert result.exit_code == 0, result.output
    assert "check passed" in " ".join(result.stdout.split())


def test_input_renamed_by_a_run_report_is_the_same_input(tmp_path):
    ref = _relu(tmp_path, "ref.onnx", ["x"])
    cand = _relu(tmp_path, "renamed.onnx", ["x_renamed"])
    report = tmp_path / "run.json"
    report.write_text(json.dumps({"renamed": {"x": "x_renamed"}, "removed": {}}))
    result = runner.invoke(app, ["check", str(ref), str(cand), "--run-report", str(report)])
    assert result.exit_code == 0, result.output
