"""nms-to-plugin and nms-for-trt on tiny detectors built in code (tests/nms/detectors.py)."""

from __future__ import annotations

import detectors as d
import numpy as np
import onnx
from nmshelpers import apply
from onnx import helper

import graphfix
from graphfix.graph import fingerprint, to_graph
from graphfix.nms.compare import compare_detections, from_efficient, from_onnx_nms
from graphfix.passes.base import PassContext
from graphfix.passes.nms_for_trt import NmsForTrt, choose
from graphfix.passes.nms_to_plugin import COUNT, OUTPUTS, NmsToPlugin, NmsToPluginOptions
from graphfix.passes.plugin_to_nms import PluginToNms
from graphfix.plugins.nodes import problems
from graphfix.report import APPLIED
from graphfix.runtime import references
from graphfix.runtime.outputs import run_checkable
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target, plugin_for

AFTER = ["Constant"] * 5 + ["MatMul", "Slice", "Slice", "Sigmoid", "EfficientNMS_TRT"]


def gather_tail_detector(center: bool = False, k: int = 100, b: int = 1) -> onnx.ModelProto:
    """ONNX NMS (per-class cap k, larger than N so it never binds) + a Gather tail."""
    nodes = [*d._heads(b), *d._limits(k=k),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"],
                              center_point_box=int(center), name="nms"),
             *d._tail()]
    return d._model(nodes, [d._out("det_boxes", d.F, [None, 4]),
                            d._out("labels", d.I64, [None])], b=b)


def original_detections(model, feeds, center):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n)
                              for n in ("sel", "boxes", "scores_t"))
    out = run_model(probe, feeds)
    return from_onnx_nms(out["sel"], out["boxes"], out["scores_t"], int(center))


def plugin_detections(model, feeds):
    out = run_checkable(model, feeds)
    return from_efficient(*(out[n] for n in OUTPUTS))


def test_gather_tail_becomes_efficient_nms_with_the_same_detections():
    for center in (False, True):
        model = gather_tail_detector(center)
        out, result = apply(NmsToPlugin(), model)
        assert result.counts[COUNT] == 1 and result.verified, result.notes
        assert [n.op_type for n in out.graph.node] == AFTER
        assert [o.name for o in out.graph.output] == list(OUTPUTS)
        node = next(n for n in out.graph.node if n.op_type == "EfficientNMS_TRT")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["box_coding"] == int(center) and attrs["background_class"] == -1
        assert attrs["max_output_boxes"] == 100
        # built by plugins.nodes: every field typed as the parser reads it, nothing missing
        assert problems(node, plugin_for("EfficientNMS_TRT")) == []
        assert attrs["plugin_version"] == b"1" and attrs["plugin_namespace"] == b""
        # ONNX's `score > 0.3` is the plugin's `score >= 0.3 + 1 ulp`
        assert attrs["score_threshold"] == np.nextafter(np.float32(0.3), np.float32(1))
        assert node.input[1] == "scores"  # the Transpose in front of the NMS is reused
        # the plugin runs as its CPU reference form (runtime.references)
        assert references.needs_reference(out)
        onnx.checker.check_model(references.substitute(out).model, full_check=True)
        for seed in (3, 4):
            feeds = d.controlled_feeds(seed=seed)
            report = compare_detections(original_detections(model, feeds, center),
                                        plugin_detections(out, feeds))
            assert report.ok and report.count_a > 10, report.describe()
        notes = " ".join(str(n) for n in result.notes)
        assert "per class" in notes and "per image" in notes and "deprecated" in notes
        again = NmsToPlugin().run(to_graph(out), PassContext())
        assert not again.changed and "no ONNX NonMaxSuppression" in str(again.notes[0])


def test_no_deprecation_note_before_10_12():
    _, result = apply(NmsToPlugin(), gather_tail_detector(), "8.4")
    assert result.changed and "deprecated" not in " ".join(str(n) for n in result.notes)


