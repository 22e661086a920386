"""lower-unsupported: exact ops after, onnxruntime numerics (the original op run by
onnxruntime with its optimizations off), checker, idempotence, and every note.

The lowerings themselves (Einsum parsing, the op table, doctor's fix text) are tested in
tests/plugins/test_lowering.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, output_types
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphfix.api import run as api_run
from graphfix.doctor import diagnose
from graphfix.errors import GraphfixError
from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import LIMIT_REACHED, PassContext, RewriteBudget
from graphfix.passes.lower_unsupported import LowerUnsupported, LowerUnsupportedOptions
from graphfix.passes.pipeline import parse_pipeline
from graphfix.passes.registry import PASSES
from graphfix.report import APPLIED
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target

F, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
NORM = ["ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt", "Div"]
NORM_KEY = "ReduceMean, Sub, Mul, Add, Sqrt, Div"
NO_RULE = "; no plugin rule replaces it either"
GROUP_CHOSEN = ("graph", "GroupNormalization: lowered to ONNX ops rather than replaced by the "
                "plugin GroupNormalizationPlugin (rule groupnorm-to-plugin): the lowering needs "
                "no plugin library to build or run the engine, and onnxruntime checks it; for "
                "the plugin's kernel instead, run substitute-plugins{force=true,"
                "select=groupnorm-to-plugin} before this pass")


# ----------------------------------------------------------------------------- helpers


def _vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _w(name: str, shape, dtype=np.float32, seed: int = 0) -> onnx.TensorProto:
    value = np.random.default_rng(seed).standard_normal(shape) * 0.5 + 1.0
    return numpy_helper.from_array(value.astype(dtype), name)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17, checked=True) -> onnx.ModelProto:
    """A model at `opset`; `checked`: it must pass the full checker (the checker rejects
    GroupNormalization-18, which ONNX deprecated in opset 21 and onnxruntime still runs)."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    if checked:
        onnx.checker.check_model(model, full_check=True)
    return model


def _ctx(trt: str | None) -> PassContext:
    return PassContext(trt=parse_target(trt) if trt else None)


def _feeds(model: onnx.ModelProto, scale: float = 1.0, seed: int = 0) -> dict[str, np.ndarray]:
    return {k: (v * scale).astype(v.dtype) for k, v in feeds_for(model, seed).items()}


def _lowers(model, trt, expected_ops, counts, notes=(), options=None, feed_sets=None,
            rtol=1e-5, atol=1e-6) -> onnx.ModelProto:
    """Ops, counts, notes, checker (in apply), output names and types, numerics against
    onnxruntime running the original op, and a second run that changes nothing."""
    pass_ = LowerUnsupported(options)
    out, result = apply(pass_, model, _ctx(trt))
    assert result.changed
    assert dict(result.counts) == counts
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert ops(out) == expected_ops
    assert output_types(out) == output_types(model)
    for feeds in feed_sets or [_feeds(model)]:
        assert_same_outputs(model, out, feeds, rtol=rtol, atol=atol)
    assert_idempotent(pass_, out, _ctx(trt))
    return out


