"""`graphfix check --html` and `graphfix calibrate --html`: the file is written with the
other outputs, is a well-formed self-contained page, and holds the command's data."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import numpy_helper
from pagecheck import page_data, parse_page
from typer.testing import CliRunner

from graphfix import samples
from graphfix.cli.app import app

runner = CliRunner()


def _models(tmp_path):
    model = samples.deep_resnet(blocks=3)
    onnx.save(model, tmp_path / "model.onnx")
    weight = next(i for i in model.graph.initializer if i.name == "block.1.weight")
    values = numpy_helper.to_array(weight).copy()
    values[0] *= 1.3
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, tmp_path / "bad.onnx")
    return tmp_path / "model.onnx", tmp_path / "bad.onnx"


def test_check_html_holds_the_comparison(tmp_path):
    ref, bad = _models(tmp_path)
    page, saved = tmp_path / "check.html", tmp_path / "check.json"
    result = runner.invoke(app, ["check", str(ref), str(bad), "--html", str(page),
                                 "--json-out", str(saved)])
    assert result.exit_code == 1, result.output
    assert f"wrote {page}" in result.stdout
    root = parse_page(page.read_text(encoding="utf-8"))
    data = json.loads(saved.read_text())
    assert page_data(root) == data and not data["passed"]
    text = page.read_text(encoding="utf-8")
    first = data["first_divergence"]["name"]
    assert "first divergence" in text and first in text
    assert all(t["name"] in text for t in data["tensors"] if t["status"] == "compared")


def test_calibrate_html_plots_every_quantized_tensor(tmp_path):
    ref, _ = _models(tmp_path)
    data = tmp_path / "calib.npz"
    rng = np.random.default_rng(0)
    np.savez(data, input=rng.standard_normal((8, 3, 16, 16)).astype(np.float32))
    page, ranges = tmp_path / "calib.html", tmp_path / "ranges.json"
    result = runner.invoke(app, ["calibrate", str(ref), "--data", str(data), "--method",
                                 "entropy,minmax", "--html", str(page), "--ranges",
                                 str(ranges), "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 0, result.output
    assert f"wrote {page}" in " ".join(result.stdout.split())
    root = parse_page(page.read_text(encoding="utf-8"))
    embedded = page_data(root)
    assert embedded == json.loads(ranges.read_text())
    text = page.read_text(encoding="utf-8")
    assert text.count("<svg") >= len(embedded["tensors"]) > 0
    assert all(name in text for name in embedded["tensors"])


def test_html_is_refused_before_any_work_where_it_cannot_be_made(tmp_path):
    ref, bad = _models(tmp_path)
    onto_input = runner.invoke(app, ["check", str(ref), str(bad), "--html", str(ref)])
    assert onto_input.exit_code == 2 and "error: " in onto_input.output
    detections = runner.invoke(app, ["check", str(ref), str(bad), "--detections",
                                     "--html", str(tmp_path / "d.html")])
    assert detections.exit_code == 2 and "--detections" in detections.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "model.onnx"]
