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