def _stays(model, trt, notes, options=None) -> None:
    """Nothing changes, and the notes are exactly these."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result = LowerUnsupported(options).run(graph, _ctx(trt))
    assert not result.changed
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert fingerprint(graph) == before


def _opset_note(opset: int, trt: str, high: int = 17) -> tuple[str, str]:
    return ("graph", f"the model's opset {opset} is above the {high} that TensorRT {trt} "
                     f"parses; opset{{version={high}}} after this pass converts it (the "
                     "default --trt pipeline runs opset{to-target=true} near its end)")


# ----------------------------------------------------------------------------- LayerNormalization


def _layer_norm(shape, axis, elem=F, bias=True, outputs=("y",), opset=17, **attrs):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    norm = shape[axis:] if axis >= 0 else shape[len(shape) + axis:]
    inits = [_w("s", norm, dtype)] + ([_w("b", norm, dtype, seed=1)] if bias else [])
    names = ["y", "mean" if "mean" in outputs else "", "inv" if "inv" in outputs else ""]
    while names[-1] == "":
        names.pop()
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), names,
                            name="ln", axis=axis, **attrs)
    stash = attrs.get("stash_type", 1)
    stat_shape = [d if i < (axis % len(shape)) else 1 for i, d in enumerate(shape)]
    outs = [_vi("y", shape, elem)] + [_vi(n, stat_shape, stash) for n in names[1:] if n]
    return _model([node], [_vi("x", shape, elem)], outs, inits, opset)


@pytest.mark.parametrize(("axis", "shape"), [(-2, [2, 3, 4]), (-1, [2, 5]), (1, [2, 3, 4]),
                                             (0, [3, 4])])
def test_layer_norm_any_axis_lowers_on_8_4(axis, shape):
    _lowers(_layer_norm(shape, axis, epsilon=1e-3), "8.4", NORM + ["Mul", "Add"],
            {f"lowered LayerNormalization into {NORM_KEY}": 1})


def test_layer_norm_without_bias_ends_with_the_scale():
    _lowers(_layer_norm([2, 3, 4], -1, bias=False), "8.4", NORM + ["Mul"],
            {f"lowered LayerNormalization into {NORM_KEY}": 1})


def test_layer_norm_mean_and_inv_std_dev_are_produced_when_read():
    model = _layer_norm([2, 3, 4], -2, outputs=("y", "mean", "inv"))
    expected = NORM[:6] + ["Div", "Mul", "Mul", "Add"]  # InvStdDev = Div(1, StdDev); D * it
    out = _lowers(model, "8.4", expected, {f"lowered LayerNormalization into {NORM_KEY}": 1})
    div = next(n for n in out.graph.node if n.op_type == "Div")
    assert list(div.output) == ["inv"]
    assert [n.output[0] for n in out.graph.node if n.op_type == "ReduceMean"][0] == "mean"


def test_layer_norm_only_y_is_supported_from_10_1():
    """The 10.1 row supports LayerNormalization with 'Only the first output `Y` is supported.'"""
    read = _layer_norm([2, 3, 4], -1, outputs=("y", "mean"))
    _lowers(read, "10.1", NORM + ["Mul", "Add"],
            {f"lowered LayerNormalization into {NORM_KEY}": 1})
    _stays(_layer_norm([2, 3, 4], -1), "10.1",
           [("LayerNormalization 'ln'", "TensorRT 10.1 parses it natively")])


def test_float16_layer_norm_with_stash_type_1_computes_in_float32():
    model = _layer_norm([2, 3, 8], -1, elem=F16, outputs=("y", "mean", "inv"), stash_type=1)
    out = _lowers(model, "8.4", ["Cast"] + NORM[:6] + ["Div", "Mul", "Cast", "Mul", "Add"],
                  {f"lowered LayerNormalization into Cast, {NORM_KEY}": 1}, rtol=2e-3, atol=2e-3)
    assert output_types(out) == [("y", F16), ("mean", F), ("inv", F)]
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [F, F16]


def test_layer_norm_at_opset_18_takes_reduce_mean_axes_as_an_input():
    out = _lowers(_layer_norm([2, 3, 4], -2, opset=18), "8.4", NORM + ["Mul", "Add"],
                  {f"lowered LayerNormalization into {NORM_KEY}": 1},
                  notes=[_opset_note(18, "8.4")])
    assert [len(n.input) for n in out.graph.node if n.op_type == "ReduceMean"] == [2, 2]


def test_layer_norm_with_positive_axis_and_unknown_rank_is_left_with_a_note():
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu")
    ln = helper.make_node("LayerNormalization", ["r", "s"], ["y"], name="ln", axis=1)
    model = _model([relu, ln], [_vi("x", [2, 4])], [_vi("y", [2, 4])], [_w("s", [4])])
    _stays(model, "8.4", [("LayerNormalization 'ln'",
                           "TensorRT 8.4 lists it as unsupported, but it has no exact lowering: "
                           "its axis is 1 and its input's rank is unknown, so the normalized "
                           "axes are unknown (a negative axis needs no rank)" + NO_RULE)])


def test_layer_norm_is_native_on_8_6_and_forced_with_ops():
    model = _layer_norm([2, 3, 4], -1)
    _stays(model, "8.6", [("LayerNormalization 'ln'", "TensorRT 8.6 parses it natively")])
    _lowers(model, "8.6", NORM + ["Mul", "Add"],
            {f"lowered LayerNormalization into {NORM_KEY}": 1},
            options=LowerUnsupportedOptions(ops="LayerNormalization"))


# ----------------------------------------------------------------------------- Group/InstanceNorm


def _group_norm(opset: int, groups: int = 2, channels: int = 6, elem=F, x_shape=None):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    per = groups if opset < 21 else channels
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                            num_groups=groups, epsilon=1e-4)
    shape = x_shape if x_shape is not None else [2, channels, 3, 5]
    return _model([node], [_vi("x", shape, elem)], [_vi("y", shape, elem)],
                  [_w("s", [per], dtype), _w("b", [per], dtype, seed=1)], opset, opset >= 21)


GROUP_OPS = ["Reshape", "Shape"] + NORM + ["Mul", "Add", "Reshape"]  # after toposort
GROUP_KEY = "lowered GroupNormalization into Reshape, ReduceMean, Sub, Mul, Add, Sqrt, Div, Shape"


def test_group_norm_opset_18_scales_per_group():
    model = _group_norm(18)
    out = _lowers(model, "8.4", GROUP_OPS, {GROUP_KEY: 1},
                  notes=[GROUP_CHOSEN, _opset_note(18, "8.4")])
    # the reference above is onnxruntime's GroupNormalization-18; it and onnx's reference
    # evaluator both scale per group, as the opset-18 spec says
    feeds = _feeds(model)
    x = feeds["x"].reshape(2, 2, -1).astype(np.float64)
    norm = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-4)
    s, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
    expected = (norm * s[:, None] + b[:, None]).reshape(feeds["x"].shape)
    for got in (ReferenceEvaluator(model).run(None, feeds)[0], run_model(out, feeds)["y"]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_group_norm_opset_21_scales_per_channel():
    model = _group_norm(21, groups=3)
    expected = ["Reshape", "Shape"] + NORM + ["Reshape", "Mul", "Add", "Reshape"]
    _lowers(model, "10.16", expected, {GROUP_KEY: 1}, notes=[GROUP_CHOSEN],
            options=LowerUnsupportedOptions(ops="GroupNormalization"))


def test_group_norm_opset_21_on_8_4_with_float16():
    model = _group_norm(21, groups=2, elem=F16)
    expected = ["Cast", "Shape", "Reshape"] + NORM + ["Cast", "Reshape", "Mul", "Add", "Reshape"]
    _lowers(model, "8.4", expected, {GROUP_KEY.replace("into ", "into Cast, "): 1},
            notes=[GROUP_CHOSEN, _opset_note(21, "8.4")], rtol=2e-3, atol=4e-3)


def test_group_norm_opset_21_with_unknown_channels_and_a_computed_scale_is_left():
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn",
                            num_groups=2)
    model = _model([node], [_vi("x", [2, "c", 4]), _vi("s", ["c"]), _vi("b", ["c"])],
                   [_vi("y", [2, "c", 4])], opset=21)
    _stays(model, "8.4", [
        ("GroupNormalization 'gn'", "TensorRT 8.4 does not list it, but it has no exact "
         "lowering: its channel count is unknown (neither its input's shape nor a constant "
         "scale gives it), so the per-channel scale cannot be laid out; the plugin rule "
         "groupnorm-to-plugin cannot either: the plugin takes 4-D input [N, C, H, W]; this one "
         "is 3-D"),
        _opset_note(21, "8.4")])


INSTANCE_OPS = ["Reshape", "Shape"] + NORM + ["Mul", "Add", "Reshape"]
INSTANCE_KEY = ("lowered InstanceNormalization into Reshape, ReduceMean, Sub, Mul, Add, Sqrt, "
                "Div, Shape")


def _instance_norm(shape, weights_as_inputs=False):
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="in",
                            epsilon=1e-3)
    per = [shape[1]]
    if weights_as_inputs:
        return _model([node], [_vi("x", shape), _vi("s", per), _vi("b", per)], [_vi("y", shape)])
    return _model([node], [_vi("x", shape)], [_vi("y", shape)],
                  [_w("s", per), _w("b", per, seed=1)])


def test_instance_norm_is_lowered_only_where_the_row_restrictions_exclude_it():
    """8.4: 'Scales `scale` and biases `B` must be initializers. Input rank must be >=3 & <=5'."""
    _stays(_instance_norm([2, 3, 4, 5]), "8.4",
           [("InstanceNormalization 'in'", "TensorRT 8.4 parses it natively")])
    _lowers(_instance_norm([2, 3, 4, 5], weights_as_inputs=True), "8.4",
            ["Reshape"] * 3 + ["Shape"] + NORM + ["Mul", "Add", "Reshape"],
            {INSTANCE_KEY: 1})
    _lowers(_instance_norm([1, 2, 2, 3, 2, 3]), "8.4", INSTANCE_OPS, {INSTANCE_KEY: 1})
    _stays(_instance_norm([1, 2, 2, 3, 2, 3]), "8.6",
           [("InstanceNormalization 'in'", "TensorRT 8.6 parses it natively")])


# ----------------------------------------------------------------------------- activations


def _unary(op: str, opset: int, elem=F, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], name="act", **attrs)
    return _model([node], [_vi("x", [2, 3, 8], elem)], [_vi("y", [2, 3, 8], elem)], opset=opset)


def test_ops_the_target_parses_get_one_note_per_op_after_the_others():
    """28 HardSwish/HardSigmoid nodes on mobilenet_v3 each said "parses it natively" and
    buried the notes that matter; one note per op type, after them."""
    nodes = [helper.make_node("HardSwish", ["x"], ["a"], name="hs1"),
             helper.make_node("HardSwish", ["a"], ["b"], name="hs2"),
             helper.make_node("HardSigmoid", ["b"], ["c"], name="hsig"),
             helper.make_node("NonZero", ["c"], ["y"], name="nz")]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, None], TensorProto.INT64)], opset=17)
    graph = to_graph(model)
    result = LowerUnsupported().run(graph, _ctx("8.4"))  # 8.4 has no NonZero
    notes = [(n.subject, n.reason) for n in result.notes]
    assert notes[0][0] == "NonZero 'nz'"
    assert notes[1:] == [("HardSwish (2 nodes)", "TensorRT 8.4 parses it natively"),
                         ("HardSigmoid 'hsig'", "TensorRT 8.4 parses it natively")]


@pytest.mark.parametrize(("approximate", "expected", "key"), [
    ("none", ["Div", "Mul", "Erf", "Add", "Mul"], "Div, Erf, Add, Mul"),
    ("tanh", ["Pow", "Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul"], "Pow, Mul, Add, Tanh"),
])
def test_gelu_both_modes_lower_on_8_4(approximate, expected, key):
    model = _unary("Gelu", 20, approximate=approximate)
    feeds = [_feeds(model, 3.0), _feeds(model, 0.5, seed=1)]
    _lowers(model, "8.4", expected, {f"lowered Gelu into {key}": 1},
            notes=[_opset_note(20, "8.4")], feed_sets=feeds)


def test_gelu_is_native_from_10_0():
    _stays(_unary("Gelu", 20), "10.0", [("Gelu 'act'", "TensorRT 10.0 parses it natively")])


def test_float16_gelu_keeps_its_type_and_typed_constants():
    out = _lowers(_unary("Gelu", 20, elem=F16), "9.3", ["Div", "Mul", "Erf", "Add", "Mul"],
                  {"lowered Gelu into Div, Erf, Add, Mul": 1},
                  notes=[_opset_note(20, "9.3", 19)], rtol=2e-3, atol=2e-3)
    assert {t.data_type for t in out.graph.initializer} == {F16}


def test_hard_swish_lowers_through_hard_sigmoid_on_8_2():
    model = _unary("HardSwish", 14)
    _lowers(model, "8.2", ["HardSigmoid", "Mul"], {"lowered HardSwish into HardSigmoid, Mul": 1},
            notes=[_opset_note(14, "8.2", 13)], feed_sets=[_feeds(model, 4.0)])
    _stays(model, "8.4", [("HardSwish 'act'", "TensorRT 8.4 parses it natively")])


def test_mish_lowers_through_softplus_on_8_4():
    model = _unary("Mish", 18)
    _lowers(model, "8.4", ["Softplus", "Tanh", "Mul"],
            {"lowered Mish into Softplus, Tanh, Mul": 1}, notes=[_opset_note(18, "8.4")],
            feed_sets=[_feeds(model, 3.0)])


def test_softplus_and_hard_sigmoid_lower_when_forced_without_a_target():
    softplus = _unary("Softplus", 17)
    _lowers(softplus, None, ["Exp", "Add", "Log"], {"lowered Softplus into Exp, Add, Log": 1},
            options=LowerUnsupportedOptions(ops="Softplus"), feed_sets=[_feeds(softplus, 3.0)])
    hard = _unary("HardSigmoid", 17, alpha=0.3, beta=0.4)
    _lowers(hard, None, ["Mul", "Add", "Min", "Max"],
            {"lowered HardSigmoid into Mul, Add, Min, Max": 1},
            options=LowerUnsupportedOptions(ops="HardSigmoid"), feed_sets=[_feeds(hard, 4.0)])


class _Without:
    """A TensorRT target whose table lacks `ops` (to reach the nested and blocked cases)."""

    def __init__(self, version: str, *ops: str) -> None:
        self.base, self.lacks = parse_target(version), set(ops)

    def op(self, op: str):
        return None if op in self.lacks else self.base.op(op)

    @property
    def opset_range(self):
        return self.base.opset_range

    def label(self) -> str:
        return f"TensorRT {self.base.version} without {'/'.join(sorted(self.lacks))}"


def test_an_emitted_op_the_target_lacks_is_lowered_in_turn():
    model = _unary("HardSwish", 17)
    target = _Without("8.4", "HardSwish", "HardSigmoid")
    out, result = apply(LowerUnsupported(), model, PassContext(trt=target))
    assert ops(out) == ["Mul", "Add", "Min", "Max", "Mul"]
    assert dict(result.counts) == {"lowered HardSwish into HardSigmoid, Mul": 1,
                                   "lowered HardSigmoid into Mul, Add, Min, Max": 1}
    assert result.notes == []
    assert_same_outputs(model, out, _feeds(model, 4.0))
    assert_idempotent(LowerUnsupported(), out, PassContext(trt=target))


def test_a_node_whose_lowering_emits_an_op_the_target_cannot_parse_is_left():
    target = _Without("10.0", "Gelu", "Erf")
    graph = to_graph(_unary("Gelu", 20))
    result = LowerUnsupported().run(graph, PassContext(trt=target))
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [(
        "Gelu 'act'", "TensorRT 10.0 without Erf/Gelu does not list it, but its lowering "
        "emits Erf, which TensorRT 10.0 without Erf/Gelu neither parses nor can lower"
        + NO_RULE)]


# ----------------------------------------------------------------------------- Einsum


def _einsum(equation: str, shapes, out_shape, opset: int = 12) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], name="es", equation=equation)
    return _model([node], [_vi(n, s) for n, s in zip(names, shapes, strict=True)],
                  [_vi("y", out_shape)], opset=opset)


@pytest.mark.parametrize(("equation", "shapes", "out", "expected"), [
    ("ij,jk->ik", [[3, 4], [4, 5]], [3, 5], ["MatMul"]),
    ("ij,jk", [[3, 4], [4, 5]], [3, 5], ["MatMul"]),
    ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]], [2, 3, 5], ["MatMul"]),
    ("bhqd,bhkd->bhqk", [[2, 3, 4, 8], [2, 3, 5, 8]], [2, 3, 4, 5], ["Transpose", "MatMul"]),
    ("...ij,...jk->...ik", [[2, 3, 4, 6], [2, 3, 6, 5]], [2, 3, 4, 5], ["MatMul"]),
    ("...ji,...jk->...ik", [[2, 6, 4], [2, 6, 5]], [2, 4, 5], ["Transpose", "MatMul"]),
    ("bij,bjk->bki", [[2, 3, 4], [2, 4, 5]], [2, 5, 3], ["MatMul", "Transpose"]),
    ("ij->ji", [[3, 4]], [4, 3], ["Transpose"]),
])
def test_einsum_matrix_multiplies_lower_on_8_0(equation, shapes, out, expected):
    key = ", ".join(dict.fromkeys(expected))
    _lowers(_einsum(equation, shapes, out), "8.0", expected,
            {f"lowered Einsum into {key}": 1})


def test_einsum_with_an_ellipsis_lowers_where_the_row_excludes_ellipses():
    model = _einsum("...ij,...jk->...ik", [[2, 3, 4, 6], [2, 3, 6, 5]], [2, 3, 4, 5])
    _lowers(model, "8.4", ["MatMul"], {"lowered Einsum into MatMul": 1})
    _stays(model, "9.3", [("Einsum 'es'", "TensorRT 9.3 parses it natively")])
    _stays(_einsum("ij,jk->ik", [[3, 4], [4, 5]], [3, 5]), "8.4",
           [("Einsum 'es'", "TensorRT 8.4 parses it natively")])


def test_einsum_that_is_not_a_matrix_multiply_is_left_with_a_note():
    _stays(_einsum("ij,ij->i", [[3, 4], [3, 4]], [3]), "8.0", [(
        "Einsum 'es'", "TensorRT 8.0 lists it as unsupported, but it has no exact lowering: "
        "it is not a (batched) matrix multiply: it contracts 1 letters and keeps 0 of the "
        "first and 0 of the second operand alone (a MatMul needs 1, 1 and 1)" + NO_RULE)])


# ----------------------------------------------------------------------------- targets, options


def test_without_a_target_nothing_changes():
    _stays(_layer_norm([2, 3, 4], -1), None, [(
        "graph", "no TensorRT target: give one (graphfix run --trt 8.4), or name op types "
        "with lower-unsupported{ops=...}")])


def test_forcing_without_a_target_leaves_other_ops_alone():
    ln = helper.make_node("LayerNormalization", ["x", "s"], ["l"], name="ln")
    gelu = helper.make_node("Gelu", ["l"], ["y"], name="gelu")
    model = _model([ln, gelu], [_vi("x", [2, 4])], [_vi("y", [2, 4])], [_w("s", [4])], opset=20)
    _lowers(model, None, NORM[:2] + ["Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Gelu"],
            {f"lowered LayerNormalization into {NORM_KEY}": 1},
            options=LowerUnsupportedOptions(ops="LayerNormalization"))


def test_ops_option_in_pipeline_text_and_its_errors():
    spec = parse_pipeline("lower-unsupported{ops=Gelu+LayerNormalization}").specs[0]
    assert spec.build().options.forced == {"Gelu", "LayerNormalization"}
    assert LowerUnsupportedOptions(ops="Gelu, Mish").forced == {"Gelu", "Mish"}
    with pytest.raises(GraphfixError, match="names Conv"):
        LowerUnsupportedOptions(ops="Gelu,Conv")
    with pytest.raises(GraphfixError, match="names ReduceMean"):
        parse_pipeline("lower-unsupported{ops=ReduceMean}")


def test_registered_right_after_detect_unsupported():
    names = [p.name for p in PASSES]
    assert names[names.index("detect-unsupported") + 1] == "lower-unsupported"


def test_an_op_without_a_lowering_that_the_target_lacks_gets_a_note():
    node = helper.make_node("Hardmax", ["x"], ["y"], name="hm")
    _stays(_model([node], [_vi("x", [2, 5])], [_vi("y", [2, 5])], opset=13), "8.6", [
        ("Hardmax 'hm'", "TensorRT 8.6 does not parse it, and graphfix has no exact lowering "
                         "for it" + NO_RULE)])


def test_rewrite_budget_stops_after_the_limit():
    ln1 = helper.make_node("LayerNormalization", ["x", "s"], ["a"], name="ln1")
    ln2 = helper.make_node("LayerNormalization", ["a", "s"], ["y"], name="ln2")
    model = _model([ln1, ln2], [_vi("x", [2, 4])], [_vi("y", [2, 4])], [_w("s", [4])])
    ctx = PassContext(trt=parse_target("8.4"), rewrites=RewriteBudget(1))
    out, result = apply(LowerUnsupported(), model, ctx)
    assert dict(result.counts) == {f"lowered LayerNormalization into {NORM_KEY}": 1}
    assert [(n.subject, n.reason) for n in result.notes] == [("LayerNormalization 'ln2'",
                                                              LIMIT_REACHED)]
    assert ops(out).count("LayerNormalization") == 1
    assert ctx.rewrites.applied[0].label == f"LayerNormalization 'ln1' into {NORM_KEY}"
    assert_same_outputs(model, out, _feeds(model))


# ----------------------------------------------------------------------------- ReduceX axes


def _reduce(opset: int, axes_node: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="rm", keepdims=1)]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    if axes_node:
        nodes.insert(0, helper.make_node("Constant", [], ["axes"], name="k",
                                         value=inits.pop()))
    return _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 1, 4])], inits, opset)


def test_reduce_axes_input_points_at_the_opset_pass():
    _stays(_reduce(18, axes_node=False), "8.4", [
        ("ReduceMean 'rm'", "its axes are an input (from opset 18), which TensorRT 8.4 cannot "
         "read: it parses opsets up to 17, where ReduceMean takes axes as an attribute; "
         "opset{version=17} (opset{to-target=true}, near the end of the default --trt pipeline) "
         "converts the model and moves constant axes into the attribute (not done here: the "
         "model declares opset 18)"),
        _opset_note(18, "8.4")])
    _stays(_reduce(18, axes_node=False), "9.3", [("graph", "no node to lower for TensorRT 9.3")])


def test_reduce_axes_that_are_not_an_initializer_get_a_note_from_10():
    text = parse_target("10.16").op("ReduceMean").restrictions
    _stays(_reduce(18, axes_node=True), "10.16", [
        ("ReduceMean 'rm'", f"its axes input is not an initializer, and the table says: {text}; "
         "fold-constants makes a constant expression one, axes computed at run time have no "
         "static form")])
    _stays(_reduce(18, axes_node=False), "10.16",
           [("graph", "no node to lower for TensorRT 10.16")])


# ----------------------------------------------------------------------------- subgraphs, e2e


def test_layer_norm_inside_an_if_branch_is_lowered_there():
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["t"], name="ln", axis=-1)
    then = helper.make_graph([ln], "then", [], [_vi("t", [2, 3, 4])],
                             [_w("s", [4]), _w("b", [4], seed=1)])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e"], name="relu")], "else", [],
                              [_vi("e", [2, 3, 4])])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    model = _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [2, 3, 4])],
                   [_vi("y", [2, 3, 4])])
    x = _feeds(model)["x"]
    out = _lowers(model, "8.4", ["If"], {f"lowered LayerNormalization into {NORM_KEY}": 1},
                  feed_sets=[{"c": np.array(c), "x": x} for c in (True, False)])
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == NORM + ["Mul", "Add"]


def test_api_run_keeps_the_pass_and_doctor_finds_nothing_unsupported_after():
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["l"], name="ln")
    gelu = helper.make_node("Gelu", ["l"], ["g"], name="gelu", approximate="tanh")
    mish = helper.make_node("Mish", ["g"], ["y"], name="mish")
    model = _model([ln, gelu, mish], [_vi("x", [1, 4, 8])], [_vi("y", [1, 4, 8])],
                   [_w("s", [8]), _w("b", [8], seed=1)], opset=20)
    before = {f.op for f in diagnose(model, parse_target("8.4")).findings
              if f.rule == "op-unsupported"}
    assert before == {"LayerNormalization", "Gelu", "Mish"}
    result = api_run(model, "lower-unsupported,opset{version=17}", trt="8.4")
    assert [p.status for p in result.report.passes] == [APPLIED, APPLIED]
    assert result.report.passes[0].counts == {
        f"lowered LayerNormalization into {NORM_KEY}": 1,
        "lowered Gelu into Pow, Mul, Add, Tanh": 1, "lowered Mish into Softplus, Tanh, Mul": 1}
    assert result.report.passes[0].check.startswith("passed")
    after = diagnose(result.model, parse_target("8.4")).findings
    assert [f for f in after if f.rule in ("op-unsupported", "opset-out-of-range")] == []


# ----------------------------------------------------------------------------- integer types


def _position_ids(length, int_type=TensorProto.INT32, source="bits"):
    """RoBERTa's position ids: CumSum over Cast<int>(x > 0) (source "bits"), or over an
    integer input's own values ("values")."""
    nodes = [helper.make_node("CumSum", ["n", "axis"], ["y"], name="cumsum")]
    if source.startswith("bits"):
        nodes[:0] = [helper.make_node("Greater", ["x", "zero"], ["b"], name="gt"),
                     helper.make_node("Cast", ["b"], ["n"], name="cast", to=int_type)]
        if source == "bits-twice":  # torch's dynamo exporter: BOOL -> INT32 -> INT64
            nodes[1].output[0] = "n32"
            nodes[1].attribute[0].i = TensorProto.INT32
            nodes.insert(2, helper.make_node("Cast", ["n32"], ["n"], name="cast2", to=int_type))
        inputs = [_vi("x", [2, length])]
        inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    else:
        nodes[0].input[0] = "x"
        inputs, inits = [_vi("x", [2, length], int_type)], []
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    return _model(nodes, inputs, [_vi("y", [2, length], int_type)], inits)


