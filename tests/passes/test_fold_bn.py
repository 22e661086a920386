"""fold-bn: exact ops after, onnxruntime numerics, checker, idempotence, every skip reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import fingerprint
from graphfix.passes.base import PassContext, PassResult
from graphfix.passes.fold_bn import FoldBatchNorm
from graphfix.runtime.session import run_model

FLOAT = TensorProto.FLOAT
BN_PARAMS = ("scale", "B", "mean", "var")


# ----------------------------------------------------------------------------- builders


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _bn_inits(rng: np.random.Generator, channels: int, dtype=np.float32, prefix: str = "bn"):
    values = {
        "scale": rng.uniform(0.5, 1.5, channels),
        "B": rng.uniform(-0.5, 0.5, channels),
        "mean": rng.uniform(-0.5, 0.5, channels),
        "var": rng.uniform(0.5, 1.5, channels),
    }
    return [_init(f"{prefix}_{k}", v.astype(dtype)) for k, v in values.items()]


def _bn(x: str, y: str, prefix: str = "bn", **attrs) -> onnx.NodeProto:
    inputs = [x] + [f"{prefix}_{p}" for p in BN_PARAMS]
    return helper.make_node("BatchNormalization", inputs, [y], name=prefix, **attrs)


def _value(name: str, shape, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills output shapes
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    return model


def _weights(rng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.3).astype(dtype)


def _feeds(model: onnx.ModelProto, **extra) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {}
    for inp in model.graph.input:
        if inp.name in extra:
            continue
        dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
    feeds.update(extra)
    return feeds


# ----------------------------------------------------------------------------- checks


def _fold(model: onnx.ModelProto) -> tuple[PassResult, onnx.ModelProto, gs.Graph]:
    graph = gs.import_onnx(model)
    result = FoldBatchNorm().run(graph, PassContext())
    graph.cleanup().toposort()
    return result, gs.export_onnx(graph), graph


def _ops(graph: onnx.GraphProto) -> list[str]:
    return [n.op_type for n in graph.node]


def _out_types(model: onnx.ModelProto) -> dict[str, int]:
    return {o.name: o.type.tensor_type.elem_type for o in model.graph.output}


def _assert_folds(model, ops, counts, feed_sets=None, rtol=1e-5, atol=1e-5) -> onnx.ModelProto:
    """Fold, then check ops, counts, checker, numerics, output names/dtypes, idempotence."""
    result, after, graph = _fold(model)
    assert result.changed
    assert dict(result.counts) == counts
    assert result.notes == []
    assert _ops(after.graph) == ops
    onnx.checker.check_model(after, full_check=True)
    assert _out_types(after) == _out_types(model)
    for feeds in feed_sets or [_feeds(model)]:
        before, got = run_model(model, feeds), run_model(after, feeds)
        assert set(got) == set(before)
        for name, ref in before.items():
            assert got[name].dtype == ref.dtype
            np.testing.assert_allclose(got[name], ref, rtol=rtol, atol=atol)
    snapshot = fingerprint(graph)
    again = FoldBatchNorm().run(graph, PassContext())
    assert not again.changed
    assert fingerprint(graph) == snapshot
    assert [n.reason for n in again.notes] == ["no BatchNormalization in the graph"]
    return after


def _conv_model(op, x_shape, w_shape, cout, bias=True, opset=17, dtype=np.float32, **attrs):
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [_init("W", _weights(rng, w_shape, dtype))]
    conv_inputs = ["x", "W"]
    if bias:
        inits.append(_init("b", _weights(rng, [cout], dtype)))
        conv_inputs.append("b")
    inits += _bn_inits(rng, cout, dtype)
    nodes = [
        helper.make_node(op, conv_inputs, ["c"], name="conv", **attrs),
        _bn("c", "n"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    return _model(nodes, [_value("x", x_shape, elem)], [_value("y", None, elem)], inits, opset)


# ----------------------------------------------------------------------------- folds


CONV_CASES = {
    "conv2d-bias": ("Conv", [1, 3, 8, 8], [4, 3, 3, 3], 4, True, {"pads": [1, 1, 1, 1]}),
    "conv2d-no-bias": ("Conv", [1, 3, 8, 8], [4, 3, 3, 3], 4, False, {}),
    "grouped-dilated": ("Conv", [1, 4, 9, 9], [6, 2, 3, 3], 6, True,
                        {"group": 2, "dilations": [2, 2]}),
    "depthwise": ("Conv", [1, 4, 8, 8], [4, 1, 3, 3], 4, False, {"group": 4}),
    "conv1d": ("Conv", [2, 3, 16], [5, 3, 3], 5, True, {"strides": [2]}),
    "conv3d": ("Conv", [1, 2, 5, 6, 7], [4, 2, 3, 3, 3], 4, True, {"pads": [1] * 6}),
    "conv-transpose": ("ConvTranspose", [1, 3, 5, 5], [3, 4, 3, 3], 4, True, {"strides": [2, 2]}),
    # Cin/g, Cout/g and g all differ, so a wrong [g, Cin/g, Cout/g] split cannot pass.
    "conv-transpose-group2": ("ConvTranspose", [1, 6, 5, 5], [6, 5, 3, 3], 10, True,
                              {"group": 2, "strides": [2, 2]}),
    "conv-transpose-group3-no-bias": ("ConvTranspose", [1, 6, 5, 5], [6, 4, 2, 2], 12, False,
                                      {"group": 3, "strides": [2, 1], "pads": [0, 1, 0, 1]}),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_folds_into_conv_family(case):
    op, x_shape, w_shape, cout, bias, attrs = CONV_CASES[case]
    model = _conv_model(op, x_shape, w_shape, cout, bias, **attrs)
    _assert_folds(model, [op, "Relu"], {f"folded BatchNormalization into {op}": 1})


def test_folds_opset11_without_spatial_attribute():
    model = _conv_model("Conv", [1, 3, 8, 8], [4, 3, 3, 3], 4, opset=11)
    assert all(a.name != "spatial" for n in model.graph.node for a in n.attribute)
    _assert_folds(model, ["Conv", "Relu"], {"folded BatchNormalization into Conv": 1})


def test_folds_fp16_and_keeps_fp16_weights():
    # fp16 keeps 11 significant bits: the folded W*s and b*s+t are rounded to fp16
    # once, where the reference rounds the Conv output and then the BN output. Outputs
    # reach |y| ~ 6, where one fp16 ulp is 2**-8 ~ 3.9e-3; that is the measured max
    # error, so 1e-2 allows about two ulps and still fails on a wrong fold.
    model = _conv_model("Conv", [1, 3, 8, 8], [4, 3, 3, 3], 4, dtype=np.float16)
    after = _assert_folds(
        model, ["Conv", "Relu"], {"folded BatchNormalization into Conv": 1}, rtol=1e-2, atol=1e-2
    )
    assert {i.data_type for i in after.graph.initializer} == {TensorProto.FLOAT16}


GEMM_C = {"none": None, "scalar": [], "row": [4], "row2d": [1, 4], "col": [5, 1], "full": [5, 4]}


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_kind", sorted(GEMM_C))
def test_folds_into_gemm(trans_b, c_kind):
    rng = np.random.default_rng(0)
    inits = [_init("B", _weights(rng, [4, 6] if trans_b else [6, 4]))]
    inputs = ["a", "B"]
    if GEMM_C[c_kind] is not None:
        inits.append(_init("C", _weights(rng, GEMM_C[c_kind])))
        inputs.append("C")
    inits += _bn_inits(rng, 4)
    nodes = [
        helper.make_node("Gemm", inputs, ["g"], name="gemm", transB=trans_b, alpha=0.7, beta=1.3),
        _bn("g", "y"),
    ]
    model = _model(nodes, [_value("a", [5, 6])], [_value("y", [5, 4])], inits)
    _assert_folds(model, ["Gemm"], {"folded BatchNormalization into Gemm": 1})


def test_folds_matmul_into_gemm():
    rng = np.random.default_rng(0)
    inits = [_init("W", _weights(rng, [6, 4]))] + _bn_inits(rng, 4)
    nodes = [helper.make_node("MatMul", ["a", "W"], ["m"], name="mm"), _bn("m", "n"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    model = _model(nodes, [_value("a", [5, 6])], [_value("y", [5, 4])], inits)
    _assert_folds(model, ["Gemm", "Relu"], {"folded BatchNormalization into MatMul": 1})


def _branch(rng, name: str, relu: bool) -> onnx.GraphProto:
    inits = [_init(f"{name}_W", _weights(rng, [4, 3, 3, 3]))] + _bn_inits(rng, 4, prefix=name)
    nodes = [helper.make_node("Conv", ["x", f"{name}_W"], [f"{name}_c"], name=f"{name}_conv"),
             _bn(f"{name}_c", f"{name}_n", prefix=name)]
    if relu:
        nodes.append(helper.make_node("Relu", [f"{name}_n"], [f"{name}_y"], name=f"{name}_relu"))
    out = f"{name}_y" if relu else f"{name}_n"
    return helper.make_graph(nodes, name, [], [_value(out, [1, 4, 6, 6])], inits)


def test_folds_inside_both_if_branches():
    rng = np.random.default_rng(0)
    node = helper.make_node("If", ["cond"], ["y"], name="if",
                            then_branch=_branch(rng, "then", True),
                            else_branch=_branch(rng, "else", False))
    model = _model([node], [_value("x", [1, 3, 8, 8]), _value("cond", [], TensorProto.BOOL)],
                   [_value("y", [1, 4, 6, 6])], [])
    x = np.random.default_rng(1).standard_normal([1, 3, 8, 8]).astype(np.float32)
    feed_sets = [{"x": x, "cond": np.array(c)} for c in (True, False)]
    after = _assert_folds(model, ["If"], {"folded BatchNormalization into Conv": 2}, feed_sets)
    branches = {a.name: _ops(a.g) for a in after.graph.node[0].attribute}
    assert branches == {"then_branch": ["Conv", "Relu"], "else_branch": ["Conv"]}


def test_keeps_graph_output_name_and_dtype():
    rng = np.random.default_rng(0)
    inits = [_init("W", _weights(rng, [4, 3, 3, 3]))] + _bn_inits(rng, 4)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), _bn("c", "probs")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("probs", [1, 4, 6, 6])], inits)
    after = _assert_folds(model, ["Conv"], {"folded BatchNormalization into Conv": 1})
    assert [(o.name, o.type.tensor_type.elem_type) for o in after.graph.output] == [
        ("probs", FLOAT)
    ]
    assert after.graph.node[0].output == ["probs"]


def test_folds_a_chain_of_two_batchnorms_in_one_run():
    rng = np.random.default_rng(0)
    inits = [_init("W", _weights(rng, [4, 3, 3, 3]))] + _bn_inits(rng, 4)
    inits += _bn_inits(rng, 4, prefix="bn2")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), _bn("c", "n"),
             _bn("n", "y", prefix="bn2")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])], [_value("y", [1, 4, 6, 6])], inits)
    _assert_folds(model, ["Conv"], {"folded BatchNormalization into Conv": 2})


def test_shared_weight_is_not_modified_for_the_other_conv():
    rng = np.random.default_rng(0)
    inits = [_init("W", _weights(rng, [4, 3, 3, 3]))] + _bn_inits(rng, 4)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"), _bn("c", "y1"),
             helper.make_node("Conv", ["x", "W"], ["y2"], name="plain")]
    model = _model(nodes, [_value("x", [1, 3, 8, 8])],
                   [_value("y1", [1, 4, 6, 6]), _value("y2", [1, 4, 6, 6])], inits)
    graph = gs.import_onnx(model)
    original = graph.tensors()["W"].values
    after = _assert_folds(model, ["Conv", "Conv"], {"folded BatchNormalization into Conv": 1})
    plain = next(n for n in after.graph.node if n.name == "plain")
    assert plain.input[1] == "W"
    kept = next(i for i in after.graph.initializer if i.name == "W")
    np.testing.assert_array_equal(numpy_helper.to_array(kept), original)


# ----------------------------------------------------------------------------- skips


def _skip_model(case: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    x = _value("x", [1, 3, 8, 8])
    inits = [_init("W", _weights(rng, [4, 3, 3, 3]))] + _bn_inits(rng, 4)
    conv = helper.make_node("Conv", ["x", "W"], ["c"], name="conv")
    outputs = [_value("y", [1, 4, 6, 6])]
    nodes, inputs = [conv, _bn("c", "y")], [x]
    if case == "second-consumer":
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outputs.append(_value("r", [1, 4, 6, 6]))
    elif case == "weights-input":
        inits, inputs = inits[1:], [x, _value("W", [4, 3, 3, 3])]
    elif case == "training":
        nodes[1] = helper.make_node(
            "BatchNormalization", nodes[1].input, ["y", "run_mean", "run_var"], name="bn",
            training_mode=1,
        )
    elif case == "mean-input":
        inits = [i for i in inits if i.name != "bn_mean"]
        inputs = [x, _value("bn_mean", [4])]
    elif case == "after-relu":
        nodes = [conv, helper.make_node("Relu", ["c"], ["r"], name="relu"), _bn("r", "y")]
    elif case == "conv-output-is-graph-output":
        outputs.append(_value("c", [1, 4, 6, 6]))
    elif case == "after-graph-input":
        nodes = [_bn("x", "y")]
        inits = _bn_inits(np.random.default_rng(0), 3)
        outputs = [_value("y", [1, 3, 8, 8])]
    return _model(nodes, inputs, outputs, inits)


# A copy of the 3x3 Conv (3 -> 4 channels) costs more than the layer it would save
# (`_conv_copy`): 144 outputs x 27 MACs / 16 + 192 inputs + 108 weights > 144.
_COPY_COST = (
    "copying Conv 'conv' to fold the BatchNormalization would add 3.89 kMAC and re-read 1.2"
    " kB (its input and weights) to save one read of its 576 B output (cost model: 543 "
    "element moves added, 144 saved), so it is not copied")

SKIPS = {
    "second-consumer": "the Conv output is also read by Relu 'relu'; " + _COPY_COST,
    "weights-input": "the Conv weights are not a constant",
    "training": "it is in training mode (training_mode=1), so it normalizes with batch statistics",
    "mean-input": "its mean input is not a constant",
    "after-relu": "it does not follow a Conv, ConvTranspose, Gemm or MatMul "
                  "(its input comes from Relu 'relu')",
    "conv-output-is-graph-output": "the Conv output is also a graph output; " + _COPY_COST,
    "after-graph-input": "it does not follow a Conv, ConvTranspose, Gemm or MatMul "
                         "(its input is a graph input)",
}


def _assert_skips(model: onnx.ModelProto, reason: str) -> None:
    graph = gs.import_onnx(model)
    snapshot = fingerprint(graph)
    result = FoldBatchNorm().run(graph, PassContext())
    assert not result.changed
    assert not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == [("BatchNormalization 'bn'", reason)]
    assert fingerprint(graph) == snapshot
    graph.cleanup().toposort()
    assert "BatchNormalization" in _ops(gs.export_onnx(graph).graph)


@pytest.mark.parametrize("case", sorted(SKIPS))
def test_skips_with_reason(case):
    _assert_skips(_skip_model(case), SKIPS[case])


def test_skips_matmul_with_rank3_output():
    rng = np.random.default_rng(0)
    inits = [_init("W", _weights(rng, [6, 4]))] + _bn_inits(rng, 2)
    nodes = [helper.make_node("MatMul", ["a", "W"], ["m"], name="mm"), _bn("m", "y")]
    model = _model(nodes, [_value("a", [3, 2, 6])], [_value("y", [3, 2, 4])], inits)
    reason = "the MatMul output has rank 3, so its columns are not the channel axis"
    _assert_skips(model, reason)


def test_skips_gemm_with_non_constant_c():
    rng = np.random.default_rng(0)
    inits = [_init("B", _weights(rng, [6, 4]))] + _bn_inits(rng, 4)
    nodes = [helper.make_node("Gemm", ["a", "B", "c_in"], ["g"], name="gemm"), _bn("g", "y")]
    model = _model(nodes, [_value("a", [5, 6]), _value("c_in", [4])], [_value("y", [5, 4])], inits)
    _assert_skips(model, "the Gemm C input is not a constant")


def test_reports_when_there_is_no_batchnorm():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                   [_value("x", [2, 3])], [_value("y", [2, 3])], [])
    graph = gs.import_onnx(model)
    result = FoldBatchNorm().run(graph, PassContext())
    assert not result.changed
    assert [n.reason for n in result.notes] == ["no BatchNormalization in the graph"]


# ----------------------------------------------------------------------------- real models


REAL_MODELS = {
    "mobilenet_v3_small_bn.onnx": ("input", [1, 3, 224, 224]),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": ("x", [1, 3, 48, 192]),
}


@pytest.mark.parametrize("filename", sorted(REAL_MODELS))
def test_real_model_folds_every_batchnorm(filename, shared_model):
    model = onnx.load(str(shared_model(filename)))  # read-only: never saved back
    bn_count = _ops(model.graph).count("BatchNormalization")
    result, after, graph = _fold(model)
    assert result.notes == []
    assert sum(result.counts.values()) == bn_count > 0
    assert "BatchNormalization" not in _ops(after.graph)
    onnx.checker.check_model(after, full_check=True)
    name, shape = REAL_MODELS[filename]
    feeds = {name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    before, got = run_model(model, feeds), run_model(after, feeds)
    for out, ref in before.items():
        np.testing.assert_allclose(got[out], ref, rtol=1e-4, atol=1e-5)
        # The outputs can be small (mobilenet's peak is ~3e-2), so also bound the
        # error relative to the output's scale; measured ~4e-7.
        assert np.abs(got[out] - ref).max() <= 1e-5 * np.abs(ref).max()
    snapshot = fingerprint(graph)
    assert not FoldBatchNorm().run(graph, PassContext()).changed
    assert fingerprint(graph) == snapshot


@pytest.mark.parametrize("shape,dtype", [((700, 300, 1, 1), np.float32),
                                         ((64, 3, 7, 7), np.float32),
                                         ((33, 5, 3, 3), np.float16),
                                         ((3, 1, 3), np.float64)])
def test_blocked_scaling_gives_the_bits_of_float64_math(shape, dtype, monkeypatch):
    from graphfix.passes import fold_bn

    monkeypatch.setattr(fold_bn, "_BLOCK", 4096)  # several blocks, the last one partial
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(dtype)
    s = rng.standard_normal((shape[0],) + (1,) * (len(shape) - 1))
    expected = (w.astype(np.float64) * s).astype(dtype)
    got = fold_bn._scaled(w, s)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.view(f"u{np.dtype(dtype).itemsize}"),
                                  expected.view(f"u{np.dtype(dtype).itemsize}"))


def _many_convs(rng, count: int, w_shape) -> onnx.ModelProto:
    """x -> (Conv -> BN) x count, each Conv with its own weight of `w_shape` (scaled so
    the outputs stay near 1)."""
    c = w_shape[0]
    inits, nodes, x = [], [], "x"
    for i in range(count):
        inits.append(_init(f"W{i}", _weights(rng, w_shape) / np.float32(4)))
        inits += _bn_inits(rng, c, prefix=f"bn{i}")
        nodes += [helper.make_node("Conv", [x, f"W{i}"], [f"c{i}"], name=f"conv{i}",
                                   pads=[1, 1, 1, 1]), _bn(f"c{i}", f"n{i}", prefix=f"bn{i}")]
        x = f"n{i}"
    nodes[-1].output[0] = "y"
    return _model(nodes, [_value("x", [1, c, 6, 6])], [_value("y", [1, c, 6, 6])], inits)


@pytest.mark.parametrize("threshold", [1, 10**9])  # every weight in workers; none
def test_large_conv_weights_computed_in_workers_give_the_same_bits(threshold, monkeypatch):
    from graphfix.passes import fold_bn

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", threshold)
    rng = np.random.default_rng(3)
    model = _many_convs(rng, 6, [16, 16, 3, 3])
    after = _assert_folds(model, ["Conv"] * 6, {"folded BatchNormalization into Conv": 6})
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in (n for n in after.graph.node if n.op_type == "Conv"):
        i = node.name.removeprefix("conv")
        bn = {p: inits[f"bn{i}_{p}"].astype(np.float64) for p in BN_PARAMS}
        s = bn["scale"] / np.sqrt(bn["var"] + 1e-5)
        expected = (inits[f"W{i}"].astype(np.float64) * s[:, None, None, None]).astype(
            np.float32)
        got = next(numpy_helper.to_array(t) for t in after.graph.initializer
                   if t.name == node.input[1])
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_no_pending_weight_outlives_the_pass(monkeypatch):
    from graphfix.passes import fold_bn

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", 1)
    graph = gs.import_onnx(_many_convs(np.random.default_rng(0), 3, [8, 8, 3, 3]))
    assert FoldBatchNorm().run(graph, PassContext()).changed
    values = [t._values for t in graph.tensors().values() if isinstance(t, gs.Constant)]
    assert not any(isinstance(v, fold_bn._Pending) for v in values)
    assert not any(t.name.startswith("graphfix-fold-bn") for t in __import__(
        "threading").enumerate())


def _shared_weight_graph(values) -> tuple[gs.Graph, dict[str, np.ndarray]]:
    """x -> Conv(W) -> BN a, x -> Conv(W) -> BN b: one weight constant, whose values are
    `values` (an array or lazy values), read by both Convs; the expected new weights."""
    rng = np.random.default_rng(5)
    w = _weights(rng, [8, 8, 3, 3])
    inits = [_init("W", w)] + _bn_inits(rng, 8, prefix="a") + _bn_inits(rng, 8, prefix="b")
    nodes = []
    for p in "ab":
        nodes += [helper.make_node("Conv", ["x", "W"], [f"c{p}"], name=f"conv{p}",
                                   pads=[1, 1, 1, 1]), _bn(f"c{p}", f"y{p}", prefix=p)]
    model = _model(nodes, [_value("x", [1, 8, 6, 6])],
                   [_value("ya", [1, 8, 6, 6]), _value("yb", [1, 8, 6, 6])], inits)
    stats = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in inits}
    expected = {}
    for p in "ab":
        scale = stats[f"{p}_scale"] / np.sqrt(stats[f"{p}_var"] + 1e-5)
        expected[f"conv{p}"] = (w.astype(np.float64) * scale[:, None, None, None]).astype(
            np.float32)
    graph = gs.import_onnx(model)
    graph.tensors()["W"].values = values(w) if callable(values) else values
    return graph, expected


def _folded_weights(graph: gs.Graph) -> dict[str, np.ndarray]:
    from graphfix.graph import constant_value

    return {n.name: constant_value(n.inputs[1]) for n in graph.nodes if n.op == "Conv"}


def test_a_weight_read_fresh_is_scaled_in_place_and_an_array_in_memory_never(monkeypatch):
    # the two Convs read one weight; a fold that scaled an array it does not own in
    # place would give the second Conv the weight scaled twice
    from graphfix.graph.convert import spilled
    from graphfix.passes import fold_bn
    from graphfix.spill import Spill

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", 1)
    scaled_in_place = []
    scaled = fold_bn._scaled

    def recording(w, s, in_place=False):
        scaled_in_place.append(in_place)
        return scaled(w, s, in_place)

    monkeypatch.setattr(fold_bn, "_scaled", recording)
    # in memory: gs's own array, never written
    graph, expected = _shared_weight_graph(lambda w: w)
    shared = graph.tensors()["W"].values
    before = shared.copy()
    assert FoldBatchNorm().run(graph, PassContext()).changed
    assert scaled_in_place == [False, False]
    np.testing.assert_array_equal(shared, before)
    for name, got in _folded_weights(graph).items():
        np.testing.assert_array_equal(got, expected[name])
    # deferred (the input's weights in their file): each read is a fresh array
    with Spill() as spill:
        graph, expected = _shared_weight_graph(lambda w: spilled(spill, "W", w))
        scaled_in_place.clear()
        assert FoldBatchNorm().run(graph, PassContext()).changed
        assert scaled_in_place == [True, True]
        for name, got in _folded_weights(graph).items():
            np.testing.assert_array_equal(got, expected[name])


def test_workers_write_the_new_weights_to_the_runs_spill(monkeypatch):
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from graphfix import weights
    from graphfix.passes import fold_bn
    from graphfix.spill import Spill

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", 1)
    rng = np.random.default_rng(3)
    model = _many_convs(rng, 4, [16, 16, 3, 3])
    # a BatchNormalization after the last one: folded into the weight a worker spilled
    # in the same run (a fold of a fold reads it back)
    model.graph.initializer.extend(_bn_inits(rng, 16, prefix="again"))
    model.graph.node[-1].output[0] = "n3"
    model.graph.node.append(_bn("n3", "y", prefix="again"))
    expected = _assert_folds(model, ["Conv"] * 4, {"folded BatchNormalization into Conv": 5})
    graph = gs.import_onnx(model)
    with Spill() as spill:
        ctx = PassContext()
        ctx.spill = spill
        assert FoldBatchNorm().run(graph, ctx).changed
        graph.cleanup().toposort()
        convs = [n for n in graph.nodes if n.op == "Conv"]
        for conv in convs:
            values = conv.inputs[1]._values
            assert isinstance(values, LazyValues) and weights.is_deferred(values.tensor)
        assert spill.bytes >= 5 * 16 * 16 * 9 * 4  # the refolded weight written again
        got = gs.export_onnx(graph)
        for want, have in zip(expected.graph.node, got.graph.node, strict=True):
            assert want.op_type == have.op_type
        feeds = _feeds(model)
        np.testing.assert_array_equal(run_model(got, feeds)["y"], run_model(expected, feeds)["y"])


def test_weights_in_their_file_are_scaled_block_by_block_into_the_spill(tmp_path, monkeypatch):
    # the input's weights deferred to its file (io.load(weights=False)); each new weight
    # is read, scaled and written a few output channels at a time, the last block short
    from graphfix import io, weights
    from graphfix.graph import to_graph
    from graphfix.passes import fold_bn
    from graphfix.spill import Spill

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", 1)
    monkeypatch.setattr(fold_bn, "_BLOCK", 3 * 16 * 9)  # 3 of 16 output channels a block
    pieces = []
    read_into = weights.PieceReader.read_into
    monkeypatch.setattr(weights.PieceReader, "read_into",
                        lambda self, out, at: pieces.append((at, out.size))
                        or read_into(self, out, at))
    rng = np.random.default_rng(8)
    model = _many_convs(rng, 3, [16, 16, 3, 3])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    graph = to_graph(io.load(path, weights=False))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with Spill() as spill:
        ctx = PassContext()
        ctx.spill = spill
        assert FoldBatchNorm().run(graph, ctx).changed
        # per weight: channels 0-2, 3-5, 6-8, 9-11, 12-14, then 15 alone
        one = [(at, 3 * 144) for at in range(0, 15 * 144, 3 * 144)] + [(15 * 144, 144)]
        assert sorted(pieces) == sorted(one * 3)
        for conv in (n for n in graph.nodes if n.op == "Conv"):
            i = conv.name.removeprefix("conv")
            bn = {p: inits[f"bn{i}_{p}"].astype(np.float64) for p in BN_PARAMS}
            scale = bn["scale"] / np.sqrt(bn["var"] + 1e-5)
            w = inits[f"W{i}"]
            expected = (w.astype(np.float64) * scale[:, None, None, None]).astype(w.dtype)
            lazy = conv.inputs[1]._values
            assert weights.is_deferred(lazy.tensor)
            got = lazy.load()
            assert got.dtype == w.dtype
            bits = f"u{w.dtype.itemsize}"
            np.testing.assert_array_equal(got.view(bits), expected.view(bits))
            assert lazy.sample == weights.sample(expected)


def test_a_worker_that_fails_fails_the_pass(monkeypatch):
    from graphfix.passes import fold_bn

    monkeypatch.setattr(fold_bn, "_ASYNC_MIN_ELEMENTS", 1)

    def broken(w, s, in_place=False):
        raise MemoryError("no room for the new weight")

    monkeypatch.setattr(fold_bn, "_scaled", broken)
    graph = gs.import_onnx(_many_convs(np.random.default_rng(0), 2, [8, 8, 3, 3]))
    with pytest.raises(MemoryError, match="no room"):
        FoldBatchNorm().run(graph, PassContext())


def test_a_weight_of_a_type_numpy_lacks_stays_on_the_checked_path():
    # gs gives bfloat16 (no ml_dtypes) as ONNX's type number: no worker, no np.dtype error
    from onnx_graphsurgeon.ir.tensor import LazyValues

    from graphfix.passes import fold_bn

    def conv(tensor):
        return gs.Node("Conv", inputs=[gs.Variable("x"), gs.Constant(tensor.name,
                                                                      LazyValues(tensor))],
                       outputs=[gs.Variable("y")])

    big = [256, 256, 1]
    bf16 = helper.make_tensor("w", TensorProto.BFLOAT16, big, vals=[0] * 65536)
    f32 = helper.make_tensor("v", FLOAT, big, vals=[0.0] * 65536)
    assert fold_bn._large_weight(conv(bf16)) is None
    assert fold_bn._large_weight(conv(f32)) is not None
