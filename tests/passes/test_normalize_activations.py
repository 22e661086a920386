"""normalize-activations: exact ops after, onnxruntime numerics, checker, idempotence, notes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse
from onnx import helper, numpy_helper

from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.normalize_activations import (
    NON_CONSTANT_BOUNDS,
    SILU,
    NormalizeActivations,
)

NOTHING = ("graph", "no Clip(x, 0, inf), Max(x, 0), x * HardSigmoid(x) or "
                    "Clip(x + 3, 0, 6) / 6 to rewrite")
CLIP = "rewrote Clip(x, 0, inf) as Relu"
MAX = "rewrote Max(x, 0) as Relu"
HARDSWISH = "fused x * HardSigmoid(x) into HardSwish"


def _header(opset: int) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>'


def _feeds(model: onnx.ModelProto, scale: float = 4.0) -> dict[str, np.ndarray]:
    """Seeded N(0, scale^2) inputs: wide enough to reach HardSwish's clamps at +-3."""
    return {k: (v * scale).astype(v.dtype) for k, v in feeds_for(model).items()}


def _outputs(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output]


def _rewrites(model, expected_ops, counts, feeds=None, rtol=1e-5, atol=1e-6):
    """Ops, counts, no notes, checker (in apply), outputs kept, numerics, idempotence."""
    out, result = apply(NormalizeActivations(), model)
    assert result.changed
    assert dict(result.counts) == counts
    assert result.notes == []
    assert ops(out) == expected_ops
    assert _outputs(out) == _outputs(model)
    assert_same_outputs(model, out, feeds or _feeds(model), rtol=rtol, atol=atol)
    assert_idempotent(NormalizeActivations(), out)
    return out