CUMSUM_KEY = "lowered CumSum into Cast, CumSum"


@pytest.mark.parametrize("int_type", [TensorProto.INT32, TensorProto.INT64])
def test_integer_cumsum_of_bits_is_summed_in_float_where_the_table_lists_floats_only(
        int_type):
    out = _lowers(_position_ids(7, int_type), "10.16", ["Greater", "Cast", "CumSum", "Cast"],
                  {CUMSUM_KEY: 1}, rtol=0, atol=0)
    graph = out.graph
    assert graph.node[1].input[0] == "b"  # the bits straight to float (the integer Cast
    # before is left to cleanup where nothing else reads it)
    assert [helper.get_attribute_value(a) for a in graph.node[1].attribute] == [
        TensorProto.FLOAT]
    assert [helper.get_attribute_value(a) for a in graph.node[3].attribute] == [int_type]


def test_a_cumsum_of_bits_cast_twice_is_summed_in_float():
    out = _lowers(_position_ids(7, TensorProto.INT64, source="bits-twice"), "10.16",
                  ["Greater", "Cast", "CumSum", "Cast"], {CUMSUM_KEY: 1}, rtol=0, atol=0)
    assert out.graph.node[1].input[0] == "b"  # both integer Casts left to cleanup


@pytest.mark.parametrize("table, lowered", [(np.eye(4, dtype=np.int64), True),
                                             (np.eye(4, dtype=np.int64) * 3, False)])
