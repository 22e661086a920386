"""Bad input: exit 2, a one-paragraph message (what, why, how to fix), input untouched,
no partial output."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from graphfix import samples
from graphfix.cli.app import app

runner = CliRunner()


def external_model(tmp_path, name, location, length=None):
    """A model whose weight points at external data `location`."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0"}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        w.external_data.add(key=k, value=v)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def bad_inputs(tmp_path):
    good = samples.conv_bn_relu_residual().SerializeToString()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(4096))
    (tmp_path / "model.json").write_text(json.dumps({"graph": {"node": []}}))
    (tmp_path / "truncated.onnx").write_bytes(good[: len(good) // 2])
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.zeros(16, np.float32).tobytes())
    (sub / "short.bin").write_bytes(b"\0" * 8)
    yield "missing", tmp_path / "nope.onnx", "does not exist"
    yield "empty", tmp_path / "empty.onnx", "empty"
    yield "random", tmp_path / "random.onnx", "ONNX"
    yield "json", tmp_path / "model.json", "ONNX"
    yield "truncated", tmp_path / "truncated.onnx", "truncated"
    yield "ext-missing", external_model(sub, "missing", "weights.bin"), "weights.bin"
    yield "ext-short", external_model(sub, "short", "short.bin"), "short"
    yield "ext-dotdot", external_model(sub, "dotdot", "../secret.bin"), "outside"
    yield "ext-absolute", external_model(sub, "absolute", str(tmp_path / "secret.bin")), "absolute"


@pytest.mark.parametrize("case", ["missing", "empty", "random", "json", "truncated",
                                  "ext-missing", "ext-short", "ext-dotdot", "ext-absolute"])
def test_bad_model_file_exit_2_input_unchanged_no_output(tmp_path, case):
    cases = {name: (path, hint) for name, path, hint in bad_inputs(tmp_path)}
    path, hint = cases[case]
    before = path.read_bytes() if path.exists() else None
    listing = sorted(p.name for p in path.parent.iterdir())
    out = path.parent / "out.onnx"
    result = runner.invoke(app, ["run", str(path), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert hint.lower() in result.stderr.lower()
    assert "Traceback" not in result.stderr
    assert (path.read_bytes() if path.exists() else None) == before
    assert sorted(p.name for p in path.parent.iterdir()) == listing, "no output, no temp files"


def test_debug_shows_the_traceback(tmp_path):
    result = runner.invoke(app, ["--debug", "run", str(tmp_path / "nope.onnx")])
    assert result.exit_code == 2
    assert "Traceback" in result.stderr


@pytest.mark.parametrize("args, hint", [
    (["--passes", "fold-nb"], "did you mean 'fold-bn'"),
    (["--passes", "cleanup,"], "ends with ','"),
    (["--passes", "fold-constants{size=1}"], "no option 'size'"),
    (["--input-shape", "input=1x3"], "--input-shape input:1x3x224x224"),
    (["--input-shape", "input:1x4x32x32"], "does not fit"),
])
def test_bad_options_exit_2(tmp_path, args, hint):
    src = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    result = runner.invoke(app, ["run", str(src), *args])
    assert result.exit_code == 2, result.output
    assert hint in result.stderr
    assert not (tmp_path / "m.graphfix.onnx").exists()


@pytest.mark.parametrize("trt", ["7", "abc"])
def test_a_bad_trt_version_exits_2_in_a_real_process(tmp_path, trt):
    """The version is refused before the original starts running in the background: an
    error while onnxruntime ran in a thread ended the process with an abort (134)."""
    src = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    done = subprocess.run([sys.executable, "-m", "graphfix", "run", str(src), "--trt", trt],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "as the TensorRT version" in done.stderr
    assert "terminate called" not in done.stderr
    assert not (tmp_path / "m.graphfix.onnx").exists()


def test_refuses_to_overwrite_the_input_without_in_place(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    before = src.read_bytes()
    result = runner.invoke(app, ["run", str(src), "-o", str(src)])
    assert result.exit_code == 2
    assert "--in-place" in result.stderr
    assert src.read_bytes() == before
    result = runner.invoke(app, ["run", str(src), "-o", str(src), "--in-place"])
    assert result.exit_code == 0, result.output
    assert "BatchNormalization" not in [n.op_type for n in onnx.load(src).graph.node]


def test_missing_output_directory(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(samples.conv_bn_relu_residual(), src)
    result = runner.invoke(app, ["run", str(src), "-o", str(tmp_path / "no" / "o.onnx")])
    assert result.exit_code == 2
    assert "directory" in result.stderr
