"""fuse-pad-conv: exact ops after, onnxruntime numerics, checker, idempotence, every skip."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, parse
from onnx import helper, numpy_helper

from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.fuse_pad_conv import MAXPOOL, FusePadConv
from graphfix.runtime.session import run_model

CONV = "folded Pad into Conv"
POOL = "folded Pad into AveragePool"


def _header(opset: int) -> str:
    return f'<ir_version: 8, opset_import: ["" : {opset}]>'


def _weights(shape: list[int], seed: int = 0) -> str:
    """An ONNX-text initializer body of seeded weights."""
    values = np.random.default_rng(seed).standard_normal(int(np.prod(shape))) * 0.3
    return "{" + ", ".join(f"{v:.6f}" for v in values) + "}"


def _attr(model: onnx.ModelProto, op: str, name: str):
    node = next(n for n in model.graph.node if n.op_type == op)
    attr = next((a for a in node.attribute if a.name == name), None)
    return None if attr is None else helper.get_attribute_value(attr)


def _folds(model, expected_ops, counts, feeds=None, rtol=1e-5, atol=1e-6) -> onnx.ModelProto:
    """Ops, counts, no notes, checker (in apply), output names, numerics, idempotence."""
    out, result = apply(FusePadConv(), model)
    assert result.changed
    assert dict(result.counts) == counts
    assert result.notes == []
    assert ops(out) == expected_ops
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    assert_same_outputs(model, out, feeds or feeds_for(model), rtol=rtol, atol=atol)
    assert_idempotent(FusePadConv(), out)
    return out


def _skips(model, reason: str, subject: str = "Pad 't'") -> None:
    graph = to_graph(model)
    before = fingerprint(graph)
    result = FusePadConv().run(graph, PassContext())
    assert not result.changed
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == [(subject, reason)]
    assert fingerprint(graph) == before
    out, _ = apply(FusePadConv(), model)
    assert ops(out) == ops(model)


# ----------------------------------------------------------------------------- Conv


def test_pad_into_conv_with_own_pads_strides_and_dilation():
    model = parse(_header(17) + f"""
    g (float[1,3,9,10] x) => (float[1,4,5,6] y)
      <int64[8] p = {{0, 0, 1, 2, 0, 0, 3, 0}}, float[4,3,3,3] w = {_weights([4, 3, 3, 3])},
       float[4] b = {{0.1, -0.2, 0.3, 0.0}}> {{
        t = Pad(x, p)
        y = Conv <pads = [1, 0, 0, 1], strides = [2, 2], dilations = [2, 1]> (t, w, b)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    # Conv pads are [h_begin, w_begin, h_end, w_end]: Pad's H (1, 3) and W (2, 0) added.
    assert _attr(out, "Conv", "pads") == [2, 2, 3, 1]
    assert list(out.graph.node[0].input) == ["x", "w", "b"]
    assert [i.name for i in out.graph.initializer] == ["w", "b"]


def test_pad_into_conv3d_without_own_pads():
    model = parse(_header(17) + f"""
    g (float[1,2,4,5,3] x) => (float[1,3,5,6,3] y)
      <int64[10] p = {{0, 0, 1, 0, 1, 0, 0, 1, 2, 1}},
       float[3,2,2,2,3] w = {_weights([3, 2, 2, 2, 3])}> {{
        t = Pad(x, p)
        y = Conv(t, w)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    assert _attr(out, "Conv", "pads") == [1, 0, 1, 1, 2, 1]


def test_explicit_zero_value_input_at_opset_11():
    model = parse(_header(11) + f"""
    g (float[1,2,6,6] x) => (float[1,2,6,6] y)
      <int64[8] p = {{0, 0, 1, 1, 0, 0, 1, 1}}, float zero = {{0.0}},
       float[2,2,3,3] w = {_weights([2, 2, 3, 3])}> {{
        t = Pad(x, p, zero)
        y = Conv(t, w)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    assert _attr(out, "Conv", "pads") == [1, 1, 1, 1]


def test_attribute_form_at_opset_10():
    model = parse(_header(10) + f"""
    g (float[1,2,6,6] x) => (float[1,2,7,6] y) <float[2,2,3,3] w = {_weights([2, 2, 3, 3])}> {{
        t = Pad <pads = [0, 0, 2, 1, 0, 0, 1, 1], mode = "constant", value = 0.0> (x)
        y = Conv(t, w)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    assert _attr(out, "Conv", "pads") == [2, 1, 1, 1]


@pytest.mark.parametrize("axes", ["2, 3", "-2, -1"], ids=["positive", "negative"])
def test_axes_input_at_opset_18(axes):
    model = parse(_header(18) + f"""
    g (float[1,2,6,6] x) => (float[1,2,7,6] y)
      <int64[4] p = {{2, 1, 1, 1}}, int64[2] axes = {{{axes}}},
       float[2,2,3,3] w = {_weights([2, 2, 3, 3])}> {{
        t = Pad(x, p, , axes)
        y = Conv(t, w)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    assert _attr(out, "Conv", "pads") == [2, 1, 1, 1]


def test_fp16_pad_into_conv():
    # Folding moves no arithmetic: the same products are summed in the same order, so
    # the fp16 result is expected to match exactly; one fp16 ulp (~1e-3 relative) is
    # allowed so the test does not depend on onnxruntime's fp16 Conv kernel.
    fp16 = onnx.TensorProto.FLOAT16
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "p"),
        numpy_helper.from_array(np.array(0, dtype=np.float16), "zero"),
        numpy_helper.from_array((rng.standard_normal([4, 3, 3, 3]) * 0.3).astype(np.float16), "w"),
    ]
    nodes = [
        helper.make_node("Pad", ["x", "p", "zero"], ["t"], name="pad"),
        helper.make_node("Conv", ["t", "w"], ["y"], name="conv"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", fp16, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", fp16, [1, 4, 8, 8])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    out = _folds(model, ["Conv"], {CONV: 1}, rtol=1e-3, atol=1e-3)
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [fp16]
    assert {i.data_type for i in out.graph.initializer} == {fp16}


def test_pad_into_conv_with_auto_pad_valid():
    # HF EfficientNet: ZeroPad2d((0, 1, 0, 1)) before a 'valid' stride-2 Conv. VALID is no
    # padding at all, so the Pad becomes the Conv's explicit pads and auto_pad NOTSET.
    model = parse(_header(17) + f"""
    g (float[1,4,16,16] x) => (float[1,8,8,8] y)
      <int64[8] p = {{0, 0, 0, 0, 0, 0, 1, 1}}, float zero = {{0.0}},
       float[8,4,3,3] w = {_weights([8, 4, 3, 3])}> {{
        t = Pad(x, p, zero)
        y = Conv <auto_pad = "VALID", kernel_shape = [3, 3], strides = [2, 2]> (t, w)
    }}""")
    out = _folds(model, ["Conv"], {CONV: 1})
    assert _attr(out, "Conv", "pads") == [0, 0, 1, 1]
    assert _attr(out, "Conv", "auto_pad") in (None, b"NOTSET")
    assert list(out.graph.node[0].input) == ["x", "w"]


def test_folds_inside_if_branches():
    model = parse(_header(17) + f"""
    g (bool c, float[1,2,5,5] x) => (float[1,2,5,5] y)
      <int64[8] p = {{0, 0, 1, 1, 0, 0, 1, 1}}, float[2,2,3,3] w = {_weights([2, 2, 3, 3])}> {{
        y = If(c) <
            then_branch = th () => (float[1,2,5,5] ty) {{ t1 = Pad(x, p) ty = Conv(t1, w) }},
            else_branch = el () => (float[1,2,5,5] ey) {{
                t2 = Pad(x, p)
                ey = AveragePool <kernel_shape = [3, 3]> (t2)
            }}
        >
    }}""")
    out, result = apply(FusePadConv(), model)
    assert dict(result.counts) == {CONV: 1, POOL: 1}
    assert result.notes == []
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Conv"], "else_branch": ["AveragePool"]}
    x = np.random.default_rng(0).standard_normal([1, 2, 5, 5]).astype(np.float32)
    for cond in (True, False):
        assert_same_outputs(model, out, {"c": np.array(cond), "x": x})
    assert_idempotent(FusePadConv(), out)


# ----------------------------------------------------------------------------- AveragePool


def _pool_model(pool_attrs: str, op: str = "AveragePool", size: int = 6) -> onnx.ModelProto:
    return parse(_header(17) + f"""
    g (float[1,2,{size},{size}] x) => (float[1,2,?,?] y)
      <int64[8] p = {{0, 0, 1, 1, 0, 0, 1, 1}}> {{
        t = Pad(x, p)
        y = {op} <{pool_attrs}> (t)
    }}""")


def test_pad_into_average_pool_without_own_pads_sets_count_include_pad():
    # The Pad's zeros are counted in every average; once they are the pool's own pads,
    # count_include_pad=1 keeps counting them. Inputs ~ N(0, 1), so a pool that left the
    # pad cells out would differ by far more than the tolerance at the borders.
    model = _pool_model("kernel_shape = [3, 3], strides = [2, 2]")
    out = _folds(model, ["AveragePool"], {POOL: 1})
    assert _attr(out, "AveragePool", "pads") == [1, 1, 1, 1]
    assert _attr(out, "AveragePool", "count_include_pad") == 1


def test_pad_into_average_pool_that_counts_its_own_pads():
    model = _pool_model("kernel_shape = [3, 3], pads = [1, 0, 0, 1], count_include_pad = 1")
    out = _folds(model, ["AveragePool"], {POOL: 1})
    assert _attr(out, "AveragePool", "pads") == [2, 1, 1, 2]
    assert _attr(out, "AveragePool", "count_include_pad") == 1


def test_pad_into_dilated_average_pool_at_opset_19():
    model = parse(_header(19) + """
    g (float[1,2,9,9] x) => (float[1,2,?,?] y) <int64[8] p = {0, 0, 1, 2, 0, 0, 2, 1}> {
        t = Pad(x, p)
        y = AveragePool <kernel_shape = [3, 3], dilations = [2, 2], strides = [1, 2]> (t)
    }""")
    out = _folds(model, ["AveragePool"], {POOL: 1})
    assert _attr(out, "AveragePool", "pads") == [1, 2, 2, 1]


def test_pad_into_average_pool_with_auto_pad_valid():
    model = _pool_model('kernel_shape = [3, 3], strides = [2, 2], auto_pad = "VALID"', size=7)
    out = _folds(model, ["AveragePool"], {POOL: 1})
    assert _attr(out, "AveragePool", "pads") == [1, 1, 1, 1]
    assert _attr(out, "AveragePool", "count_include_pad") == 1
    assert _attr(out, "AveragePool", "auto_pad") in (None, b"NOTSET")


def test_pool_whose_pads_would_reach_its_kernel_is_skipped():
    model = _pool_model("kernel_shape = [2, 2], pads = [0, 1, 0, 1], count_include_pad = 1")
    reason = (
        "the AveragePool pads would become [1, 2, 1, 2], not all smaller than its kernel "
        "[2, 2], which onnxruntime refuses"
    )
    _skips(model, reason)


def _naive_fold(model: onnx.ModelProto, pads: list[int], **attrs) -> onnx.ModelProto:
    """The fold the pass refuses: drop the Pad, give the pool `pads` (and `attrs`)."""
    pool = model.graph.node[1]
    changed = [a for a in pool.attribute if a.name != "pads" and a.name not in attrs]
    node = helper.make_node(pool.op_type, ["x"], ["y"], pads=pads, **attrs)
    node.attribute.extend(changed)
    graph = helper.make_graph([node], "g", model.graph.input, model.graph.output)
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=8)


def _differs(model: onnx.ModelProto, naive: onnx.ModelProto, shift: float = 0.0) -> bool:
    feeds = {k: (v + shift).astype(v.dtype) for k, v in feeds_for(model).items()}
    a, b = run_model(model, feeds)["y"], run_model(naive, feeds)["y"]
    return a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_average_pool_excluding_its_own_pads_is_skipped():
    model = _pool_model("kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 0")
    reason = (
        "the AveragePool leaves its own pads out of the average (count_include_pad=0), "
        "but the Pad's zeros are counted"
    )
    _skips(model, reason)
    # Neither choice of count_include_pad reproduces the mix of counted and uncounted pads.
    for include in (0, 1):
        assert _differs(model, _naive_fold(model, [2] * 4, count_include_pad=include))


def test_average_pool_with_ceil_mode_is_skipped():
    model = _pool_model("kernel_shape = [2, 2], strides = [2, 2], ceil_mode = 1", size=5)
    reason = (
        "the AveragePool has ceil_mode=1, whose last window is placed differently "
        "once the padding is its own"
    )
    _skips(model, reason)
    # onnxruntime drops a last window that would start in the pool's own padding: 7x7
    # padded input gives 4x4 windows, the 5x5 input with pads 1 only 3x3.
    assert _differs(model, _naive_fold(model, [1] * 4, count_include_pad=1))


def test_max_pool_is_skipped():
    model = _pool_model("kernel_shape = [3, 3]", op="MaxPool")
    _skips(model, MAXPOOL)
    # MaxPool's own pads are -inf: a border window over negative inputs loses the Pad's 0.
    # Inputs ~ N(-2, 1) make such windows certain.
    assert _differs(model, _naive_fold(model, [1] * 4), shift=-2.0)


# ----------------------------------------------------------------------------- skips


def _conv_skip(pad_line: str, extra_inits: str = "", conv_attrs: str = "", more: str = "",
               outputs: str = "float[1,2,?,?] y", inputs: str = "float[1,2,6,6] x",
               opset: int = 17) -> onnx.ModelProto:
    return parse(_header(opset) + f"""
    g ({inputs}) => ({outputs})
      <int64[8] p = {{0, 0, 1, 1, 0, 0, 1, 1}}, float[2,2,3,3] w = {_weights([2, 2, 3, 3])}
       {extra_inits}> {{
        {pad_line}
        y = Conv <{conv_attrs or 'group = 1'}> (t, w)
        {more}
    }}""")


SKIPS = {
    "reflect-mode": (
        _conv_skip('t = Pad <mode = "reflect"> (x, p)'),
        "it pads in reflect mode; only zero constant padding matches a Conv's or pool's pads",
    ),
    "edge-mode": (
        _conv_skip('t = Pad <mode = "edge"> (x, p)'),
        "it pads in edge mode; only zero constant padding matches a Conv's or pool's pads",
    ),
    "non-zero-value": (
        _conv_skip("t = Pad(x, p, v)", ", float v = {0.5}"),
        "it pads with the value 0.5, not 0",
    ),
    "non-zero-value-attribute": (
        _conv_skip("t = Pad <pads = [0, 0, 1, 1, 0, 0, 1, 1], value = 1.0> (x)", opset=10),
        "it pads with the value 1, not 0",
    ),
    "non-constant-value": (
        _conv_skip("t = Pad(x, p, v)", inputs="float[1,2,6,6] x, float v"),
        "its pad value is not a constant",
    ),
    "non-constant-pads": (
        _conv_skip("t = Pad(x, q)", inputs="float[1,2,6,6] x, int64[8] q"),
        "its pads input is not a constant",
    ),
    "non-constant-axes": (
        _conv_skip("t = Pad(x, p4, , a)", ", int64[4] p4 = {1, 1, 1, 1}",
                   inputs="float[1,2,6,6] x, int64[2] a", opset=18),
        "its axes input is not a constant",
    ),
    "channel-axis": (
        _conv_skip("t = Pad(x, pc)", ", int64[8] pc = {0, 1, 1, 1, 0, 0, 1, 1}",
                   conv_attrs="group = 1", inputs="float[1,1,6,6] x"),
        "it pads the batch or channel axis, which a Conv or pool cannot pad",
    ),
    "negative-pads": (
        _conv_skip("t = Pad(x, pn)", ", int64[8] pn = {0, 0, -1, 0, 0, 0, 1, 1}"),
        "it has negative pads, which crop instead of pad",
    ),
    "second-consumer": (
        _conv_skip("t = Pad(x, p)", more="z = Relu(t)",
                   outputs="float[1,2,?,?] y, float[1,2,8,8] z"),
        "the Pad output is also read by another node, which needs the padded tensor",
    ),
    "graph-output": (
        _conv_skip("t = Pad(x, p)", outputs="float[1,2,?,?] y, float[1,2,8,8] t"),
        "the Pad output is a graph output, so the padded tensor must stay",
    ),
    "auto-pad": (
        _conv_skip("t = Pad(x, p)", conv_attrs='auto_pad = "SAME_UPPER"'),
        "the Conv has auto_pad=SAME_UPPER, which computes its own pads",
    ),
    "auto-pad-same-lower": (
        _conv_skip("t = Pad(x, p)", conv_attrs='auto_pad = "SAME_LOWER"'),
        "the Conv has auto_pad=SAME_LOWER, which computes its own pads",
    ),
}

# ONNX forbids pads beside auto_pad (onnx.checker does not catch it; onnxruntime refuses
# the Conv), so the pass leaves such a Conv alone, even with pads all zero.
SKIPS["auto-pad-valid-with-pads"] = (
    _conv_skip("t = Pad(x, p)", conv_attrs='auto_pad = "VALID", pads = [1, 0, 0, 0]'),
    "the Conv has auto_pad=VALID and also pads [1, 0, 0, 0], which ONNX does not allow together",
)
SKIPS["auto-pad-valid-with-zero-pads"] = (
    _conv_skip("t = Pad(x, p)", conv_attrs='auto_pad = "VALID", pads = [0, 0, 0, 0]'),
    "the Conv has auto_pad=VALID and also pads [0, 0, 0, 0], which ONNX does not allow together",
)


@pytest.mark.parametrize("case", sorted(SKIPS))
def test_skips_with_reason(case):
    model, reason = SKIPS[case]
    _skips(model, reason)


def test_pad_feeding_another_op_is_skipped():
    model = parse(_header(17) + """
    g (float[1,2,6,6] x) => (float[1,2,8,8] y) <int64[8] p = {0, 0, 1, 1, 0, 0, 1, 1}> {
        t = Pad(x, p)
        y = Relu(t)
    }""")
    _skips(model, "it feeds Relu 'y', not a Conv, AveragePool or MaxPool")


def test_pad_as_conv_weights_is_skipped():
    model = parse(_header(17) + """
    g (float[1,2,6,6] x, float[2,2,1,1] w) => (float[1,2,?,?] y)
      <int64[8] p = {0, 0, 1, 1, 0, 0, 1, 1}> {
        t = Pad(w, p)
        y = Conv(x, t)
    }""")
    _skips(model, "it feeds Conv 'y' at another input than the data input")


def test_reports_when_there_is_no_pad():
    model = parse(_header(17) + """
    g (float[1,2,6,6] x) => (float[1,2,6,6] y) { y = Relu(x) }""")
    graph = to_graph(model)
    result = FusePadConv().run(graph, PassContext())
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [("graph", "no Pad in the graph")]
    assert_idempotent(FusePadConv(), model)