def test_a_cumsum_of_rows_of_a_zero_one_table_is_summed_in_float(table, lowered):
    """tf2onnx's CombinedNonMaxSuppression: CumSum(Gather(identity matrix, classes))."""
    nodes = [helper.make_node("Gather", ["table", "k"], ["rows"], name="rows"),
             helper.make_node("CumSum", ["rows", "axis"], ["y"], name="cumsum", exclusive=1)]
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array(0, np.int64), "axis")]
    model = onnx.shape_inference.infer_shapes(_model(
        nodes, [_vi("k", [5], TensorProto.INT64)], [_vi("y", [5, 4], TensorProto.INT64)],
        inits))
    if lowered:
        _lowers(model, "10.16", ["Gather", "Cast", "CumSum", "Cast"], {CUMSUM_KEY: 1},
                feed_sets=[{"k": np.array([3, 0, 3, 1, 2], np.int64)}], rtol=0, atol=0)
    else:  # 8.6 lists ReduceSum for floats only: no masked sum either
        _stays(model, "8.6", [("CumSum 'cumsum'", (
            "TensorRT 8.6 lists CumSum for FP32, FP16 only, not INT64 (INT32 after the "
            "parser's cast), and it cannot be computed in float32 exactly: its terms are "
            "not a Cast of a BOOL tensor or rows of a 0/1 table, so they may be large, and "
            "a float32 sum of large integers rounds; nor as a masked sum in its own type: "
            "TensorRT 8.6 lists ReduceSum without INT64 (INT32 after the parser's cast)"))])


