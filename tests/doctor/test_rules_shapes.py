"""Doctor's dynamic-input, data-dependent-shape and INT64 rules."""

from __future__ import annotations

import numpy as np
from doctorhelpers import findings, model, one, rule_ids, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F = TP.FLOAT


def test_dynamic_batch_gets_a_trtexec_profile_line():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")],
              [vi("x", F, ["N", 3, 224, 224])], [vi("y", F, ["N", 3, 224, 224])])
    f = one(m, "10.16", "dynamic-input", only=["dynamic-inputs"])
    assert f.severity == "warn" and f.tensors == ("x",)
    assert "--minShapes=x:1x3x224x224" in f.fix and "--maxShapes=x:8x3x224x224" in f.fix
    assert "fix-shapes{x=1x3x224x224}" in f.fix


def test_unknown_spatial_dims_are_left_to_fill_in():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="r")],
              [vi("x", F, [-1, 3, "h", None])], [vi("y", F, [-1, 3, "h", None])])
    f = one(m, "10.16", "dynamic-input", only=["dynamic-inputs"])
    assert "x[x.d0,3,h,x.d3]" in f.message
    assert "--minShapes=x:1x3x<h>x<x.d3>" in f.fix and "--maxShapes=x:8x3x<h>x<x.d3>" in f.fix


def test_several_dynamic_inputs_each_dim_named_per_input_and_axis():
    """Ranks 4, 3 and 2; `N` (the batch: axis 0 of the first input) shared with axis 1 of
    `c`, `seq` shared by b and c, unnamed dims told apart by input and axis."""
    node = helper.make_node("Relu", ["a"], ["y"], name="r")
    m = model([node], [vi("a", F, ["N", 3, "h", None]), vi("b", F, ["seq", "N", -1]),
                       vi("c", F, ["seq", "N"]), vi("s", F, [2])], [vi("y", F, None)])
    f = one(m, "10.16", "dynamic-input", only=["dynamic-inputs"])
    assert f.tensors == ("a", "b", "c")
    assert f.message == ("dynamic input dimensions: a[N,3,h,a.d3], b[seq,N,b.d2], "
                         "c[seq,N]; the engine needs an optimization profile (fill in the "
                         "sizes you will run)")
    assert f.fix == (
        "trtexec --onnx=model.onnx --minShapes=a:1x3x<h>x<a.d3>,b:<seq>x1x<b.d2>,c:<seq>x1 "
        "--optShapes=a:1x3x<h>x<a.d3>,b:<seq>x1x<b.d2>,c:<seq>x1 "
        "--maxShapes=a:8x3x<h>x<a.d3>,b:<seq>x8x<b.d2>,c:<seq>x8   "
        "or fix them: fix-shapes{a=1x3x<h>x<a.d3>,b=<seq>x1x<b.d2>,c=<seq>x1}")


def test_unnamed_batch_is_the_first_inputs_only():
    """Unnamed dims at axis 0 of two inputs need not be the same size."""
    m = model([helper.make_node("Add", ["x", "z"], ["y"], name="add")],
              [vi("x", F, [None, 4]), vi("z", F, ["?", 4])], [vi("y", F, None)])
    f = one(m, "10.16", "dynamic-input", only=["dynamic-inputs"])
    assert "--maxShapes=x:8x4,z:<z.d0>x4 " in f.fix
    assert f.fix.endswith("fix-shapes{x=1x4,z=<z.d0>x4}")


def test_static_inputs_need_no_profile():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F, [1, 3])], [vi("y", F, [1, 3])])
    assert findings(m, "10.16", only=["dynamic-inputs"]) == []


def test_data_dependent_outputs_one_finding_per_op():
    nz = helper.make_node("NonZero", ["x"], ["i"], name="nz")
    nz2 = helper.make_node("NonZero", ["x"], ["i2"], name="nz2")
    shape = helper.make_node("Shape", ["x"], ["s"], name="shape")
    ks = helper.make_node("TopK", ["x", "s"], ["sv", "si"], name="topk_shape")
    u = helper.make_node("Unique", ["x"], ["v"], name="u")
    k = helper.make_node("TopK", ["x", "k"], ["tv", "ti"], name="topk")
    kc = helper.make_node("TopK", ["x", "kc"], ["cv", "ci"], name="topk_const")
    kc_init = numpy_helper.from_array(np.array([2], np.int64), "kc")
    m = model([nz, u, k, kc, nz2, shape, ks], [vi("x", F, [5]), vi("k", TP.INT64, [1])],
              [vi("i", TP.INT64, [1, None]), vi("v", F, [None]), vi("tv", F, [None]),
               vi("cv", F, [2]), vi("i2", TP.INT64, [1, None]), vi("sv", F, [5])], [kc_init])
    found = findings(m, "10.16", only=["data-dependent"])
    assert [(f.rule, f.nodes) for f in found] == [
        ("data-dependent-shape", ("NonZero 'nz'", "NonZero 'nz2'")),
        ("data-dependent-shape", ("Unique 'u'",)),
        ("data-dependent-shape", ("TopK 'topk'",)),
    ]
    assert found[2].fix == "make K a constant"


def test_nms_fact_depends_on_the_version():
    nms = helper.make_node("NonMaxSuppression", ["b", "s"], ["sel"], name="nms")
    m = model([nms], [vi("b", F, [1, 10, 4]), vi("s", F, [1, 1, 10])],
              [vi("sel", TP.INT64, [None, 3])])
    new = one(m, "10.16", "data-dependent-shape", only=["data-dependent"])
    old = one(m, "8.4", "data-dependent-shape", only=["data-dependent"])
    assert "INMSLayer" in new.fact and "EfficientNMS_ONNX_TRT" in old.fact


def test_int64_weight_above_int32_is_an_error_before_9_only():
    big = numpy_helper.from_array(np.array([1, 2**31 + 5], np.int64), "big")
    m = model([helper.make_node("Add", ["x", "big"], ["y"], name="add")],
              [vi("x", TP.INT64, [2])], [vi("y", TP.INT64, [2])], [big])
    f = one(m, "8.6", "int64-overflow", only=["int64"])
    assert (f.severity, f.tensors) == ("error", ("big",))
    assert str(2**31 + 5) in f.message and "INT64" in f.fact
    inp = one(m, "8.6", "int64-input", only=["int64"])
    assert inp.tensors == ("x",) and inp.severity == "warn"
    assert rule_ids(m, "10.16", only=["int64"]) == set()


def test_int64_max_slice_ends_are_not_an_overflow():
    ends = numpy_helper.from_array(np.array([2**63 - 1], np.int64), "ends")
    starts = numpy_helper.from_array(np.array([1], np.int64), "starts")
    m = model([helper.make_node("Slice", ["x", "starts", "ends"], ["y"])],
              [vi("x", F, [4])], [vi("y", F, [3])], [starts, ends])
    assert "int64-overflow" not in rule_ids(m, "8.6", only=["int64"])
