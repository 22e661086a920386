"""Doctor's restriction checks: the matrix's restriction sentences, per version."""

from __future__ import annotations

import numpy as np
import pytest
from doctorhelpers import findings, model, one, rule_ids, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.doctor.rules_restrictions import restriction_for, sentences
from graphfix.trt import documented_versions, parse_target

F = TP.FLOAT


def test_sentences_are_split_verbatim():
    text = ("Supported resize modes: `nearest`, `linear`.\n"
            "`sorted` must be 1. `K` input must be less than 3840.")
    assert sentences(text) == ["Supported resize modes: `nearest`, `linear`",
                               "`sorted` must be 1", "`K` input must be less than 3840"]


def test_1d_pooling_is_rejected():
    m = model([helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2])],
              [vi("x", F, [1, 1, 8])], [vi("y", F, [1, 1, 7])])
    f = one(m, "10.16", "restriction-violated", only=["restrictions"])
    assert f.nodes == ("MaxPool 'p'",) and f.severity == "error"
    assert f.message == "MaxPool: 1-D MaxPool (only 2-D or 3-D are supported)"
    assert f.fact == "matrix 10.16, MaxPool restriction: 2D or 3D pooling only"


def test_dilated_pooling_rejected_from_10_only():
    m = model([helper.make_node("MaxPool", ["x"], ["y"], name="p", kernel_shape=[2, 2],
                                dilations=[2, 2])],
              [vi("x", F, [1, 1, 8, 8])], [vi("y", F, [1, 1, 6, 6])])
    assert one(m, "10.16", "restriction-violated", only=["restrictions"]).message == (
        "MaxPool: dilations [2, 2]")
    assert "restriction-violated" not in rule_ids(m, "8.6", only=["restrictions"])


@pytest.mark.parametrize(("attrs", "message"), [
    ({"mode": "cubic"}, "Resize: mode is 'cubic'"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"},
     "Resize: coordinate_transformation_mode is 'tf_crop_and_resize'"),
    ({"antialias": 1, "mode": "linear"}, "Resize: antialias is 1"),
])
def test_resize_modes(attrs, message):
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", **attrs)
    m = model([node], [vi("x", F, [1, 1, 4, 4])], [vi("y", F, [1, 1, 8, 8])], [scales], opset=18)
    found = [f for f in findings(m, "10.16", only=["restrictions"])
             if f.rule == "restriction-violated"]
    assert [f.message for f in found] == [message]


def test_reduce_axes_must_be_constant_from_10():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="rs")
    m = model([node], [vi("x", F, [2, 3]), vi("axes", TP.INT64, [1])], [vi("y", F, None)],
              opset=18)
    f = one(m, "10.16", "restriction-violated", only=["restrictions"])
    assert f.message == "ReduceSum: `axes` is computed at run time, the parser needs a constant"
    assert f.fix.startswith("fold-constants")


def test_topk_k_limit_and_unchecked_sentences_are_info():
    k = numpy_helper.from_array(np.array([5000], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="t")
    m = model([node], [vi("x", F, [1, 6000])],
              [vi("v", F, [1, 5000]), vi("i", TP.INT64, [1, 5000])], [k])
    f = one(m, "10.16", "restriction-violated", only=["restrictions"])
    assert f.message == "TopK: K is 5000"
    assert "restriction-violated" not in rule_ids(m, "8.6", only=["restrictions"])


def test_restriction_doctor_cannot_check_is_info_with_the_text():
    """Branch outputs of unknown rank (x has none): the rank rule cannot be settled."""
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "t", [], [vi("t", F, None)])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "e", [], [vi("e", F, None)])
    m = model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=then,
                                else_branch=other)],
              [vi("c", TP.BOOL, []), vi("x", F, None)], [vi("y", F, None)])
    f = one(m, "10.16", "restriction-unchecked", only=["restrictions"])
    assert f.severity == "info" and f.nodes == ("If 'if'",)
    assert f.fact == ("matrix 10.16, If restriction: Output tensors of the two conditional "
                      "branches must have the same rank and must have different names")


def test_every_sentence_of_every_documented_table_has_a_checker():
    """Of supported ops (the rule reads no other): a sentence without a checker would only
    ever be quoted as unchecked, so a new table stating a new restriction fails here until
    a checker reads it or it is marked as answered elsewhere."""

    unread = set()
    for version in documented_versions():
        target = parse_target(version)
        for op in target.listed_ops():
            row = target.op(op)
            for sentence in sentences(row.restrictions) if row.supported else ():
                if restriction_for(sentence) is None:
                    unread.add((version, op, sentence))
    assert unread == set()