def test_a_dynamic_summed_axis_is_said_to_be_assumed_short():
    model = _position_ids("L")
    _lowers(model, "10.16", ["Greater", "Cast", "CumSum", "Cast"],
            {CUMSUM_KEY: 1}, notes=[("CumSum 'cumsum'", (
                "summed in float32: exact while it sums at most 2^24 = 16,777,216 terms "
                "(how many is not known statically here)"))],
            feed_sets=[feeds_for(model, x=(2, 300))], rtol=0, atol=0)


LEFT_ON_86 = (
    "TensorRT 8.6 lists CumSum for FP32, FP16 only, not INT32, and it cannot be computed "
    "in float32 exactly: its terms are not a Cast of a BOOL tensor or rows of a 0/1 table, "
    "so they may be large, and a float32 sum of large integers rounds; nor as a masked sum "
    "in its own type: TensorRT 8.6 lists ReduceSum without INT32")


def test_an_integer_cumsum_of_values_that_may_be_large_is_left_where_reducesum_is_float():
    _stays(_position_ids(7, source="values"), "8.6", [("CumSum 'cumsum'", LEFT_ON_86)])


MASKED = ["Shape", "Unsqueeze", "Gather", "Range", "Reshape", "Reshape", "Add", "Less",
          "Cast", "Mul", "ReduceSum"]
MASKED_EMITTED = ["Shape", "Gather", "Range", "Reshape", "Add", "Less", "Cast", "Unsqueeze",
                  "Mul", "ReduceSum"]


@pytest.mark.parametrize("int_type", [TensorProto.INT32, TensorProto.INT64])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [1, -2, 2])
def test_an_integer_cumsum_of_any_values_is_summed_under_a_mask_in_its_own_type(
        int_type, exclusive, reverse, axis):
    """BLOOM's ALiBi positions: CumSum(attention_mask), an INT64 graph input. Values a
    float32 sum would round (2^30 and more) come out exactly."""
    dtype = helper.tensor_dtype_to_np_dtype(int_type)
    model = _model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum",
                                     exclusive=exclusive, reverse=reverse)],
                   [_vi("x", [2, "L", 3], int_type)], [_vi("y", [2, "L", 3], int_type)],
                   [numpy_helper.from_array(np.array(axis, np.int64), "axis")])
    big = 2**30 if int_type == TensorProto.INT32 else 2**40
    values = np.random.default_rng(0).integers(-big, big, (2, 5, 3)) // 8
    expected, emitted = ([[o for o in ops_ if o != "Add"] for ops_ in (MASKED, MASKED_EMITTED)]
                         if exclusive else (MASKED, MASKED_EMITTED))
    summed = 5 if axis in (1, -2) else 3
    _lowers(model, "10.16", expected, {f"lowered CumSum into {', '.join(emitted)}": 1},
            notes=[("CumSum 'cumsum'", (
                f"summed under a triangular mask in {np.dtype(dtype).name}: exact; its "
                f"product holds {'L' if summed == 5 else 3} times the input's elements"))],
            feed_sets=[{"x": values.astype(dtype)}], rtol=0, atol=0)


def _int_clip(int_type, bounds=("lo", "hi")):
    """DeBERTa-v2's position buckets: Clip of an integer tensor by integer bounds."""
    dtype = helper.tensor_dtype_to_np_dtype(int_type)
    inits = [numpy_helper.from_array(np.array(v, dtype), n) for n, v in (("lo", -3), ("hi", 4))
             if n in bounds]
    inputs = ["x", *(b if b in bounds else "" for b in ("lo", "hi"))]
    while inputs[-1] == "":
        inputs.pop()
    return _model([helper.make_node("Clip", inputs, ["y"], name="clip")],
                  [_vi("x", [2, 9], int_type)], [_vi("y", [2, 9], int_type)], inits)


@pytest.mark.parametrize("int_type", [TensorProto.INT32, TensorProto.INT64])
@pytest.mark.parametrize(("bounds", "expected"), [
    (("lo", "hi"), ["Max", "Min"]), (("lo",), ["Max"]), (("hi",), ["Min"])])
def test_an_integer_clip_is_computed_with_max_and_min_in_its_own_type(int_type, bounds,
                                                                       expected):
    model = _int_clip(int_type, bounds)
    x = np.arange(-9, 9, dtype=helper.tensor_dtype_to_np_dtype(int_type)).reshape(2, 9)
    out = _lowers(model, "10.16", expected, {f"lowered Clip into {', '.join(expected)}": 1},
                  feed_sets=[{"x": x}], rtol=0, atol=0)
    assert {vi.type.tensor_type.elem_type for vi in out.graph.output} == {int_type}


def test_an_integer_clip_where_the_table_lists_max_and_min_without_its_type_is_left():
    # 10.16 lists Max and Min for INT32 and INT64, not INT8
    _stays(_int_clip(TensorProto.INT8), "10.16", [("Clip 'clip'", (
        "TensorRT 10.16 lists Clip for FP32, FP16, BF16 only, not INT8, and it cannot be "
        "computed with Max and Min in its own type exactly: TensorRT 10.16 lists Max "
        "without INT8 as well"))])


