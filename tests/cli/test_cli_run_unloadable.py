"""`graphfix run` on a model onnxruntime cannot load (D9's repro: Identity's output
declared float, computed float16): the skipped check says the model is at fault, not an
input, and eliminate-noops keeps the real float16 -> float Cast."""

from __future__ import annotations

import onnx
from gfhelpers import build_model, value
from onnx import TensorProto, helper
from typer.testing import CliRunner

from graphfix.cli.app import app

runner = CliRunner()


def test_run_says_the_model_does_not_load_and_keeps_the_cast(tmp_path):
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Identity", ["x16"], ["y16"]),
             helper.make_node("Relu", ["y16"], ["r16"]),
             helper.make_node("Cast", ["r16"], ["out"], to=TensorProto.FLOAT)]
    model = build_model(nodes, [value("x", [1, 4])], [value("out", [1, 4])], [],
                        checked=False, value_info=[value("y16", [1, 4])])
    src, out = tmp_path / "bad.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    result = runner.invoke(app, ["run", str(src), "-o", str(out)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "onnxruntime cannot run the input model (it does not load)" in said
    assert "no input is to blame" in said
    assert "is to blame:" not in said and "--input-value x=VALUE" not in said
    assert ("declares types its nodes contradict for 'y16' (onnxruntime cannot load it): "
            "graphfix dropped those value_info entries") in said  # the manager's note
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Cast", "Relu", "Cast"]
    assert src.read_bytes() == before
