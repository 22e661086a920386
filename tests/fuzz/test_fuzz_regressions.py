"""Cases the fuzz tests (test_fuzz_passes.py) found, shrunk, as plain tests: each runs
its pipeline through the manager with the check on and asserts the properties the fuzz
test asserts (`check_pipeline`), plus what the fix does."""

from __future__ import annotations

import onnx
import onnx.parser
from graphgen import Drawn
from test_fuzz_passes import check_pipeline

from graphfix import api


def _model(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_int64_to_int32_keeps_pad_axes_int64():
    """Pad-18's schema lets `axes` be INT32, but onnx's shape inference and onnxruntime
    read it only as INT64: the pass converted it and was rolled back as invalid."""
    model = _model("""
        <ir_version: 8, opset_import: ["" : 18]>
        fuzz (float[1,1,1] x) => (float[1,1,1] y)
        <int64[2] pads = {0, 0}, int64[1] axes = {0}>
        { y = Pad <mode = "reflect"> (x, pads, , axes) }
    """)
    check_pipeline(Drawn(model, None), "int64-to-int32")
    result = api.run(model, "int64-to-int32")
    inits = {t.name: t.data_type for t in result.model.graph.initializer}
    assert inits == {"pads": onnx.TensorProto.INT64, "axes": onnx.TensorProto.INT64}
    notes = result.report.passes[0].notes
    assert any("reads 'axes' as 'axes', which onnx's shape inference" in n for n in notes), notes


def test_fold_reshape_targets_folds_a_chain_in_one_run():
    """The second Reshape's target reads the shape of the first one's output, which the
    model does not record: the first run folded one target, a second run the other."""
    model = _model("""
        <ir_version: 6, opset_import: ["" : 11]>
        fuzz (float[1,1] x) => (float[1,1] y)
        <int64[1] zero = {0}, int64[1] one = {1}, int64[1] rest = {-1}>
        {
           s1 = Shape (x)
           l1 = Slice (s1, zero, one)
           t1 = Concat <axis = 0> (l1, rest)
           r1 = Reshape (x, t1)
           s2 = Shape (r1)
           l2 = Slice (s2, zero, one)
           t2 = Concat <axis = 0> (l2, rest)
           y = Reshape (r1, t2)
        }
    """)
    check_pipeline(Drawn(model, None), "fold-reshape-targets")
    result = api.run(model, "fold-reshape-targets")
    assert result.report.passes[0].counts == {
        "made Reshape targets computed from Shape constant": 2}
    assert [n.op_type for n in result.model.graph.node] == ["Reshape", "Reshape"]


def test_fold_reshape_targets_sees_through_an_op_after_a_folded_reshape():
    """The second target reads the shape of an Add after the first Reshape, known only
    once the first target is folded and shapes are inferred again: one run must fold
    both (a second run folded the other)."""
    model = _model("""
        <ir_version: 6, opset_import: ["" : 11]>
        fuzz (float[1,1,1] x) => (float[1,1] y)
        <int64[1] zero = {0}, int64[1] one = {1}, int64[1] rest = {-1}>
        {
           s1 = Shape (x)
           l1 = Slice (s1, zero, one)
           t1 = Concat <axis = 0> (l1, rest)
           r1 = Reshape (x, t1)
           a = Add (r1, r1)
           s2 = Shape (a)
           l2 = Slice (s2, zero, one)
           t2 = Concat <axis = 0> (l2, rest)
           y = Reshape (a, t2)
        }
    """)
    check_pipeline(Drawn(model, None), "fold-reshape-targets")
    result = api.run(model, "fold-reshape-targets")
    assert result.report.passes[0].counts == {
        "made Reshape targets computed from Shape constant": 2}
    assert [n.op_type for n in result.model.graph.node] == ["Reshape", "Add", "Reshape"]
