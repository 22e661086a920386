"""graphfix.writeset: outputs claimed against the inputs before any work, written as a set."""

from __future__ import annotations

import errno
import os

import numpy as np
import onnx
import pytest
from gfhelpers import build_model, init, value

from graphfix import io
from graphfix.errors import GraphfixError
from graphfix.writeset import Given, WriteSet, target_is_external_data


def _model() -> onnx.ModelProto:
    weight = np.arange(2048, dtype=np.float32).reshape(32, 64)
    node = onnx.helper.make_node("MatMul", ["x", "w"], ["y"])
    return build_model([node], [value("x", [1, 32])], [value("y", [1, 64])], [init("w", weight)])


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.onnx"
    io.save(_model(), path)
    return path


def test_an_output_on_an_input_is_refused_by_path_and_by_inode(tmp_path, model_file):
    os.link(model_file, tmp_path / "hard.onnx")
    os.symlink(model_file, tmp_path / "soft.onnx")
    files = WriteSet([Given(model_file, "the input model", model=True)])
    for path in (model_file, tmp_path / "hard.onnx", tmp_path / "soft.onnx",
                 tmp_path / "sub" / ".." / "m.onnx"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(GraphfixError, match="Refusing to write --report .*It is the "
                           "input model"):
            files.claim(path, "--report")


def test_the_external_data_of_an_input_model_is_an_input(tmp_path):
    path = tmp_path / "big.onnx"
    io.save(_model(), path, external_data=True)
    assert (tmp_path / "big.onnx.data").exists()
    assert target_is_external_data(str(path), str(tmp_path / "big.onnx.data"))
    assert not target_is_external_data(str(path), str(path))
    files = WriteSet([Given(path, "the input model", model=True)])
    with pytest.raises(GraphfixError, match="It holds the external data of the input model"):
        files.claim(tmp_path / "big.onnx.data", "--cache")
    # -o big.onnx would also write big.onnx.data: both are the input's files
    with pytest.raises(GraphfixError, match="It is the input model"):
        files.claim(path, "the output model", model=True)
    files.claim(path, "the output model", model=True, replaces=path)  # --in-place


@pytest.mark.parametrize("where", ["initializer", "Constant node"])
def test_external_data_is_found_among_inline_weights(tmp_path, monkeypatch, where):
    """The model is read without its large inline weights (`graphfix.wire`); the one
    tensor kept in 'side.bin' is still found, in an initializer or a Constant node, and
    the file is not loaded whole."""
    model = _model()  # w: 8 KB inline
    side = onnx.numpy_helper.from_array(np.ones([4, 64], np.float32), "side")
    (tmp_path / "side.bin").write_bytes(side.raw_data)
    side.ClearField("raw_data")
    side.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "side.bin"), ("offset", "0"), ("length", str(4 * 64 * 4))):
        side.external_data.add(key=k, value=v)
    graph = model.graph
    graph.output.append(value("s", [4, 64]))
    if where == "initializer":
        graph.initializer.append(side)
        graph.node.append(onnx.helper.make_node("Identity", ["side"], ["s"]))
    else:
        graph.node.append(onnx.helper.make_node("Constant", [], ["s"], value=side))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    (tmp_path / "other.bin").write_bytes(b"")
    monkeypatch.setattr(onnx, "load_model", lambda *a, **k: pytest.fail("loaded whole"))
    assert target_is_external_data(str(path), str(tmp_path / "side.bin"))
    assert not target_is_external_data(str(path), str(tmp_path / "other.bin"))


def test_an_output_inside_a_given_folder_is_refused(tmp_path, model_file):
    data = tmp_path / "calib"
    data.mkdir()
    files = WriteSet([Given(model_file, "the input model", model=True),
                      Given(data, "--data")])
    with pytest.raises(GraphfixError, match="It lies inside --data .* a folder graphfix reads"):
        files.claim(data / "ranges.json", "--ranges")
    files.claim(tmp_path / "ranges.json", "--ranges")


def test_two_outputs_on_one_file_are_refused(tmp_path):
    files = WriteSet()
    files.claim(tmp_path / "out.onnx", "the output model", model=True)
    with pytest.raises(GraphfixError, match="Two outputs would be the same file.*The output "
                       "model and --report"):
        files.claim(tmp_path / "out.onnx", "--report")
    with pytest.raises(GraphfixError, match="The output model and --cache"):
        files.claim(tmp_path / "out.onnx.data", "--cache")


def test_nothing_appears_before_commit_and_all_appears_after(tmp_path, model_file):
    before = model_file.read_bytes()
    with WriteSet([Given(model_file, "the input model", model=True)]) as files:
        staged = files.model(_model(), tmp_path / "out.onnx", external_data=True)
        files.text(tmp_path / "r.json", "{}\n", "--report")
        assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "r.json").exists()
        assert onnx.load(staged, load_external_data=False).graph.node[0].op_type == "MatMul"
        files.commit()
    assert _leftovers(tmp_path) == ["m.onnx", "out.onnx", "out.onnx.data", "r.json"]
    assert (tmp_path / "r.json").read_text() == "{}\n"
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(io.load(tmp_path / "out.onnx").graph.initializer[0]),
        onnx.numpy_helper.to_array(_model().graph.initializer[0]))
    assert model_file.read_bytes() == before


def test_a_failure_leaves_no_output_and_no_temporary(tmp_path, model_file):
    with pytest.raises(RuntimeError, match="later step"):
        with WriteSet([Given(model_file, "the input model", model=True)]) as files:
            files.model(_model(), tmp_path / "out.onnx", external_data=True)
            files.text(tmp_path / "r.json", "{}\n", "--report")
            raise RuntimeError("a later step failed")
    assert _leftovers(tmp_path) == ["m.onnx"]


def test_an_output_that_cannot_be_written_takes_the_others_with_it(tmp_path, monkeypatch):
    def full_disk(path, text):
        def write(f):
            f.write(b"{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return [(os.path.abspath(path), write)]

    monkeypatch.setattr(io, "text_files", full_disk)
    with pytest.raises(GraphfixError, match="Cannot write .*r.json'. No space left on device"):
        with WriteSet() as files:
            files.model(_model(), tmp_path / "out.onnx")
            files.text(tmp_path / "r.json", "{}\n", "--report")
    assert _leftovers(tmp_path) == []