def test_doctor_names_lower_unsupported_for_an_integer_clip():
    finding, = [f for f in diagnose(_int_clip(TensorProto.INT64), parse_target("10.16")).findings
                if f.rule == "dtype-unsupported"]
    assert finding.fix.startswith("lower-unsupported (the default --trt pipeline runs it) "
                                  "computes Clip as Max and Min in INT64, exactly")
    assert not [f for f in api_run(_int_clip(TensorProto.INT64), trt="10.16", check=True)
                .diagnosis.findings if f.rule == "dtype-unsupported"]


def test_after_the_run_doctor_says_why_the_pass_left_the_node():
    """doctor alone names lower-unsupported as the fix; after `run --trt`, which ran it, the
    fix says what the pass noted about the node it left, then the fix for elsewhere."""
    model = _position_ids(7, source="values")
    alone, = [f for f in diagnose(model, parse_target("8.6")).findings
              if f.rule == "dtype-unsupported"]
    assert alone.fix.startswith("lower-unsupported (the default --trt pipeline runs it) ")
    result = api_run(model, trt="8.6", check=True)
    after, = [f for f in result.diagnosis.findings if f.rule == "dtype-unsupported"]
    assert after.fix == ("lower-unsupported ran and left it: " + LEFT_ON_86 + "; instead: "
                         + alone.fix.split("; elsewhere: ")[1])
    assert result.report.doctor["findings"][0]["fix"] == after.fix


def _filled(value: np.ndarray, shape_from=(2, 3)):
    """y = Min(ConstantOfShape(Shape(x)){value}, Cast<value type>(x)): T5's bucket clamp."""
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["f"], name="fill",
                              value=numpy_helper.from_array(value.reshape(1), "v")),
             helper.make_node("Cast", ["x"], ["c"], name="cast", to=elem),
             helper.make_node("Min", ["f", "c"], ["y"], name="min")]
    return _model(nodes, [_vi("x", list(shape_from))], [_vi("y", list(shape_from), elem)])


FILL_KEY = "lowered ConstantOfShape into ConstantOfShape, Cast"


@pytest.mark.parametrize("value", [np.array(15, np.int64), np.array(-(2**24), np.int32)])
def test_an_integer_constant_of_shape_is_filled_in_float_where_the_table_lists_fp32_only(
        value):
    feeds = {"x": (np.random.default_rng(0).standard_normal((2, 3)) * 40).astype(np.float32)}
    out = _lowers(_filled(value), "8.6", ["Shape", "Cast", "ConstantOfShape", "Cast", "Min"],
                  {FILL_KEY: 1}, feed_sets=[feeds], rtol=0, atol=0)
    fill = next(n for n in out.graph.node if n.op_type == "ConstantOfShape")
    assert numpy_helper.to_array(fill.attribute[0].t).dtype == np.float32


def test_a_bool_constant_of_shape_is_filled_in_float_too():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["f"], name="fill",
                              value=numpy_helper.from_array(np.array([True]), "v")),
             helper.make_node("Greater", ["x", "zero"], ["g"]),
             helper.make_node("And", ["f", "g"], ["y"])]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3], TensorProto.BOOL)],
                   [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    _lowers(model, "10.0", ["Shape", "Greater", "ConstantOfShape", "Cast", "And"],
            {FILL_KEY: 1}, rtol=0, atol=0)


def test_a_fill_float32_cannot_hold_exactly_is_left():
    _stays(_filled(np.array(2**24 + 1, np.int64)), "8.6", [("ConstantOfShape 'fill'", (
        "TensorRT 8.6 lists ConstantOfShape for FP32 only, not INT64 (INT32 after the "
        "parser's cast), and it cannot be computed in float32 exactly: its value 16777217 "
        "(int64) is not an integer float32 holds exactly (|v| <= 2^24) or a BOOL"))])


def test_doctor_asks_for_a_float_fill_where_the_integer_one_cannot_be_lowered():
    """A ConstantOfShape's only input is the shape: the fix cannot be a Cast before it."""
    model = _filled(np.array(2**24 + 1, np.int64))
    finding, = [f for f in diagnose(model, parse_target("8.6")).findings
                if f.rule == "dtype-unsupported"]
    assert finding.fix.endswith(
        "elsewhere: export the fill's value as FP32 (its only input is the shape, so there "
        "is nothing to Cast before it), or target a TensorRT version that lists "
        "ConstantOfShape for INT64 (INT32 after the parser's cast)")


def test_types_the_row_lists_are_left_alone():
    nothing = [("graph", "no node to lower for TensorRT 10.16")]
    _stays(_filled(np.array(15, np.int64)), "10.16", nothing)  # 10.1+ lists INT64 fills
    _stays(_filled(np.array(1.5, np.float32)), "8.6",
           [("graph", "no node to lower for TensorRT 8.6")])
    cumsum = _model([helper.make_node("CumSum", ["x", "axis"], ["y"])], [_vi("x", [2, 3])],
                    [_vi("y", [2, 3])], [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    _stays(cumsum, "10.16", nothing)


def test_doctor_names_the_pass_for_integer_types_it_computes_in_float():
    for model, trt in ((_position_ids(7), "10.16"), (_filled(np.array(15, np.int64)), "8.6")):
        finding, = [f for f in diagnose(model, parse_target(trt)).findings
                    if f.rule == "dtype-unsupported"]
        assert finding.fix.startswith("lower-unsupported")
        result = api_run(model, trt=trt, check=True)
        assert not [f for f in result.diagnosis.findings if f.rule == "dtype-unsupported"]


def _mask_count(op="ReduceSum", source="bits", opset=17):
    """Mask2Former's pixel count: op(Cast<INT64>(Not(x > 0)), axes [1]) (source "bits"),
    or op over an INT64 input's own values ("values")."""
    axes = [numpy_helper.from_array(np.array([1], np.int64), "axes")] if op == "ReduceSum" \
        else []
    reduce = helper.make_node(op, ["n"] + (["axes"] if axes else []), ["y"], name="count",
                              keepdims=0, **({} if axes else {"axes": [1]}))
    if source == "bits":
        nodes = [helper.make_node("Greater", ["x", "zero"], ["b"]),
                 helper.make_node("Not", ["b"], ["nb"]),
                 helper.make_node("Cast", ["nb"], ["n"], to=TensorProto.INT64), reduce]
        inputs = [_vi("x", [2, 300])]
        inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")] + axes
    else:
        reduce.input[0] = "x"
        nodes, inputs, inits = [reduce], [_vi("x", [2, 300], TensorProto.INT64)], axes
    model = _model(nodes, inputs, [_vi("y", [2], TensorProto.INT64)], inits, opset)
    model.graph.value_info.append(_vi("n", [2, 300], TensorProto.INT64))  # the 300 summed
    return model


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_a_reduction_of_bits_is_computed_in_float_where_the_table_lists_floats_only(op):
    _lowers(_mask_count(op), "8.6", ["Greater", "Not", "Cast", op, "Cast"],
            {f"lowered {op} into Cast, {op}": 1}, rtol=0, atol=0)


def test_a_sum_of_integers_that_may_be_large_is_left():
    _stays(_mask_count(source="values"), "8.6", [("ReduceSum 'count'", (
        "TensorRT 8.6 lists ReduceSum for FP32, FP16 only, not INT64 (INT32 after the "
        "parser's cast), and it cannot be computed in float32 exactly: its terms are not a "
        "Cast of a BOOL tensor or rows of a 0/1 table, so they may be large, and a float32 "
        "sum of large integers rounds; nor slice by slice: it reduces 300 elements into "
        "each output element, more than the 16 graphfix combines one by one"))])


def _image_size(op: str, keepdims: int, opset: int = 17) -> onnx.ModelProto:
    """torchvision's detectors: op(Slice(Shape(image), -2)) of the image's [H, W] (INT64)."""
    axes_in = opset >= (13 if op == "ReduceSum" else 18)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "start", "end"], ["hw"]),
             helper.make_node(op, ["hw"] + (["axes"] if axes_in else []), ["y"], name="r",
                              keepdims=keepdims, **({} if axes_in else {"axes": [0]}))]
    inits = [numpy_helper.from_array(np.array([-2], np.int64), "start"),
             numpy_helper.from_array(np.array([4], np.int64), "end")]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "axes")] if axes_in else []
    model = _model(nodes, [_vi("x", [1, 3, "h", "w"])],
                   [_vi("y", [1] if keepdims else [], TensorProto.INT64)], inits, opset)
    model.graph.value_info.append(_vi("hw", [2], TensorProto.INT64))  # as inference says
    return model