def test_round_trip_through_plugin_to_nms():
    model = gather_tail_detector(b=2)
    plugin, _ = apply(NmsToPlugin(), model)
    std, result = apply(PluginToNms(), plugin)
    assert result.changed and "EfficientNMS_TRT" not in [n.op_type for n in std.graph.node]
    onnx.checker.check_model(std, full_check=True)
    feeds = d.controlled_feeds(b=2)
    a, b = run_checkable(plugin, feeds), run_checkable(std, feeds)
    for name in OUTPUTS:
        np.testing.assert_array_equal(a[name], b[name])
    report = compare_detections(original_detections(model, feeds, False),
                                plugin_detections(std, feeds))
    assert report.ok and report.images == 2, report.describe()


def refusal(model, **opts):
    graph = to_graph(model)
    before = fingerprint(graph)
    result = NmsToPlugin(NmsToPluginOptions(**opts)).run(graph, PassContext())
    assert not result.changed and fingerprint(graph) == before
    return " ".join(str(n) for n in result.notes)


def test_refusals_say_why():
    assert "iou_threshold ('iou_in') is not constant" in refusal(d.input_thresholds())
    assert "use split-nms" in refusal(d.in_if())
    assert "2 NonMaxSuppression nodes" in refusal(d.two_regions())
    assert "MatMul" in refusal(d.two_stage())  # the tail does more than gather
    # ONNX's per-class cap of 4 binds on these inputs: per-image max cannot reproduce it
    assert "not converted: detections DIFFER" in refusal(d.top_level())
    # a per-image cap below what the original keeps
    assert "per image" in refusal(gather_tail_detector(), max=2)
    nothing = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]> '
                                      "g (float[2] x) => (float[2] y) { y = Relu(x) }")
    assert "no ONNX NonMaxSuppression" in refusal(nothing)


def test_nms_for_trt_chooses_by_target():
    assert choose(parse_target("8.4"))[0] == "nms-to-plugin"
    assert choose(parse_target("8.5"))[0] == "bound-nms"
    assert choose(None)[0] == "bound-nms"
    pass_ = NmsForTrt()
    out, result = apply(pass_, gather_tail_detector(), "8.4")
    assert pass_.changes_outputs and result.verified
    assert "chose nms-to-plugin" in str(result.notes[0])
    pass_ = NmsForTrt()
    _, result = apply(pass_, d.top_level(), "10.8")
    assert not pass_.changes_outputs and "chose bound-nms" in str(result.notes[0])


def test_nms_for_trt_through_graphfix_run():
    model = gather_tail_detector()
    old = graphfix.run(model, passes="nms-for-trt", trt="8.4")
    record = old.report.passes[0]
    assert record.status == APPLIED, record.rollback_reason
    assert record.check.startswith("verified by the pass")
    assert [o.name for o in old.model.graph.output] == list(OUTPUTS)
    new = graphfix.run(model, passes="nms-for-trt{max=50}", trt="10.8")
    record = new.report.passes[0]
    assert record.status == APPLIED, record.rollback_reason
    assert any("chose bound-nms" in n for n in record.notes)
    assert not record.check.startswith("verified by the pass")  # outputs compared
    assert record.counts == {"capped max_output_boxes_per_class at 50": 1}
    assert [o.name for o in new.model.graph.output] == ["det_boxes", "labels"]


def test_a_rewrite_budget_of_zero_leaves_the_nms():
    from graphfix.passes.base import LIMIT_REACHED, RewriteBudget

    graph = to_graph(gather_tail_detector())
    result = NmsToPlugin().run(graph, PassContext(rewrites=RewriteBudget(0)))
    assert not result.changed and LIMIT_REACHED in str(result.notes[0])
    assert "NonMaxSuppression" in [n.op for n in graph.nodes]



