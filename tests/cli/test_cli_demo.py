import onnx
from typer.testing import CliRunner

from graphfix.cli.app import app

runner = CliRunner()


def test_demo_writes_input_and_output_and_prints_the_table(tmp_path):
    result = runner.invoke(app, ["demo", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    src = onnx.load(tmp_path / "conv_bn_relu_residual.onnx")
    out = onnx.load(tmp_path / "conv_bn_relu_residual.graphfix.onnx")
    assert "BatchNormalization" in [n.op_type for n in src.graph.node]
    assert "BatchNormalization" not in [n.op_type for n in out.graph.node]
    assert "fold-bn" in result.stdout and "passed" in result.stdout
    assert "rolled back" not in result.stdout
