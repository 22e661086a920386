"""unfuse-contrib: FusedConv, FusedGemm, Gelu, leftovers, opset imports (NCHWc: test_unfuse_nchwc).

The reference for a hand-built contrib node is onnxruntime running that node (its
CPU kernels for FusedConv, FusedGemm and Gelu run with graph optimizations off);
the reference for a model that onnxruntime's optimizer fused is the model before.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import GraphfixError
from graphfix.graph import fingerprint
from graphfix.passes.base import PassContext
from graphfix.passes.unfuse_contrib import UnfuseContrib, UnfuseContribOptions

FLOAT = TensorProto.FLOAT
MS = "com.microsoft"
FLT_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- builders


def _w(rng: np.random.Generator, name: str, *shape: int, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(dtype), name)


def _vi(name: str, shape, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits, opset: int = 17, domains=(MS,)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _domains(model: onnx.ModelProto) -> list[tuple[str, int]]:
    return [(o.domain, o.version) for o in model.opset_import]


def _standard_only(model: onnx.ModelProto) -> bool:
    graphs = [model.graph] + [a.g for n in model.graph.node for a in n.attribute if a.g.node]
    return all(n.domain in ("", "ai.onnx") for g in graphs for n in g.node)


def _assert_rewrites(model, expected_ops, counts, feed_sets=None, rtol=1e-5, atol=1e-6):
    """Apply, then: exact ops, counts, no notes, standard domain only, numerics, idempotence."""
    out, result = apply(UnfuseContrib(), model)
    assert result.changed
    assert dict(result.counts) == {**counts, "dropped unused opset imports": 1}
    assert result.notes == []
    assert ops(out) == expected_ops
    assert _standard_only(out)
    assert _domains(out) == [("", model.opset_import[0].version)]
    assert [o.name for o in out.graph.output] == [o.name for o in model.graph.output]
    for feeds in feed_sets or [feeds_for(model)]:
        assert_same_outputs(model, out, feeds, rtol=rtol, atol=atol)
    assert_idempotent(UnfuseContrib(), out)
    return out


def _assert_skips(model, subject: str, reason: str) -> None:
    """The pass leaves the graph as it is and says why, then lists what is left."""
    graph = gs.import_onnx(model)
    snapshot = fingerprint(graph)
    result = UnfuseContrib().run(graph, PassContext())
    assert not result.changed
    assert not result.counts
    assert fingerprint(graph) == snapshot
    assert (subject, reason) == (result.notes[0].subject, result.notes[0].reason)
    assert all("left outside the standard ONNX domain" in n.reason for n in result.notes[1:])


# ----------------------------------------------------------------------------- fused by onnxruntime


def _cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv+Relu, Conv+Add+Relu residual, Conv+Clip(0,6), depthwise Conv+LeakyRelu,
    MaxPool, Conv+Sigmoid with 4 output channels, GlobalAveragePool, Gemm+Relu."""
    n = helper.make_node
    inits = [
        _w(rng, "w1", 16, 3, 3, 3), _w(rng, "b1", 16), _w(rng, "w2", 16, 16, 3, 3),
        _w(rng, "b2", 16), _w(rng, "w3", 16, 16, 1, 1), _w(rng, "wd", 16, 1, 3, 3),
        _w(rng, "w4", 4, 16, 3, 3), _w(rng, "g", 4, 5), _w(rng, "gb", 5),
        numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi"),
    ]
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
        n("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]), n("Add", ["c2", "r1"], ["a2"]),
        n("Relu", ["a2"], ["r2"]),
        n("Conv", ["r2", "w3"], ["c3"]), n("Clip", ["c3", "lo", "hi"], ["r3"]),
        n("Conv", ["r3", "wd"], ["cd"], group=16, pads=[1, 1, 1, 1]),
        n("LeakyRelu", ["cd"], ["r4"], alpha=0.1),
        n("MaxPool", ["r4"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p", "w4"], ["c4"]), n("Sigmoid", ["c4"], ["y1"]),
        n("GlobalAveragePool", ["y1"], ["gp"]), n("Flatten", ["gp"], ["f"]),
        n("Gemm", ["f", "g", "gb"], ["gm"]), n("Relu", ["gm"], ["y2"]),
    ]
    return _model(nodes, [_vi("x", [1, 3, 16, 16])], [_vi("y1", [1, 4, 6, 6]), _vi("y2", [1, 5])],
                  inits, domains=())


CNN_OPS = ["Conv", "Relu", "Conv", "Add", "Relu", "Conv", "Clip", "Conv", "LeakyRelu", "MaxPool",
           "Conv", "Sigmoid", "GlobalAveragePool", "Flatten", "Gemm", "Relu"]


def ort_optimized(model: onnx.ModelProto, level, path) -> onnx.ModelProto:
    """The model as onnxruntime's offline optimizer saves it at `level`."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(path)
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def test_model_saved_with_ort_enable_extended_gets_its_ops_back(tmp_path):
    model = _cnn(np.random.default_rng(0))
    level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    fused = ort_optimized(model, level, tmp_path / "m.onnx")
    fused_ops = {(n.domain, n.op_type) for n in fused.graph.node}
    assert {(MS, "FusedConv"), (MS, "FusedGemm")} <= fused_ops
    assert len(fused.opset_import) > 2  # onnxruntime imports every domain it knows
    out, result = apply(UnfuseContrib(), fused)
    assert dict(result.counts) == {
        "rewrote FusedConv as standard ops": 4, "rewrote FusedGemm as standard ops": 1,
        "dropped unused opset imports": len(fused.opset_import) - 1,
    }
    assert result.notes == []
    assert ops(out) == CNN_OPS
    assert _standard_only(out)
    assert _domains(out) == [("", 17)]
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(UnfuseContrib(), out)


def test_model_saved_with_ort_enable_all_gets_its_ops_back(tmp_path):
    model = _cnn(np.random.default_rng(0))
    fused = ort_optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path / "m.onnx")
    if not any(x.domain == "com.microsoft.nchwc" for x in fused.graph.node):
        pytest.skip("onnxruntime made no NCHWc op on this CPU")
    out, result = apply(UnfuseContrib(), fused)
    # The 4-channel Conv's output was padded to the NCHWc block, hence the Slice; that
    # padding also tells the block size, so no option is needed.
    assert dict(result.counts) == {
        "rewrote NCHWc Conv as Conv": 5, "rewrote NCHWc MaxPool as MaxPool": 1,
        "rewrote ReorderOutput as Slice": 1, "rewrote FusedGemm as standard ops": 1,
        "dropped unused opset imports": len(fused.opset_import) - 1,
    }
    assert result.notes == []
    assert ops(out) == CNN_OPS[:12] + ["Slice"] + CNN_OPS[12:]
    assert _standard_only(out)
    assert _domains(out) == [("", 17)]
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(UnfuseContrib(), out)


# ----------------------------------------------------------------------------- FusedConv


def _fused_conv(activation=None, params=None, bias=True, z=False, opset=17, dtype=np.float32):
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [_w(rng, "W", 4, 3, 3, 3, dtype=dtype)]
    inits += [_w(rng, "B", 4, dtype=dtype)] if bias else []
    inputs = ["x", "W", "B" if bias else ""] + (["z"] if z else [])
    attrs = {"pads": [1, 1, 1, 1]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", inputs, ["y"], name="fc", domain=MS, **attrs)
    graph_inputs = [_vi("x", [1, 3, 8, 8], elem)] + ([_vi("z", [1, 4, 8, 8], elem)] if z else [])
    return _model([node], graph_inputs, [_vi("y", [1, 4, 8, 8], elem)], inits, opset)


CONV_CASES = {
    "relu": ("Relu", None, ["Conv", "Relu"]),
    "tanh": ("Tanh", None, ["Conv", "Tanh"]),
    "sigmoid": ("Sigmoid", None, ["Conv", "Sigmoid"]),
    "leaky-relu": ("LeakyRelu", [0.2], ["Conv", "LeakyRelu"]),
    "clip": ("Clip", [0.0, 0.5], ["Conv", "Clip"]),
    "hard-sigmoid": ("HardSigmoid", [0.3, 0.4], ["Conv", "HardSigmoid"]),
    "hard-swish": ("HardSwish", None, ["Conv", "HardSwish"]),
    "no-activation": (None, None, ["Conv"]),
}


@pytest.mark.parametrize("z", [False, True], ids=["plain", "with-z"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_fused_conv_becomes_conv_then_activation(case, z):
    activation, params, expected = CONV_CASES[case]
    model = _fused_conv(activation, params, z=z)
    if activation == "HardSwish" and not _runs_in_onnxruntime(model):
        pytest.skip(f"onnxruntime {ort.__version__}'s FusedConv has no HardSwish")
    expected = expected[:1] + ["Add"] * z + expected[1:]  # Z is added before the activation
    out = _assert_rewrites(model, expected, {"rewrote FusedConv as standard ops": 1})
    assert out.graph.node[-1].output == ["y"]


def _runs_in_onnxruntime(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # onnxruntime's errors have no common base class
        return False
    return True


def test_fused_conv_without_bias_and_with_z():
    model = _fused_conv("Relu", bias=False, z=True)
    out = _assert_rewrites(model, ["Conv", "Add", "Relu"], {"rewrote FusedConv as standard ops": 1})
    assert list(out.graph.node[0].input) == ["x", "W"]


def test_clip_bounds_are_typed_inputs_and_open_bounds_are_left_out():
    model = _fused_conv("Clip", [-FLT_MAX, 0.5])
    out = _assert_rewrites(model, ["Conv", "Clip"], {"rewrote FusedConv as standard ops": 1})
    clip = out.graph.node[1]
    assert clip.input[1] == ""
    bound = next(i for i in out.graph.initializer if i.name == clip.input[2])
    assert bound.data_type == FLOAT and numpy_helper.to_array(bound) == np.float32(0.5)


def test_fp16_fused_conv_gets_fp16_clip_bounds():
    model = _fused_conv("Clip", [0.0, 0.5], dtype=np.float16)
    out = _assert_rewrites(model, ["Conv", "Clip"], {"rewrote FusedConv as standard ops": 1})
    bounds = {i.name: i.data_type for i in out.graph.initializer}
    assert [bounds[name] for name in out.graph.node[1].input[1:]] == [TensorProto.FLOAT16] * 2
    assert out.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16


def test_clip_at_opset_10_uses_attributes():
    out = _assert_rewrites(_fused_conv("Clip", [0.0, 0.5], opset=10), ["Conv", "Clip"],
                           {"rewrote FusedConv as standard ops": 1})
    clip = out.graph.node[1]
    assert len(clip.input) == 1
    assert {a.name: a.f for a in clip.attribute} == {"min": 0.0, "max": 0.5}


CONV_SKIPS = {
    "unknown-activation": (("Swish", None), "its fused activation 'Swish' has no standard "
                                            "ONNX rewrite here"),
    "missing-params": (("LeakyRelu", []), "its LeakyRelu activation has 0 activation_params "
                                          "instead of 1"),
    "too-many-params": (("Clip", [0.0, 1.0, 2.0]), "its Clip activation has 3 activation_params "
                                                   "instead of 2"),
}


@pytest.mark.parametrize("case", sorted(CONV_SKIPS))
def test_fused_conv_it_cannot_rebuild_stays_with_reason(case):
    (activation, params), reason = CONV_SKIPS[case]
    _assert_skips(_fused_conv(activation, params), "FusedConv 'fc'", reason)


def test_hard_swish_before_opset_14_stays_with_reason():
    _assert_skips(_fused_conv("HardSwish", opset=13), "FusedConv 'fc'",
                  "its HardSwish activation is a standard op from opset 14, not 13")


# ----------------------------------------------------------------------------- FusedGemm


def _fused_gemm(activation=None, **act_attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    attrs = {"transB": 1, "alpha": 0.7, "beta": 1.3, **act_attrs}
    if activation:
        attrs["activation"] = activation
    node = helper.make_node("FusedGemm", ["a", "B", "C"], ["y"], name="fg", domain=MS, **attrs)
    return _model([node], [_vi("a", [3, 6])], [_vi("y", [3, 4])],
                  [_w(rng, "B", 4, 6), _w(rng, "C", 4)])


GEMM_CASES = {
    "relu": ("Relu", {}),
    "sigmoid": ("Sigmoid", {}),
    "tanh": ("Tanh", {}),
    "softsign": ("Softsign", {}),
    "softplus": ("Softplus", {}),
    "leaky-relu": ("LeakyRelu", {"activation_alpha": 0.2}),
    "hard-sigmoid": ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
    "elu": ("Elu", {"activation_alpha": 0.8}),
    "selu": ("Selu", {"activation_alpha": 1.5, "activation_gamma": 1.1}),
    "thresholded-relu": ("ThresholdedRelu", {"activation_alpha": 0.1}),
}


@pytest.mark.parametrize("case", sorted(GEMM_CASES))
def test_fused_gemm_becomes_gemm_then_activation(case):
    activation, attrs = GEMM_CASES[case]
    out = _assert_rewrites(_fused_gemm(activation, **attrs), ["Gemm", activation],
                           {"rewrote FusedGemm as standard ops": 1})
    gemm, act = out.graph.node
    assert {a.name for a in gemm.attribute} == {"transB", "alpha", "beta"}
    expected = {k[len("activation_"):]: pytest.approx(v) for k, v in attrs.items()}
    assert {a.name: a.f for a in act.attribute} == expected


def test_fused_gemm_without_activation_is_a_gemm():
    # onnxruntime's kernel insists on an activation, so the reference is a plain Gemm.
    model = _fused_gemm()
    out, result = apply(UnfuseContrib(), model)
    assert dict(result.counts) == {"rewrote FusedGemm as standard ops": 1,
                                   "dropped unused opset imports": 1}
    assert ops(out) == ["Gemm"]
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    reference.graph.node[0].domain = ""
    reference.graph.node[0].op_type = "Gemm"
    assert_same_outputs(reference, out, feeds_for(model))


def test_fused_gemm_it_cannot_rebuild_stays_with_reason():
    _assert_skips(_fused_gemm("ScaledTanh", activation_alpha=1.0, activation_beta=1.0),
                  "FusedGemm 'fg'", "its fused activation 'ScaledTanh' has no standard ONNX "
                  "rewrite here")
    _assert_skips(_fused_gemm("LeakyRelu", activation_alpha=0.1, activation_gamma=2.0),
                  "FusedGemm 'fg'", "its activation attribute 'activation_gamma' is not an "
                  "attribute of LeakyRelu")


# ----------------------------------------------------------------------------- Gelu


def test_gelu_becomes_the_erf_form():
    node = helper.make_node("Gelu", ["x"], ["y"], name="gelu", domain=MS)
    model = _model([node], [_vi("x", [2, 3, 16])], [_vi("y", [2, 3, 16])], [])
    feeds = {"x": (np.random.default_rng(0).standard_normal([2, 3, 16]) * 3).astype(np.float32)}
    _assert_rewrites(model, ["Mul", "Erf", "Add", "Mul", "Mul"],
                     {"rewrote Gelu as standard ops": 1}, [feeds])


def test_gelu_of_unknown_type_stays_with_reason():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill",
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("Gelu", ["c"], ["y"], name="gelu", domain=MS)]
    model = _model(nodes, [_vi("shape", [2], TensorProto.INT64)], [_vi("y", ["n", "m"])], [])
    _assert_skips(model, "Gelu 'gelu'", "its float type is unknown, so the constants it needs "
                                        "cannot be typed; run shape inference on the model first")


# ----------------------------------------------------------------------------- leftovers, imports


def test_unknown_contrib_op_is_listed_and_left_alone():
    nodes = [helper.make_node("Inverse", ["x"], ["f"], name="inv", domain=MS),
             helper.make_node("Inverse", ["f"], ["y"], name="inv2", domain=MS)]
    model = _model(nodes, [_vi("x", [2, 8, 8])], [_vi("y", [2, 8, 8])], [])
    _assert_skips(model, f"{MS}::Inverse",
                  "2 nodes left outside the standard ONNX domain; TensorRT cannot parse them")


def test_graph_without_contrib_ops_says_so():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2])],
                   [_vi("y", [2])], [], domains=())
    graph = gs.import_onnx(model)
    result = UnfuseContrib().run(graph, PassContext())
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [
        ("graph", "no com.microsoft or com.microsoft.nchwc node")
    ]


def test_unused_imports_are_dropped_and_the_input_model_is_not_touched():
    model = _fused_conv("Relu")
    model.opset_import.extend([helper.make_opsetid("ai.onnx.ml", 3),
                               helper.make_opsetid("com.microsoft.nchwc", 1)])
    before = _domains(model)
    out, result = apply(UnfuseContrib(), model)
    assert result.counts["dropped unused opset imports"] == 3
    assert _domains(out) == [("", 17)]
    assert _domains(model) == before


def test_rewrites_inside_if_branches():
    rng = np.random.default_rng(0)

    def branch(name: str, activation: str) -> onnx.GraphProto:
        node = helper.make_node("FusedConv", ["x", f"{name}_W"], [f"{name}_y"], name=name,
                                domain=MS, activation=activation, pads=[1, 1, 1, 1])
        return helper.make_graph([node], name, [], [_vi(f"{name}_y", [1, 4, 8, 8])],
                                 [_w(rng, f"{name}_W", 4, 3, 3, 3)])

    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch("then", "Relu"),
                            else_branch=branch("else", "Sigmoid"))
    model = _model([node], [_vi("x", [1, 3, 8, 8]), _vi("cond", [], TensorProto.BOOL)],
                   [_vi("y", [1, 4, 8, 8])], [])
    x = np.random.default_rng(1).standard_normal([1, 3, 8, 8]).astype(np.float32)
    feed_sets = [{"x": x, "cond": np.array(c)} for c in (True, False)]
    out = _assert_rewrites(model, ["If"], {"rewrote FusedConv as standard ops": 2}, feed_sets)
    branches = {a.name: ops(helper.make_model(a.g)) for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Conv", "Relu"], "else_branch": ["Conv", "Sigmoid"]}


# ----------------------------------------------------------------------------- options


def test_nchwc_block_option_is_checked():
    assert UnfuseContrib.parse_options([("nchwc-block", "16")]) == UnfuseContribOptions(16)
    with pytest.raises(GraphfixError, match="NCHWc block is 8 .AVX2. or 16"):
        UnfuseContrib.parse_options([("nchwc-block", "4")])
