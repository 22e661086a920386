"""graphfix.io: loading refuses bad input with a clear error and never modifies it;
saving is atomic, never overwrites the input by accident, and writes what onnxruntime reads."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix import io as gio
from graphfix.errors import GraphfixError

SHAPE = (16, 16)  # 1 KiB of float32: large enough to go to external data


def make_model(ir_version: int = 8, seed: int = 0) -> onnx.ModelProto:
    """y = x + w, with w a seeded 16x16 float32 initializer."""
    w = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=ir_version)


def weights(model: onnx.ModelProto) -> np.ndarray:
    return numpy_helper.to_array(model.graph.initializer[0])


def run_ort(path: Path, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every entry under `directory`: file bytes, or the target of a symbolic link."""
    out = {}
    for p in sorted(directory.rglob("*")):
        if p.is_symlink():
            out[str(p)] = os.readlink(p).encode()
        elif p.is_file():
            out[str(p)] = p.read_bytes()
    return out


def external_tensor(name: str, location: str, offset: int | None = None,
                    length: int | None = None) -> TensorProto:
    tensor = numpy_helper.from_array(np.zeros(SHAPE, np.float32), name)
    tensor.ClearField("raw_data")
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def write_external_model(path: Path, location: str, where: str = "initializer", **kw) -> Path:
    """A model whose tensor w lives in external file `location`: as a main-graph
    initializer, in an If branch, or as the values of a sparse initializer."""
    model = make_model()
    del model.graph.initializer[:]
    tensor = external_tensor("w", location, **kw)
    if where == "initializer":
        model.graph.initializer.append(tensor)
    elif where == "if":
        branch = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y_b"])], "b", [],
                                   [helper.make_tensor_value_info("y_b", TensorProto.FLOAT,
                                                                  SHAPE)], [tensor])
        model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        model.graph.node[0].CopyFrom(helper.make_node(
            "If", ["c"], ["y"], then_branch=branch, else_branch=branch))
    elif where == "sparse":
        indices = numpy_helper.from_array(np.arange(4, dtype=np.int64), "w_i")
        tensor.dims[:] = [4]
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(tensor, indices, SHAPE))
    else:
        raise AssertionError(where)
    path.write_bytes(model.SerializeToString())
    return path


def test_round_trip_keeps_the_input_bytes(tmp_path):
    src, dst = tmp_path / "model.onnx", tmp_path / "model.graphfix.onnx"
    model = make_model()
    src.write_bytes(model.SerializeToString())
    before = snapshot(tmp_path)
    loaded = gio.load(src)
    gio.save(loaded, dst, input_path=src)
    again = gio.load(dst)
    assert again.SerializeToString() == model.SerializeToString()
    np.testing.assert_array_equal(weights(again), weights(model))
    assert src.read_bytes() == before[str(src)]
    assert sorted(os.listdir(tmp_path)) == ["model.graphfix.onnx", "model.onnx"]
    onnx.checker.check_model(str(dst), full_check=True)


def test_load_accepts_a_real_model_with_subgraphs(shared_model):
    model = gio.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    assert any(n.op_type == "If" for n in model.graph.node)


