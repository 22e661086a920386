"""`graphfix calibrate` from the command line on digits_dev: outputs, cache, ranges,
--from-cache, errors."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from graphfix.calibration.cache import read_cache
from graphfix.cli.app import app

runner = CliRunner()


@pytest.fixture
def digits(shared_model, tmp_path):
    model = tmp_path / "digits.onnx"
    model.write_bytes(shared_model("digits_dev.onnx").read_bytes())
    return model, shared_model("digits_dev_data.npz")


def test_method_all_compares_and_writes_everything(digits, tmp_path):
    model, data = digits
    before = model.read_bytes()
    out, cache, ranges = tmp_path / "q.onnx", tmp_path / "c.cache", tmp_path / "r.json"
    result = runner.invoke(app, [
        "calibrate", str(model), "--data", str(data), "--data-key", "calib",
        "--batch-size", "50", "--method", "all", "--eval-data", str(data),
        "--eval-key", "test", "--labels", "test_labels", "-o", str(out),
        "--cache", str(cache), "--trt", "8.6", "--ranges", str(ranges), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [m["method"] for m in summary["methods"]] == ["auto", "entropy", "minmax",
                                                         "percentile", "mse"]
    assert all(m["accuracy"] is not None for m in summary["methods"])
    assert summary["schema"] == "graphfix.calibrate/2" and summary["clipping"] == []
    assert model.read_bytes() == before
    onnx.checker.check_model(onnx.load(out), full_check=True)
    header, scales = read_cache(cache.read_text())
    assert header.startswith("TRT-8600-") and scales
    written = json.loads(ranges.read_text())
    assert written["schema"] == "graphfix.ranges/2"
    chosen = {t["chosen"]["auto"] for t in written["tensors"].values() if t["chosen"]}
    assert chosen and chosen <= {"minmax", "percentile", "entropy", "mse"}
    back = tmp_path / "back.onnx"
    again = runner.invoke(app, ["calibrate", str(model), "--from-cache", str(cache),
                                "-o", str(back)])
    assert again.exit_code == 0, again.output
    onnx.checker.check_model(onnx.load(back), full_check=True)


def test_table_output_names_the_recommendation(digits, tmp_path):
    model, data = digits
    result = runner.invoke(app, [
        "calibrate", str(model), "--data", str(data), "--data-key", "calib",
        "--samples", "40", "--batch-size", "20", "--method", "minmax", "--eval",
        "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 0, result.output
    assert "recommended (*): minmax" in result.stdout
    assert "held apart" in result.stdout


@pytest.mark.parametrize(("args", "text"), [
    (["--method", "kl"], "Unknown calibration method 'kl'"),
    (["--percentile", "150"], "--percentile 150 is out of range"),
    (["--method", "minmax", "--per-tensor"], "nothing to choose from"),
    (["--bins", "64"], "--bins 64 is out of range"),
    ([], "no calibration data"),
    (["--cache", "x.cache", "--trt", "11.1"], "TensorRT 11 removed implicit INT8"),
    (["--memory-budget", "lots"], "--memory-budget"),
])
def test_user_errors_exit_2(digits, tmp_path, args, text):
    model, data = digits
    data_args = [] if args == [] else ["--data", str(data), "--data-key", "calib",
                                       "--samples", "8"]
    result = runner.invoke(app, ["calibrate", str(model), *data_args, *args,
                                 "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 2, result.output
    assert text in result.stderr


def test_entropy_warns_of_bad_clips_and_the_default_does_not(shared_model, tmp_path):
    """digits_hswish_dev: TensorRT-style entropy clips HardSwish outputs; the warning names
    them with the way out, the JSON carries the same list; auto (the default) has none,
    and the doctor note checks the documented default target."""
    model, data = shared_model("digits_hswish_dev.onnx"), shared_model("digits_hswish_dev_data.npz")
    args = ["calibrate", str(model), "--data", str(data), "--data-key", "calib",
            "--batch-size", "50"]
    table = runner.invoke(app, [*args, "--method", "entropy", "-o", str(tmp_path / "e.onnx")],
                          env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    assert "lose more than 6.02 dB (one bit)" in table.stdout
    assert "entropy clips at" in table.stdout and "--exclude-nodes" in table.stdout
    as_json = runner.invoke(app, [*args, "--method", "entropy", "--json",
                                  "-o", str(tmp_path / "e2.onnx")])
    clips = json.loads(as_json.stdout)["clipping"]
    assert clips and all(c["lost_db"] > 6.02 and c["amax"] < c["observed_amax"] for c in clips)
    assert [c["tensor"] for c in clips] == [c["tensor"] for c in sorted(clips, key=lambda c:
                                                                         -c["lost_db"])]
    default = runner.invoke(app, [*args, "--json", "-o", str(tmp_path / "a.onnx")])
    summary = json.loads(default.stdout)
    assert [m["method"] for m in summary["methods"]] == ["auto"]
    assert summary["clipping"] == [] and summary["methods"][0]["chosen"]
    assert "graphfix doctor: no Q/DQ findings for TensorRT 10.16" in summary["notes"]
    assert not any("will parse this model" in n for n in summary["notes"])  # it parses


def test_a_model_tensorrt_will_not_parse_gets_one_note_naming_the_way(tmp_path):
    """onnxruntime's fused ops (com.microsoft Gelu here) do not parse in TensorRT, with or
    without Q/DQ: calibrate still writes the model (the reader of the untyped tensor
    float) and says so in one note, with the command that rewrites them."""
    import numpy as np
    from gfhelpers import contrib_gelu_mlp

    rng = np.random.default_rng(1)
    onnx.save(contrib_gelu_mlp(), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((4, 8)).astype(np.float32))
    result = runner.invoke(app, ["calibrate", str(tmp_path / "m.onnx"), "--data",
                                 str(tmp_path / "d.npz"), "--json", "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    verdict = [n for n in notes if "will parse this model" in n]
    assert len(verdict) == 1 and "TensorRT 10.16 will parse this model: no" in verdict[0]
    assert "`graphfix run MODEL --trt 10.16` before calibrating" in verdict[0]
    assert "graphfix doctor: no Q/DQ findings for TensorRT 10.16" in notes


def test_labels_follow_the_held_samples_rows_when_samples_are_limited(shared_model, tmp_path):
    """--samples 200 --eval-split 100 compares rows 101-200 of the data; the labels were
    read from the file's last 100 rows (297-397), so FP32's accuracy read 13% on a
    model that scores 99% there."""
    import numpy as np

    with np.load(shared_model("digits_dev_data.npz")) as archive:
        np.savez(tmp_path / "d.npz", x=archive["test"], y=archive["test_labels"])
    args = ["calibrate", str(shared_model("digits_dev.onnx")), "--data", str(tmp_path / "d.npz"),
            "--data-key", "x", "--labels", "y", "--json", "-o", str(tmp_path / "q.onnx")]
    limited = runner.invoke(app, [*args, "--samples", "200", "--eval-split", "100"])
    assert limited.exit_code == 0, limited.output
    auto = json.loads(limited.stdout)["methods"][0]
    assert auto["samples"] == 100 and auto["reference_accuracy"] >= 0.95
    short = tmp_path / "short.npz"
    with np.load(tmp_path / "d.npz") as archive:
        np.savez(short, x=archive["x"], y=archive["y"][:150])
    args[args.index(str(tmp_path / "d.npz"))] = str(short)
    bad = runner.invoke(app, [*args, "--samples", "200", "--eval-split", "100"])
    assert bad.exit_code == 2
    assert "has 150 labels, but the compared samples are rows 101-200" in bad.output