def offset_detections(model, feeds, boxes, best, label):
    """The original's detections: the kept boxes without offsets (tensor `boxes`), their
    scores (`best`, the NMS's one class) and ArgMax labels (`label`)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n)
                              for n in ("sel", boxes, best, label))
    out = run_model(probe, feeds)
    n = out[best].size // len(feeds["feats"])
    return from_onnx_nms(out["sel"], out[boxes].reshape(-1, n, 4), out[best].reshape(-1, 1, n),
                         labels=out[label].reshape(-1, n))


def efficient_node(model):
    node = next(n for n in model.graph.node if n.op_type == "EfficientNMS_TRT")
    return node, {a.name: helper.get_attribute_value(a) for a in node.attribute}


def test_class_offset_becomes_per_class_scores():
    """YOLOv7's ORT end2end form: the offset is undone, each box's score goes to its
    label's column, the cap (per image for one class) becomes max_output_boxes."""
    model = d.yolov7_ort(b=2, k=7)
    out, result = apply(NmsToPlugin(), model)
    assert result.counts[COUNT] == 1 and result.verified, result.notes
    assert [n.op_type for n in out.graph.node] == OFFSET_AFTER
    node, attrs = efficient_node(out)
    assert attrs["max_output_boxes"] == 7  # ONNX's one-class cap, per image already
    assert node.input[0] == "boxes"  # the boxes without the offset
    assert "class-offset NMS" in " ".join(str(n) for n in result.notes)
    onnx.checker.check_model(references.substitute(out).model, full_check=True)
    for seed in (3, 4):
        feeds = d.controlled_feeds(b=2, seed=seed)
        got = plugin_detections(out, feeds)
        report = compare_detections(offset_detections(model, feeds, "boxes", "best", "label"),
                                    got)
        assert report.ok and report.count_a > 10, report.describe()
        assert {int(c) for g in got for c in g.classes} == {0, 1, 2}
        assert max(g.count for g in got) == 7  # the cap binds, as in the original
    again = NmsToPlugin().run(to_graph(out), PassContext())
    assert not again.changed


OFFSET_AFTER = ["Constant"] * 5 + ["MatMul", "Slice", "Slice", "Sigmoid", "ReduceMax", "ArgMax",
                                   "Cast", "Shape", "Reshape", "Equal", "Where", "EfficientNMS_TRT"]


def test_torchvision_batched_nms_is_undone():
    """Flat boxes, a span computed from the boxes, INT64_MAX cap, no score threshold: the
    cap becomes the box count, the threshold one ulp above the filler of the other
    classes, and the Unsqueeze after the offset is replayed on the plain boxes."""
    model = d.torchvision_batched()
    out, result = apply(NmsToPlugin(), model)
    assert result.changed and result.verified, result.notes
    node, attrs = efficient_node(out)
    lowest = np.finfo(np.float32).min
    assert attrs["max_output_boxes"] == d.N
    assert attrs["score_threshold"] == np.nextafter(lowest, np.float32(0))
    producer = next(n for n in out.graph.node if node.input[0] in n.output)
    assert producer.op_type == "Unsqueeze" and producer.input[0] == "boxes2d"
    feeds = d.controlled_feeds(seed=5)
    report = compare_detections(offset_detections(model, feeds, "boxes2d", "best", "label"),
                                plugin_detections(out, feeds))
    assert report.ok and report.count_a == d.N, report.describe()  # no box overlaps another


def test_class_offset_refusals_say_why():
    # centre-size boxes: the offset is added to w and h too, so the original's IoUs are
    # not per-class NMS's; the detection check refuses
    assert "not converted: detections DIFFER" in refusal(d.torchvision_batched(center=True))
    # labels that do not come from ArgMax: the class count is unknown
    model = d.yolov7_ort()
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] == "label":
            node.op_type, node.input[0] = "Identity", "best"
            node.ClearField("attribute")
    assert "does not multiply one ArgMax's labels" in refusal(model)


def test_the_runs_data_is_what_the_pass_checks(tmp_path):
    """A score threshold no seeded input reaches: with no detections the check proves
    nothing and the pass refuses; with --data that has detections it applies, and says it
    checked the run's input."""
    nodes = [*d._heads(), *d._limits(score=0.999, k=100),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms"),
             *d._tail()]
    model = d._model(nodes, [d._out("det_boxes", d.F, [None, 4]),
                             d._out("labels", d.I64, [None])])
    seeded = graphfix.run(model, passes="nms-to-plugin", trt="8.4").report.passes[0]
    assert seeded.status != APPLIED and "no detections on the checked inputs" in \
        " ".join(seeded.notes), seeded.notes
    feeds = d.controlled_feeds(seed=1)
    feeds["feats"][..., 4:] = 9.0  # sigmoid(9) = 0.99988 > 0.999 for every box and class
    np.savez(tmp_path / "data.npz", **feeds)
    given = graphfix.run(model, passes="nms-to-plugin", trt="8.4", data=tmp_path / "data.npz")
    record = given.report.passes[0]
    assert record.status == APPLIED, record.notes
    assert "detections match on the run's check input and 3 seeded inputs" in record.check
