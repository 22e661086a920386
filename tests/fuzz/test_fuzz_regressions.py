"""Cases the fuzz tests (test_fuzz_passes.py) found, shrunk, as plain tests: each runs
its pipeline through the manager with the check on and asserts the properties the fuzz
test asserts (`check_pipeline`), plus what the fix does."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest
from gfhelpers import reshape_chain
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


@pytest.mark.parametrize(("middle", "ops_after"), [
    ((), ["Reshape", "Identity", "Reshape"]),
    (("m = Add (r, r)",), ["Reshape", "Add", "Reshape"]),
])
def test_fold_reshape_targets_folds_a_chain_in_one_run(middle, ops_after):
    """The second Reshape's target reads the shape of the first one's output (or of an op
    after it), which the model does not record: the first run folded one target, a
    second run the other. Shapes are inferred again between rounds now."""
    model = reshape_chain(*middle)
    check_pipeline(Drawn(model, None), "fold-reshape-targets")
    result = api.run(model, "fold-reshape-targets")
    assert result.report.passes[0].counts == {
        "made Reshape targets computed from Shape constant": 2}
    assert [n.op_type for n in result.model.graph.node] == ops_after
