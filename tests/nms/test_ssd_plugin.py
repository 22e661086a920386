"""NMS_TRT / NMSDynamic_TRT decomposition against a plain numpy DetectionOutput written here
from TensorRT's kernels (decodeBBoxes.cu, permuteData.cu, sortScoresPerClass.cu,
allClassNMS.cu, sortScoresPerImage.cu, gatherTopDetections.cu), not from graphfix.

Decoded coordinates of CENTER_SIZE / TF_CENTER go through exp: numpy's float32 exp and
onnxruntime's Exp may differ in the last bit, so those box columns are compared with an
absolute tolerance of 2 ulps at 1.0 (the boxes are saturated into [0, 1]); everything else,
and every box of CORNER / CORNER_SIZE (same float32 adds and multiplies), is compared exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from nmshelpers import apply
from onnx import helper, numpy_helper

from graphfix.graph import to_graph
from graphfix.nms.ssd import (
    CENTER_SIZE,
    CORNER,
    CORNER_SIZE,
    REFERENCES,
    SSD_PLUGINS,
    TF_CENTER,
    detection_output,
)
from graphfix.passes.base import PassContext
from graphfix.passes.plugin_to_nms import COUNT, PluginToNms
from graphfix.runtime import references
from graphfix.runtime.outputs import run_checkable
from graphfix.runtime.references import PLUGIN_DOMAIN, Unavailable
from graphfix.runtime.session import run_model

F32 = np.float32
FLOAT = onnx.TensorProto.FLOAT
VARIANCES = np.array([0.1, 0.1, 0.2, 0.2], F32)
BOX_ATOL = 2 * float(np.spacing(F32(1)))  # exp: last-bit differences (module docstring)


# ----------------------------------------------------------------------------- numpy plugin


def _decode(d, p, v, code, in_target):
    """decodeBBoxes_kernel: d [N,L,4] loc, p and v [N,1,4] prior corners and variances."""
    x1, y1, x2, y2 = (p[..., k] for k in range(4))
    if code == CORNER:
        return p + d if in_target else p + d * v
    pw, ph = x2 - x1, y2 - y1
    if code == CORNER_SIZE:
        size = np.stack([pw, ph, pw, ph], -1)
        return p + d * size if in_target else p + (d * v) * size
    if code == CENTER_SIZE:
        tx, ty, tw, th = (d[..., k] for k in range(4))
    else:
        ty, tx, th, tw = (d[..., k] for k in range(4))
    if code == TF_CENTER or not in_target:
        tx, ty, tw, th = v[..., 0] * tx, v[..., 1] * ty, v[..., 2] * tw, v[..., 3] * th
    cx = tx * pw + (x1 + x2) / F32(2)
    cy = ty * ph + (y1 + y2) / F32(2)
    w, h = np.exp(tw) * pw, np.exp(th) * ph
    return np.stack([cx - w / F32(2), cy - h / F32(2), cx + w / F32(2), cy + h / F32(2)], -1)


def _jaccard(a, b):
    """allClassNMS.cu jaccardOverlap, normalized boxes."""
    a = [min(a[0], a[2]), min(a[1], a[3]), max(a[0], a[2]), max(a[1], a[3])]
    b = [min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3])]
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F32(0)
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if not (iw > 0 and ih > 0):
        return F32(0)
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _class_nms(scores, boxes, bg, c, thr, top_k, nms):
    """sortScoresPerClass + allClassNMS for one (image, class): (scores, prior ids) [top_k],
    0 / -1 where nothing is kept."""
    n = len(scores)
    valid = (scores > thr) & (c != bg)
    s = np.where(valid, scores, F32(0))
    idx = np.where(valid, np.arange(n), -1)
    order = np.argsort(-s, kind="stable")[:top_k]
    s, idx = s[order], idx[order]
    kept = idx != -1
    for r in range(len(idx)):
        if kept[r]:
            for j in range(r + 1, len(idx)):
                if kept[j] and _jaccard(boxes[idx[r]], boxes[idx[j]]) > F32(nms):
                    kept[j] = False
    out_s, out_i = np.zeros(top_k, F32), np.full(top_k, -1)
    out_s[:len(s)], out_i[:len(s)] = np.where(kept, s, F32(0)), np.where(kept, idx, -1)
    return out_s, out_i


def numpy_detection_output(loc, conf, prior, a, agnostic=True):
    """DetectionOutput of float32 inputs with attribute dict `a` -> (detections [B,1,K,7],
    keep_count [B,1,1,1] float32 holding int32 bits)."""
    bsz, c, top_k, keep = loc.shape[0], a["numClasses"], a["topK"], a["keepTopK"]
    n = prior.shape[2] // 4
    width = 1 if a["shareLocation"] else c
    loc = loc.reshape(bsz, n, width, 4)
    scores = conf.reshape(bsz, n, c)
    if a["confSigmoid"]:
        with np.errstate(over="ignore", invalid="ignore"):
            scores = np.exp(scores) / (F32(1) + np.exp(scores))
    det = np.zeros((bsz, 1, keep, 7), F32)
    count = np.zeros(bsz, np.int32)
    for b in range(bsz):
        pb = prior[0 if agnostic else b].reshape(2, n, 1, 4)
        boxes = _decode(loc[b], pb[0], pb[1], a.get("codeType", TF_CENTER),
                        a.get("varianceEncodedInTarget", 0))
        per_class = [_class_nms(scores[b, :, k], boxes[:, 0 if width == 1 else k],
                                a["backgroundLabelId"], k, F32(a["confidenceThreshold"]),
                                top_k, a["nmsThreshold"]) for k in range(c)]
        flat_s = np.concatenate([s for s, _ in per_class])
        flat_i = np.concatenate([i for _, i in per_class])
        for row, f in enumerate(np.argsort(-flat_s, kind="stable")[:keep]):
            if flat_i[f] == -1:
                det[b, 0, row] = [b, -1, 0, 0, 0, 0, 0]
                continue
            label = f // top_k
            box = boxes[flat_i[f], 0 if width == 1 else label]
            det[b, 0, row] = [b, label, flat_s[f], *np.nan_to_num(np.clip(box, 0, 1), nan=0)]
            count[b] += 1
    return det, count.view(F32).reshape(bsz, 1, 1, 1)


# ----------------------------------------------------------------------------- models, data


def ssd_attrs(**extra):
    attrs = dict(shareLocation=1, varianceEncodedInTarget=0, backgroundLabelId=0, numClasses=4,
                 topK=60, keepTopK=25, confidenceThreshold=0.3, nmsThreshold=0.45,
                 confSigmoid=0, isNormalized=1, codeType=CENTER_SIZE, inputOrder=[0, 2, 1])
    attrs.update(extra)
    return {k: v for k, v in attrs.items() if v is not None}


def ssd_model(op, attrs, b, n, prior_batch=1, opset=17, domain="", n_inputs=3):
    """loc, conf, prior wired to the node by inputOrder -> detections, keep_count."""
    c = attrs["numClasses"]
    width = 1 if attrs["shareLocation"] else c
    shapes = {"loc": [b, n * width * 4, 1, 1], "conf": [b, n * c, 1, 1],
              "prior": [prior_batch, 2, n * 4, 1]}
    names = [""] * 3
    for role, pos in zip(shapes, attrs.get("inputOrder", [0, 2, 1]), strict=True):
        names[pos] = role
    node = helper.make_node(op, names[:n_inputs], ["detections", "keep_count"], name="nms",
                            domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, FLOAT, s) for k, s in shapes.items()],
        [helper.make_tensor_value_info("detections", FLOAT, [b, 1, attrs["keepTopK"], 7]),
         helper.make_tensor_value_info("keep_count", FLOAT, [b, 1, 1, 1])])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain
                                                 else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def ssd_inputs(b, c, seed, attrs, prior_batch=1, logits=False):
    """SSD-like data: 3 prior sizes on a 3x3 grid (N=27; neighbours overlap, some reach past
    the image), loc offsets scaled to the code type, uniform scores (or logits)."""
    rng = np.random.default_rng(seed)
    g = (np.arange(3) + 0.5) / 3
    corners = [[x - s / 2, y - s / 2, x + s / 2, y + s / 2]
               for y in g for x in g for s in (0.3, 0.45, 0.6)]
    n = len(corners)
    priors = np.asarray(corners, F32)[None] + rng.normal(0, 0.01, (prior_batch, n, 4))
    prior = np.stack([priors, np.broadcast_to(VARIANCES, priors.shape)], 1)
    scaled = attrs.get("codeType", TF_CENTER) == TF_CENTER or not attrs["varianceEncodedInTarget"]
    width = 1 if attrs["shareLocation"] else c
    loc = rng.normal(0, 1.0 if scaled else 0.15, (b, n * width * 4, 1, 1))
    conf = rng.normal(0, 2, (b, n * c, 1, 1)) if logits else rng.uniform(0, 1, (b, n * c, 1, 1))
    return {"loc": loc.astype(F32), "conf": conf.astype(F32),
            "prior": prior.reshape(prior_batch, 2, n * 4, 1).astype(F32)}


REGISTRY = references.References(REFERENCES)


def _run(model, feeds):
    sub = references.substitute(model, REGISTRY)
    assert not sub.not_checkable, sub.not_checkable
    assert all(n.domain == "" and n.op_type not in SSD_PLUGINS for n in sub.model.graph.node)
    onnx.checker.check_model(sub.model, full_check=True)
    out = run_model(sub.model, feeds)
    return out["detections"], out["keep_count"]


def _check(model, feeds, attrs, exact_boxes=True, agnostic=True, score_rtol=0.0):
    det, keep = _run(model, feeds)
    want_det, want_keep = numpy_detection_output(feeds["loc"], feeds["conf"], feeds["prior"],
                                                 attrs, agnostic)
    assert det.dtype == keep.dtype == np.float32
    assert det.shape == want_det.shape and keep.shape == want_keep.shape
    np.testing.assert_array_equal(keep.view(np.int32), want_keep.view(np.int32))
    np.testing.assert_array_equal(det[..., :2], want_det[..., :2])
    np.testing.assert_allclose(det[..., 2], want_det[..., 2], rtol=score_rtol, atol=0)
    if exact_boxes:
        np.testing.assert_array_equal(det[..., 3:], want_det[..., 3:])
    else:
        np.testing.assert_allclose(det[..., 3:], want_det[..., 3:], rtol=0, atol=BOX_ATOL)
    assert (keep.view(np.int32) > 0).all()
    return det, keep.view(np.int32).ravel()


# ----------------------------------------------------------------------------- semantics


@pytest.mark.parametrize("op", SSD_PLUGINS)
@pytest.mark.parametrize("in_target", [0, 1])
@pytest.mark.parametrize("code", [CORNER, CENTER_SIZE, CORNER_SIZE, TF_CENTER])
def test_each_code_type_matches_numpy(code, in_target, op):
    """TF_CENTER applies the variances even with varianceEncodedInTarget=1."""
    attrs = ssd_attrs(codeType=code, varianceEncodedInTarget=in_target)
    feeds = ssd_inputs(2, 4, seed=code * 2 + in_target, attrs=attrs, prior_batch=2)
    det, _ = _check(ssd_model(op, attrs, 2, 27, prior_batch=2), feeds, attrs,
                    exact_boxes=code in (CORNER, CORNER_SIZE), agnostic=op == "NMS_TRT")
    assert ((det[..., 3:] == 0) | (det[..., 3:] == 1)).any()  # some boxes were saturated


@pytest.mark.parametrize("background", [-1, 0, 2])
def test_per_class_locations(background):
    """shareLocation=0: one box per (prior, class); the background class's boxes are unused."""
    attrs = ssd_attrs(shareLocation=0, backgroundLabelId=background, codeType=CORNER_SIZE,
                      numClasses=3)
    feeds = ssd_inputs(2, 3, seed=10 + background, attrs=attrs, prior_batch=2)
    det, _ = _check(ssd_model("NMSDynamic_TRT", attrs, 2, 27, prior_batch=2), feeds, attrs,
                    agnostic=False)
    labels = det[..., 1][det[..., 1] >= 0]
    assert background not in labels and len(set(labels.tolist())) == 3 - (background >= 0)


