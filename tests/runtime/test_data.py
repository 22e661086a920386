import pickle

import numpy as np
import onnx
import pytest
from gfhelpers import build_model, parse
from onnx import helper

from graphfix.errors import GraphfixError
from graphfix.runtime.data import CalibrationData, InputSpec, Preprocess, open_data

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
ONE = parse(HEAD + "g (float[batch,3,4,4] x) => (float[batch,3,4,4] y) { y = Relu(x) }")
TWO = parse(HEAD + """
g (float[N,3] a, int64[N,T] ids) => (float[N,3] y) { y = Relu(a) }""")
STATIC4 = parse(HEAD + "g (float[4,3] x) => (float[4,3] y) { y = Relu(x) }")
FREE_HW = parse(HEAD + "g (float[N,3,H,W] x) => (float[N,3,H,W] y) { y = Relu(x) }")
SHARED_T = parse(HEAD + "g (float[N,T] a, float[N,T] b) => (float[N,T] y) { y = Add(a, b) }")
SCALAR = build_model([helper.make_node("Relu", ["s"], ["y"])],
                     [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [])],
                     [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [])], [])


def _rng():
    return np.random.default_rng(0)


def _samples(n: int, shape=(3, 4, 4)) -> np.ndarray:
    return _rng().standard_normal((n, *shape)).astype(np.float32)


def _npy_folder(tmp_path, arrays, name="calib"):
    folder = tmp_path / name
    folder.mkdir()
    for i, arr in enumerate(arrays):
        np.save(folder / f"{i:03d}.npy", arr)
    return folder


def _rows(data: CalibrationData, name: str = "x") -> np.ndarray:
    return np.concatenate([feeds[name] for feeds in data])


def test_npy_folder_one_sample_per_file_batched_in_order(tmp_path):
    samples = _samples(10)
    folder = _npy_folder(tmp_path, samples)  # each file one sample [3, 4, 4], no batch axis
    one = open_data(folder, ONE)
    four = open_data(folder, ONE, batch_size=4)
    assert [f["x"].shape for f in one] == [(1, 3, 4, 4)] * 10
    assert [len(f["x"]) for f in four] == [4, 4, 2]
    np.testing.assert_array_equal(_rows(one), samples)
    np.testing.assert_array_equal(_rows(four), samples)
    assert four.num_samples == 10
    assert four.describe() == "10 samples from calib/ (10 .npy files), batches of 4"
    assert four.inputs == [InputSpec("x", np.dtype(np.float32), ("batch", 3, 4, 4))]
    assert four.inputs[0].shape == ("batch", 3, 4, 4)


def test_npz_folder_stacks_of_any_size_are_cut_into_batches(tmp_path):
    folder = tmp_path / "feeds"
    folder.mkdir()
    rng = _rng()
    a = rng.standard_normal((10, 3)).astype(np.float32)
    ids = rng.integers(0, 9, (10, 5))
    for name, (lo, hi) in zip("abc", [(0, 3), (3, 5), (5, 10)], strict=True):
        np.savez(folder / f"{name}.npz", a=a[lo:hi], ids=ids[lo:hi])
    data = open_data(folder, TWO, batch_size=4)
    assert [len(f["a"]) for f in data] == [4, 4, 2]
    np.testing.assert_array_equal(_rows(data, "a"), a)
    np.testing.assert_array_equal(_rows(data, "ids"), ids)
    assert list(data.__iter__().__next__()) == ["a", "ids"]


def test_iteration_is_repeatable(tmp_path):
    data = open_data(_npy_folder(tmp_path, _samples(7)), ONE, batch_size=3)
    first, second = list(data), list(data)
    assert len(first) == len(second) == 3
    for f, s in zip(first, second, strict=True):
        np.testing.assert_array_equal(f["x"], s["x"])


def test_folder_is_read_one_file_at_a_time(tmp_path, monkeypatch):
    data = open_data(_npy_folder(tmp_path, _samples(5)), ONE)
    loaded = []
    real = np.load
    monkeypatch.setattr(np, "load", lambda p, *a, **k: loaded.append(p) or real(p, *a, **k))
    batches = iter(data)
    next(batches)
    assert len(loaded) == 1
    next(batches)
    assert len(loaded) == 2


