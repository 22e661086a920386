"""unfuse-contrib on the fusions of onnxruntime's transformer optimizer: skip and RMS layer
norms, the GELUs, BiasAdd, BiasSplitGelu, and the ops onnxruntime writes in the ONNX domain.

The reference is onnxruntime running the contrib node (its CPU kernel, graph
optimizations off); for the three ops without a CPU kernel (BiasAdd, BiasSplitGelu,
GemmFastGelu) it is the formula in onnxruntime's operator docs, in numpy.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import apply, assert_idempotent, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.graph import fingerprint
from graphfix.passes.base import PassContext
from graphfix.passes.unfuse_contrib import UnfuseContrib
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target

MS = "com.microsoft"
H = 32
RNG_SEED = 0


def _model(node: onnx.NodeProto, inputs: dict[str, list], inits: dict[str, np.ndarray],
           outputs: int = 1, dtype=np.float32, opset: int = 17) -> onnx.ModelProto:
    """One node; inputs of `dtype`, outputs typed by onnxruntime (left untyped here); the
    com.microsoft import only for a com.microsoft node."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in node.output[:outputs]],
        [numpy_helper.from_array(v.astype(dtype), k) for k, v in inits.items()])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)]
                                                  if node.domain == MS else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return model


def _feeds(model: onnx.ModelProto, seed: int = RNG_SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
                     * 2).astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
            for i in model.graph.input}