def test_top_k_cuts_each_class_before_nms():
    """Heavy suppression (IoU > 0.1): a class's 4th box would survive without the cut."""
    attrs = ssd_attrs(topK=3, keepTopK=3, codeType=CORNER, numClasses=2, backgroundLabelId=-1,
                      nmsThreshold=0.1)
    feeds = ssd_inputs(3, 2, seed=3, attrs=attrs)
    narrow, _ = _check(ssd_model("NMS_TRT", attrs, 3, 27), feeds, attrs)
    wide = numpy_detection_output(feeds["loc"], feeds["conf"], feeds["prior"],
                                  dict(attrs, topK=60))[0]
    assert not np.array_equal(wide, narrow)  # the cut changes the result on this data


def test_keep_top_k_padding_rows():
    attrs = ssd_attrs(topK=200, keepTopK=150, codeType=CORNER, confidenceThreshold=0.8)
    feeds = ssd_inputs(2, 4, seed=30, attrs=attrs)
    det, counts = _check(ssd_model("NMS_TRT", attrs, 2, 27), feeds, attrs)
    for b, n in enumerate(counts):
        assert 0 < n < 150
        pad = np.zeros((150 - n, 7), F32)
        pad[:, 0], pad[:, 1] = b, -1
        np.testing.assert_array_equal(det[b, 0, n:], pad)
        assert (det[b, 0, :n, 2] > 0.8).all() and (np.diff(det[b, 0, :n, 2]) <= 0).all()