def test_max_samples_and_split(tmp_path):
    samples = _samples(10)
    data = open_data(_npy_folder(tmp_path, samples), ONE, max_samples=7, batch_size=3)
    assert data.num_samples == 7
    assert [len(f["x"]) for f in data] == [3, 3, 1]
    assert data.describe() == "7 of 10 samples (1-7) from calib/ (10 .npy files), batches of 3"
    calib, held = data.split(2)
    assert (calib.num_samples, held.num_samples) == (5, 2)
    np.testing.assert_array_equal(_rows(calib), samples[:5])
    np.testing.assert_array_equal(_rows(held), samples[5:7])
    np.testing.assert_array_equal(_rows(held), samples[5:7])  # re-iterable too
    assert held.describe().startswith("2 of 10 samples (6-7) from calib/")
    for count in (0, 7):
        with pytest.raises(GraphfixError, match="Hold apart between 1 and 6 samples"):
            data.split(count)


def test_single_npz_by_key_by_input_names_and_only_array(tmp_path):
    samples = _samples(6)
    np.savez(tmp_path / "d.npz", calib=samples, labels=np.arange(6))
    data = open_data(tmp_path / "d.npz", ONE, data_key="calib", batch_size=4)
    assert data.describe() == "6 samples from d.npz['calib'], batches of 4"
    np.testing.assert_array_equal(_rows(data), samples)
    np.savez(tmp_path / "only.npz", whatever=samples)
    np.testing.assert_array_equal(_rows(open_data(tmp_path / "only.npz", ONE)), samples)
    a, ids = samples[:, 0, 0, :3], np.arange(12).reshape(6, 2)
    np.savez(tmp_path / "two.npz", ids=ids, a=a, labels=np.arange(6))
    two = open_data(tmp_path / "two.npz", TWO, batch_size=5)
    np.testing.assert_array_equal(_rows(two, "ids"), ids)
    assert two.describe() == "6 samples from two.npz['a', 'ids'], batches of 5"


def test_single_npz_errors_list_the_keys(tmp_path):
    np.savez(tmp_path / "d.npz", calib=_samples(2), test=_samples(2))
    with pytest.raises(GraphfixError, match="no array 'nope'. It has 'calib', 'test'"):
        open_data(tmp_path / "d.npz", ONE, data_key="nope")
    with pytest.raises(GraphfixError, match="'calib', 'test', and none named 'x'. Pick one"):
        open_data(tmp_path / "d.npz", ONE)
    with pytest.raises(GraphfixError, match="--data-key picks one array, but the model has 2"):
        open_data(tmp_path / "d.npz", TWO, data_key="calib")


def test_single_npy_is_read_in_rows_as_plain_arrays(tmp_path):
    samples = _samples(5)
    np.save(tmp_path / "x.npy", samples)
    data = open_data(tmp_path / "x.npy", ONE, batch_size=2)
    assert [type(f["x"]) for f in data] == [np.ndarray] * 3
    np.testing.assert_array_equal(_rows(data), samples)


def test_float64_is_cast_and_said(tmp_path):
    data = open_data(_npy_folder(tmp_path, _samples(3).astype(np.float64)), ONE)
    assert {f["x"].dtype for f in data} == {np.dtype(np.float32)}
    assert data.describe().endswith("; float64 data cast to float32 for 'x'")


