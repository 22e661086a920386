"""NMS regions: where each NMS is, what feeds it, its limits, its tail, why it cannot split."""

import detectors as d
import onnx
import pytest

import graphfix
from graphfix.nms.regions import BoxFormat, Kind, Layout, Where, find_regions
from graphfix.report import APPLIED


def only(model):
    (region,) = find_regions(model)
    return region


def test_top_level_nms_with_a_gather_tail():
    r = only(d.top_level())
    assert (r.kind, r.where, r.op_type, r.label) == (
        Kind.ONNX, Where.MAIN, "NonMaxSuppression", "NonMaxSuppression 'nms'")
    assert (r.boxes, r.scores) == (("boxes",), ("scores",))  # before the Transpose
    assert r.layout is Layout.BNC and r.box_format is BoxFormat.CORNER
    assert [t.describe() for t in r.thresholds] == [
        "max_output_boxes_per_class: 4", "iou_threshold: 0.5", "score_threshold: 0.3"]
    assert r.tail == ("Gather 'det_boxes'", "Gather 'idx'", "Gather 'labels'")
    assert r.reaches_output and r.splittable and r.reasons == ()


def test_centre_box_format_is_read_from_center_point_box():
    assert only(d.top_level(center=True)).box_format is BoxFormat.CENTER


def test_nms_inside_an_if_branch_is_traced_to_the_outer_tensors():
    r = only(d.in_if())
    assert r.where is Where.IF
    assert r.label == "If 'if_empty'.else_branch > NonMaxSuppression 'nms'"
    assert (r.boxes, r.scores) == (("boxes",), ("scores",))
    assert r.layout is Layout.FLAT  # per-image [N] scores, axes added by Unsqueeze
    assert "Gather 'det_boxes'" in r.tail and "If 'if_empty'.else_branch > Gather 'keep'" \
        in r.tail
    assert r.reaches_output and r.splittable


def test_per_image_loop_holding_nms():
    r = only(d.in_loop())
    assert r.where is Where.LOOP and r.splittable
    assert (r.boxes, r.scores) == (("boxes",), ("scores",))
    assert r.layout is Layout.BNC
    assert r.tail == ("Loop 'per_image_loop'.body > Concat 'acc_out'",)
    assert r.reaches_output


def test_two_regions_are_both_found():
    a, b = find_regions(d.two_regions())
    assert (a.label, b.label) == ("NonMaxSuppression 'nms_a'", "NonMaxSuppression 'nms_b'")
    assert a.threshold("iou_threshold").value == 0.5
    assert b.threshold("iou_threshold").value == pytest.approx(0.7)


def test_non_constant_thresholds_say_so():
    r = only(d.input_thresholds())
    iou, score = r.threshold("iou_threshold"), r.threshold("score_threshold")
    assert (iou.source, iou.value, iou.constant) == ("iou_in", None, False)
    assert score.describe() == "score_threshold: not constant"
    assert r.to_json()["thresholds"]["iou_threshold"] == "not constant"
    assert r.splittable  # fine for a split: they go with the post-processing


def test_absent_score_threshold_is_not_given():
    model = d.top_level()
    nms = next(n for n in model.graph.node if n.op_type == "NonMaxSuppression")
    del nms.input[4]
    t = only(model).threshold("score_threshold")
    assert (t.given, t.describe()) == (False, "score_threshold: not given")


def test_nms_with_no_tail():
    r = only(d.no_tail())
    assert r.tail == () and r.reaches_output and r.splittable


def test_boxes_from_a_loop_cannot_be_split():
    r = only(d.boxes_from_loop())
    assert r.boxes == ("looped",)
    assert r.reasons == ("the boxes come from Loop 'box_loop', which does not hold this "
                         "NMS: the cut would have to go before it",)


def test_unused_nms_says_its_result_reaches_no_output():
    model = d.no_tail()
    model.graph.output[0].name = "boxes"  # the NMS result is now read by nothing
    r = only(model)
    assert not r.reaches_output and r.reasons == ("its result reaches no graph output",)


def test_other_ops_on_a_dirty_path_are_steps_walked_through():
    """Decoding/normalising after a data-dependent op (torchvision's clamp after TopK,
    Ultralytics' normalised offsets) is post-processing: the walk goes on to where the
    data-dependence starts, names the ops as steps, and split-nms cuts there."""
    model = d.top_level()
    nodes = list(model.graph.node)
    nms = next(n for n in nodes if n.op_type == "NonMaxSuppression")
    # boxes -> NonZero-filtered -> Mul (not a pre-NMS step) -> NMS
    extra = [onnx.helper.make_node("Greater", ["scores", "score_thr"], ["keep_mask"]),
             onnx.helper.make_node("NonZero", ["keep_mask"], ["nz"]),
             onnx.helper.make_node("Size", ["nz"], ["count"]),
             onnx.helper.make_node("Cast", ["count"], ["countf"], to=1),
             onnx.helper.make_node("Mul", ["boxes", "countf"], ["scaled"])]
    nms.input[0] = "scaled"
    index = nodes.index(nms)
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:index] + extra + nodes[index:])
    r = only(model)
    assert r.reasons == () and r.splittable
    assert r.boxes == ("boxes", "keep_mask")  # the clean tensors the dirty path starts from
    assert {"Mul", "Size", "NonZero"} <= set(r.steps)
    record = graphfix.run(model, "split-nms").report.passes[0]
    assert record.status == APPLIED and "verified by the pass" in record.check, record.notes
    plugin = graphfix.run(model, "nms-to-plugin", trt="8.4").report.passes[0]
    assert plugin.status != APPLIED and "Mul" in " ".join(plugin.notes)


@pytest.mark.parametrize("domain", ["TRT", ""])
def test_plugin_with_list_attributes_reads_scalars(domain):
    r = only(d.plugin(domain=domain))
    assert (r.kind, r.op_type) == (Kind.PLUGIN, "EfficientNMS_TRT")
    assert r.attributes["max_output_boxes"] == 100 and r.attributes["box_coding"] == 1
    assert r.attributes["background_class"] == -1 and r.attributes["plugin_version"] == "1"
    assert r.threshold("score_threshold").value == pytest.approx(0.25)
    assert r.threshold("max_output_boxes").value == 100
    assert r.box_format is BoxFormat.CENTER and r.layout is Layout.BNC
    assert r.nms_inputs == ("boxes", "scores")
    assert "TensorRT plugin" in r.reasons[0]


def test_batched_nms_plugin():
    r = only(d.plugin("BatchedNMSDynamic_TRT", ""))
    assert r.threshold("keepTopK").value == 50 and r.box_format is BoxFormat.CORNER
    assert (r.boxes, r.scores) == (("boxes",), ("scores",))  # traced back through Unsqueeze


def test_no_nms_no_region():
    model = d.top_level()
    keep = [n for n in model.graph.node if n.op_type != "NonMaxSuppression"]
    model.graph.ClearField("node")
    model.graph.node.extend(keep)
    assert find_regions(model) == []


def test_ssdlite(shared_model):
    model = onnx.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    r = only(model)
    assert r.where is Where.IF and r.label.startswith("If 'If_4349'.else_branch > ")
    assert (r.boxes, r.scores) == (("/Reshape_output_0",), ("/Split_1_output_0",))
    assert set(r.steps) == {"class offset", "Concat", "score filter", "TopK"}
    assert r.threshold("iou_threshold").value == pytest.approx(0.55)
    assert not r.threshold("score_threshold").given
    assert r.layout is Layout.FLAT and r.box_format is BoxFormat.CORNER
    assert "Gather '/Gather_277'" in r.tail and r.reaches_output and r.splittable