def test_sha256_file(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(make_model().SerializeToString())
    assert gio.sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_external_data_round_trip_runs_in_onnxruntime(tmp_path):
    model = make_model()
    before = model.SerializeToString()
    out = tmp_path / "model.graphfix.onnx"
    gio.save(model, out, external_data=True)
    assert model.SerializeToString() == before  # the caller's model is untouched
    assert sorted(os.listdir(tmp_path)) == ["model.graphfix.onnx", "model.graphfix.onnx.data"]
    stored = onnx.load(out, load_external_data=False).graph.initializer[0]
    assert stored.data_location == TensorProto.EXTERNAL
    assert {e.key: e.value for e in stored.external_data}["location"] == out.name + ".data"
    assert (tmp_path / (out.name + ".data")).stat().st_size == weights(model).nbytes
    loaded = gio.load(out)
    np.testing.assert_array_equal(weights(loaded), weights(model))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(run_ort(out, x), x + weights(model))


def test_external_data_is_automatic_over_the_protobuf_limit(tmp_path, monkeypatch):
    gio.save(make_model(), tmp_path / "small.onnx")
    assert not (tmp_path / "small.onnx.data").exists()
    inline = len(make_model().SerializeToString())  # ~1.2 KB, ~0.2 KB with external data
    monkeypatch.setattr(gio, "_PROTOBUF_LIMIT", inline - 512)  # pretend that is 2 GB
    gio.save(make_model(), tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").stat().st_size == SHAPE[0] * SHAPE[1] * 4
    np.testing.assert_array_equal(weights(gio.load(tmp_path / "big.onnx")), weights(make_model()))
    with pytest.raises(GraphfixError, match="2 GB protobuf limit.*external data"):
        gio.save(make_model(), tmp_path / "forced.onnx", external_data=False)
    assert not list(tmp_path.glob("forced*")) and not list(tmp_path.glob(".*"))


def test_save_refuses_external_data_that_was_never_loaded(tmp_path):
    src = tmp_path / "model.onnx"
    gio.save(make_model(), src, external_data=True)
    unloaded = onnx.load(src, load_external_data=False)
    with pytest.raises(GraphfixError, match="never loaded.*graphfix.io.load"):
        gio.save(unloaded, tmp_path / "copy.onnx")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _symlink(link: Path, target: Path) -> None:
    try:
        link.symlink_to(target)
    except (OSError, NotImplementedError):
        pytest.skip("symbolic links are not available here")


def _case(name: str, tmp: Path) -> Path:
    """Build bad input `name` under `tmp` (the model goes in tmp/m) and return its path."""
    model_dir = tmp / "m"
    model_dir.mkdir()
    (tmp / "outside.bin").write_bytes(b"\0" * 4096)
    serialized = make_model().SerializeToString()
    p = model_dir / "model.onnx"
    rng = np.random.default_rng(1234)
    if name == "missing":
        return p
    if name == "directory":
        return model_dir
    simple = {"empty": b"", "random": rng.bytes(4096), "json": json.dumps({"a": [1]}).encode(),
              "text": b"hello, this is not a model\n", "no graph": b"\x08\x08",  # ir_version only
              "truncated": serialized[: len(serialized) // 2]}
    if name in simple:
        return _write(p, simple[name])
    if name == "ext missing":
        return write_external_model(p, "w.bin")
    if name.startswith("ext short") or name == "ext wrong length":
        (model_dir / "w.bin").write_bytes(b"\0" * 100)
        kw = {"ext short": {"length": 1024}, "ext short offset": {"offset": 200},
              "ext short no length": {}, "ext wrong length": {"length": 16}}[name]
        return write_external_model(p, "w.bin", **kw)
    if name == "ext absolute":
        return write_external_model(p, str(tmp / "outside.bin"), length=1024)
    if name == "ext dotdot":
        return write_external_model(p, "../outside.bin", length=1024)
    if name in ("ext dotdot in If", "ext dotdot in sparse"):
        return write_external_model(p, "../outside.bin", where=name.split()[-1].lower(), length=16)
    if name == "ext symlink escaping":
        _symlink(model_dir / "w.bin", tmp / "outside.bin")
        return write_external_model(p, "w.bin", length=1024)
    if name == "ext symlinked dir escaping":
        _symlink(model_dir / "sub", tmp)
        return write_external_model(p, "sub/outside.bin", length=1024)
    if name == "ext symlink inside":
        (model_dir / "real.bin").write_bytes(b"\0" * 4096)
        _symlink(model_dir / "w.bin", model_dir / "real.bin")
        return write_external_model(p, "w.bin", length=1024)
    raise AssertionError(name)


BAD_INPUTS = {  # name: (words the message must contain, words of its how-to-fix part)
    "missing": ("does not exist", "check the path"),
    "directory": ("is a directory", "pass the .onnx file inside it"),
    "empty": ("empty (0 bytes)", "re-export or re-download"),
    "random": ("ONNX model", "re-export the model, or re-download it"),
    "json": ("is a JSON file, not an ONNX model", "torch.onnx.export"),
    "text": ("is a text file, not an ONNX model", "torch.onnx.export"),
    "truncated": ("truncated or corrupt", "re-download it"),
    "no graph": ("not an ONNX model: it has no graph", "re-download it"),
    "ext missing": ("'w.bin', which does not exist", "copy the data file next to the model"),
    "ext short": ("is 100 bytes, but the tensor needs bytes up to 1024", "re-download"),
    "ext short offset": ("is 100 bytes, but the tensor needs bytes up to 1224", "re-download"),
    "ext short no length": ("is 100 bytes, but the tensor needs bytes up to 1024", "re-download"),
    "ext wrong length": ("declared as 16 bytes long, but the tensor's shape and type need 1024",
                         "re-export the model"),
    "ext absolute": ("is an absolute path", "give it a relative location"),
    "ext dotdot": ("outside the model's directory", "give it a relative location"),
    "ext dotdot in If": ("outside the model's directory", "give it a relative location"),
    "ext dotdot in sparse": ("outside the model's directory", "give it a relative location"),
    "ext symlink escaping": ("symbolic link to", "copy the data file into the model's directory"),
    "ext symlinked dir escaping": ("symbolic link to", "copy the data file into"),
    "ext symlink inside": ("through the symbolic link", "replace the link with a copy"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_refused_clearly_and_left_unchanged(name, tmp_path, monkeypatch):
    path = _case(name, tmp_path)
    before = snapshot(tmp_path)
    opened = []
    monkeypatch.setattr(gio, "load_external_data_for_tensor", lambda t, d: opened.append(t))
    with pytest.raises(GraphfixError) as info:
        gio.load(path)
    message, (what, fix) = str(info.value), BAD_INPUTS[name]
    assert str(path) in message
    assert what in message and fix in info.value.fix, message
    assert not opened, "no external data may be read when a reference is refused"
    assert snapshot(tmp_path) == before


def test_one_bad_reference_stops_loading_before_any_data_is_read(tmp_path, monkeypatch):
    path = write_external_model(tmp_path / "model.onnx", "w.bin", length=1024)
    (tmp_path / "w.bin").write_bytes(b"\0" * 1024)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer.append(external_tensor("v", "../v.bin", length=1024))
    path.write_bytes(model.SerializeToString())
    opened = []
    monkeypatch.setattr(gio, "load_external_data_for_tensor", lambda t, d: opened.append(t))
    with pytest.raises(GraphfixError, match=r"Tensor 'v'.*'\.\./v\.bin'"):
        gio.load(path)
    assert not opened


def test_external_data_in_if_branch_and_sparse_tensor_is_loaded(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(256, dtype=np.float32).tobytes())
    branch = gio.load(write_external_model(tmp_path / "if.onnx", "w.bin", where="if",
                                           length=1024))
    tensor = branch.graph.node[0].attribute[0].g.initializer[0]
    np.testing.assert_array_equal(numpy_helper.to_array(tensor).ravel(), np.arange(256))
    sparse = gio.load(write_external_model(tmp_path / "sp.onnx", "w.bin", where="sparse",
                                           offset=16, length=16))
    values = sparse.graph.sparse_initializer[0].values
    assert values.data_location == TensorProto.DEFAULT
    np.testing.assert_array_equal(numpy_helper.to_array(values), [4, 5, 6, 7])


def _leftovers(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def _fail_nth(n: int, exc: Exception):
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == n:
            raise exc
        return real(fd)

    return fsync


@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("existing", [False, True])
def test_failed_write_leaves_no_output_and_no_temp_files(tmp_path, monkeypatch, existing,
                                                         external):
    out = tmp_path / "out.onnx"
    if existing:
        out.write_bytes(b"old")
    disk_full = OSError(errno.ENOSPC, "No space left on device")
    # with external data the model file is the second fsync: the data file was written
    monkeypatch.setattr(os, "fsync", _fail_nth(2 if external else 1, disk_full))
    with pytest.raises(GraphfixError, match="No space left on device. Free disk space"):
        gio.save(make_model(), out, external_data=external)
    assert (out.read_bytes() == b"old") if existing else not out.exists()
    assert not (tmp_path / "out.onnx.data").exists()
    assert _leftovers(tmp_path) == []


def test_write_cut_off_midway_leaves_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old")
    real = os.fdopen

    class HalfWriter:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(real(fd, mode)))
    with pytest.raises(GraphfixError, match="Input/output error"):
        gio.save(make_model(), out)
    assert out.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_failed_rename_leaves_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old")

    def refuse(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(GraphfixError, match=f"'{out}'.*Permission denied"):
        gio.save(make_model(), out)
    assert out.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_new_files_get_normal_permissions(tmp_path):
    out = tmp_path / "out.onnx"
    gio.save(make_model(), out, external_data=True)
    umask = os.umask(0)
    os.umask(umask)
    for p in (out, tmp_path / "out.onnx.data"):
        assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_refuses_to_overwrite_the_input_unless_in_place(tmp_path):
    src = tmp_path / "model.onnx"
    src.write_bytes(make_model(seed=0).SerializeToString())
    before = src.read_bytes()
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.onnx"
    spellings = [src, tmp_path / "sub" / ".." / "model.onnx", str(src)]
    try:
        link.symlink_to(src)
        spellings.append(link)
    except (OSError, NotImplementedError):
        pass
    for out in spellings:
        with pytest.raises(GraphfixError, match="Refusing to overwrite.*--in-place") as info:
            gio.save(make_model(seed=1), out, input_path=src)
        assert str(src) in str(info.value) and "-o" in info.value.fix
        assert src.read_bytes() == before
    gio.save(make_model(seed=1), src, input_path=src, in_place=True)
    np.testing.assert_array_equal(weights(gio.load(src)), weights(make_model(seed=1)))
    assert _leftovers(tmp_path) == []


def test_output_directory_must_exist_and_output_must_not_be_a_directory(tmp_path):
    missing = tmp_path / "nope" / "out.onnx"
    with pytest.raises(GraphfixError, match="does not exist.*mkdir -p") as info:
        gio.save(make_model(), missing)
    assert str(missing) in str(info.value)
    with pytest.raises(GraphfixError, match="existing directory") as info:
        gio.save(make_model(), tmp_path)
    assert str(tmp_path) in str(info.value)
    assert os.listdir(tmp_path) == []


def test_write_text_atomic(tmp_path):
    path = tmp_path / "report.json"
    gio.write_text_atomic(path, '{"ok": true}\n')
    gio.write_text_atomic(path, '{"ok": false}\n')
    assert path.read_text() == '{"ok": false}\n' and _leftovers(tmp_path) == []


def test_runtime_ir_version_is_what_onnxruntime_accepts():
    ir = gio.runtime_ir_version()
    assert 3 <= ir <= onnx.IR_VERSION
    model = make_model(ir_version=ir)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_newest_ir_version_is_lowered_so_onnxruntime_loads_it(tmp_path):
    model = make_model(ir_version=onnx.IR_VERSION)
    out = tmp_path / "out.onnx"
    gio.save(model, out)
    assert model.ir_version == onnx.IR_VERSION  # the caller's model is untouched
    written = onnx.load(out).ir_version
    assert written == min(onnx.IR_VERSION, gio.runtime_ir_version())
    assert written == gio.compatible_ir_version(model)
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_array_equal(run_ort(out, x), x + weights(model))


def test_old_ir_version_is_kept(tmp_path):
    out = tmp_path / "out.onnx"
    gio.save(make_model(ir_version=8), out)
    assert onnx.load(out).ir_version == 8
    assert gio.compatible_ir_version(make_model(ir_version=8)) == 8


def test_garbage_that_protobuf_happens_to_parse_is_still_refused(tmp_path):
    parsed = []
    for seed in range(200):
        data = np.random.default_rng(seed).bytes(8)
        try:
            onnx.ModelProto().ParseFromString(data)
        except Exception:
            continue
        parsed.append(data)
    assert parsed, "expected some 8-byte strings to parse as a ModelProto"
    for i, data in enumerate(parsed):
        path = _write(tmp_path / f"g{i}.onnx", data)
        with pytest.raises(GraphfixError, match="not an ONNX model") as info:
            gio.load(path)
        assert str(path) in str(info.value) and path.read_bytes() == data


def test_runtime_ir_version_without_onnxruntime(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes the import fail
    assert gio.runtime_ir_version.__wrapped__() == onnx.IR_VERSION
