import sys

import numpy as np
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime.data import Preprocess, open_data

Image = pytest.importorskip("PIL.Image")

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
NCHW = parse(HEAD + "g (float[N,3,8,8] x) => (float[N,3,8,8] y) { y = Relu(x) }")
NHWC = parse(HEAD + "g (float[N,8,8,3] x) => (float[N,8,8,3] y) { y = Relu(x) }")
FREE = parse(HEAD + "g (float[N,3,H,W] x) => (float[N,3,H,W] y) { y = Relu(x) }")
INTS = parse(HEAD + "g (uint8[N,3,8,8] x) => (uint8[N,3,8,8] y) { y = Identity(x) }")


def _images(tmp_path, sizes=((10, 12),) * 3, names=None, suffix=".png"):
    """PNGs of seeded random pixels; sizes are (height, width). Returns the folder and
    the pixel arrays in sorted file-name order."""
    folder = tmp_path / "imgs"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    names = names or [f"{i:02d}" for i in range(len(sizes))]
    pixels = {}
    for name, (h, w) in zip(names, sizes, strict=True):
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(folder / f"{name}{suffix}")
        pixels[f"{name}{suffix}"] = arr
    return folder, [pixels[k] for k in sorted(pixels)]


def _expected(arr, size, scale, mean, std, bgr, nchw=True):
    im = Image.fromarray(arr)
    if im.size != (size[1], size[0]):
        im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    x = np.asarray(im, dtype=np.float32)
    x = (x[..., ::-1] if bgr else x) * np.float32(scale)
    x = (x - np.float32(mean)) / np.float32(std)
    return x.transpose(2, 0, 1) if nchw else x


def test_images_are_preprocessed_in_sorted_order(tmp_path):
    folder, pixels = _images(tmp_path, names=["b", "a", "c"])
    spec = Preprocess.parse("resize=8,layout=NCHW,scale=1/255,mean=0.5/0.4/0.3,"
                            "std=0.2/0.25/0.5,bgr")
    data = open_data(folder, NCHW, preprocess=spec, batch_size=2)
    batches = list(data)
    assert [f["x"].shape for f in batches] == [(2, 3, 8, 8), (1, 3, 8, 8)]
    got = np.concatenate([f["x"] for f in batches])
    assert got.dtype == np.float32
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.25, 0.5])
    want = np.stack([_expected(p, (8, 8), 1 / 255, mean, std, True) for p in pixels])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert data.describe() == (f"3 samples from imgs/ (3 images, {spec}), batches of 2")


def test_images_take_the_models_size_and_layout(tmp_path):
    folder, pixels = _images(tmp_path, sizes=((10, 12), (9, 7)), suffix=".JPEG")
    data = open_data(folder, NHWC, preprocess=Preprocess.parse("layout=nhwc,scale=1"))
    assert [f["x"].shape for f in data] == [(1, 8, 8, 3)] * 2
    jpeg = np.asarray(Image.open(sorted(folder.iterdir())[0]).convert("RGB"))
    np.testing.assert_allclose(next(iter(data))["x"][0],
                               _expected(jpeg, (8, 8), 1, 0, 1, False, nchw=False), atol=1e-6)


def test_dynamic_image_size_keeps_the_image_size(tmp_path):
    folder, _ = _images(tmp_path, sizes=((10, 12), (9, 7)))
    spec = Preprocess.parse("scale=1/255")
    data = open_data(folder, FREE, preprocess=spec)
    assert [f["x"].shape for f in data] == [(1, 3, 10, 12), (1, 3, 9, 7)]
    with pytest.raises(GraphfixError, match="cannot share a batch"):
        open_data(folder, FREE, preprocess=spec, batch_size=2)
    same = open_data(folder, FREE, preprocess=Preprocess.parse("resize=6x5"), batch_size=2)
    assert [f["x"].shape for f in same] == [(2, 3, 6, 5)]


CHW = parse(HEAD + "g (float[3,H,W] image) => (float[3,H,W] y) { y = Relu(image) }")
HWC = parse(HEAD + "g (float[8,8,3] image) => (float[8,8,3] y) { y = Relu(image) }")
VECTOR = parse(HEAD + "g (float[N,12] x) => (float[N,12] y) { y = Relu(x) }")


def test_a_model_without_a_batch_axis_takes_each_image_as_it_is(tmp_path):
    """torchvision's detectors take image [3, H, W]: an image folder fed only 4-D inputs
    ('not an image batch')."""
    folder, pixels = _images(tmp_path, sizes=((10, 12), (9, 7)))
    data = open_data(folder, CHW, preprocess=Preprocess.parse("scale=1/255"))
    runs = list(data)
    assert [f["image"].shape for f in runs] == [(3, 10, 12), (3, 9, 7)]
    np.testing.assert_allclose(runs[1]["image"], _expected(pixels[1], (9, 7), 1 / 255, 0, 1,
                                                           False), atol=1e-6)
    hwc = open_data(folder, HWC, preprocess=Preprocess.parse("layout=NHWC,scale=1"))
    assert [f["image"].shape for f in hwc] == [(8, 8, 3)] * 2  # resized to the model's
    with pytest.raises(GraphfixError, match=r"\[N, 12\] is not an image or a batch of im"):
        open_data(folder, VECTOR, preprocess=Preprocess.parse("scale=1"))


@pytest.mark.parametrize(("model", "text", "message"), [
    (NHWC, "layout=NCHW", r"has 8 channels in layout NCHW.*Pass the other layout="),
    (NCHW, "resize=10", r"becomes 10x10, but input 'x' \[N, 3, 8, 8\] has height 8"),
    (INTS, "scale=1", "Input 'x' is uint8, but image preprocessing gives floats"),
])
def test_image_errors_say_what_to_change(tmp_path, model, text, message):
    folder, _ = _images(tmp_path)
    with pytest.raises(GraphfixError, match=message):
        open_data(folder, model, preprocess=Preprocess.parse(text))