ELEMENTWISE = {"ReduceMin": "Min", "ReduceMax": "Max", "ReduceSum": "Add", "ReduceProd": "Mul"}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", sorted(ELEMENTWISE))
def test_an_integer_reduction_of_two_elements_is_combined_slice_by_slice(op, keepdims, opset):
    """8.6 lists ReduceX for FP32/FP16 only: over the detectors' [H, W] it becomes two
    Gathers and Min/Max/Add/Mul in INT64 (INT32 for the parser, which its rows list),
    exactly; doctor then finds nothing to say about it."""
    model = _image_size(op, keepdims, opset)
    feed_sets = [feeds_for(model, x=(1, 3, h, w)) for h, w in ((480, 640), (800, 333))]
    out = _lowers(model, "8.6", ["Shape", "Slice", "Gather", "Gather", ELEMENTWISE[op]],
                  {f"lowered {op} into Gather, {ELEMENTWISE[op]}": 1}, feed_sets=feed_sets,
                  notes=[_opset_note(18, "8.6")] if opset == 18 else [], rtol=0, atol=0)
    gathers = [n for n in out.graph.node if n.op_type == "Gather"]
    index = [numpy_helper.to_array(i) for i in out.graph.initializer
             if i.name in {n.input[1] for n in gathers}]
    assert sorted(int(v.reshape(-1)[0]) for v in index) == [0, 1]
    assert all(v.shape == ((1,) if keepdims else ()) for v in index)
    assert not [f for f in diagnose(out, parse_target("8.6")).findings
                if f.rule == "dtype-unsupported"]


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op", ["ReduceProd", "ReduceMin"])
def test_several_axes_are_combined_one_after_another(op, keepdims):
    """x INT32 [2, 3, 4] over axes 0 and 2: 8 elements into each output element, the last
    axis first; values drawn in [-9, 9] so the products stay in range."""
    reduce = helper.make_node(op, ["x"], ["y"], name="r", axes=[0, 2], keepdims=keepdims)
    shape = [1, 3, 1] if keepdims else [3]
    model = _model([reduce], [_vi("x", [2, 3, 4], TensorProto.INT32)],
                   [_vi("y", shape, TensorProto.INT32)])
    rng = np.random.default_rng(4)
    feeds = {"x": rng.integers(-9, 10, [2, 3, 4]).astype(np.int32)}
    combine = ELEMENTWISE[op]
    expected = ["Gather"] * 4 + ([combine] * 3 if combine == "Mul" else [combine]) + \
        ["Gather"] * 2 + [combine]
    _lowers(model, "8.6", expected, {f"lowered {op} into Gather, {combine}": 1},
            feed_sets=[feeds], rtol=0, atol=0)


def test_a_reduction_too_long_or_of_unknown_extent_is_left():
    dynamic = _model([helper.make_node("ReduceMin", ["x"], ["y"], name="r", axes=[1],
                                       keepdims=0)],
                     [_vi("x", [2, "n"], TensorProto.INT64)], [_vi("y", [2], TensorProto.INT64)])
    _stays(dynamic, "8.6", [("ReduceMin 'r'", (
        "TensorRT 8.6 lists ReduceMin for FP32, FP16 only, not INT64 (INT32 after the "
        "parser's cast), and it cannot be computed in float32 exactly: its terms are not a "
        "Cast of a BOOL tensor or rows of a 0/1 table, so they may be large, and a float32 "
        "sum of large integers rounds; nor slice by slice: the extents of its axes [1] are "
        "not known statically (or are 0)"))])
    finding, = [f for f in diagnose(dynamic, parse_target("8.6")).findings
                if f.rule == "dtype-unsupported"]
    assert finding.fix.startswith(
        "lower-unsupported (the default --trt pipeline runs it) computes ReduceMin exactly "
        "where it reduces at most 16 elements of static extent (slice by slice: Gather and "
        "Min in INT64 (INT32 after the parser's cast)) or a BOOL tensor cast to an integer "
        "type (in FP32); elsewhere: Cast the tensor")


