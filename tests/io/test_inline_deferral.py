"""Weights stored inside the .onnx file are deferred to that file on `io.load(weights=False)`
(`graphfix.wire` finds their bytes, `weights.defer_in_file` references them): the proto
passes copy holds no weights, and everything that reads them gets the same values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from graphfix import api, io, weights
from graphfix.cli.app import app
from graphfix.runtime.session import run_model
from graphfix.wire import initializer_spans

KINDS = {"w": np.float32, "h": np.float16, "i": np.int64, "b": np.bool_}


def _model() -> onnx.ModelProto:
    """Conv + BN with a large float32 weight, plus large fp16/int64/bool initializers
    read by small side branches, and one float tensor stored as float_data."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32),
                                     "w"),
             numpy_helper.from_array(rng.standard_normal(10000).astype(np.float16), "h"),
             numpy_helper.from_array(rng.integers(-5, 5, 10000).astype(np.int64), "i"),
             numpy_helper.from_array(rng.integers(0, 2, 10000).astype(np.bool_), "b"),
             helper.make_tensor("typed", TensorProto.FLOAT, [10000],
                                rng.standard_normal(10000).astype(np.float32).tolist())]
    for name, low in (("scale", 0.5), ("bias", -1), ("mean", -1), ("var", 0.5)):
        inits.append(numpy_helper.from_array(rng.uniform(low, 2, 64).astype(np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["y"]),
             helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["i"], ["if"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
             helper.make_node("Sum", ["hf", "if", "bf", "typed"], ["s"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [10000])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    return path


def test_spans_are_where_protobuf_put_each_raw_data(saved):
    data = saved.read_bytes()
    model = onnx.load(saved)
    spans = initializer_spans(data)
    assert [s.name for s in spans] == [t.name for t in model.graph.initializer]
    for span, tensor in zip(spans, model.graph.initializer, strict=True):
        if tensor.HasField("raw_data"):
            assert data[span.offset:span.offset + span.length] == tensor.raw_data
        else:
            assert span.length == -1


def test_without_raw_cuts_exactly_the_raw_data_of_at_least_the_length_asked(saved):
    from graphfix.wire import without_raw

    data = saved.read_bytes()
    model = onnx.load(saved)
    for min_length in (0, 257, 10000, 20000, 10**9):
        kept, dropped = without_raw(data, min_length)
        big = [t.name for t in model.graph.initializer
               if t.HasField("raw_data") and len(t.raw_data) >= min_length]
        assert [s.name for s in dropped] == big
        cut = onnx.load_from_string(kept)
        for before, after in zip(model.graph.initializer, cut.graph.initializer, strict=True):
            if before.name in big:
                assert not after.raw_data
                after.raw_data = before.raw_data
            assert after == before
        assert cut.graph.node == model.graph.node


def test_unusual_layouts_give_no_spans(saved):
    data = saved.read_bytes()
    graph_again = onnx.ModelProto(graph=onnx.load(saved).graph).SerializeToString()
    assert onnx.load_from_string(data + graph_again).graph.node  # protobuf merges them
    assert initializer_spans(data + graph_again) is None  # two graph fields: give up
    assert initializer_spans(data[:-7]) is None  # truncated
    assert initializer_spans(b"\x0b\x00") is None  # a group: not ONNX


def test_large_inline_weights_stay_in_the_model_file(saved):
    lazy = io.load(saved, weights=False)
    where = {t.name: {e.key: e.value for e in t.external_data}["location"]
             for t in weights.deferred(lazy)}
    assert where == dict.fromkeys(KINDS, "m.onnx")  # typed float_data and small ones stay
    assert lazy.ByteSize() < 10000 * 4 + 4096  # the float_data tensor and small ones
    eager = onnx.load(saved)
    for tensor in weights.deferred(lazy):
        original = next(t for t in eager.graph.initializer if t.name == tensor.name)
        np.testing.assert_array_equal(weights.to_array(tensor), numpy_helper.to_array(original))
    assert weights.materialized(lazy).SerializeToString() == io.load(saved).SerializeToString()
    x = np.random.default_rng(1).standard_normal((1, 32, 8, 8)).astype(np.float32)
    for name, got in run_model(lazy, {"x": x}).items():  # onnxruntime reads the .onnx file
        np.testing.assert_array_equal(got, run_model(eager, {"x": x})[name])


def test_a_run_from_the_file_equals_a_run_from_memory(saved, tmp_path):
    from_file = api.run(saved, passes="cleanup,fold-bn", output=tmp_path / "a.onnx")
    from_memory = api.run(onnx.load(saved), passes="cleanup,fold-bn")
    assert from_file.model.SerializeToString() == from_memory.model.SerializeToString()
    assert not weights.deferred(from_file.model)
    assert from_file.report.check.enabled and not from_file.report.rolled_back


def test_in_place_reads_the_weights_before_replacing_their_file(saved):
    expected = api.run(onnx.load(saved), passes="cleanup,fold-bn").model
    result = CliRunner().invoke(app, ["run", str(saved), "-o", str(saved), "--in-place",
                                      "--passes", "cleanup,fold-bn"])
    assert result.exit_code == 0, result.output
    assert onnx.load(saved).SerializeToString() == expected.SerializeToString()
