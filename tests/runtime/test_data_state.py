"""`open_data` on models whose static axis 0 is not a batch axis (recurrent state), and
the batch-size hint for commands that have no --batch-size."""

import numpy as np
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime.data import first_feeds, open_data, run_batch
from vadhelpers import vad_model

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
MIXED = parse(HEAD + """
g (float[4,3] a, float[2,5] b) => (float[4,3] y) { y = Relu(a) }""")
STATIC4 = parse(HEAD + "g (float[4,3] x) => (float[4,3] y) { y = Relu(x) }")


def test_state_is_one_whole_array_per_sample(tmp_path):
    np.savez(tmp_path / "one.npz", input=np.ones((1, 512), np.float32),
             state=np.full((2, 1, 128), 0.5, np.float32), sr=np.array(16000))
    data = open_data(tmp_path / "one.npz", vad_model())
    (feeds,) = list(data)
    assert feeds["state"].shape == (2, 1, 128) and feeds["input"].shape == (1, 512)
    assert feeds["sr"].shape == () and feeds["sr"] == 16000
    np.savez(tmp_path / "three.npz", input=np.ones((3, 512), np.float32),
             state=np.stack([np.full((2, 1, 128), i, np.float32) for i in range(3)]),
             sr=np.array([8000, 16000, 8000]))
    runs = list(open_data(tmp_path / "three.npz", vad_model()))
    assert [r["state"][0, 0, 0] for r in runs] == [0, 1, 2]
    assert [int(r["sr"]) for r in runs] == [8000, 16000, 8000]
    assert all(r["state"].shape == (2, 1, 128) for r in runs)


def test_state_with_the_wrong_shape_says_so(tmp_path):
    np.savez(tmp_path / "bad.npz", input=np.ones((1, 512), np.float32),
             state=np.zeros((2, 1, 64), np.float32), sr=np.array(16000))
    with pytest.raises(GraphfixError, match="The model's dim 2 is 128, the data has 64"):
        open_data(tmp_path / "bad.npz", vad_model())


def test_inputs_with_different_static_axis_0_are_whole(tmp_path):
    np.savez(tmp_path / "m.npz", a=np.ones((4, 3), np.float32), b=np.ones((2, 5), np.float32))
    assert run_batch(MIXED) == 1
    feeds = first_feeds(tmp_path / "m.npz", MIXED)
    assert feeds["a"].shape == (4, 3) and feeds["b"].shape == (2, 5)


def test_a_static_batch_is_the_check_batch_and_the_hint_fits_the_command(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((8, 3), np.float32))
    assert run_batch(STATIC4) == 4
    assert first_feeds(tmp_path / "x.npy", STATIC4)["x"].shape == (4, 3)
    with pytest.raises(GraphfixError, match="Pass --batch-size 4"):
        open_data(tmp_path / "x.npy", STATIC4, batch_size=1)
    with pytest.raises(GraphfixError) as info:
        open_data(tmp_path / "x.npy", STATIC4, batch_size=1, batch_option=None)
    assert "--batch-size" not in str(info.value)
    assert "A batch of 1 does not fit input 'x'" in str(info.value)


IMAGE = parse(HEAD + "g (float[3,H,W] image) => (float[3,H,W] y) { y = Relu(image) }")


def test_an_image_without_a_batch_axis_is_one_sample_a_run(tmp_path):
    """torchvision's detectors take image [3, H, W]: [N, 3, H, W] data is N images
    (it was refused with 'pass --batch-size 3'), and a run counts one sample."""
    from graphfix.calibration.stats import collect
    from graphfix.check.samples import check_samples

    images = np.random.default_rng(0).standard_normal((5, 3, 4, 6)).astype(np.float32)
    np.savez(tmp_path / "i.npz", image=images)
    data = open_data(tmp_path / "i.npz", IMAGE)
    runs = list(data)
    assert [r["image"].shape for r in runs] == [(3, 4, 6)] * 5
    np.testing.assert_array_equal(np.stack([r["image"] for r in runs]), images)
    assert data.num_samples == 5 and [data.rows(r) for r in runs] == [1] * 5
    assert collect(IMAGE, ["y"], data).samples == 5
    np.save(tmp_path / "one.npy", images[0])  # one image, no sample axis
    assert [r["image"].shape for r in open_data(tmp_path / "one.npy", IMAGE)] == [(3, 4, 6)]
    # the per-pass check and `graphfix check` read the same data
    assert first_feeds(tmp_path / "i.npz", IMAGE)["image"].shape == (3, 4, 6)
    got = check_samples(IMAGE, tmp_path / "i.npz", None, {}, 2, 0)
    assert [g["image"].shape for g in got] == [(3, 4, 6)] * 2
    np.testing.assert_array_equal(got[1]["image"], images[1])


def test_rows_of_a_static_batch_still_ask_for_that_batch_size(tmp_path):
    np.save(tmp_path / "x.npy", np.ones((8, 3), np.float32))
    with pytest.raises(GraphfixError, match="axis 0 is fixed at 4.*Pass --batch-size 4"):
        open_data(tmp_path / "x.npy", STATIC4)
    np.save(tmp_path / "w.npy", np.ones((2, 4, 3), np.float32))  # two whole [4, 3] samples
    assert [r["x"].shape for r in open_data(tmp_path / "w.npy", STATIC4)] == [(4, 3)] * 2