def _stays(model, notes) -> None:
    """Nothing changes (same fingerprint, same ops after apply) and the notes are exactly these."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result = NormalizeActivations().run(graph, PassContext())
    assert not result.changed
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == notes
    assert fingerprint(graph) == before
    out, _ = apply(NormalizeActivations(), model)
    assert ops(out) == ops(model)


# ----------------------------------------------------------------------------- Clip


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_clip_zero_inf_becomes_relu(opset):
    model = parse(_header(opset) + """
    g (float[2,3,4] x) => (float[2,3,4] y) <float lo = {0.0}, float hi = {inf}> {
        c = Clip(x, lo, hi)
        y = Neg(c)
    }""")
    out = _rewrites(model, ["Relu", "Neg"], {CLIP: 1})
    assert [i.name for i in out.graph.initializer] == []


@pytest.mark.parametrize("hi", ["", ", hi"], ids=["max-absent", "max-float-max"])
def test_clip_without_or_with_float_max_becomes_relu_and_keeps_output_name(hi):
    model = parse(_header(13) + f"""
    g (float[2,3] x) => (float[2,3] y) <float lo = {{0.0}}, float hi = {{3.4028234663852886e38}}> {{
        y = Clip(x, lo{hi})
    }}""")
    out = _rewrites(model, ["Relu"], {CLIP: 1})
    assert list(out.graph.node[0].output) == ["y"]


def test_clip_attribute_form_at_opset_10_becomes_relu():
    model = parse(_header(10) + """
    g (float[2,3] x) => (float[2,3] y) {
        y = Clip <min = 0.0> (x)
    }""")
    out = _rewrites(model, ["Relu"], {CLIP: 1})
    assert list(out.graph.node[0].attribute) == []


def test_clip_attribute_form_with_max_6_stays():
    model = parse(_header(10) + """
    g (float[2,3] x) => (float[2,3] y) {
        y = Clip <min = 0.0, max = 6.0> (x)
    }""")
    _stays(model, [NOTHING])


def test_clip_0_6_stays_without_a_note_of_its_own():
    model = parse(_header(17) + """
    g (float[2,3] x) => (float[2,3] y) <float lo = {0.0}, float hi = {6.0}> {
        y = Clip(x, lo, hi)
    }""")
    _stays(model, [NOTHING])
    assert_idempotent(NormalizeActivations(), model)


def test_clip_with_a_lower_bound_other_than_zero_stays():
    model = parse(_header(17) + """
    g (float[2,3] x) => (float[2,3] y) <float lo = {-1.0}> {
        y = Clip(x, lo)
    }""")
    _stays(model, [NOTHING])


def test_clip_with_non_constant_max_is_reported():
    model = parse(_header(17) + """
    g (float[2,3] x, float hi) => (float[2,3] y) <float lo = {0.0}> {
        y = Clip(x, lo, hi)
    }""")
    _stays(model, [("Clip 'y'", NON_CONSTANT_BOUNDS)])


def test_fp16_clip_to_fp16_max_becomes_relu():
    # Relu and Clip(0, max) give bit-identical results, so fp16 needs no looser tolerance.
    # (ONNX text has no fp16 literals, so this model is built with onnx.helper.)
    fp16 = onnx.TensorProto.FLOAT16
    bounds = [
        numpy_helper.from_array(np.array(v, dtype=np.float16), name)
        for name, v in (("lo", 0.0), ("hi", np.finfo(np.float16).max))
    ]
    graph = helper.make_graph(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")], "g",
        [helper.make_tensor_value_info("x", fp16, [2, 8])],
        [helper.make_tensor_value_info("y", fp16, [2, 8])], bounds,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    out = _rewrites(model, ["Relu"], {CLIP: 1}, rtol=0, atol=0)
    assert _outputs(out) == [("y", fp16)]


def test_float64_clip_attribute_form_with_default_max_stays():
    # Clip-6's default max is the float32 maximum: on float64 it still clips.
    model = parse(_header(10) + """
    g (double[2,3] x) => (double[2,3] y) {
        y = Clip <min = 0.0> (x)
    }""")
    _stays(model, [NOTHING])


# ----------------------------------------------------------------------------- Max


@pytest.mark.parametrize("args", ["x, zero", "zero, x"], ids=["x-first", "zero-first"])
def test_max_with_zero_becomes_relu_in_either_order(args):
    model = parse(_header(17) + f"""
    g (float[2,3] x) => (float[2,3] y) <float zero = {{0.0}}> {{
        m = Max({args})
        y = Neg(m)
    }}""")
    _rewrites(model, ["Relu", "Neg"], {MAX: 1})


def test_max_with_a_broadcastable_zero_row_becomes_relu():
    model = parse(_header(17) + """
    g (float[2,3] x) => (float[2,3] y) <float[1,3] zero = {0.0, 0.0, 0.0}> {
        y = Max(x, zero)
    }""")
    _rewrites(model, ["Relu"], {MAX: 1})


def test_max_with_one_stays_with_a_note():
    model = parse(_header(17) + """
    g (float[2,3] x) => (float[2,3] y) <float one = {1.0}> {
        y = Max(x, one)
    }""")
    _stays(model, [("Max 'y'", "its constant operand is not all zeros, so it is not Relu")])


def test_max_whose_zero_would_broadcast_x_stays_with_a_note():
    model = parse(_header(17) + """
    g (float[3] x) => (float[2,3] y) <float[2,3] zero = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0}> {
        y = Max(x, zero)
    }""")
    reason = "its zero constant may broadcast x to a larger shape, which Relu would not"
    _stays(model, [("Max 'y'", reason)])


def test_max_of_three_inputs_stays_with_a_note():
    model = parse(_header(17) + """
    g (float[3] x, float[3] z) => (float[3] y) <float zero = {0.0}> {
        y = Max(x, zero, z)
    }""")
    _stays(model, [("Max 'y'", "it has 3 inputs; only Max(x, 0) with two inputs is Relu")])


def test_integer_max_needs_opset_14_for_relu():
    text = """
    g (int32[6] x) => (int32[6] y) <int32 zero = {0}> {
        y = Max(x, zero)
    }"""
    reason = "Relu takes int32 only from opset 14; the model imports opset 13"
    _stays(parse(_header(13) + text), [("Max 'y'", reason)])
    model = parse(_header(14) + text)
    feeds = {"x": np.array([-3, -1, 0, 1, 2, 7], dtype=np.int32)}
    _rewrites(model, ["Relu"], {MAX: 1}, feeds=feeds, rtol=0, atol=0)


# ----------------------------------------------------------------------------- HardSwish


_HARDSIGMOID = "HardSigmoid <alpha = 0.16666667, beta = 0.5>"


@pytest.mark.parametrize("args", ["x, h", "h, x"], ids=["x-first", "gate-first"])
def test_x_times_hardsigmoid_becomes_hardswish_at_opset_14(args):
    model = parse(_header(14) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) {{
        h = {_HARDSIGMOID} (x)
        y = Mul({args})
    }}""")
    out = _rewrites(model, ["HardSwish"], {HARDSWISH: 1})
    assert list(out.graph.node[0].input) == ["x"]
    assert list(out.graph.node[0].output) == ["y"]


