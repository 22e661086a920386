"""Weights left in their file (`io.load(weights=False)`, `graphfix.weights`): passes read
them, onnxruntime runs the model from the file, results and saves carry the values."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from gfhelpers import conv_bn_model
from onnx import TensorProto, helper, numpy_helper

from graphfix import api, io, weights
from graphfix.errors import GraphfixError
from graphfix.graph import to_graph, to_model
from graphfix.runtime.session import run_model


@pytest.fixture
def saved(tmp_path):
    """`conv_bn_model`, saved with external data (its Conv weight is deferred)."""
    model = conv_bn_model()
    path = tmp_path / "m.onnx"
    io.save(model, path, external_data=True)
    return path, model


def test_only_large_initializers_are_deferred(saved):
    path, model = saved
    lazy = io.load(path, weights=False)
    assert [t.name for t in weights.deferred(lazy)] == ["w"]
    w = next(t for t in lazy.graph.initializer if t.name == "w")
    assert not w.HasField("raw_data")
    np.testing.assert_array_equal(weights.to_array(w), numpy_helper.to_array(
        model.graph.initializer[0]))
    eager = io.load(path)
    assert not weights.deferred(eager)
    assert weights.materialized(lazy).SerializeToString() == eager.SerializeToString()


def test_onnxruntime_runs_a_model_with_deferred_weights(saved, tmp_path):
    path, model = saved
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(np.float32)
    lazy = io.load(path, weights=False)
    before = lazy.SerializeToString()
    got = run_model(lazy, {"x": x})["y"]
    np.testing.assert_array_equal(got, run_model(model, {"x": x})["y"])
    assert lazy.SerializeToString() == before  # the references are put back as they were


def test_making_a_session_never_touches_the_models_own_tensors(saved, monkeypatch):
    """The check runs the original in a thread while passes read the same tensors:
    the `basepath` entries onnxruntime refuses are taken off a copy, never off them
    (taken off and put back, a read in between raced it)."""
    from graphfix.runtime.session import session_options

    path, _ = saved
    lazy = io.load(path, weights=False)
    originals = [t for t in lazy.graph.initializer if weights.is_deferred(t)]
    calls = []

    def forget(tensor):
        real(tensor)
        calls.append(all(weights.BASE_KEY in weights.reference(t) for t in originals))

    real = weights.forget_dir
    monkeypatch.setattr(weights, "forget_dir", forget)
    data, _ = weights.session_bytes(lazy, session_options(once=True))
    assert calls and all(calls)
    assert all(weights.BASE_KEY in weights.reference(t) for t in originals)
    assert data is not None and b"basepath" not in data


def test_passes_read_deferred_weights_and_the_result_holds_them(saved):
    path, _ = saved
    result = api.run(str(path), passes="fold-bn")
    assert [n.op_type for n in result.model.graph.node] == ["Conv"]
    assert result.report.passes[0].status == "applied"
    assert not weights.deferred(result.model)
    eager = api.run(io.load(path), passes="fold-bn")  # the weights read at load
    assert result.model.SerializeToString() == eager.model.SerializeToString()


def test_an_unchanged_deferred_weight_is_exported_as_its_reference(saved):
    path, _ = saved
    lazy = io.load(path, weights=False)
    graph = to_graph(lazy)
    exported = to_model(graph, lazy)
    assert [t.name for t in weights.deferred(exported)] == ["w"]
    w = graph.tensors()["w"]
    w.values = w.values * 2  # a pass that sets the values writes them inline
    exported = to_model(graph, lazy)
    tensor = next(t for t in exported.graph.initializer if t.name == "w")
    assert tensor.data_location == TensorProto.DEFAULT and tensor.HasField("raw_data")
    onnx.checker.check_model(exported)


def test_a_moved_data_file_is_a_clear_error(saved):
    path, _ = saved
    lazy = io.load(path, weights=False)
    (path.parent / "m.onnx.data").rename(path.parent / "elsewhere.data")
    with pytest.raises(io.GraphfixError, match="(?i)keep the model's data file in place"):
        weights.materialize(lazy)


def test_what_stays_deferred_is_what_the_skeleton_leaves_out():
    """Shape inference runs on `graph.skeleton`, which keeps initializers of up to
    MAX_ELEMENTS elements: those must never be deferred (they are read at load)."""
    from graphfix.graph.skeleton import MAX_ELEMENTS

    assert weights.SMALL_ELEMENTS >= MAX_ELEMENTS


def test_onnxruntime_maps_deferred_weights_of_two_directories_without_a_copy(
        saved, tmp_path, monkeypatch):
    """onnxruntime reads the weights of one directory itself and gets those of the other
    (the run's spill beside the input's) as memory maps of their files; nothing is read
    into the model, and the maps outlive every other reference to them."""
    import gc

    from graphfix.runtime.session import make_session

    path, model = saved
    lazy = io.load(path, weights=False)
    other = tmp_path / "other"
    other.mkdir()
    bias = np.random.default_rng(2).standard_normal(64 * 32 * 9).astype(np.float32)
    (other / "w2.bin").write_bytes(bias.tobytes())
    w2 = numpy_helper.from_array(bias.reshape(64, 32, 3, 3), "w2")
    w2.ClearField("raw_data")
    w2.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w2.bin"), ("offset", "0"),
                       ("length", str(bias.nbytes)), (weights.BASE_KEY, str(other))):
        entry = w2.external_data.add()
        entry.key, entry.value = key, value
    lazy.graph.initializer.append(w2)
    lazy.graph.node.append(helper.make_node("Conv", ["x", "w2"], ["z"], pads=[1, 1, 1, 1]))
    lazy.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                           [1, 64, 8, 8]))

    def no_copy(m):
        raise AssertionError("read the weights into the model")

    monkeypatch.setattr(weights, "materialized", no_copy)
    monkeypatch.setattr(weights, "_read_into", no_copy)
    session = make_session(lazy, once=True)
    assert len(session.graphfix_weights) == 1  # one directory's weight, handed over
    del lazy
    gc.collect()
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(np.float32)
    y, z = session.run(["y", "z"], {"x": x})
    np.testing.assert_array_equal(y, run_model(model, {"x": x})["y"])
    conv = helper.make_graph([helper.make_node("Conv", ["x", "w2"], ["z"], pads=[1, 1, 1, 1])],
                             "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                 [1, 32, 8, 8])],
                             [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                            [1, 64, 8, 8])],
                             [numpy_helper.from_array(bias.reshape(64, 32, 3, 3), "w2")])
    plain = helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    np.testing.assert_array_equal(z, run_model(plain, {"x": x})["z"])


def test_a_weight_at_an_unaligned_offset_is_read_not_mapped(tmp_path):
    data = np.arange(10, dtype=np.float32)
    (tmp_path / "d.bin").write_bytes(b"x" + data.tobytes())
    tensor = numpy_helper.from_array(data, "t")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "d.bin"), ("offset", "1"), ("length", "40"),
                       (weights.BASE_KEY, str(tmp_path))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    values = weights.mapped(tensor)
    assert not isinstance(values, np.memmap)
    np.testing.assert_array_equal(values, data)
    tensor.external_data[1].value = "0"
    (tmp_path / "d.bin").write_bytes(data.tobytes())
    assert isinstance(weights.mapped(tensor), np.memmap)


def test_a_model_whose_only_deferred_weight_is_an_attribute_runs(tmp_path):
    """A pass may move a weight into a Constant node; with no deferred initializer left,
    there is no directory to give onnxruntime (max() of nothing raised ValueError)."""
    from graphfix.runtime.session import make_session

    values = np.arange(2000, dtype=np.float32)
    (tmp_path / "w.bin").write_bytes(values.tobytes())
    tensor = numpy_helper.from_array(values, "c")
    tensor.ClearField("raw_data")
    weights.defer_in_file(tensor, str(tmp_path / "w.bin"), 0, values.nbytes)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=tensor),
         helper.make_node("Neg", ["c"], ["y"])], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2000])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    np.testing.assert_array_equal(make_session(model).run(None, {})[0], -values)
    assert weights.deferred(model)  # the caller's model keeps its reference


def test_a_piece_reader_reads_any_range_and_says_when_the_file_got_shorter(tmp_path):
    from graphfix.spill import Spill

    values = np.arange(1000, dtype=np.float32)
    with Spill() as spill:
        tensor = spill.put("w", values)
        with weights.PieceReader.open(tensor) as reader:
            out = np.empty(7, np.float32)
            reader.read_into(out, 993)
            np.testing.assert_array_equal(out, values[993:])
            with open(weights.data_file(tensor), "r+b") as f:
                f.truncate(int(weights.reference(tensor)["offset"]) + 40)
            with pytest.raises(GraphfixError, match="became shorter"):
                reader.read_into(out, 5)
    inline = numpy_helper.from_array(values, "w")
    assert weights.PieceReader.open(inline) is None  # not in a file: read it whole


@pytest.mark.parametrize("elem", sorted(weights._PLAIN))  # noqa: SLF001 - the types it reads
def test_to_array_reads_a_deferred_tensor_whole_into_a_writable_array(elem, tmp_path):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    data = tmp_path / "w.bin"
    for shape in [(3, 5), (), (0, 4)]:
        values = (np.arange(int(np.prod(shape)), dtype=np.int64) % 7).astype(dtype)
        values = values.reshape(shape)
        data.write_bytes(b"pad" + values.tobytes() + b"tail")
        tensor = numpy_helper.from_array(values, "w")
        tensor.ClearField("raw_data")
        weights.defer_in_file(tensor, str(data), 3, values.nbytes)
        got = weights.to_array(tensor)
        np.testing.assert_array_equal(got, values)
        assert got.dtype == values.dtype and got.shape == shape and got.flags.writeable
        assert weights.to_array(tensor) is not got  # a fresh array each call
    big = (np.arange(1000) % 7).astype(dtype)
    data.write_bytes(big.tobytes())
    tensor = numpy_helper.from_array(big, "w")
    tensor.ClearField("raw_data")
    weights.defer_in_file(tensor, str(data), 0, big.nbytes)
    with open(data, "r+b") as f:
        f.truncate(big.nbytes - 1)
    with pytest.raises(GraphfixError, match="became shorter"):
        weights.to_array(tensor)


@pytest.mark.parametrize("elem", sorted(weights._PLAIN))  # noqa: SLF001 - the types it reads
def test_inline_array_reads_what_gs_lazy_values_load(elem):
    from onnx_graphsurgeon.ir.tensor import LazyValues

    dtype = helper.tensor_dtype_to_np_dtype(elem)
    for shape in [(2, 3), (), (0, 4)]:
        values = (np.arange(math.prod(shape)) % 3).astype(dtype).reshape(shape)
        tensor = numpy_helper.from_array(values, "t")
        got, loaded = weights.inline_array(tensor), LazyValues(tensor).load()
        assert got.dtype == loaded.dtype and got.shape == loaded.shape == shape
        np.testing.assert_array_equal(got, loaded)
        assert got.flags.writeable and got.flags.owndata


def test_inline_array_leaves_other_tensors_to_onnx():
    typed = helper.make_tensor("f", TensorProto.FLOAT, [2], [1.0, 2.0])  # float_data
    bf16 = helper.make_tensor("b", TensorProto.BFLOAT16, [1], b"\x80\x3f", raw=True)
    text = helper.make_tensor("s", TensorProto.STRING, [1], [b"a"])
    external = numpy_helper.from_array(np.ones(4, np.float32), "e")
    external.data_location = TensorProto.EXTERNAL
    for tensor in (typed, bf16, text, external):
        assert weights.inline_array(tensor) is None
