"""`graphfix calibrate` on a float16 model: exit 2 with why and how to fix, no output
written, the input untouched (with --data and with --from-cache)."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import build_model, init, seeded, value
from onnx import TensorProto, helper
from typer.testing import CliRunner

from graphfix.calibration.cache import write_cache
from graphfix.cli.app import app

runner = CliRunner()


def fp16_model(tmp_path):
    """x[1,3,8,8] float16 -> Conv(W float16) -> y, saved; with float16 data for it."""
    model = build_model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv")],
                        [value("x", [1, 3, 8, 8], TensorProto.FLOAT16)],
                        [value("y", None, TensorProto.FLOAT16)],
                        [init("W", seeded([4, 3, 3, 3], np.float16))])
    path, data = tmp_path / "half.onnx", tmp_path / "half.npz"
    onnx.save(model, path)
    np.savez(data, x=np.random.default_rng(0).standard_normal([4, 3, 8, 8]).astype(np.float16))
    return path, data


def test_float16_model_exits_2_and_writes_nothing(tmp_path):
    model, data = fp16_model(tmp_path)
    before = model.read_bytes()
    out = tmp_path / "half.int8.onnx"
    result = runner.invoke(app, ["calibrate", str(model), "--data", str(data), "-o", str(out)])
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "no tensor of the model can be calibrated" in said
    assert "computes in float16" in said and "FP32 model" in said
    assert "wrote" not in result.output
    assert not out.exists()
    assert model.read_bytes() == before


def test_float16_model_from_cache_exits_2(tmp_path):
    model, _ = fp16_model(tmp_path)
    cache = tmp_path / "c.cache"
    cache.write_text(write_cache({"x": 2.0}, trt_version="10.9"))
    out = tmp_path / "half.int8.onnx"
    result = runner.invoke(app, ["calibrate", str(model), "--from-cache", str(cache),
                                 "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert "computes in float16" in " ".join(result.stderr.split())
    assert not out.exists()