def test_conf_sigmoid_as_exp_over_one_plus_exp():
    """exp(x) / (1 + exp(x)): a logit of 100 overflows to NaN and is dropped, as in the
    plugin. Scores via exp: last-bit differences, rtol 1 ulp."""
    attrs = ssd_attrs(confSigmoid=1, confidenceThreshold=0.6, codeType=CORNER)
    feeds = ssd_inputs(2, 4, seed=40, attrs=attrs, logits=True)
    feeds["conf"][0, 5] = 100.0  # prior 1, class 1 of image 0
    det, _ = _check(ssd_model("NMS_TRT", attrs, 2, 27), feeds, attrs,
                    score_rtol=float(np.finfo(F32).eps))
    assert not (det[0, 0, :, 2] == 1).any()


def test_nan_scores_do_not_take_top_k_places():
    """The plugin drops NaN before its per-class sort; onnxruntime's TopK ranks NaN first."""
    attrs = ssd_attrs(confSigmoid=1, numClasses=2, topK=2, keepTopK=2, codeType=CORNER)
    feeds = ssd_inputs(1, 2, seed=41, attrs=attrs, logits=True)
    feeds["conf"][0, [1, 3]] = 100.0  # class 1 of priors 0 and 1: NaN after the sigmoid
    _check(ssd_model("NMS_TRT", attrs, 1, 27), feeds, attrs,
           score_rtol=float(np.finfo(F32).eps))