def test_nonzero_of_bool_reads_float():
    nodes = [helper.make_node("Greater", ["x", "zero"], ["b"]),
             helper.make_node("NonZero", ["b"], ["y"], name="nz")]
    model = _model(nodes, [_vi("x", [3, 4])], [_vi("y", [2, None], TensorProto.INT64)],
                   [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    out = _lowers(model, "10.16", ["Greater", "Cast", "NonZero"],
                  {"lowered NonZero into Cast, NonZero": 1}, rtol=0, atol=0)
    assert out.graph.node[1].input[0] == "b"
    finding, = [f for f in diagnose(model, parse_target("10.16")).findings
                if f.rule == "dtype-unsupported"]
    assert finding.fix.startswith("lower-unsupported")


# ----------------------------------------------------------------------------- FP16/BF16 fills


def _float_fill(value: float, elem: int = F16, io: int = F16, opset: int = 13):
    """y = x + ConstantOfShape(Shape(x)){value: `elem`} (a fp16 YOLOv8 head with a
    dynamic batch, probe3 D6), x and y of type `io` (a Cast in between where they differ)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["f"], name="fill",
                              value=helper.make_tensor("v", elem, [1], [value]))]
    if io != elem:
        nodes.append(helper.make_node("Cast", ["f"], ["c"], name="cast", to=io))
    nodes.append(helper.make_node("Add", ["x", nodes[-1].output[0]], ["y"], name="add"))
    return _model(nodes, [_vi("x", ["N", 4], io)], [_vi("y", ["N", 4], io)], opset=opset)


def _fill_of(model: onnx.ModelProto) -> onnx.TensorProto:
    return next(n for n in model.graph.node if n.op_type == "ConstantOfShape").attribute[0].t


# fp16 values that are not "round" in fp32: 0.1 rounded to fp16, the largest, the
# smallest subnormal, -0 and an infinity; each is an fp32 value, so the Cast back is exact
FP16_FILLS = [1.5, float(np.float16(0.1)), 65504.0, float(np.float16(2**-24)), -0.0,
              float("-inf")]


@pytest.mark.parametrize("trt", ["8.0", "8.6", "10.0"])
@pytest.mark.parametrize("value", FP16_FILLS)
def test_an_fp16_constant_of_shape_is_filled_in_fp32_where_the_table_lists_fp32_only(
        trt, value):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float16)
    out = _lowers(_float_fill(value), trt, ["Shape", "ConstantOfShape", "Cast", "Add"],
                  {FILL_KEY: 1}, feed_sets=[{"x": x}], rtol=0, atol=0)
    fill = _fill_of(out)
    assert fill.data_type == F
    np.testing.assert_array_equal(numpy_helper.to_array(fill),
                                  np.array([value], np.float16).astype(np.float32))
    cast = next(n for n in out.graph.node if n.op_type == "Cast")
    assert helper.get_attribute_value(cast.attribute[0]) == F16
    assert list(cast.output) == ["f"]  # the fill's tensor keeps its name and type


def test_a_bf16_constant_of_shape_is_filled_in_fp32_where_cast_lists_bf16():
    """ConstantOfShape takes BF16 from opset 20; TensorRT 10.0 parses opset 20, lists
    ConstantOfShape for FP32 only and Cast for BF16."""
    model = _float_fill(1.5 + 2**-7, elem=TensorProto.BFLOAT16, io=F, opset=20)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = _lowers(model, "10.0", ["Shape", "ConstantOfShape", "Cast", "Cast", "Add"],
                  {FILL_KEY: 1}, feed_sets=[{"x": x}], rtol=0, atol=0)
    assert _fill_of(out).data_type == F
    np.testing.assert_array_equal(run_model(out, {"x": x})["y"], x + np.float32(1.5 + 2**-7))


def test_a_bf16_fill_is_left_where_cast_does_not_list_bf16():
    model = _float_fill(1.5, elem=TensorProto.BFLOAT16, io=F, opset=20)
    why = ("TensorRT 8.6 lists ConstantOfShape for FP32 only, not BF16, and it cannot be "
           "computed in float32 here: TensorRT 8.6 lists Cast without BF16, so an FP32 fill "
           "cannot be cast back")
    _stays(model, "8.6", [("ConstantOfShape 'fill'", why), _opset_note(20, "8.6")])
    finding, = [f for f in diagnose(model, parse_target("8.6")).findings
                if f.rule == "dtype-unsupported" and f.op == "ConstantOfShape"]
    assert finding.fix == ("TensorRT 8.6 lists Cast without BF16, so an FP32 fill cannot be "
                           "cast back: export this fill (and what reads it) in FP32, or "
                           "target a TensorRT version that lists ConstantOfShape for BF16")


def test_fp16_fills_the_row_lists_are_left_alone():
    for trt in ("10.1", "10.16"):
        _stays(_float_fill(1.5), trt, [("graph", f"no node to lower for TensorRT {trt}")])


def test_doctor_names_the_pass_for_an_fp16_fill_and_run_for_8_6_clears_it():
    """probe3 D6: the fix named no pass and asked to Cast an input the node does not have."""
    model, target = _float_fill(1.5), parse_target("8.6")
    finding, = [f for f in diagnose(model, target).findings if f.severity == "error"]
    assert (finding.rule, finding.nodes) == ("dtype-unsupported", ("ConstantOfShape 'fill'",))
    assert finding.fix == ("lower-unsupported (the default --trt pipeline runs it) fills in "
                           "FP32 and Casts the result to FP16, exactly (FP32 holds every FP16 "
                           "value)")
    result = api_run(model, trt="8.6", input_shapes={"x": [3, 4]})
    assert [f for f in result.diagnosis.findings if f.severity == "error"] == []
    assert ops(result.model) == ["Shape", "ConstantOfShape", "Cast", "Add"]
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float16)
    assert_same_outputs(model, result.model, {"x": x}, rtol=0, atol=0)
    again = api_run(result.model, trt="8.6", input_shapes={"x": [3, 4]})
    assert onnx.printer.to_text(again.model.graph) == onnx.printer.to_text(result.model.graph)


def test_the_default_trt_pipeline_output_is_a_fixed_point():
    """Each Gelu-20 lowered for TensorRT 8.6 brings its own 0.5, 1 and sqrt(1/2); without
    dedup-constants after the lowering, a second `run --trt 8.6` shared them and wrote
    another model (probe 4: timm convnextv2 from the dynamo exporter)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Gelu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w2"], ["c"]), helper.make_node("Gelu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), n)
         for n in ("w1", "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    first = api_run(model, trt="8.6").model
    assert "Gelu" not in ops(first) and first.opset_import[0].version == 17
    constants = [numpy_helper.to_array(i).tobytes() for i in first.graph.initializer
                 if numpy_helper.to_array(i).size == 1]
    assert len(constants) == len(set(constants))  # each scalar once
    second = api_run(first, trt="8.6").model
    assert second.SerializeToString() == first.SerializeToString()


def _qdq_conv(bias_out: bool = False, uint8_weights: bool = False) -> onnx.ModelProto:
    """onnxruntime quantize_static's Q/DQ Conv: int8 activations, per-channel weights and
    an INT32 bias dequantized with scale = input scale * weight scale."""
    rng = np.random.default_rng(0)
    w_scale = (rng.random(4) * 0.01 + 0.001).astype(np.float32)
    wtype = np.uint8 if uint8_weights else np.int8
    weights = rng.integers(0 if uint8_weights else -127, 128, (4, 3, 3, 3)).astype(wtype)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
             numpy_helper.from_array(np.array(0, np.int8), "xz"),
             numpy_helper.from_array(weights, "wq"), numpy_helper.from_array(w_scale, "ws"),
             numpy_helper.from_array(np.zeros(4, wtype), "wz"),
             numpy_helper.from_array(rng.integers(-5000, 5000, 4).astype(np.int32), "bq"),
             numpy_helper.from_array(w_scale * np.float32(0.02), "bs"),
             numpy_helper.from_array(np.zeros(4, np.int32), "bz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["y"], pads=[1, 1, 1, 1])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])]
    if bias_out:
        outputs.append(helper.make_tensor_value_info("bd", TensorProto.FLOAT, [4]))
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("trt", ["10.16", "8.6"])
def test_an_int32_bias_dequantize_becomes_its_float_constant(trt):
    """Probe 4: every onnxruntime quantize_static Q/DQ model has one per Conv/Gemm, and
    no TensorRT table lists DequantizeLinear for INT32 (TensorRT quantizes biases itself);
    the constant is (q - zero point) * scale in float32, bit for bit onnxruntime's."""
    out = _lowers(_qdq_conv(), trt, ["QuantizeLinear", "DequantizeLinear",
                                     "DequantizeLinear", "Conv"],
                  {"stored INT32 DequantizeLinear outputs as float constants": 1},
                  rtol=0, atol=0)
    bias = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}[
        out.graph.node[-1].input[2]]
    assert bias.dtype == np.float32 and bias.shape == (4,)
    assert diagnose(out, parse_target(trt)).blocking_nodes() == []


def test_an_int32_dequantize_the_target_cannot_fold_stays_with_the_reason():
    rows = "TensorRT 10.16 lists DequantizeLinear for INT8, FP8, FP4, INT4 only"
    _stays(_qdq_conv(bias_out=True), "10.16",
           [("DequantizeLinear 'bd'", f"{rows}, and its output is a graph output")])


def test_uint8_weights_are_not_dequantized_into_float():
    """A UINT8 weight is a quantization choice (doctor says how to change it), not a
    bias: folding it would silently take the Conv out of INT8."""
    graph = to_graph(_qdq_conv(uint8_weights=True))
    result = LowerUnsupported().run(graph, _ctx("10.16"))
    assert dict(result.counts) == {"stored INT32 DequantizeLinear outputs as float constants": 1}
    assert [n.op for n in graph.nodes if n.outputs] == [
        "QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Conv"]