def test_missing_and_extra_inputs_are_named(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    np.savez(folder / "0.npz", a=np.zeros((1, 3), np.float32), mask=np.zeros((1, 2)))
    with pytest.raises(GraphfixError) as err:
        open_data(folder, TWO)
    assert "0.npz' does not match the model's inputs (a, ids)" in str(err.value)
    assert "no array for input 'ids'; it has 'mask', which the model does not take" in str(
        err.value)


@pytest.mark.parametrize(("array", "message"), [
    (np.zeros((3, 4, 4), np.int32),
     "The data for input 'x' in '.*003.npy' is int32, but the model's input is float32"),
    (np.zeros((3, 5, 4), np.float32),
     r"has shape \[3, 5, 4\], which does not fit the model's input \[batch, 3, 4, 4\]. "
     r"The model's dim 2 is 4, the data has 5 there"),
    (np.zeros((4, 4), np.float32), "Its rank is 2"),
])
def test_a_bad_late_file_fails_before_any_batch(tmp_path, monkeypatch, array, message):
    folder = _npy_folder(tmp_path, list(_samples(3)) + [array] + list(_samples(146)))
    real = np.load
    loaded = []
    monkeypatch.setattr(np, "load", lambda p, *a, **k: loaded.append(p) or real(p, *a, **k))
    with pytest.raises(GraphfixError, match=message):
        open_data(folder, ONE)
    assert loaded == []  # headers only


def test_pickles_are_refused(tmp_path):
    folder = tmp_path / "objects"
    folder.mkdir()
    np.save(folder / "0.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(GraphfixError, match="holds Python objects .a pickle."):
        open_data(folder, ONE)
    with open(tmp_path / "raw.npy", "wb") as fp:
        pickle.dump({"x": 1}, fp)
    with pytest.raises(GraphfixError, match="allow_pickle=False"):
        open_data(tmp_path / "raw.npy", ONE)
    np.savez(tmp_path / "o.npz", x=np.array([None], dtype=object))
    with pytest.raises(GraphfixError, match=r"'.*o.npz\['x'\]' holds Python objects"):
        open_data(tmp_path / "o.npz", ONE)


def test_static_batch_needs_that_batch_size(tmp_path):
    with pytest.raises(GraphfixError, match=r"axis 0 is fixed at 4.*Pass --batch-size 4"):
        open_data(_npy_folder(tmp_path, np.zeros((8, 3), np.float32)), STATIC4)
    rows = _rng().standard_normal((8, 3)).astype(np.float32)
    data = open_data(tmp_path / "calib", STATIC4, batch_size=4)  # one [3] sample per file
    assert [f["x"].shape for f in data] == [(4, 3), (4, 3)]
    np.testing.assert_array_equal(_rows(data), np.zeros((8, 3)))
    np.save(tmp_path / "r.npy", rows[:6])
    with pytest.raises(GraphfixError, match="6 samples do not fill batches of 4"):
        open_data(tmp_path / "r.npy", STATIC4, batch_size=4)


def test_samples_of_other_shapes_cannot_share_a_batch(tmp_path):
    folder = _npy_folder(tmp_path, [np.zeros((3, 8, 8), np.float32),
                                    np.zeros((3, 6, 8), np.float32)])
    assert [f["x"].shape for f in open_data(folder, FREE_HW)] == [(1, 3, 8, 8), (1, 3, 6, 8)]
    with pytest.raises(GraphfixError, match=r"'.*000.npy' and '.*001.npy' cannot share a b"):
        open_data(folder, FREE_HW, batch_size=2)


def test_one_dim_name_has_one_size(tmp_path):
    np.savez(tmp_path / "d.npz", a=np.zeros((2, 3), np.float32), b=np.zeros((2, 4), np.float32))
    with pytest.raises(GraphfixError, match="dim 'T' is 3 in 'a' but 4 in 'b'"):
        open_data(tmp_path / "d.npz", SHARED_T)
    np.savez(tmp_path / "n.npz", a=np.zeros((2, 3), np.float32), b=np.zeros((3, 3), np.float32))
    with pytest.raises(GraphfixError, match="different numbers of samples .'a' 2, 'b' 3."):
        open_data(tmp_path / "n.npz", SHARED_T)


def test_scalar_inputs_take_one_sample_per_run(tmp_path):
    np.save(tmp_path / "s.npy", np.arange(3, dtype=np.float32))
    data = open_data(tmp_path / "s.npy", SCALAR)
    assert [(type(f["s"]), f["s"].shape) for f in data] == [(np.ndarray, ())] * 3
    assert [float(f["s"]) for f in data] == [0, 1, 2]
    with pytest.raises(GraphfixError, match="It is a scalar"):
        open_data(tmp_path / "s.npy", SCALAR, batch_size=2)


SCRIPT = """
import numpy as np
CALLS = []

def load_data():
    CALLS.append(1)
    rng = np.random.default_rng(0)
    for _ in range(3):
        yield {"x": rng.standard_normal((3, 3, 4, 4))}   # float64 stacks of 3

def shrinking():
    CALLS.append(1)
    for _ in range(4 - len(CALLS)):
        yield {"x": np.zeros((3, 4, 4), np.float32)}

def broken():
    yield {"x": np.zeros((3, 4, 4), np.float32)}
    raise RuntimeError("disk on fire")

def not_dicts():
    yield [1, 2]

def objects():
    yield {"x": [None, 1]}
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "loader.py"
    path.write_text(SCRIPT)
    return path


def test_loader_script_is_called_each_pass(script):
    expected = np.random.default_rng(0).standard_normal((9, 3, 4, 4)).astype(np.float32)
    data = open_data(None, ONE, loader_script=str(script), batch_size=4)
    assert data.describe() == ("samples from loader.py:load_data (counted on the first pass), "
                               "batches of 4")
    assert [len(f["x"]) for f in data] == [4, 4, 1]
    assert data.num_samples == 9
    np.testing.assert_array_equal(_rows(data), expected)
    assert data.describe() == ("9 samples from loader.py:load_data, batches of 4; float64 "
                               "data cast to float32 for 'x'")
    calib, held = data.split(3)
    np.testing.assert_array_equal(_rows(calib), expected[:6])
    np.testing.assert_array_equal(_rows(held), expected[6:])
    limited = open_data(None, ONE, loader_script=f"{script}:load_data", max_samples=5)
    assert limited.num_samples == 5
    np.testing.assert_array_equal(_rows(limited), expected[:5])


def test_loader_script_errors(script):
    def opened(function, **kw):
        return open_data(None, ONE, loader_script=f"{script}:{function}", **kw)

    with pytest.raises(GraphfixError, match="no function 'nope'.*broken, load_data, not_dic"):
        opened("nope")
    with pytest.raises(GraphfixError, match="failed at item 1. RuntimeError: disk on fire"):
        list(opened("broken"))
    with pytest.raises(GraphfixError, match="gave a list as loader.py:not_dicts item 0"):
        list(opened("not_dicts"))
    with pytest.raises(GraphfixError, match="value for 'x' that is not a numeric array"):
        list(opened("objects"))
    shrinking = opened("shrinking")
    assert shrinking.num_samples == 3
    with pytest.raises(GraphfixError, match="gave 2 samples on this pass, fewer than the 3"):
        list(shrinking)
    with pytest.raises(GraphfixError, match="does not exist"):
        open_data(None, ONE, loader_script="missing.py:load_data")
    with pytest.raises(GraphfixError, match="Both --data and --data-loader-script"):
        open_data(script, ONE, loader_script=str(script))


def test_option_and_path_errors(tmp_path):
    folder = _npy_folder(tmp_path, _samples(2))
    with pytest.raises(GraphfixError, match="--data-key does not apply to the folder"):
        open_data(folder, ONE, data_key="x")
    with pytest.raises(GraphfixError, match="--preprocess does not apply"):
        open_data(folder, ONE, preprocess=Preprocess())
    with pytest.raises(GraphfixError, match="does not exist"):
        open_data(tmp_path / "nothing", ONE)
    with pytest.raises(GraphfixError, match="--batch-size 0 is not usable"):
        open_data(folder, ONE, batch_size=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphfixError, match="has no .npy, .npz, jpg or png files"):
        open_data(tmp_path / "empty", ONE)
    np.savez(folder / "z.npz", x=_samples(1))
    with pytest.raises(GraphfixError, match="mixes 2 .npy files and 1 .npz files"):
        open_data(folder, ONE)
    with pytest.raises(GraphfixError, match="the model has 2 inputs"):
        open_data(tmp_path / "calib" / "000.npy", TWO)


def test_digits_calibration_data(shared_model):
    model = onnx.load(shared_model("digits_dev.onnx"))
    path = shared_model("digits_dev_data.npz")
    data = open_data(path, model, data_key="calib", batch_size=32)
    assert data.num_samples == 200
    assert data.describe() == "200 samples from digits_dev_data.npz['calib'], batches of 32"
    assert [len(f["input"]) for f in data] == [32] * 6 + [8]
    calib, held = data.split(40)
    with np.load(path) as archive:
        np.testing.assert_array_equal(_rows(held, "input"), archive["calib"][160:])
        np.testing.assert_array_equal(_rows(calib, "input"), archive["calib"][:160])
