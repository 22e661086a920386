"""lower-unsupported writes out a cubic Resize (no TensorRT version parses mode=cubic):
onnxruntime's numbers for every coordinate mode, exclude_outside, scales or sizes, up
and down; sizes computed at run time as torch writes them; what it refuses and why."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.passes.base import PassContext
from graphfix.passes.lower_unsupported import LowerUnsupported
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target

F = TensorProto.FLOAT
MODES = "Supported resize modes: `nearest`, `linear`"


def _resize(shape, coordinates="half_pixel", exclude=0, a=-0.75, scales=None, sizes=None,
            elem=F, opset=13, dynamic=False, **attrs) -> onnx.ModelProto:
    dims = ["N", "C", "H", "W"][-len(shape):] if dynamic else list(shape)
    inputs, inits = ["x", "", ""], []
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        inputs[2] = "scales"
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        inputs.append("sizes")
    node = helper.make_node("Resize", inputs, ["y"], mode="cubic", exclude_outside=exclude,
                            coordinate_transformation_mode=coordinates, cubic_coeff_a=a,
                            **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, dims)],
                              [helper.make_tensor_value_info("y", elem, [None] * len(shape))],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ctx(trt: str = "10") -> PassContext:
    return PassContext(trt=parse_target(trt))


def _same_as_onnxruntime(model, out, shape, seed=0) -> None:
    """onnxruntime's cubic kernel and the written-out ops (optimizations off) agree; they
    were bit-identical on every case here (measured), the bound leaves room for kernels
    other CPUs pick."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want, got = run_model(model, {"x": x})["y"], run_model(out, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


CASES = list(itertools.product(
    [(1, 2, 5, 7), (6, 9)],
    ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"],
    [0, 1],
    ["up", "down", "sizes", "one_axis", "to_one"]))


@pytest.mark.parametrize(("shape", "coordinates", "exclude", "how"), CASES)
def test_cubic_resize_computes_what_onnxruntime_computes(shape, coordinates, exclude, how):
    lead = [1.0] * (len(shape) - 2)
    spec = {"up": {"scales": lead + [2.0, 3.0]}, "down": {"scales": lead + [0.6, 0.5]},
            "sizes": {"sizes": list(shape[:-2]) + [11, 4]},
            "one_axis": {"scales": lead + [1.7, 1.0]},
            "to_one": {"sizes": list(shape[:-2]) + [1, 13]}}[how]
    model = _resize(shape, coordinates, exclude, a=-0.5 if exclude else -0.75, **spec)
    pass_ = LowerUnsupported()
    out, result = apply(pass_, model, _ctx())
    ((key, count),) = result.counts.items()
    assert key.startswith("lowered Resize into Shape, Gather, Cast, ") and count == 1
    assert "Resize" not in ops(out)
    _same_as_onnxruntime(model, out, shape)
    assert_idempotent(pass_, out, _ctx())


def test_the_written_out_ops_for_a_static_2x_upsample():
    """Exactly these ops (half_pixel, scales, both axes); fold-constants would reduce the
    index arithmetic to constants, leaving 8 Gathers, 8 Muls and 6 Adds."""
    out, _ = apply(LowerUnsupported(), _resize((1, 3, 4, 4), scales=[1, 1, 2, 2]), _ctx())
    per_axis = Counter({"Gather": 6, "Cast": 5, "Mul": 17, "Floor": 2, "Range": 1, "Add": 13,
                        "Div": 1, "Sub": 11, "Max": 4, "Min": 4})
    want = per_axis + per_axis + Counter({"Shape": 1, "Reshape": 4})
    assert Counter(ops(out)) == want


