"""A single .npz (or .npy) is streamed: batches equal numpy.load's arrays cut in order,
for stored and compressed members, multi-input files, Fortran order, zip64 and every
.npy header version; damaged files fail with a GraphfixError; and peak memory does
not grow with the sample count."""

import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime import _sources
from graphfix.runtime.data import OWN_BATCH_MAX, first_feeds, open_data

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
ONE = parse(HEAD + "g (float[batch,3,4,4] x) => (float[batch,3,4,4] y) { y = Relu(x) }")
TWO = parse(HEAD + """
g (float[N,3] a, int64[N,T] ids) => (float[N,3] y) { y = Relu(a) }""")
ROWS = 23  # not a multiple of 7
ROW_BYTES = 3 * 4 * 4 * 4  # one float32 [3, 4, 4] sample


def _samples(n: int = ROWS) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 3, 4, 4)).astype(np.float32)


def _pairs(n: int = ROWS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((n, 3)).astype(np.float32),
            "ids": rng.integers(0, 1000, (n, 5))}


def _expected(arrays: dict[str, np.ndarray], batch: int, lo: int = 0, hi: int = ROWS):
    return [{k: v[i:min(i + batch, hi)] for k, v in arrays.items()}
            for i in range(lo, hi, batch)]


def _assert_batches(data, expected) -> None:
    got = list(data)
    assert [list(f) for f in got] == [list(e) for e in expected]
    for feeds, want in zip(got, expected, strict=True):
        for name, value in want.items():
            assert feeds[name].dtype == value.dtype
            np.testing.assert_array_equal(feeds[name], value)


@pytest.fixture(params=[None, 5 * ROW_BYTES], ids=["default-blocks", "blocks-of-5-rows"])
def chunk(request, monkeypatch):
    """Default blocks (one for these small files), or blocks of 5 rows, which cut
    batches of 7 at other places than the blocks do."""
    if request.param is not None:
        monkeypatch.setattr(_sources, "CHUNK_BYTES", request.param)
    return request.param


def _save(path, arrays, how):
    if how == "npy":
        (value,) = arrays.values()
        np.save(path, value)
    elif how == "fortran":
        np.savez(path, **{k: np.asfortranarray(v) for k, v in arrays.items()})
    else:
        getattr(np, how)(path, **arrays)
    return path


FORMS = ["savez", "savez_compressed", "fortran", "npy"]


@pytest.mark.parametrize("how", FORMS)
@pytest.mark.parametrize("batch", [1, 7])
def test_batches_equal_numpy_load(tmp_path, chunk, how, batch):
    path = _save(tmp_path / ("x.npy" if how == "npy" else "x.npz"), {"x": _samples()}, how)
    loaded = np.load(path) if how == "npy" else np.load(path)["x"]
    data = open_data(path, ONE, batch_size=batch)
    _assert_batches(data, _expected({"x": loaded}, batch))
    _assert_batches(data, _expected({"x": loaded}, batch))  # every pass starts over


@pytest.mark.parametrize("how", ["savez", "savez_compressed", "fortran"])
@pytest.mark.parametrize("batch", [1, 7])
def test_multi_input_arrays_stay_aligned_by_row(tmp_path, chunk, how, batch):
    arrays = _pairs()
    path = _save(tmp_path / "two.npz", {"ids": arrays["ids"], "a": arrays["a"]}, how)
    with np.load(path) as archive:
        loaded = {"a": archive["a"], "ids": archive["ids"]}  # in the model's input order
    _assert_batches(open_data(path, TWO, batch_size=batch), _expected(loaded, batch))


@pytest.mark.parametrize("how", FORMS)
def test_max_samples_and_the_split_tail(tmp_path, chunk, how):
    samples = _samples()
    path = _save(tmp_path / ("x.npy" if how == "npy" else "x.npz"), {"x": samples}, how)
    data = open_data(path, ONE, batch_size=7, max_samples=20)
    _assert_batches(data, _expected({"x": samples}, 7, hi=20))
    calib, held = data.split(6)
    _assert_batches(calib, _expected({"x": samples}, 7, hi=14))
    _assert_batches(held, _expected({"x": samples}, 7, lo=14, hi=20))
    _assert_batches(held, _expected({"x": samples}, 7, lo=14, hi=20))


def test_split_tail_of_a_multi_input_npz(tmp_path, chunk):
    arrays = _pairs()
    path = _save(tmp_path / "two.npz", arrays, "savez_compressed")
    _, held = open_data(path, TWO, batch_size=3).split(4)
    _assert_batches(held, _expected(arrays, 3, lo=ROWS - 4))


def test_the_first_feeds_take_the_files_own_stack_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(_sources, "CHUNK_BYTES", 5 * ROW_BYTES)
    samples = _samples(40)
    np.savez(tmp_path / "x.npz", x=samples)
    np.testing.assert_array_equal(first_feeds(tmp_path / "x.npz", ONE)["x"],
                                  samples[:OWN_BATCH_MAX])


