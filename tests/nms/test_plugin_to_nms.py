"""plugin-to-nms: NMS plugin nodes become standard ONNX with the same outputs."""

from __future__ import annotations

import numpy as np
import pytest
from gfhelpers import apply, assert_idempotent, ops, parse
from nmshelpers import efficient_attrs, numpy_efficient_nms, plugin_model, random_inputs

from graphfix.graph import to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.plugin_to_nms import COUNT, PluginToNms
from graphfix.runtime.session import run_model

DECOMPOSED = ["Shape", "Slice", "Slice", "Cast", "Reshape", "Concat", "Slice", "Slice", "Mul",
              "Sub", "Add", "Concat", "Expand", "Transpose", "Cast", "Transpose", "Concat",
              "Reshape", "Concat", "Reshape", "Shape", "Expand", "NonMaxSuppression",
              "GatherND", "ScatterND", "Concat", "Reshape", "Concat", "Expand", "Concat",
              "TopK", "Greater", "Where", "Reshape", "Unsqueeze", "Concat", "Expand",
              "GatherElements", "Unsqueeze", "Where", "Where", "Div", "Where", "Cast",
              "ReduceSum", "Identity", "CastLike", "CastLike", "Cast"]


def test_efficient_nms_becomes_standard_onnx():
    """yolov7's export: domain TRT, box_coding and background_class as INTS [x]."""
    model = plugin_model(domain="TRT", **efficient_attrs(box_coding=[1], background_class=[-1]))
    out, result = apply(PluginToNms(), model)
    assert result.counts[COUNT] == 1
    assert sorted(ops(out)) == sorted(DECOMPOSED)
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    feeds = random_inputs(2, 40, 3, 7, centre_size=True)
    want = numpy_efficient_nms(feeds["boxes"], feeds["scores"], 10, 0.3, 0.5, box_coding=1)
    for got, w in zip(run_model(out, feeds).values(), want, strict=True):
        assert got.dtype == w.dtype
        np.testing.assert_array_equal(got, w)
    assert_idempotent(PluginToNms(), out)


def test_batched_nms_dynamic_becomes_standard_onnx():
    model = plugin_model("BatchedNMSDynamic_TRT", box_rank=4, shareLocation=1,
                         backgroundLabelId=-1, numClasses=3, topK=50, keepTopK=10,
                         scoreThreshold=0.3, iouThreshold=0.5, isNormalized=1, clipBoxes=0)
    out, result = apply(PluginToNms(), model)
    assert result.changed and "NonMaxSuppression" in ops(out)
    feeds = random_inputs(2, 40, 3, 1)
    feeds["boxes"] = feeds["boxes"][:, :, None]
    got = run_model(out, feeds)
    assert got["nmsed_classes"].dtype == np.float32 and (got["num_detections"] > 0).all()


@pytest.mark.parametrize("model, why", [
    (plugin_model(**efficient_attrs(iou=0.0)), "must be > 0"),
    (plugin_model("BatchedNMSDynamic_TRT", box_rank=4, shareLocation=1, backgroundLabelId=-1,
                  numClasses=3, topK=50, keepTopK=10, scoreThreshold=0.3, iouThreshold=0.5,
                  isNormalized=0), "caffeSemantics"),
])
def test_refusals_leave_the_node_with_a_reason(model, why):
    result = PluginToNms().run(to_graph(model), PassContext())
    assert not result.changed and why in str(result.notes[0])


def test_nothing_to_do_says_so():
    model = parse('<ir_version: 8, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) '
                  "{ y = Relu(x) }")
    assert_idempotent(PluginToNms(), model)