@pytest.mark.parametrize("op, agnostic_attr, agnostic", [
    ("NMS_TRT", None, True), ("NMS_TRT", 0, False), ("NMSDynamic_TRT", 1, False)])
def test_priors_per_image_or_batch_agnostic(op, agnostic_attr, agnostic):
    """NMS_TRT decodes every image with image 0's priors (isBatchAgnostic, default 1);
    NMSDynamic_TRT ignores the attribute and uses prior_data[b]."""
    attrs = ssd_attrs(codeType=CORNER, isBatchAgnostic=agnostic_attr)
    feeds = ssd_inputs(3, 4, seed=50, attrs=attrs, prior_batch=3)
    feeds["prior"][1:, 0] += F32(0.05)
    _check(ssd_model(op, attrs, 3, 27, prior_batch=3), feeds, attrs, agnostic=agnostic)
    other = numpy_detection_output(feeds["loc"], feeds["conf"], feeds["prior"], attrs,
                                   not agnostic)[0]
    assert not np.array_equal(other, _run(ssd_model(op, attrs, 3, 27, prior_batch=3),
                                          feeds)[0])


def test_ties_at_the_threshold_the_top_k_cut_and_across_classes():
    """Six disjoint priors, loc 0 (CORNER, encoded). A score equal to the threshold is dropped
    (`>`); of four equal scores topK=3 keeps the lowest priors; equal scores of two classes
    come out class by class (class 0's before class 1's prior 0)."""
    attrs = ssd_attrs(numClasses=3, backgroundLabelId=-1, topK=3, keepTopK=3, codeType=CORNER,
                      varianceEncodedInTarget=1, confidenceThreshold=0.5)
    corners = np.array([[0, 0, .2, .2], [.3, 0, .5, .2], [.6, 0, .8, .2], [0, .5, .2, .7],
                        [.3, .5, .5, .7], [.6, .5, .8, .7]], F32)
    prior = np.stack([corners, np.broadcast_to(VARIANCES, (6, 4))]).reshape(1, 2, 24, 1)
    conf = np.zeros((1, 6, 3), F32)
    conf[0, :5, 0] = [0.5, 0.7, 0.7, 0.7, 0.7]
    conf[0, 0, 1] = 0.7
    conf[0, 5, 2] = 0.9
    feeds = {"loc": np.zeros((1, 24, 1, 1), F32), "conf": conf.reshape(1, 18, 1, 1),
             "prior": prior.astype(F32)}
    det, keep = _run(ssd_model("NMS_TRT", attrs, 1, 6), feeds)
    want = np.array([[0, 2, .9, *corners[5]], [0, 0, .7, *corners[1]],
                     [0, 0, .7, *corners[2]]], F32)
    np.testing.assert_array_equal(det[0, 0], want)
    assert keep.view(np.int32).ravel().tolist() == [3]
    np.testing.assert_array_equal(det, numpy_detection_output(**feeds, a=attrs)[0])