def _npy_bytes(array: np.ndarray, version: tuple[int, int], rows: int | None = None) -> bytes:
    """`array` as a .npy of header `version`; `rows` overrides the header's axis 0."""
    header = np.lib.format.header_data_from_array_1_0(array)
    if rows is not None:
        header["shape"] = (rows, *array.shape[1:])
    length = "<H" if version == (1, 0) else "<I"
    size = 6 + 2 + np.dtype(length).itemsize
    text = repr(header)
    text += " " * (-(size + len(text) + 1) % 64) + "\n"
    prefix = np.lib.format.magic(*version) + np.array(len(text), length).tobytes()
    return prefix + text.encode("latin1") + np.ascontiguousarray(array).tobytes()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_zip64_members_of_every_header_version(tmp_path, chunk, version, compression):
    samples = _samples()
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w", compression) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as fp:
            fp.write(_npy_bytes(samples, version))
    local = path.read_bytes()
    extra_at = 30 + int.from_bytes(local[26:28], "little")
    assert local[extra_at:extra_at + 2] == b"\x01\x00"  # the zip64 extra field
    _assert_batches(open_data(path, ONE, batch_size=7), _expected({"x": samples}, 7))


def test_a_cut_short_npy_or_member_fails_when_opened(tmp_path):
    path = _save(tmp_path / "x.npy", {"x": _samples()}, "npy")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(GraphfixError, match=r"x.npy' is cut short. Its header says "
                                            r"\[23, 3, 4, 4\] float32 \(4416 bytes\)"):
        open_data(path, ONE)
    with zipfile.ZipFile(tmp_path / "two.npz", "w") as archive:
        archive.writestr("a.npy", _npy_bytes(_pairs()["a"], (1, 0)))
        archive.writestr("ids.npy", _npy_bytes(_pairs()["ids"], (1, 0), rows=ROWS + 1))
    with pytest.raises(GraphfixError, match=r"two.npz\['ids'\]' is cut short.*save it again"):
        open_data(tmp_path / "two.npz", TWO)


@pytest.mark.parametrize("how", ["savez", "savez_compressed"])
def test_damaged_member_data_fails_with_what_and_how_to_fix(tmp_path, how):
    arrays = _pairs(400)
    path = _save(tmp_path / "two.npz", arrays, how)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("ids.npy")
    raw = bytearray(path.read_bytes())
    name_and_extra = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28],
                                    "little") + int.from_bytes(
        raw[info.header_offset + 28:info.header_offset + 30], "little")
    spot = info.header_offset + 30 + name_and_extra + info.compress_size * 3 // 4
    raw[spot:spot + 8] = bytes(255 - b for b in raw[spot:spot + 8])
    path.write_bytes(bytes(raw))
    data = open_data(path, TWO, batch_size=64)  # the headers are intact
    with pytest.raises(GraphfixError) as err:
        list(data)
    assert str(err.value).startswith(f"Cannot read the samples in '{path}['ids']'.")
    assert "damaged" in str(err.value)


_MEASURE = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import onnx.parser
    from graphfix.runtime.data import open_data

    path, how = sys.argv[1], sys.argv[2]
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]> g (float[N,3,128,128] x) '
        '=> (float[N,3,128,128] y) { y = Relu(x) }')
    data = open_data(path, model, batch_size=8)
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes there, KiB here
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    rows = 0
    if how == "whole":  # the control: what reading the member at once costs
        rows += len(np.load(path)["x"])
    else:
        for part in (data, data.split(100)[1]):  # all, then the held-apart tail
            rows += sum(len(feeds["x"]) for feeds in part)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    print(json.dumps({"growth": peak - base, "rows": rows}))
""")


# A new process's ru_maxrss starts at its parent's peak (exec keeps it), so the measure
# runs under a small launcher, not straight under pytest, whose peak may exceed it.
_LAUNCH = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def _growth(path, how: str) -> int:
    run = subprocess.run([sys.executable, "-c", _LAUNCH, sys.executable, "-c", _MEASURE,
                          str(path), how],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["rows"] == (512 if how == "whole" else 512 + 100)
    return result["growth"]


@pytest.mark.skipif(sys.platform == "win32", reason="resource is POSIX only")
def test_peak_memory_does_not_grow_with_the_sample_count(tmp_path):
    """512 samples of float32 [3, 128, 128] are 100 MB in every form; reading them all
    whole grows the peak by about that, streaming them by a few blocks of 4 MB."""
    row = np.arange(3 * 128 * 128, dtype=np.float32).reshape(3, 128, 128) % 97
    samples = np.broadcast_to(row, (512, 3, 128, 128))
    size = samples.nbytes
    paths = [_save(tmp_path / "stored.npz", {"x": samples}, "savez"),
             _save(tmp_path / "deflated.npz", {"x": samples}, "savez_compressed"),
             _save(tmp_path / "x.npy", {"x": samples}, "npy")]
    del samples
    assert _growth(paths[0], "whole") > 0.8 * size  # the measure sees a whole read
    for path in paths:
        assert _growth(path, "stream") < 30e6, path.name


def test_one_fortran_order_sample_without_a_stack_axis(tmp_path):
    sample = _samples(1)[0]
    np.savez(tmp_path / "one.npz", x=np.asfortranarray(sample))
    (feeds,) = open_data(tmp_path / "one.npz", ONE)
    np.testing.assert_array_equal(feeds["x"], sample[np.newaxis])