def test_hardswish_option_off_keeps_the_pair_with_reason():
    model = parse(_header(14) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
    }}""")
    pass_ = NormalizeActivations(NormalizeActivations.parse_options([("hardswish", "false")]))
    out, result = apply(pass_, model)
    assert [n.op_type for n in out.graph.node] == ["HardSigmoid", "Mul"]
    assert not result.changed
    assert any("TensorRT 8.0 and 8.2" in n.reason for n in result.notes)


@pytest.mark.parametrize(("trt", "fused"), [("8.2", False), ("8.4", True), ("10", True)])
def test_hardswish_follows_the_run_target_matrix(trt, fused):
    from graphfix.passes.base import PassContext
    from graphfix.trt import parse_target

    model = parse(_header(14) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
    }}""")
    out, result = apply(NormalizeActivations(), model, PassContext(trt=parse_target(trt)))
    assert [n.op_type for n in out.graph.node] == (
        ["HardSwish"] if fused else ["HardSigmoid", "Mul"])
    if not fused:
        assert [n.reason for n in result.notes] == [
            "left as x * HardSigmoid(x): the TensorRT 8.2 operator table does not list "
            "HardSwish as supported"]


def test_fp16_hardswish():
    # x * HardSigmoid(x) may round twice in fp16 where HardSwish rounds once; onnxruntime
    # gives identical results on these inputs (|y| up to ~8), but about one fp16 ulp
    # (2**-10 relative) is allowed so the test does not depend on kernel internals.
    model = parse(_header(17) + f"""
    g (float16[4,16] x) => (float16[4,16] y) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
    }}""")
    _rewrites(model, ["HardSwish"], {HARDSWISH: 1}, rtol=1e-3, atol=1e-3)


def test_hardswish_needs_opset_14():
    model = parse(_header(13) + f"""
    g (float[2,3] x) => (float[2,3] y) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
    }}""")
    _stays(model, [("Mul 'y'", "HardSwish needs opset 14; the model imports opset 13")])


def test_hardsigmoid_with_another_reader_stays():
    model = parse(_header(14) + f"""
    g (float[2,3] x) => (float[2,3] y, float[2,3] z) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
        z = Neg(h)
    }}""")
    reason = "the HardSigmoid output is also read by another node, so the HardSigmoid must stay"
    _stays(model, [("Mul 'y'", reason)])


def test_hardsigmoid_writing_a_graph_output_stays():
    model = parse(_header(14) + f"""
    g (float[2,3] x) => (float[2,3] y, float[2,3] h) {{
        h = {_HARDSIGMOID} (x)
        y = Mul(x, h)
    }}""")
    reason = "the HardSigmoid output is a graph output, so the HardSigmoid must stay"
    _stays(model, [("Mul 'y'", reason)])


def test_hardsigmoid_with_default_alpha_is_not_hardswish():
    model = parse(_header(14) + """
    g (float[2,3] x) => (float[2,3] y) {
        h = HardSigmoid(x)
        y = Mul(x, h)
    }""")
    reason = (
        "its HardSigmoid has alpha=0.2, beta=0.5, not alpha=1/6, beta=0.5, "
        "so x * HardSigmoid(x) is not HardSwish"
    )
    _stays(model, [("Mul 'y'", reason)])


def test_mul_of_hardsigmoid_of_another_tensor_is_not_a_candidate():
    model = parse(_header(14) + f"""
    g (float[2,3] x, float[2,3] z) => (float[2,3] y) {{
        h = {_HARDSIGMOID} (z)
        y = Mul(x, h)
    }}""")
    _stays(model, [NOTHING])


# ----------------------------------------------------------------------------- SiLU


def test_silu_is_reported_and_left_alone():
    model = parse(_header(17) + """
    g (float[2,3] x) => (float[2,3] y) {
        s = Sigmoid(x)
        y = Mul(s, x)
    }""")
    _stays(model, [("Mul 'y'", SILU)])
    assert_idempotent(NormalizeActivations(), model)


# ----------------------------------------------------------------------------- subgraphs


def test_rewrites_inside_if_branches():
    model = parse(_header(14) + f"""
    g (bool c, float[2,3] x) => (float[2,3] y) <float lo = {{0.0}}, float hi = {{inf}}> {{
        y = If(c) <
            then_branch = t () => (float[2,3] ty) {{ ty = Clip(x, lo, hi) }},
            else_branch = e () => (float[2,3] ey) {{
                h = {_HARDSIGMOID} (x)
                ey = Mul(h, x)
            }}
        >
    }}""")
    out, result = apply(NormalizeActivations(), model)
    assert dict(result.counts) == {CLIP: 1, HARDSWISH: 1}
    assert result.notes == []
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Relu"], "else_branch": ["HardSwish"]}
    assert [[o.name for o in a.g.output] for a in out.graph.node[0].attribute] == [["ty"], ["ey"]]
    x = (np.random.default_rng(0).standard_normal([2, 3]) * 4).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x})
    assert_idempotent(NormalizeActivations(), out)


