"""Chains whose Conv output has a second reader: fold into a copy of the Conv when the
cost model (`graphfix.passes._conv_copy`) says it is cheaper, else say why, with numbers.

Every model here is x -> Conv 'conv' -> c, with c also read elsewhere (a GlobalAveragePool
'pool', or the graph outputs). Which Convs the model copies, per output element (K MACs,
r input elements; copied when K / 16 + r + weights / outputs < 1):

- depthwise 3x3 with 4 outputs per input channel: 9/16 + 1/4 + small -> copied;
- expanding 1x1, 8 -> 64 channels: 8/16 + 1/8 + small -> copied;
- plain depthwise 3x3 (r = 1): 9/16 + 1 -> not copied;
- 3x3, 32 -> 32 channels: 288/16 + 1 -> not copied.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import (
    apply,
    assert_idempotent,
    assert_same_outputs,
    build_model,
    feeds_for,
    init,
    ops,
    output_types,
    seeded,
    value,
)
from onnx import helper, numpy_helper

import graphfix
from graphfix.explain import explain
from graphfix.graph import to_graph
from graphfix.passes.base import LIMIT_REACHED, PassContext, RewriteBudget
from graphfix.passes.fold_bn import FoldBatchNorm
from graphfix.passes.fuse_conv_bias import FuseConvBias
from graphfix.passes.fuse_conv_mul import FuseConvMul
from graphfix.report import ROLLED_BACK
from graphfix.runtime.session import run_model

# (x shape, W shape, Conv attributes) of the Convs in the module docstring.
DEPTHWISE_X4 = ((1, 8, 16, 16), (32, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]})
EXPAND_1X1 = ((1, 8, 16, 16), (64, 8, 1, 1), {})
DEPTHWISE = ((1, 8, 16, 16), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]})
BIG_3X3 = ((1, 32, 16, 16), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]})


def _scale(channels: int, seed: int) -> np.ndarray:
    """Per-channel values in [0.5, 1.5) with both signs, shape [1, C, 1, 1]."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.5, 1.5, channels) * rng.choice([-1, 1], channels)).astype(
        np.float32).reshape(1, channels, 1, 1)