def _typed(model: onnx.ModelProto, reference: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The model with its outputs typed as onnxruntime computed them (the checker needs it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.graph.output:
        value = reference[o.name]
        o.CopyFrom(helper.make_tensor_value_info(
            o.name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    return out


def _rewrite(model: onnx.ModelProto, expected_ops: list[str], feeds=None, reference=None,
             exact: bool = False, tol: float = 2e-6) -> onnx.ModelProto:
    """Apply: exact ops, standard domain only, the same numbers as `reference` (onnxruntime
    running the node, by default; `exact`: float16 outputs rounded as the reference,
    `_same_rounding`; else within `tol` of the scale), checker, and a second run that
    changes nothing."""
    feeds = feeds or _feeds(model)
    if reference is None:
        reference = run_model(model, feeds)
    typed = _typed(model, reference)
    out, result = apply(UnfuseContrib(), typed)
    assert result.changed and not result.notes, result.notes
    assert ops(out) == expected_ops
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    assert [o.domain for o in out.opset_import] == [""]
    got = run_model(out, feeds)
    for name, want in reference.items():
        assert got[name].dtype == want.dtype, name
        if exact and want.dtype == np.float16:
            _same_rounding(got[name], want, name)
        else:
            scale = float(np.abs(want.astype(np.float64)).max())
            err = float(np.abs(got[name].astype(np.float64) - want).max())
            assert err <= tol * max(scale, 1.0), (name, err, scale)
    assert_idempotent(UnfuseContrib(), out)
    return out


def _same_rounding(got: np.ndarray, want: np.ndarray, name: str) -> None:
    """float16 results computed as the reference computes them: bit-identical here; a CPU
    whose float32 kernels round one step differently may flip a rare element by one unit
    (1 % of them at most). Computed in another precision, 16 to 25 % differ (measured:
    float16 op by op against onnxruntime's float32 kernels, and the other way round)."""
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    diff = np.abs(got.astype(np.float32) - want.astype(np.float32))
    assert np.all(diff <= ulp), name
    assert np.count_nonzero(diff) <= max(1, want.size // 100), (name, np.count_nonzero(diff))


def _params(*shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _skip_ln(dtype=np.float32, opset=17, outputs=1, bias=True, simplified=False):
    ins = ["x", "skip", "gamma"] + ([] if simplified else ["beta"]) + (["bias"] if bias else [])
    outs = ["y", "mean", "inv_std", "sum"][:outputs]
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    node = helper.make_node(op, ins, outs, name="sln", domain=MS, epsilon=1e-6)
    inits = {"gamma": _params(H), "beta": _params(H, seed=2), "bias": _params(H, seed=3)}
    inits = {k: v for k, v in inits.items() if k in ins}
    return _model(node, {"x": [2, 5, H], "skip": [2, 5, H]}, inits, outputs, dtype, opset)


# ----------------------------------------------------------------------------- layer norms


def test_skip_layer_norm_is_the_sum_then_layer_normalization():
    _rewrite(_skip_ln(), ["Add", "Add", "LayerNormalization"])


def test_skip_layer_norm_keeps_its_statistics_and_its_sum():
    out = _rewrite(_skip_ln(outputs=4), ["Add", "Add", "LayerNormalization"])
    norm = out.graph.node[-1]
    assert list(norm.output) == ["y", "mean", "inv_std"]
    assert out.graph.node[1].output[0] == "sum"


def test_skip_layer_norm_below_opset_17_is_written_out():
    # opset 14: no LayerNormalization in ONNX; ReduceMean takes its axes as an attribute
    out = _rewrite(_skip_ln(opset=14, outputs=4),
                   ["Add", "Add", "ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt",
                    "Reciprocal", "Div", "Mul", "Add"])
    assert all(len(n.input) == 1 for n in out.graph.node if n.op_type == "ReduceMean")


def test_float16_skip_layer_norm_computes_in_float32_as_onnxruntime_does():
    # onnxruntime sums and normalizes float16 in float32 and rounds once: bit-identical
    _rewrite(_skip_ln(np.float16, outputs=4),
             ["Cast"] * 5 + ["Add", "Add", "Cast", "LayerNormalization", "Cast"], exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_simplified_layer_norm_is_an_rms_norm(dtype):
    expected = ["Add", "Add", "Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
    if dtype == np.float16:  # x, skip, bias and gamma widened; one Cast back
        expected = ["Cast"] * 4 + expected + ["Cast"]
    _rewrite(_skip_ln(dtype, bias=True, simplified=True), expected,
             exact=dtype == np.float16, tol=4e-7)


def test_rms_norm_asked_for_its_mean_is_left_with_the_reason():
    graph = gs.import_onnx(_skip_ln(simplified=True, outputs=2))
    before = fingerprint(graph)
    result = UnfuseContrib().run(graph, PassContext())
    assert not result.changed and fingerprint(graph) == before
    assert (result.notes[0].subject, result.notes[0].reason) == (
        "SkipSimplifiedLayerNormalization 'sln'",
        "it asks for its mean output, which an RMS norm does not compute")


def _onnx_domain(op: str, dtype=np.float32, opset=17, axis=-1, outputs=1, shape=(2, 5, H)):
    ins = ["x", "scale"] + (["b"] if op == "LayerNormalization" else [])
    width = int(np.prod(shape[axis:]))
    node = helper.make_node(op, ins, ["y", "s1", "s2"][:outputs], name="norm", axis=axis,
                            epsilon=1e-5)
    inits = {"scale": _params(*shape[axis:]), "b": _params(*shape[axis:], seed=2)}
    assert width
    return _model(node, {"x": list(shape)}, {k: v for k, v in inits.items() if k in ins},
                  outputs, dtype, opset)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_onnxruntimes_simplified_layer_norm_in_the_onnx_domain(dtype):
    model = _onnx_domain("SimplifiedLayerNormalization", dtype, outputs=2)
    body = ["Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Div", "Mul"]
    expected = ["Cast", "Cast", *body, "Cast"] if dtype == np.float16 else body
    _rewrite(model, expected, exact=dtype == np.float16, tol=4e-7)


def test_layer_norm_below_opset_17_over_two_axes():
    # onnxruntime runs LayerNormalization at opset 14 (its own op); ONNX has none there
    model = _onnx_domain("LayerNormalization", opset=14, axis=1, outputs=3)
    out = _rewrite(model, ["ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt",
                           "Reciprocal", "Div", "Mul", "Add"])
    axes = [helper.get_attribute_value(a) for n in out.graph.node for a in n.attribute
            if n.op_type == "ReduceMean" and a.name == "axes"]
    assert axes == [[-2, -1], [-2, -1]]


def test_layer_norm_at_opset_17_is_left_alone():
    model = _onnx_domain("LayerNormalization", opset=17)
    graph = gs.import_onnx(model)
    result = UnfuseContrib().run(graph, PassContext())
    assert not result.changed
    assert ops(model) == ["LayerNormalization"]


def test_norm_with_a_positive_axis_and_no_rank_is_left_with_the_reason():
    model = _onnx_domain("SimplifiedLayerNormalization", axis=2)
    model.graph.input[0].type.tensor_type.ClearField("shape")
    graph = gs.import_onnx(model)
    result = UnfuseContrib().run(graph, PassContext())
    assert not result.changed
    assert result.notes[0].reason == "its axis is 2 and its input's rank is unknown"


# ----------------------------------------------------------------------------- activations


def _act(op: str, inputs: dict[str, list], inits: dict[str, np.ndarray], dtype=np.float32,
         **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [*inputs, *inits], ["y"], name="act", domain=MS, **attrs)
    return _model(node, inputs, inits, dtype=dtype)


ERF_GELU = ["Mul", "Erf", "Add", "Mul", "Mul"]
TANH_GELU = ["Mul", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_gelu(dtype):
    wide = dtype == np.float16  # onnxruntime's kernel computes float16 in float32
    expected = ["Cast", "Cast", "Add", *ERF_GELU, "Cast"] if wide else ["Add", *ERF_GELU]
    _rewrite(_act("BiasGelu", {"x": [2, 5, H]}, {"b": _params(H)}, dtype), expected,
             exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_fast_gelu_and_quick_gelu_compute_in_their_own_type(dtype):
    # onnxruntime's CPU provider evaluates float16 ones op by op in float16: bit-identical
    exact = dtype == np.float16
    _rewrite(_act("Gelu", {"x": [2, 5, H]}, {}, dtype), ERF_GELU, exact=True)
    _rewrite(_act("FastGelu", {"x": [2, 5, H]}, {"b": _params(H)}, dtype),
             ["Add", *TANH_GELU], exact=exact)
    _rewrite(_act("FastGelu", {"x": [2, 5, H]}, {}, dtype), TANH_GELU, exact=exact)
    _rewrite(_act("QuickGelu", {"x": [2, 5, H]}, {}, dtype), ["Mul", "Sigmoid", "Mul"],
             exact=True)
    _rewrite(_act("QuickGelu", {"x": [2, 5, H]}, {}, dtype, alpha=1.0), ["Sigmoid", "Mul"],
             exact=True)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_ops_without_a_cpu_kernel_match_their_formulas():
    rng = np.random.default_rng(5)
    x, skip = rng.standard_normal((2, 5, H)), rng.standard_normal((2, 5, H))
    bias, weight = _params(H), _params(H, H, seed=4) * 0.2
    feeds = {"x": x.astype(np.float32), "skip": skip.astype(np.float32)}
    model = _act("BiasAdd", {"x": [2, 5, H], "skip": [2, 5, H]}, {"bias": bias})
    model.graph.node[0].input[:] = ["x", "bias", "skip"]
    _rewrite(model, ["Add", "Add"], feeds, {"y": (x + bias + skip).astype(np.float32)})
    total = x + bias
    halves = total[..., : H // 2] * _gelu(total[..., H // 2:])
    _rewrite(_act("BiasSplitGelu", {"x": [2, 5, H]}, {"bias": bias}),
             ["Add", "Slice", "Slice", *ERF_GELU, "Mul"], {"x": feeds["x"]},
             {"y": halves.astype(np.float32)})
    t = x @ weight + bias
    fast = 0.5 * t * (1 + np.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))
    _rewrite(_act("GemmFastGelu", {"x": [2, 5, H]}, {"w": weight, "b": bias}),
             ["MatMul", "Add", *TANH_GELU], {"x": feeds["x"]}, {"y": fast.astype(np.float32)})


# ----------------------------------------------------------------------------- a real optimizer


def _bert_layer() -> onnx.ModelProto:
    """x -> MatMul -> Add(bias) -> exact GELU (Div, Erf, Add, Mul, Mul) -> MatMul -> Add ->
    residual Add -> LayerNormalization: the pattern onnxruntime's transformer optimizer
    fuses into BiasGelu and SkipLayerNormalization."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                       name)

    c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w1"], ["m1"]), n("Add", ["m1", "b1"], ["a1"]),
        n("Div", ["a1", "sqrt2"], ["d"]), n("Erf", ["d"], ["e"]), n("Add", ["e", "one"], ["e1"]),
        n("Mul", ["a1", "e1"], ["g0"]), n("Mul", ["g0", "half"], ["g"]),
        n("MatMul", ["g", "w2"], ["m2"]), n("Add", ["b2", "m2"], ["a2"]),
        n("Add", ["a2", "x"], ["r"]),
        n("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12),
    ]
    inits = [w("w1", H, 4 * H), w("b1", 4 * H), w("w2", 4 * H, H), w("b2", H), w("gamma", H),
             w("beta", H), c("sqrt2", math.sqrt(2)), c("one", 1.0), c("half", 0.5)]
    graph = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 7, H])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 7, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_model_from_onnxruntimes_transformer_optimizer_parses_after_the_pass(tmp_path):
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    original = _bert_layer()
    path = tmp_path / "layer.onnx"
    onnx.save(original, path)
    fused = optimizer.optimize_model(str(path), model_type="bert", num_heads=0, hidden_size=0,
                                     opt_level=0).model
    assert sorted({(n.domain, n.op_type) for n in fused.graph.node if n.domain}) == [
        (MS, "BiasGelu"), (MS, "SkipLayerNormalization")]
    target = parse_target("10")
    assert not diagnose(fused, target).parses()
    feeds = _feeds(original)
    out = _rewrite(fused, ["MatMul", "Add", *ERF_GELU, "MatMul", "Add", "Add",
                           "LayerNormalization"], feeds, run_model(original, feeds))
    assert diagnose(out, target).parses()


# ----------------------------------------------------------------------------- TensorFlow's Erfc


def _erfc_model(dtype=np.float32, opset=17) -> onnx.ModelProto:
    """Keras 3's ONNX export of GELU: 0.5 * x * Erfc(-x / sqrt 2), Erfc left by tf2onnx."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Mul", ["x", "k"], ["t"]),
             helper.make_node("Erfc", ["t"], ["e"], name="erfc"),
             helper.make_node("Mul", ["x", "e"], ["y"])]
    graph = helper.make_graph(nodes, "keras", [helper.make_tensor_value_info("x", elem, [2, 8])],
                              [helper.make_tensor_value_info("y", elem, [2, 8])],
                              [numpy_helper.from_array(np.array(-0.5 ** 0.5, dtype), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _erfc_reference(x: np.ndarray) -> np.ndarray:
    k = np.asarray(-0.5 ** 0.5, x.dtype)
    return x * np.vectorize(math.erfc, otypes=[np.float64])(x * k).astype(x.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tensorflows_erfc_left_by_tf2onnx_is_one_minus_erf(dtype):
    model = _erfc_model(dtype)
    out, result = apply(UnfuseContrib(), model)
    assert dict(result.counts) == {"rewrote Erfc as standard ops": 1}
    assert ops(out) == ["Mul", "Erf", "Sub", "Mul"]
    x = (np.random.default_rng(0).standard_normal((2, 8)) * 3).astype(dtype)
    got = run_model(out, {"x": x})["y"]
    want = _erfc_reference(x)
    tol = 2e-6 if dtype == np.float32 else 2e-3
    assert float(np.abs(got.astype(np.float64) - want).max()) <= tol * float(np.abs(want).max())
    assert_idempotent(UnfuseContrib(), out)


@pytest.mark.parametrize("opset", [17, 13])  # CastLike in its form from 15; numpy before
def test_the_check_runs_erfc_by_its_reference_form(opset):
    from graphfix.runtime.outputs import run_checkable

    model = _erfc_model(opset=opset)
    x = np.linspace(-4, 4, 16, dtype=np.float32).reshape(2, 8)
    got = run_checkable(model, {"x": x})["y"]
    np.testing.assert_allclose(got, _erfc_reference(x), rtol=2e-6, atol=1e-7)


def test_doctor_names_unfuse_contrib_for_erfc():
    found = [f for f in diagnose(_erfc_model(), parse_target("10")).findings
             if f.rule == "custom-op-unknown"]
    assert len(found) == 1 and found[0].fix.startswith(
        "Erfc is TensorFlow's op, which tf2onnx left in the ONNX domain: unfuse-contrib "
        "rewrites it")