def test_image_folder_needs_preprocess_and_readable_images(tmp_path):
    folder, _ = _images(tmp_path)
    with pytest.raises(GraphfixError, match="holds images, but no --preprocess was given"):
        open_data(folder, NCHW)
    (folder / "zz.png").write_bytes(b"not a png")
    with pytest.raises(GraphfixError, match="Cannot read the image '.*zz.png'"):
        open_data(folder, NCHW, preprocess=Preprocess())


def test_missing_pillow_says_how_to_install(tmp_path, monkeypatch):
    folder, _ = _images(tmp_path)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(GraphfixError, match="pip install pillow"):
        open_data(folder, NCHW, preprocess=Preprocess())


def test_preprocess_parse_and_round_trip():
    spec = Preprocess.parse(" resize=224x256, layout=nhwc ,scale=1/255,mean=0.485/0.456/0.406,"
                            "std=0.229/0.224/0.225,bgr,")
    assert spec == Preprocess((224, 256), "NHWC", 1 / 255, (0.485, 0.456, 0.406),
                              (0.229, 0.224, 0.225), True)
    assert str(spec) == ("resize=224x256,layout=NHWC,scale=1/255,mean=0.485/0.456/0.406,"
                         "std=0.229/0.224/0.225,bgr")
    assert Preprocess.parse(str(spec)) == spec
    assert Preprocess.parse("") == Preprocess(None)
    assert str(Preprocess.parse("resize=8,scale=0.5,mean=127.5")) == (
        "resize=8,layout=NCHW,scale=1/2,mean=127.5")
    assert Preprocess.parse("scale=0.3").scale == 0.3


@pytest.mark.parametrize(("text", "message"), [
    ("size=224", "Unknown --preprocess key 'size'. Keys are resize, layout"),
    ("resize=abc", "resize=abc is not a size"),
    ("resize=0", r"resize=\(0, 0\) is not a size"),
    ("layout=NCWH", "layout=NCWH is not a layout"),
    ("scale=1/0", "scale=1/0 is not understood"),
    ("mean=0.5/0.5", "mean has 2 values"),
    ("std=1/0/1", "std has a zero"),
    ("bgr=1", "gives bgr a value .'bgr=1'.. It is a flag"),
    ("scale=1,scale=2", "gives 'scale' twice"),
    ("mean=", "key 'mean' has no value"),
])
def test_bad_preprocess_text_says_how_to_write_it(text, message):
    with pytest.raises(GraphfixError, match=message) as err:
        Preprocess.parse(text)
    assert "--preprocess resize=224,layout=NCHW,scale=1/255" in str(err.value)


def _classes(tmp_path, counts=(3, 1, 2)):
    """folder/CLASS/*.png, CLASS c0, c1, ... with `counts` images each; pixels encode
    (class, image) in the first pixel so the order can be read back."""
    folder = tmp_path / "classes"
    for c, count in enumerate(counts):
        (folder / f"c{c}").mkdir(parents=True)
        for i in range(count):
            arr = np.zeros((8, 8, 3), np.uint8)
            arr[0, 0] = (c, i, 0)
            Image.fromarray(arr).save(folder / f"c{c}" / f"{i}.png")
    return folder


def test_class_subfolders_interleave_and_label_each_image(tmp_path):
    """ImageNet's val/ sorted into synsets (torchvision's ImageFolder layout): the images
    come one class at a time in turn, so any first or last N cover every class, and each
    carries its folder's index in name order (`--labels folders`)."""
    folder = _classes(tmp_path)
    data = open_data(folder, NCHW, preprocess=Preprocess.parse("scale=1"))
    order = [(int(f["x"][0, 0, 0, 0]), int(f["x"][0, 1, 0, 0])) for f in data]
    assert order == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
    assert data.folder_labels().tolist() == [0, 1, 2, 0, 2, 0]
    assert data.describe() == "6 samples from classes/ (6 images in 3 class folders, " \
        "layout=NCHW,scale=1.0), batches of 1"
    calib, held = data.split(2)
    assert calib.folder_labels().tolist() == [0, 1, 2, 0] and held.folder_labels().tolist() \
        == [2, 0]
    flat = open_data(_images(tmp_path)[0], NCHW, preprocess=Preprocess.parse("scale=1"))
    assert flat.folder_labels() is None
    with pytest.raises(GraphfixError, match="holds images, but no --preprocess was given"):
        open_data(folder, NCHW)


GRAY = parse(HEAD + "g (float[N,1,8,8] x) => (float[N,1,8,8] y) { y = Relu(x) }")


def test_a_one_channel_input_reads_images_as_grayscale(tmp_path):
    """MNIST-like and medical models take [N, 1, H, W]: images were refused ('has 1
    channels ... images are read as RGB'); they are read as Pillow's L now."""
    folder, pixels = _images(tmp_path, sizes=((8, 8), (10, 12)))
    data = open_data(folder, GRAY, preprocess=Preprocess.parse("scale=1/255,mean=0.5,std=0.25"))
    got = [f["x"] for f in data]
    assert [g.shape for g in got] == [(1, 1, 8, 8)] * 2
    gray = np.asarray(Image.fromarray(pixels[0]).convert("L"), dtype=np.float32)
    np.testing.assert_allclose(got[0][0, 0], (gray / 255 - 0.5) / 0.25, atol=1e-6)
    with pytest.raises(GraphfixError, match="gives mean 3 values, but input 'x'"):
        open_data(folder, GRAY, preprocess=Preprocess.parse("mean=0.4/0.5/0.6"))