def test_sizes_computed_at_run_time_as_torch_writes_them():
    """torch's interpolate(size=(h, w), mode='bicubic'): sizes = Concat(Slice(Shape(x),
    [0], [2]), Cast(hw)), the input's batch and channels kept; dynamic shapes."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
             helper.make_node("Cast", ["hw"], ["hw64"], to=TensorProto.INT64),
             helper.make_node("Concat", ["nc", "hw64"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic",
                              coordinate_transformation_mode="half_pixel")]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, ["N", "C", "H", "W"]),
                     helper.make_tensor_value_info("hw", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("y", F, [None] * 4)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out, result = apply(LowerUnsupported(), model, _ctx())
    assert sum(result.counts.values()) == 1 and "Resize" not in ops(out)
    rng = np.random.default_rng(3)
    for shape, hw in (((2, 3, 5, 6), (9, 4)), ((1, 17, 56, 56), (23, 31))):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32),
                 "hw": np.array(hw, np.int32)}
        want, got = run_model(model, feeds)["y"], run_model(out, feeds)["y"]
        assert got.shape == (*shape[:2], *hw)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_only_the_modes_the_target_lacks_are_written_out():
    linear = _resize((1, 1, 4, 4), scales=[1, 1, 2, 2])
    next(a for a in linear.graph.node[0].attribute if a.name == "mode").s = b"linear"
    result = LowerUnsupported().run(_to_graph(linear), _ctx())
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [
        ("Resize 'y'", "TensorRT 10.16 parses it natively")]


@pytest.mark.parametrize(("model", "why"), [
    (_resize((1, 1, 4, 4), scales=[1, 1, 2, 2], elem=TensorProto.FLOAT16),
     "its input is not float32"),
    (_resize((2, 4, 4), scales=[1, 2, 2]), "its input's rank is 3"),
    (_resize((1, 1, 4, 4), "tf_crop_and_resize", scales=[1, 1, 2, 2]),
     "its coordinate_transformation_mode is 'tf_crop_and_resize'"),
    (_resize((1, 1, 4, 4), scales=[1, 1, 2, 2], antialias=1, opset=18),
     "it antialiases (antialias=1)"),
    (_resize((1, 2, 4, 4), scales=[1, 2, 2, 2]),
     "it cannot be shown that its first two axes keep their size"),
])
def test_what_is_not_written_out_says_why(model, why):
    result = LowerUnsupported().run(_to_graph(model), _ctx())
    assert not result.changed
    (note,) = [n for n in result.notes if n.subject != "graph"]
    assert note.reason.startswith(f"its mode is 'cubic', and the table says: {MODES}, but it "
                                  f"has no exact lowering: {why}")


def test_doctor_names_the_pass_for_a_cubic_resize():
    model = _resize((1, 1, 4, 4), scales=[1, 1, 2, 2])
    (finding,) = [f for f in diagnose(model, parse_target("10")).findings
                  if f.rule == "restriction-violated"]
    assert finding.message == "Resize: mode is 'cubic'"
    assert finding.fix.startswith("lower-unsupported (graphfix run --trt VERSION) writes a "
                                  "cubic Resize")
    out, _ = apply(LowerUnsupported(), model, _ctx())
    assert diagnose(out, parse_target("10")).parses()


def _to_graph(model):
    from graphfix.graph import to_graph

    return to_graph(model)


def test_inside_a_loop_with_a_size_per_iteration():
    """Keypoint R-CNN's form: a Loop over detections resizes each heatmap to that box's
    size (known only at run time) bicubically."""
    i64 = TensorProto.INT64
    body_nodes = [
        helper.make_node("Gather", ["maps", "i"], ["one"], axis=0),
        helper.make_node("Unsqueeze", ["one", "axis0"], ["x"]),
        helper.make_node("Gather", ["hws", "i"], ["hw"], axis=0),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
        helper.make_node("Identity", ["c"], ["c_out"]),
    ]
    consts = [numpy_helper.from_array(np.array([0], np.int64), "axis0"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([2], np.int64), "two")]
    body = helper.make_graph(
        body_nodes, "body", [helper.make_tensor_value_info("i", i64, []),
                             helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("total", F, [])], consts,
        value_info=[helper.make_tensor_value_info("x", F, [1, 1, 6, 6])])  # as inferred
    loop = helper.make_node("Loop", ["n", ""], ["totals"], body=body)
    graph = helper.make_graph(
        [loop], "g", [helper.make_tensor_value_info("maps", F, ["K", 1, 6, 6]),
                      helper.make_tensor_value_info("hws", i64, ["K", 2]),
                      helper.make_tensor_value_info("n", i64, [])],
        [helper.make_tensor_value_info("totals", F, ["K"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    pass_ = LowerUnsupported()
    out, result = apply(pass_, model, _ctx())
    assert sum(result.counts.values()) == 1
    inner = out.graph.node[0].attribute[0].g
    assert "Resize" not in [n.op_type for n in inner.node]
    rng = np.random.default_rng(5)
    feeds = {"maps": rng.standard_normal((3, 1, 6, 6)).astype(np.float32),
             "hws": np.array([[9, 14], [3, 4], [6, 6]], np.int64), "n": np.array(3, np.int64)}
    np.testing.assert_allclose(run_model(out, feeds)["totals"], run_model(model, feeds)["totals"],
                               rtol=1e-6, atol=1e-5)
    assert_idempotent(pass_, out, _ctx())


def test_constant_sizes_for_an_input_of_unknown_shape_are_refused_not_a_crash():
    """The rank comes from the sizes, but whether the first two axes keep their size
    cannot be told without the input's shape (it was an IndexError, rolled back)."""
    nodes = [helper.make_node("Relu", ["a"], ["x"]),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="cubic")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", F, None)],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.array([1, 2, 8, 8], np.int64),
                                                       "sizes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    result = LowerUnsupported().run(_to_graph(model), _ctx())
    assert not result.changed
    (note,) = [n for n in result.notes if n.subject != "graph"]
    assert "it cannot be shown that its first two axes keep their size" in note.reason
