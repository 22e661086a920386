"""`run --data` and `check --data` read image folders as calibrate does, with
--preprocess (they documented image folders but had no --preprocess to read them)."""

import json

import numpy as np
import onnx
import pytest
from gfhelpers import parse
from typer.testing import CliRunner

from graphfix.cli.app import app

Image = pytest.importorskip("PIL.Image")
runner = CliRunner()
NCHW = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,3,8,8] x) => (float[N,3,8,8] y) { r = Relu(x)
    s = Identity(r)
    y = Sigmoid(s) }""")


def _images(tmp_path, count=3):
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)).save(
            folder / f"{i}.png")
    return folder


def test_run_and_check_read_an_image_folder_with_preprocess(tmp_path):
    model, out, folder = tmp_path / "m.onnx", tmp_path / "o.onnx", _images(tmp_path)
    onnx.save(NCHW, model)
    ran = runner.invoke(app, ["run", str(model), "-p", "cleanup", "-o", str(out), "--data",
                              str(folder), "--preprocess", "scale=1/255", "--report",
                              str(tmp_path / "r.json")])
    assert ran.exit_code == 0, ran.output
    check = json.loads((tmp_path / "r.json").read_text())["check"]
    assert check["enabled"] and check["data"].endswith("imgs")
    assert check["inputs"] == {"x": "float32[1x3x8x8]"}  # resized to the model's size
    checked = runner.invoke(app, ["check", str(model), str(out), "--data", str(folder),
                                  "--preprocess", "scale=1/255", "--json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["passed"] and report["samples"] == 3


@pytest.mark.parametrize("command", ["run", "check"])
def test_an_image_folder_without_preprocess_says_how(tmp_path, command):
    model, folder = tmp_path / "m.onnx", _images(tmp_path, 1)
    onnx.save(NCHW, model)
    args = [command, str(model)] + ([str(model)] if command == "check" else
                                    ["-o", str(tmp_path / "o.onnx")])
    result = runner.invoke(app, [*args, "--data", str(folder)])
    assert result.exit_code == 2
    assert "holds images, but no --preprocess was given" in result.output
    assert "--preprocess scale=1/255" in result.output


STRIDED = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,3,H,W] x) => (float[N,3,H,W] y) {
    w = Constant<value = float[3,3,1,1] {1,0,0, 0,1,0, 0,0,1}>()
    c = Conv(x, w)
    p = MaxPool<kernel_shape = [2, 2], strides = [2, 2]>(c)
    s = Constant<value = float[4] {1, 1, 2, 2}>()
    u = Resize<mode = "nearest">(p, , s)
    a = Add(c, u)
    y = Conv(a, w) }""")


def test_images_kept_at_odd_sizes_get_the_resize_hint(tmp_path):
    """A network whose strides must divide the size (YOLOv8 at 480x640 failed in a Concat)
    gets, with onnxruntime's reason, the sizes the images kept and the way: resize=."""
    model, folder = tmp_path / "m.onnx", _images(tmp_path, 2)  # 10x12 and 11x12
    onnx.save(STRIDED, model)
    result = runner.invoke(app, ["calibrate", str(model), "--data", str(folder),
                                 "--preprocess", "scale=1/255", "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "onnxruntime cannot run the model on the calibration batch that starts at sample 2" \
        in text
    assert ("the images keep their own sizes (10x12, 11x12), as the model's height and width "
            "are dynamic: pass resize=HxW in --preprocess") in text
    ok = runner.invoke(app, ["calibrate", str(model), "--data", str(folder), "--preprocess",
                             "scale=1/255,resize=8x12", "-o", str(tmp_path / "q.onnx")])
    assert ok.exit_code == 0, ok.output


CLASSIFIER = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,3,8,8] x) => (float[N,3] logits) {
    w = Constant<value = float[3,3,1,1] {1,0,0, 0,1,0, 0,0,1}>()
    c = Conv(x, w)
    pooled = GlobalAveragePool(c)
    axes = Constant<value = int64[2] {2, 3}>()
    logits = Squeeze(pooled, axes) }""")


def test_labels_from_class_folders_give_an_accuracy(tmp_path):
    """--labels folders: each image's label is its class folder's index; the classifier
    here predicts the image's brightest channel, and folder cK holds images whose channel
    K is brightest, so FP32's accuracy is 100%."""
    folder = tmp_path / "classes"
    rng = np.random.default_rng(0)
    for k in range(3):
        (folder / f"c{k}").mkdir(parents=True)
        for i in range(4):
            arr = rng.integers(0, 60, (8, 8, 3), dtype=np.uint8)
            arr[..., k] += 150
            Image.fromarray(arr).save(folder / f"c{k}" / f"{i}.png")
    model = tmp_path / "m.onnx"
    onnx.save(CLASSIFIER, model)
    result = runner.invoke(app, ["calibrate", str(model), "--data", str(folder), "--preprocess",
                                 "scale=1/255", "--labels", "folders", "--eval-split", "6",
                                 "--json", "-o", str(tmp_path / "q.onnx")])
    assert result.exit_code == 0, result.output
    auto = json.loads(result.stdout)["methods"][0]
    assert auto["method"] == "auto" and auto["samples"] == 6 and auto["reference_accuracy"] == 1.0
    assert auto["accuracy"] == 1.0
    flat = runner.invoke(app, ["calibrate", str(model), "--data", str(_images(tmp_path)),
                               "--preprocess", "scale=1/255", "--labels", "folders",
                               "-o", str(tmp_path / "q2.onnx")])
    assert flat.exit_code == 2
    assert "--labels folders needs class subfolders" in flat.output
