"""Doctor's dynamic-input, data-dependent-shape and INT64 rules."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from doctorhelpers import findings, model, one, rule_ids, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import graphfix
from graphfix.runtime.session import run_model

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


INT64_MAX = 2**63 - 1


def _while_loop(trip: int = INT64_MAX, cond: bool = True, m_also_as: str = "",
                m_in_constant: bool = False):
    """Loop(M, cond, h) whose body adds 1 to h until max(h) >= 5: the `while` loop
    torch.onnx writes for a scripted `while`, M the "no limit" INT64_MAX. `m_also_as`:
    "add" also adds M to an INT64 input, "carried" also passes M as a loop-carried value."""
    body_nodes = [helper.make_node("Add", ["h_in", "one"], ["h_out"]),
                  helper.make_node("ReduceMax", ["h_out"], ["mx"], keepdims=0),
                  helper.make_node("Less", ["mx", "lim"], ["c_out"])]
    body_in = [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("h_in", F, [1, 4])]
    body_out = [vi("c_out", TP.BOOL, []), vi("h_out", F, [1, 4])]
    loop_in = ["M", "cond" if cond else "", "x"]
    outputs, inputs = [vi("y", F, [1, 4])], [vi("x", F, [1, 4])]
    extra = []
    if m_also_as == "carried":
        body_nodes.append(helper.make_node("Identity", ["k_in"], ["k_out"]))
        body_in.append(vi("k_in", TP.INT64, []))
        body_out.append(vi("k_out", TP.INT64, []))
        loop_in.append("M")
        outputs.append(vi("k", TP.INT64, []))
    elif m_also_as == "add":
        extra.append(helper.make_node("Add", ["n", "M"], ["z"], name="add"))
        inputs.append(vi("n", TP.INT64, []))
        outputs.append(vi("z", TP.INT64, []))
    body = helper.make_graph(body_nodes, "body", body_in, body_out, [
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(5.0, np.float32), "lim")])
    loop = helper.make_node("Loop", loop_in, [o.name for o in outputs[:len(loop_in) - 2]],
                            name="loop", body=body)
    m_tensor = numpy_helper.from_array(np.array(trip, np.int64), "M")
    inits = [numpy_helper.from_array(np.array(True), "cond")] if cond else []
    nodes = [loop, *extra]
    if m_in_constant:
        nodes.insert(0, helper.make_node("Constant", [], ["M"], value=m_tensor, name="m"))
    else:
        inits.append(m_tensor)
    return model(nodes, inputs, outputs, inits, opset=13)


@pytest.mark.parametrize("stored", ["initializer", "Constant"])
def test_int64_max_loop_trip_count_with_a_condition_is_not_an_overflow(stored):
    """A `while` loop's INT64_MAX trip count clamps to INT32_MAX, which only a loop still
    running after 2**31 - 1 iterations would notice: no finding, and the model parses."""
    m = _while_loop(m_in_constant=stored == "Constant")
    onnx.checker.check_model(m, full_check=True)
    assert "int64-overflow" not in rule_ids(m, "8.6", only=["int64"])
    assert [f for f in findings(m, "8.6") if f.severity == "error"] == []


@pytest.mark.parametrize("trip", [2**31, 2**40, INT64_MAX - 1])
def test_a_large_loop_trip_count_other_than_the_sentinel_is_still_an_overflow(trip):
    """A limit above INT32_MAX that is not the "no limit" sentinel is a limit someone
    chose; clamped, the loop stops earlier than the model says."""
    f = one(_while_loop(trip), "8.6", "int64-overflow", only=["int64"])
    assert (f.severity, f.tensors) == ("error", ("M",)) and str(trip) in f.message


def test_int64_max_trip_count_of_a_loop_without_condition_is_still_an_overflow():
    """No `cond` input: a for loop of M iterations, which the clamp would cut short."""
    m = _while_loop(cond=False)
    onnx.checker.check_model(m, full_check=True)
    assert one(m, "8.6", "int64-overflow", only=["int64"]).tensors == ("M",)


@pytest.mark.parametrize("also", ["add", "carried"])
def test_int64_max_trip_count_read_elsewhere_too_is_still_an_overflow(also):
    """The exemption is for the trip count only: the same INT64_MAX read as data (by an
    Add, or as a loop-carried value of the same Loop) is clamped there too."""
    m = _while_loop(m_also_as=also)
    onnx.checker.check_model(m, full_check=True)
    assert one(m, "8.6", "int64-overflow", only=["int64"]).tensors == ("M",)


def test_int64_max_trip_count_model_runs_for_trt_8_6_unchanged():
    """`graphfix run --trt 8.6` on the repro (probe3 D5) ends with no error finding and
    the loop's numbers (it stops by its condition, after 5 iterations from 0)."""
    m = _while_loop()
    result = graphfix.run(m, trt="8.6")
    assert [f for f in result.diagnosis.findings if f.severity == "error"] == []
    assert [n.op_type for n in result.model.graph.node] == ["Loop"]
    x = np.zeros([1, 4], np.float32)
    out = run_model(result.model, {"x": x})["y"]
    np.testing.assert_array_equal(out, np.full([1, 4], 5.0, np.float32))
    np.testing.assert_array_equal(run_model(m, {"x": x})["y"], out)
    again = graphfix.run(result.model, trt="8.6")
    assert onnx.printer.to_text(again.model.graph) == onnx.printer.to_text(result.model.graph)