def _bn_inits(channels: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(5)
    return [init("bn_scale", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
            init("bn_B", rng.normal(size=channels).astype(np.float32)),
            init("bn_mean", rng.normal(size=channels).astype(np.float32)),
            init("bn_var", rng.uniform(0.5, 1.5, channels).astype(np.float32))]


def _chain(conv=DEPTHWISE_X4, chain="mul-add", second="pool", relu=True, x_dims=None,
           op="Conv", seed=0) -> onnx.ModelProto:
    """x -> `op` 'conv'(W, b) -> c -> `chain` -> [Relu 'relu'] -> y, with c also read by
    `second`: "pool" (GlobalAveragePool 'pool' -> graph output p), "output" (c is a graph
    output), or "both". `seed` varies the weights."""
    x_shape, w_shape, attrs = conv
    cout = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    inits = [init("W", seeded(w_shape, seed=seed)), init("b", seeded([cout], seed=seed + 1))]
    nodes = [helper.make_node(op, ["x", "W", "b"], ["c"], name="conv", **attrs)]
    last = "c"
    for i, step in enumerate(chain.split("-")):
        if step == "bn":
            inits += _bn_inits(cout)
            nodes.append(helper.make_node("BatchNormalization",
                                          [last, "bn_scale", "bn_B", "bn_mean", "bn_var"],
                                          ["bn"], name="bn"))
        else:
            inits.append(init(f"{step}_k", _scale(cout, seed=seed + 2 + i)))
            nodes.append(helper.make_node(step.capitalize(), [last, f"{step}_k"], [step],
                                          name=step))
        last = step
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
    outputs = [value("y" if relu else last, None)]
    if second in ("pool", "both"):
        nodes.append(helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"))
        outputs.append(value("p", None))
    if second in ("output", "both"):
        outputs.append(value("c", None))
    return build_model(nodes, [value("x", list(x_dims or x_shape))], outputs, inits)


def _fold(model, *passes, ctx=None):
    """Run `passes` in order the way the manager does; the result and each PassResult."""
    results = []
    for pass_ in passes:
        model, result = apply(pass_, model, ctx)
        results.append(result)
    return model, results


def _ops(model) -> list[str]:
    """The model's ops, sorted: what is there, whatever order toposort chose."""
    return sorted(ops(model))


def _notes(result) -> list[tuple[str, str]]:
    return [(n.subject, n.reason) for n in result.notes]


def _assert_same(model, out, **shapes):
    assert output_types(out) == output_types(model)
    for seed in (0, 1):
        assert_same_outputs(model, out, feeds_for(model, seed, **shapes))


# ----------------------------------------------------------------------------- copies


def test_depthwise_with_a_channel_multiplier_is_copied_for_mul_and_add():
    model = _chain(DEPTHWISE_X4)
    out, (mul, bias) = _fold(model, FuseConvMul(), FuseConvBias())
    assert dict(mul.counts) == {"fused Mul into Conv weights, on a copy of the Conv": 1}
    assert dict(bias.counts) == {"fused Add into Conv bias": 1}  # the copy's only reader
    assert mul.notes == bias.notes == []
    assert _ops(out) == ["Conv", "Conv", "GlobalAveragePool", "Relu"]
    _assert_same(model, out)
    conv, copy = out.graph.node[:2]
    assert (conv.name, copy.name) == ("conv", "conv_copy")
    assert list(conv.input) == ["x", "W", "b"] and list(conv.output) == ["c"]
    assert copy.input[0] == "x" and not {"W", "b"} & set(copy.input[1:])  # its own weights
    assert list(copy.output) == ["add"] and copy.attribute == conv.attribute
    assert_idempotent(FuseConvMul(), out)
    assert_idempotent(FuseConvBias(), out)


def test_expanding_1x1_conv_is_copied_for_a_bias_add():
    model = _chain(EXPAND_1X1, chain="add")
    out, (bias,) = _fold(model, FuseConvBias())
    assert dict(bias.counts) == {"fused Add into Conv bias, on a copy of the Conv": 1}
    assert _ops(out) == ["Conv", "Conv", "GlobalAveragePool", "Relu"]
    _assert_same(model, out)
    assert out.graph.node[1].input[1] == "W"  # the unchanged weight is shared, read only
    assert_idempotent(FuseConvBias(), out)


def test_batchnorm_folds_into_a_copy():
    model = _chain(DEPTHWISE_X4, chain="bn")
    out, (bn,) = _fold(model, FoldBatchNorm())
    assert dict(bn.counts) == {"folded BatchNormalization into Conv, on a copy of the Conv": 1}
    assert _ops(out) == ["Conv", "Conv", "GlobalAveragePool", "Relu"]
    _assert_same(model, out)
    assert_idempotent(FoldBatchNorm(), out)


def test_conv_transpose_is_copied():
    # ConvTranspose 4 -> 8 channels, stride 2: 256 inputs x 8 x 2 x 2 = 8192 MACs (/16 =
    # 512) + 256 inputs + 136 weights = 904 element moves added, 2048 saved.
    model = _chain(((1, 4, 8, 8), (4, 8, 2, 2), {"strides": [2, 2]}), chain="mul",
                   op="ConvTranspose")
    out, (mul,) = _fold(model, FuseConvMul())
    assert dict(mul.counts) == {
        "fused Mul into ConvTranspose weights, on a copy of the ConvTranspose": 1}
    assert _ops(out) == ["ConvTranspose", "ConvTranspose", "GlobalAveragePool", "Relu"]
    _assert_same(model, out)


def test_shared_weight_stays_for_the_conv_and_its_other_user():
    model = _chain(EXPAND_1X1, chain="mul")
    other = helper.make_node("Conv", ["x", "W"], ["o"], name="other")
    model = build_model([*model.graph.node, other], list(model.graph.input),
                        [*(value(o.name, None) for o in model.graph.output), value("o", None)],
                        list(model.graph.initializer))
    out, (mul,) = _fold(model, FuseConvMul())
    assert dict(mul.counts) == {"fused Mul into Conv weights, on a copy of the Conv": 1}
    _assert_same(model, out)
    readers = sorted(n.name for n in out.graph.node if "W" in n.input)
    assert readers == ["conv", "other"]
    kept = next(i for i in out.graph.initializer if i.name == "W")
    np.testing.assert_array_equal(numpy_helper.to_array(kept), seeded([64, 8, 1, 1]))


@pytest.mark.parametrize("second", ["pool", "output", "both"])
def test_chain_ending_in_a_graph_output_keeps_its_name(second):
    model = _chain(DEPTHWISE_X4, chain="mul-add", second=second, relu=False)
    out, (mul, bias) = _fold(model, FuseConvMul(), FuseConvBias())
    assert dict(mul.counts) == {"fused Mul into Conv weights, on a copy of the Conv": 1}
    assert sum(bias.counts.values()) == 1
    copy = next(n for n in out.graph.node if n.name == "conv_copy")
    assert list(copy.output) == ["add"]  # the chain's graph output, written by the copy
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    _assert_same(model, out)
    assert_idempotent(FuseConvMul(), out)


def test_dynamic_input_is_sized_at_the_runs_input_shapes():
    model = _chain(EXPAND_1X1, chain="mul", x_dims=[1, 8, "H", "W"])
    graph = to_graph(model)
    result = FuseConvMul().run(graph, PassContext())
    assert not result.changed
    assert _notes(result) == [("Mul 'mul'", (
        "the Conv output is also read by GlobalAveragePool 'pool'; whether a copy of Conv "
        "'conv' for the Mul is cheaper is not known: the size of its input is not static at "
        "the run's input shapes, and a copy is made only when the cost model shows it "
        "cheaper"))]
    ctx = PassContext(input_shapes={"x": (1, 8, 16, 16)})
    out, (mul,) = _fold(model, FuseConvMul(), ctx=ctx)
    assert dict(mul.counts) == {"fused Mul into Conv weights, on a copy of the Conv": 1}
    _assert_same(model, out, x=(1, 8, 16, 16))


def test_a_later_pass_sizes_from_the_shapes_an_earlier_one_inferred(monkeypatch):
    """Inference at the run's input shapes happens once: what it found is in the run's
    context (`PassContext.static_shapes`), and the next pass (or round) that must size
    the same Conv reads it there."""
    from graphfix.passes import _conv_copy

    model = _chain(EXPAND_1X1, chain="mul", x_dims=[1, 8, "H", "W"])
    ctx = PassContext(input_shapes={"x": (1, 8, 16, 16)})
    inferred = []
    real = _conv_copy._infer
    monkeypatch.setattr(_conv_copy, "_infer", lambda *a: inferred.append(1) or real(*a))
    # a pass that sizes the Conv and folds nothing (no BatchNormalization to fold)...
    graph = to_graph(model)
    books = _conv_copy.ConvCopies(graph, ctx.input_shapes, set(), ctx.static_shapes)
    conv = next(n for n in graph.nodes if n.op == "Conv")
    assert _conv_copy.copy_cost(conv, books.shapes).macs == 16 * 16 * 64 * 8
    assert inferred == [1] and ctx.static_shapes[conv.outputs[0].name] == (1, 64, 16, 16)
    # ...then fuse-conv-mul in the same run: the copy is decided without inferring again
    out, (mul,) = _fold(model, FuseConvMul(), ctx=ctx)
    assert dict(mul.counts) == {"fused Mul into Conv weights, on a copy of the Conv": 1}
    assert inferred == [1]
    _assert_same(model, out, x=(1, 8, 16, 16))


# ----------------------------------------------------------------------------- refusals


def _assert_refuses(pass_, model, subject, reason):
    graph = to_graph(model)
    result = pass_.run(graph, PassContext())
    assert not result.changed and not result.counts
    assert _notes(result) == [(subject, reason)]
    out, _ = apply(pass_, model)
    assert _ops(out) == _ops(model)


def test_big_conv_is_not_copied_and_the_note_gives_the_numbers():
    # 8192 outputs x 288 MACs = 2.36 MMAC (/16 = 147,456) + 8192 inputs + 9248 weights
    # = 164,896 element moves added, against 8192 saved (32.8 kB of fp32).
    reason = ("the Conv output is also read by GlobalAveragePool 'pool'; copying Conv 'conv' "
              "to fold the Mul would add 2.36 MMAC and re-read 69.8 kB (its input and "
              "weights) to save one read of its 32.8 kB output (cost model: 164,896 element "
              "moves added, 8,192 saved), so it is not copied")
    _assert_refuses(FuseConvMul(), _chain(BIG_3X3, chain="mul"), "Mul 'mul'", reason)


def test_plain_depthwise_is_not_copied():
    # r = 1: the copy re-reads an input as large as the output read it saves.
    reason = ("the Conv output is also read by GlobalAveragePool 'pool' and a graph output; "
              "copying Conv 'conv' to fold the BatchNormalization would add 18.4 kMAC and "
              "re-read 8.51 kB (its input and weights) to save one read of its 8.19 kB output "
              "(cost model: 3,280 element moves added, 2,048 saved), so it is not copied")
    _assert_refuses(FoldBatchNorm(), _chain(DEPTHWISE, chain="bn", second="both"),
                    "BatchNormalization 'bn'", reason)


@pytest.mark.parametrize("pass_, chain, second, module, scaler", [
    (FuseConvMul, "mul", "pool", "graphfix.passes.fuse_conv_mul", "scale_out_channels"),
    (FoldBatchNorm, "bn", "both", "graphfix.passes.fold_bn", "_scaled"),
])
def test_a_fold_the_copy_rule_refuses_never_scales_weights(monkeypatch, pass_, chain, second,
                                                           module, scaler):
    """The plan is made before the Conv-copy cost model decides; its new weights are
    computed only for a fold that is made (maxvit_t: 23 refused folds per run)."""
    import importlib

    scaled = []
    target = importlib.import_module(module)
    original = getattr(target, scaler)
    monkeypatch.setattr(target, scaler, lambda *a: scaled.append(1) or original(*a))
    refused = _chain(BIG_3X3 if chain == "mul" else DEPTHWISE, chain=chain, second=second)
    result = pass_().run(to_graph(refused), PassContext())
    assert not result.changed and "so it is not copied" in str(result.notes[0])
    assert scaled == []
    made = _chain(DEPTHWISE_X4, chain=chain, second=second)
    assert pass_().run(to_graph(made), PassContext()).changed
    assert scaled == [1]


def _decomposed_hardswish() -> onnx.ModelProto:
    """x -> Conv (8 -> 64, 1x1: cheap to copy) -> c; y = c * Clip(c + 3, 0, 6) / 6."""
    inits = [init("W", seeded([64, 8, 1, 1])), init("three", np.array(3.0, np.float32)),
             init("zero", np.array(0.0, np.float32)), init("six", np.array(6.0, np.float32))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "three"], ["a"], name="add"),
             helper.make_node("Clip", ["a", "zero", "six"], ["h"], name="clip"),
             helper.make_node("Mul", ["c", "h"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "six"], ["y"], name="div")]
    return build_model(nodes, [value("x", [1, 8, 16, 16])], [value("y", None)], inits)


def test_decomposed_hardswish_is_not_a_bias_chain():
    model = _decomposed_hardswish()
    _assert_refuses(FuseConvBias(), model, "Add 'add'", (
        "it is the + 3 of a decomposed HardSwish, x * Clip(x + 3, 0, 6) / 6, whose Mul 'mul' "
        "reads the Conv output too: it is part of one elementwise expression of the Conv "
        "output, not a scale or bias of its own, so copying the Conv would add work and "
        "remove nothing"))
    _assert_refuses(FuseConvMul(), model, "Mul 'mul'",
                    "its other input 'h' is not a constant (it comes from Clip 'clip')")


def test_other_expressions_of_the_conv_output_name_the_node_that_meets_it():
    model = _decomposed_hardswish()
    model.graph.node[1].input[1] = "six"  # c + 6: no longer a HardSwish
    _assert_refuses(FuseConvBias(), model, "Add 'add'", (
        "Mul 'mul' reads both its result and the Conv output: it is part of one elementwise "
        "expression of the Conv output, not a scale or bias of its own, so copying the Conv "
        "would add work and remove nothing"))


def test_gemm_is_not_copied():
    inits = [init("B", seeded([8, 4])), init("t", seeded([4], seed=1))]
    nodes = [helper.make_node("Gemm", ["a", "B"], ["g"], name="gemm"),
             helper.make_node("Add", ["g", "t"], ["y"], name="add"),
             helper.make_node("Relu", ["g"], ["r"], name="relu")]
    model = build_model(nodes, [value("a", [2, 8])], [value("y", None), value("r", None)],
                        inits)
    _assert_refuses(FuseConvBias(), model, "Add 'add'", (
        "the Gemm output is also read by Relu 'relu', which needs it without the Add; only a "
        "Conv or ConvTranspose is copied for that (a Gemm copy repeats a whole matrix "
        "product)"))


def test_rewrite_limit_stops_the_copy():
    model = _chain(EXPAND_1X1, chain="mul")
    graph = to_graph(model)
    result = FuseConvMul().run(graph, PassContext(rewrites=RewriteBudget(0)))
    assert not result.changed and _notes(result) == [("Mul 'mul'", LIMIT_REACHED)]
    assert _ops(model) == ["Conv", "GlobalAveragePool", "Mul", "Relu"]


# ----------------------------------------------------------------------------- explain


def test_explain_gives_the_verdict_per_chain():
    chains = {c.conv: c for c in explain(_chain(EXPAND_1X1, chain="mul")).chains}
    chain = chains["Conv 'conv'"]
    assert (chain.kind, chain.blocker, chain.fix) == ("broken", "Mul 'mul'", "fuse-conv-mul")
    (chain,) = explain(_chain(BIG_3X3, chain="bn")).chains
    assert (chain.kind, chain.blocker, chain.fix) == ("broken", "BatchNormalization 'bn'", "")
    assert chain.reason.startswith("the Conv output is also read by GlobalAveragePool 'pool'; "
                                   "copying Conv 'conv' to fold the BatchNormalization would "
                                   "add 2.36 MMAC")
    (chain,) = explain(_decomposed_hardswish()).chains
    assert chain.blocker == "Add 'add'" and "decomposed HardSwish" in chain.reason


# ----------------------------------------------------------------------------- trt-prep


def _two_chains() -> onnx.ModelProto:
    """A copied chain (depthwise x4 -> BN -> Relu) and a refused one (3x3 32 -> 32 ->
    Mul -> Add -> Relu), each Conv output also pooled."""
    a, b = _chain(DEPTHWISE_X4, chain="bn"), _chain(BIG_3X3, chain="mul-add", seed=10)
    for node in b.graph.node:
        node.name = f"big_{node.name}"
        node.input[:] = [n if n == "x" else f"big_{n}" for n in node.input]
        node.output[:] = [f"big_{n}" for n in node.output]
    for tensor in b.graph.initializer:
        tensor.name = f"big_{tensor.name}"
    b.graph.node[0].input[0] = "a_relu"
    nodes = [*a.graph.node, helper.make_node("Conv", ["y", "widen"], ["a_relu"], name="widen"),
             *b.graph.node]
    inits = [*a.graph.initializer, *b.graph.initializer, init("widen", seeded([32, 32, 1, 1]))]
    outputs = [value(n, None) for n in ("p", "big_y", "big_p")]
    return build_model(nodes, [value("x", [1, 8, 16, 16])], outputs, inits)


def _changes(report) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in report.passes:
        for what, n in record.counts.items():
            counts[f"{record.spec}: {what}"] = counts.get(f"{record.spec}: {what}", 0) + n
    return counts


def test_trt_prep_reaches_a_fixed_point_with_the_copy():
    model = _two_chains()
    result = graphfix.run(model, passes="trt-prep")
    report = result.report
    assert report.check.enabled
    assert not [r.spec for r in report.passes if r.status == ROLLED_BACK]
    assert _changes(report) == {
        "fold-bn: folded BatchNormalization into Conv, on a copy of the Conv": 1}
    assert _ops(result.model) == sorted(
        ["Conv", "Conv", "Relu", "GlobalAveragePool", "Conv", "Conv", "Mul", "Add", "Relu",
         "GlobalAveragePool"])
    onnx.checker.check_model(result.model, full_check=True)
    again = graphfix.run(result.model, passes="trt-prep")
    assert _changes(again.report) == {}  # merge-duplicates keeps the copy, nothing re-folds
    assert ops(again.model) == ops(result.model)
    # Three Convs deep (the copy's 8 -> 32 depthwise, then 32 -> 32 1x1 and 3x3) the
    # reassociated fold shows as a few fp32 ulps of the largest output (|big_y| ~ 46,
    # errors ~1.5e-5 = 3e-7 of it); a wrong fold errs by whole percents.
    for seed in (0, 1):
        feeds = feeds_for(model, seed)
        want, got = run_model(model, feeds), run_model(again.model, feeds)
        for name, ref in want.items():
            scale = float(np.abs(ref).max())
            np.testing.assert_allclose(got[name], ref, rtol=0, atol=1e-6 * scale, err_msg=name)


def test_a_dim_named_like_an_input_dim_is_sized_without_inference(monkeypatch):
    """A Conv output the graph records as [N, 64, 16, 16], with the input [N, 8, 16, 16]
    given as 1x8x16x16: N is 1 there (ONNX inference names a dim after the input's when
    it is that dim), so no inference runs; a name given two sizes is not used."""
    import onnx_graphsurgeon as gs

    from graphfix.passes import _conv_copy

    model = onnx.shape_inference.infer_shapes(_chain(EXPAND_1X1, chain="mul",
                                                     x_dims=["N", 8, 16, 16]))
    inferred = []
    real = _conv_copy._infer
    monkeypatch.setattr(_conv_copy, "_infer", lambda *a: inferred.append(1) or real(*a))
    graph = to_graph(model)
    conv = next(n for n in graph.nodes if n.op == "Conv")
    assert conv.outputs[0].shape == ["N", 64, 16, 16]
    book = _conv_copy.ShapeBook(graph, {"x": (1, 8, 16, 16)})
    assert _conv_copy.copy_cost(conv, book).macs == 16 * 16 * 64 * 8
    assert inferred == []
    # two inputs that say N twice, with two sizes: inference decides
    graph.inputs.append(gs.Variable("z", np.float32, ["N"]))
    book = _conv_copy.ShapeBook(graph, {"x": (1, 8, 16, 16), "z": (3,)})
    book.shape(conv.outputs[0])
    assert inferred == [1]