def test_mixed_graph_rewrites_each_form_once():
    model = parse(_header(17) + f"""
    g (float[1,2,6,6] x) => (float[1,4,4,4] y)
      <float[4,2,3,3] w = {{{", ".join(["0.1", "-0.2", "0.3"] * 24)}}}, float zero = {{0.0}},
       float lo = {{0.0}}, float six = {{6.0}}> {{
        c = Conv(x, w)
        r = Max(zero, c)
        r6 = Clip(r, lo, six)
        h = {_HARDSIGMOID} (r6)
        y = Mul(r6, h)
    }}""")
    _rewrites(model, ["Conv", "Relu", "Clip", "HardSwish"], {MAX: 1, HARDSWISH: 1})


# ----------------------------------------------------------------------------- decomposed

_DECOMPOSED_SWISH = "rewrote x * Clip(x + 3, 0, 6) / 6 as HardSwish"
_DECOMPOSED_SIGMOID = "rewrote Clip(x + 3, 0, 6) / 6 as HardSigmoid"
_RELU6_OF_X_PLUS_3 = """
        a = Add(x, three)
        c = Clip(a, zero, six)"""
_CONSTANTS = "float three = {3}, float zero = {0}, float six = {6}, float sixth = {0.16666667}"


@pytest.mark.parametrize("tail", [
    "m = Mul(x, c) y = Div(m, six)",         # paddle2onnx (PP-OCR)
    "m = Mul(c, x) y = Mul(sixth, m)",
    "d = Div(c, six) y = Mul(x, d)",         # a HardSigmoid, then the Mul
])
def test_decomposed_hardswish_becomes_hardswish_at_opset_14(tail):
    model = parse(_header(14) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) <{_CONSTANTS}> {{ {_RELU6_OF_X_PLUS_3} {tail} }}""")
    counts = ({_DECOMPOSED_SIGMOID: 1, HARDSWISH: 1} if tail.startswith("d =")
              else {_DECOMPOSED_SWISH: 1})
    out = _rewrites(model, ["HardSwish"], counts)
    assert list(out.graph.node[0].input) == ["x"] and list(out.graph.node[0].output) == ["y"]


def test_decomposed_hardswish_below_opset_14_becomes_x_times_hardsigmoid():
    model = parse(_header(12) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) <{_CONSTANTS}> {{
        {_RELU6_OF_X_PLUS_3}
        m = Mul(x, c)
        y = Div(m, six)
    }}""")
    out = _rewrites(model, ["HardSigmoid", "Mul"], {
        "rewrote x * Clip(x + 3, 0, 6) / 6 as x * HardSigmoid(x) (HardSwish needs opset 14)": 1})
    hard_sigmoid, mul = out.graph.node
    assert [(a.name, round(a.f, 7)) for a in hard_sigmoid.attribute] == [
        ("alpha", 0.1666667), ("beta", 0.5)]
    assert list(mul.input) == ["x", "c_hardsigmoid"] and list(mul.output) == ["y"]
    assert list(hard_sigmoid.output) == ["c_hardsigmoid"]  # not "c": it holds c / 6


def test_decomposed_hardsigmoid_alone_becomes_hardsigmoid():
    model = parse(_header(12) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y) <{_CONSTANTS}> {{
        {_RELU6_OF_X_PLUS_3}
        y = Mul(c, sixth)
    }}""")
    _rewrites(model, ["HardSigmoid"], {_DECOMPOSED_SIGMOID: 1})


@pytest.mark.parametrize("body", [
    "a = Add(x, three) c = Clip(a, zero, five) m = Mul(x, c) y = Div(m, six)",  # not ReLU6
    "a = Add(x, two) c = Clip(a, zero, six) m = Mul(x, c) y = Div(m, six)",     # not + 3
    "a = Add(x, three) c = Clip(a, zero, six) m = Mul(z, c) y = Div(m, six)",   # another x
    "a = Add(x, three) c = Clip(a, zero, six) m = Mul(x, c) y = Div(m, five)",  # not / 6
])
def test_near_misses_of_the_decomposed_forms_stay(body):
    model = parse(_header(14) + f"""
    g (float[2,3,8] x, float[2,3,8] z) => (float[2,3,8] y)
      <float two = {{2}}, float five = {{5}}, {_CONSTANTS}> {{ {body} }}""")
    _stays(model, [NOTHING])


def test_decomposed_hardswish_whose_clip_is_read_elsewhere_stays():
    model = parse(_header(14) + f"""
    g (float[2,3,8] x) => (float[2,3,8] y, float[2,3,8] c) <{_CONSTANTS}> {{
        {_RELU6_OF_X_PLUS_3}
        m = Mul(x, c)
        y = Div(m, six)
    }}""")
    _stays(model, [NOTHING])