@pytest.mark.parametrize("order", [None, [2, 0, 1], [1, 2, 0]])
def test_input_order(order):
    """inputOrder[k] is the node input holding loc, conf, prior; missing: [0, 2, 1]."""
    attrs = ssd_attrs(inputOrder=order, codeType=None)  # codeType default: TF_CENTER
    feeds = ssd_inputs(2, 4, seed=60, attrs=attrs)
    _check(ssd_model("NMS_TRT", attrs, 2, 27), feeds, attrs, exact_boxes=False)


def test_opset_12_and_a_custom_domain():
    attrs = ssd_attrs(codeType=CORNER_SIZE)
    feeds = ssd_inputs(2, 4, seed=70, attrs=attrs)
    _check(ssd_model("NMS_TRT", attrs, 2, 27, opset=12, domain="TRT"), feeds, attrs)


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("extra, why", [
    (dict(codeType=4), "codeType 4 is not a CodeTypeSSD"),
    (dict(numClasses=None), "NMS_TRT needs the attributes numClasses"),
    (dict(varianceEncodedInTarget=None), "needs the attributes varianceEncodedInTarget"),
    (dict(isNormalized=0), "caffe semantics"),
    (dict(topK=5000, keepTopK=10), r"topK 5000 must be in 1\.\.4096"),
    (dict(topK=0), r"topK 0 must be in 1\.\.4096"),
    (dict(topK=10, keepTopK=11), r"keepTopK 11 must be in 1\.\.topK \(10\)"),
    (dict(keepTopK=0), r"keepTopK 0 must be in 1\.\.topK"),
    (dict(confidenceThreshold=-0.5), "confidenceThreshold -0.5 is below 0"),
    (dict(nmsThreshold=-0.5), "the IoU threshold -0.5 is below 0"),
    (dict(inputOrder=[0, 0, 1]), r"inputOrder \[0, 0, 1\] is not a permutation"),
    (dict(numClasses=0), "numClasses 0 must be at least 1"),
])
def test_refusals_have_reasons(extra, why):
    node = helper.make_node("NMS_TRT", ["l", "c", "p"], ["d", "k"], **ssd_attrs(**extra))
    with pytest.raises(Unavailable, match=why):
        detection_output(node, 17)


