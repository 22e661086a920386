"""Saving a model with deferred weights copies them from their file as it writes
(`graphfix.streamsave`): the bytes are exactly those of the materialized model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix import io, streamsave, weights
from graphfix.errors import GraphfixError


def _model(doc: str = "") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32), "w")
    w.doc_string = doc  # a TensorProto field after raw_data
    h = numpy_helper.from_array(rng.standard_normal(8192).astype(np.float16), "h")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Cast", ["h"], ["z"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [8192])],
        [w, h], doc_string="a graph")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8, producer_name="test")
    helper.set_model_props(model, {"k": "v"})
    return model


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_streamed_bytes_are_the_materialized_bytes(tmp_path, external):
    source = tmp_path / "m.onnx"
    io.save(_model(doc="after raw_data"), source, external_data=external)
    lazy = io.load(source, weights=False)
    assert len(weights.deferred(lazy)) == 2 and streamsave.streamable(lazy)
    out = tmp_path / "out.onnx"
    io.save(lazy, out)
    expected = io.load(source).SerializeToString()
    assert out.read_bytes() == expected
    assert streamsave.size(lazy) == len(expected)
    assert weights.deferred(lazy)  # the caller's model is left as it was


def test_the_ir_version_written_is_the_one_asked_for(tmp_path):
    source = tmp_path / "m.onnx"
    io.save(_model(), source)
    lazy = io.load(source, weights=False)
    import io as stdio

    buf = stdio.BytesIO()
    streamsave.write(lazy, buf, ir_version=7)
    assert onnx.load_from_string(buf.getvalue()).ir_version == 7


def test_a_deferred_weight_outside_the_initializers_is_read_first(tmp_path):
    source = tmp_path / "m.onnx"
    io.save(_model(), source)
    lazy = io.load(source, weights=False)
    w = next(t for t in lazy.graph.initializer if t.name == "w")
    node = helper.make_node("Constant", [], ["w2"], value=w)  # a pass moved it into a node
    lazy.graph.node.append(node)
    assert not streamsave.streamable(lazy)
    out = tmp_path / "out.onnx"
    io.save(lazy, out)  # falls back to reading the weights
    saved = onnx.load(out)
    np.testing.assert_array_equal(numpy_helper.to_array(saved.graph.node[-1].attribute[0].t),
                                  numpy_helper.to_array(_model().graph.initializer[0]))


def test_a_weights_file_cut_short_fails_cleanly(tmp_path):
    source = tmp_path / "m.onnx"
    io.save(_model(), source, external_data=True)
    lazy = io.load(source, weights=False)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(GraphfixError, match="became shorter"):
        io.save(lazy, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


@pytest.mark.parametrize("copied", [0, 4096], ids=["refused", "refused-midway"])
def test_a_kernel_that_refuses_the_copy_gets_the_same_bytes_through_memory(
        tmp_path, monkeypatch, copied):
    """os.copy_file_range fails across file systems (EXDEV) and on old kernels: the rest
    of that weight, and every later one, is read and written in chunks."""
    import errno
    import os

    source = tmp_path / "m.onnx"
    io.save(_model(), source, external_data=True)
    lazy = io.load(source, weights=False)
    real, calls = os.copy_file_range, []

    def refusing(src, dst, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if copied and len(calls) == 1:
            return real(src, dst, min(count, copied), offset_src)
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refusing)
    out = tmp_path / "out.onnx"
    io.save(lazy, out)
    assert out.read_bytes() == io.load(source).SerializeToString()
    assert len(calls) == (2 if copied else 1)  # not asked again after refusing
