"""split-nms: the graph becomes the backbone; the NMS part goes to ctx.artifacts."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nms"))
import detectors as d  # noqa: E402
from gfhelpers import assert_idempotent  # noqa: E402

import graphfix  # noqa: E402
from graphfix.graph import to_graph  # noqa: E402
from graphfix.nms.chain import run_split  # noqa: E402
from graphfix.passes import split_nms  # noqa: E402
from graphfix.passes.base import PassContext  # noqa: E402
from graphfix.passes.split_nms import SplitNms  # noqa: E402
from graphfix.report import APPLIED  # noqa: E402
from graphfix.runtime.session import run_model  # noqa: E402


def test_applied_through_the_api_with_its_own_verification():
    model = d.top_level()
    result = graphfix.run(model, "split-nms,cleanup")
    split, cleanup = result.report.passes
    assert split.status == APPLIED and cleanup.status in (APPLIED, "unchanged")
    assert split.check.startswith("verified by the pass: backbone + NMS part give the "
                                  "original outputs on the run's check input and 2 seeded inputs")
    assert split.counts == {"split off the NMS post-processing": 1,
                            "nodes moved to the NMS part": split.counts[
                                "nodes moved to the NMS part"], "cut tensors": 2}
    backbone = result.model
    onnx.checker.check_model(backbone, full_check=True)
    assert [n.op_type for n in backbone.graph.node if n.op_type != "Constant"] == [
        "MatMul", "Slice", "Slice", "Sigmoid"]
    assert [o.name for o in backbone.graph.output] == ["boxes", "scores"]
    parts = result.artifacts["split-nms"]
    assert parts.backbone is None  # the backbone is result.model
    feeds = d.controlled_feeds()
    ref, got = run_model(model, feeds), run_split(parts, feeds, backbone=backbone)
    assert ref["labels"].shape[0] >= 2
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])


def test_second_run_changes_nothing():
    result = graphfix.run(d.top_level(), "split-nms")
    assert_idempotent(SplitNms(), result.model)
    again = SplitNms().run(to_graph(result.model), PassContext())
    assert [str(n) for n in again.notes] == ["graph: no NonMaxSuppression in the graph"]


def test_later_passes_are_checked_against_the_backbone():
    result = graphfix.run(d.in_if(), "split-nms,fold-constants,cleanup")
    assert [p.status for p in result.report.passes][0] == APPLIED
    assert all(p.status != "rolled back" for p in result.report.passes)
    assert result.report.check.enabled


@pytest.mark.parametrize("build, reason", [
    (d.two_stage, "graph: the post-processing would hold 1 MatMul"),
    (d.boxes_from_loop, "graph: NonMaxSuppression 'nms': the boxes come from Loop"),
    (d.plugin, "graph: the NMS is a TensorRT plugin (EfficientNMS_TRT)"),
])
def test_does_not_apply_with_a_reason(build, reason):
    graph = to_graph(build())
    result = SplitNms().run(graph, PassContext())
    assert not result.changed
    assert str(result.notes[0]).startswith(reason)


def test_refuses_when_the_chained_parts_differ(monkeypatch):
    def wrong(split, feeds, providers=("cpu",), backbone=None):
        out = run_split(split, feeds, providers, backbone)
        return {k: v + 1 for k, v in out.items()}

    monkeypatch.setattr(split_nms, "run_split", wrong)
    graph = to_graph(d.top_level())
    ctx = PassContext()
    result = SplitNms().run(graph, ctx)
    assert not result.changed and not ctx.artifacts
    (note,) = result.notes
    assert str(note).startswith("graph: the split was not applied: on seeded input 1, the "
                                "chained parts differ: det_boxes:")


def test_refuses_inputs_it_cannot_make():
    model = d.top_level()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "n"
    result = SplitNms().run(to_graph(model), PassContext())
    assert not result.changed
    assert "cannot make inputs to verify the split" in str(result.notes[0])


def test_ssdlite_split_through_the_api(shared_model):
    path = shared_model("ssdlite320_mobilenet_v3_large.onnx")
    result = graphfix.run(path, "fold-bn,split-nms")
    backbone = result.model
    assert not {n.op_type for n in backbone.graph.node} & {"NonMaxSuppression", "NonZero", "If"}
    split = result.report.passes[1]
    assert split.status == APPLIED and "'boxes' has 300, 300, 300 row(s)" in split.check
    original = graphfix.load(path)
    parts = result.artifacts["split-nms"]
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((3, 320, 320)).astype(np.float32)
        ref = run_model(original, {"images": x})
        got = run_split(parts, {"images": x}, backbone=backbone)
        np.testing.assert_array_equal(got["labels"], ref["labels"])
        np.testing.assert_allclose(got["boxes"], ref["boxes"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["scores"], ref["scores"], rtol=1e-6, atol=1e-7)