def test_refusals_of_the_node_and_opset():
    attrs = ssd_attrs()
    two_inputs = helper.make_node("NMSDynamic_TRT", ["l", "c"], ["d", "k"], **attrs)
    with pytest.raises(Unavailable, match="takes 3 inputs and has 2 outputs, this node 2 and 2"):
        detection_output(two_inputs, 17)
    node = helper.make_node("NMS_TRT", ["l", "c", "p"], ["d", "k"], **attrs)
    with pytest.raises(Unavailable, match=r"needs ONNX opset >= 11 \(the model has 10\)"):
        detection_output(node, 10)
    assert detection_output(node, 11).nodes  # the lowest opset it accepts
    # TF_CENTER ignores varianceEncodedInTarget, so it is not required there
    assert detection_output(helper.make_node(
        "NMS_TRT", ["l", "c", "p"], ["d", "k"],
        **ssd_attrs(codeType=TF_CENTER, varianceEncodedInTarget=None)), 17).nodes


def test_substitute_lists_a_refused_node_as_not_checkable():
    model = ssd_model("NMS_TRT", ssd_attrs(isNormalized=0), 1, 27)
    sub = references.substitute(model, REGISTRY)
    assert len(sub.not_checkable) == 1 and "caffe semantics" in sub.not_checkable[0]


def test_registrations():
    assert SSD_PLUGINS == ("NMS_TRT", "NMSDynamic_TRT")
    assert [(r.domain, r.op_type, r.versions) for r in REFERENCES] == [
        (PLUGIN_DOMAIN, op, ("1",)) for op in SSD_PLUGINS]
    assert all(r.reference.build is detection_output for r in REFERENCES)


# ----------------------------------------------------------------------------- in graphfix


def test_the_default_registry_checks_ssd_plugins():
    """graphfix's numerical check substitutes NMS_TRT without being told (`_PROVIDERS`)."""
    attrs = ssd_attrs()
    model = ssd_model("NMS_TRT", attrs, 2, 27)
    assert not references.substitute(model).not_checkable
    feeds = ssd_inputs(2, 4, 11, attrs)
    got = run_checkable(model, feeds)
    want = numpy_detection_output(feeds["loc"], feeds["conf"], feeds["prior"], attrs)
    np.testing.assert_array_equal(got["keep_count"].view(np.int32), want[1].view(np.int32))
    np.testing.assert_allclose(got["detections"], want[0], rtol=0, atol=BOX_ATOL)


@pytest.mark.parametrize("op", SSD_PLUGINS)
def test_plugin_to_nms_writes_the_decomposition(op):
    attrs = ssd_attrs(codeType=CORNER)
    model = ssd_model(op, attrs, 2, 27)
    out, result = apply(PluginToNms(), model)
    assert result.counts[COUNT] == 1, result.notes
    assert not {n.op_type for n in out.graph.node} & set(SSD_PLUGINS)
    assert [o.name for o in out.graph.output] == ["detections", "keep_count"]
    onnx.checker.check_model(out, full_check=True)
    feeds = ssd_inputs(2, 4, 12, attrs)
    got = run_model(out, feeds)
    want = _run(model, feeds)
    np.testing.assert_array_equal(got["detections"], want[0])
    np.testing.assert_array_equal(got["keep_count"], want[1])
    again = PluginToNms().run(to_graph(out), PassContext())
    assert not again.changed and "no EfficientNMS_TRT" in str(again.notes[0])
    refused = ssd_model(op, ssd_attrs(isNormalized=0), 1, 27)
    _, result = apply(PluginToNms(), refused)
    assert not result.changed and "caffe semantics" in str(result.notes[0])



@pytest.mark.parametrize("op", SSD_PLUGINS)
def test_priors_baked_in_as_an_initializer_survive_plugin_to_nms(op):
    """SSD exports often carry the priors as an initializer only the plugin reads: the
    replacement must wire its nodes to that initializer, not to an unproduced tensor."""
    attrs = ssd_attrs(codeType=CORNER)
    model = ssd_model(op, attrs, 2, 27)
    feeds = ssd_inputs(2, 4, 12, attrs)
    want = _run(model, feeds)
    prior = feeds.pop("prior")
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "prior"))
    model.graph.initializer.append(numpy_helper.from_array(prior, "prior"))
    out, result = apply(PluginToNms(), model)  # apply runs the full checker
    assert result.counts[COUNT] == 1, result.notes
    assert "prior" in {t.name for t in out.graph.initializer}
    got = run_model(out, feeds)
    np.testing.assert_array_equal(got["detections"], want[0])
    np.testing.assert_array_equal(got["keep_count"], want[1])
