"""detect-unsupported: records doctor's findings as notes, never changes the graph; and
`graphfix run --trt` prints what still blocks the target's parser."""

from __future__ import annotations

import json

import onnx
from gfhelpers import parse
from typer.testing import CliRunner

from graphfix.cli.app import app
from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.detect_unsupported import DetectUnsupported, DetectUnsupportedOptions
from graphfix.trt import parse_target

HARDMAX = parse("""<ir_version: 8, opset_import: ["" : 13]>
g (float[2,5] x) => (float[2,5] y) { h = Hardmax(x) y = Relu(h) }""")


def run_pass(model, options=None, ctx=None):
    graph = to_graph(model)
    before = fingerprint(graph)
    result = DetectUnsupported(options).run(graph, ctx or PassContext())
    assert not result.changed and fingerprint(graph) == before
    return [str(n) for n in result.notes]


def test_findings_for_the_option_target():
    notes = run_pass(HARDMAX, DetectUnsupportedOptions(trt="8.6"))
    assert notes[0].startswith("Hardmax 'h': error op-unsupported: Hardmax is listed as "
                               "unsupported in the TensorRT 8.6 ONNX operator table")
    assert notes[-1].startswith("graph: TensorRT 8.6 will parse this model: no — 1 blocking node")


def test_the_run_target_is_used_without_an_option():
    notes = run_pass(HARDMAX, ctx=PassContext(trt=parse_target("10.16")))
    assert notes == ["graph: TensorRT 10.16 will parse this model: yes; 0 info finding(s) "
                     "not listed (graphfix doctor --info)"]  # Hardmax's axis dim 5: static


def test_run_with_trt_prints_blocking_findings_and_reports_them(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(HARDMAX, src)
    report = tmp_path / "r.json"
    result = CliRunner().invoke(app, ["run", str(src), "-o", str(tmp_path / "o.onnx"),
                                      "--trt", "8.6", "--report", str(report)])
    assert result.exit_code == 1, result.output  # the target still cannot parse it
    assert "op-unsupported" in result.stdout
    assert "TensorRT 8.6 will parse this model: no — 1 blocking node" in result.stdout
    data = json.loads(report.read_text())
    assert data["doctor"]["schema"] == "graphfix.doctor/1"
    assert data["doctor"]["counts"]["error"] == 1
