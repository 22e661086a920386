"""Reference forms: InstanceNormalization_TRT decomposed and checked against numpy, nodes in
If branches, numpy kernels run by stages, and the nodes that stay not checkable."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import GraphfixError, InternalError
from graphfix.runtime import references
from graphfix.runtime.references import (
    Decompose,
    Decomposition,
    Kernel,
    References,
    Registration,
    needs_reference,
    substitute,
)

SHAPE = [2, 3, 5, 4]
C = SHAPE[1]
TEST_DOMAIN = "test.graphfix"


def rng_array(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def instance_norm_node(name="in1", domain="", relu=0, alpha=0.0, weights="floats",
                       inp="x", out="y", **extra):
    """An InstanceNormalization_TRT node typed as TensorRT's parser maps its fields: epsilon
    FLOAT, scales/bias FLOATS (or FLOAT tensors), relu INT, alpha FLOAT, version strings."""
    scales, bias = rng_array([C], 1) + 1.0, rng_array([C], 2)
    if weights == "tensor":
        scales = numpy_helper.from_array(scales, "scales")
        bias = numpy_helper.from_array(bias, "bias")
    else:
        scales, bias = scales.tolist(), bias.tolist()
    attrs = {"epsilon": 1e-5, "scales": scales, "bias": bias, "relu": relu, "alpha": alpha,
             "plugin_version": "1", "plugin_namespace": ""}
    attrs.update(extra)
    return helper.make_node("InstanceNormalization_TRT", [inp], [out], name=name,
                            domain=domain, **attrs)


def make(nodes, inputs, outputs, opsets=(("", 17),), inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 8
    return model


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def numpy_instance_norm(x, node):
    """The plugin's definition, computed in float64 from the node's own attributes."""
    attrs = references.attributes(node)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(2, 3), keepdims=True)
    var = x64.var(axis=(2, 3), keepdims=True)
    scale = np.asarray(attrs["scales"], np.float64).reshape(1, -1, 1, 1)
    bias = np.asarray(attrs["bias"], np.float64).reshape(1, -1, 1, 1)
    y = (x64 - mean) / np.sqrt(var + attrs["epsilon"]) * scale + bias
    if attrs["relu"] > 0:
        y = np.where(y < 0, y * attrs["alpha"], y)
    return y


def ops(graph):
    return [n.op_type for n in graph.node]


@pytest.mark.parametrize(("domain", "relu", "alpha", "weights", "after"), [
    ("", 0, 0.0, "floats", ["Cast", "InstanceNormalization", "CastLike"]),
    ("trt.plugins", 1, 0.1, "floats", ["Cast", "InstanceNormalization", "LeakyRelu", "CastLike"]),
    ("", 1, 0.0, "tensor", ["Cast", "InstanceNormalization", "LeakyRelu", "CastLike"]),
    ("my.namespace", -1, 0.3, "tensor", ["Cast", "InstanceNormalization", "CastLike"]),
])
def test_instance_norm_trt_matches_numpy(domain, relu, alpha, weights, after):
    node = instance_norm_node(domain=domain, relu=relu, alpha=alpha, weights=weights)
    opsets = (("", 17),) + (((domain, 1),) if domain else ())
    model = make([node], [tensor("x", SHAPE)], [tensor("y", SHAPE)], opsets)
    assert needs_reference(model)

    sub = substitute(model)

    assert sub.replaced == [f"InstanceNormalization_TRT 'in1' -> {', '.join(after)}"]
    assert sub.not_checkable == [] and sub.kernels == []
    assert ops(sub.model.graph) == after
    assert [o.name for o in sub.model.graph.output] == ["y"]
    assert not needs_reference(sub.model)
    onnx.checker.check_model(sub.model, full_check=True)
    x = rng_array(SHAPE, 0)
    (y,) = ort_run(sub.model, {"x": x})
    np.testing.assert_allclose(y, numpy_instance_norm(x, node), rtol=1e-5, atol=1e-6)
    assert (y < 0).any() == (relu <= 0 or alpha > 0)  # the activation did (not) run


def test_float16_data_is_normalized_in_float32_like_the_plugin():
    node = instance_norm_node(relu=1, alpha=0.2)
    model = make([node], [tensor("x", SHAPE, TensorProto.FLOAT16)],
                 [tensor("y", SHAPE, TensorProto.FLOAT16)])
    sub = substitute(model)
    onnx.checker.check_model(sub.model, full_check=True)
    x = rng_array(SHAPE, 0, np.float16)
    (y,) = ort_run(sub.model, {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, numpy_instance_norm(x, node), rtol=2e-3, atol=2e-3)


def test_before_opset_15_no_casts():
    node = instance_norm_node(relu=1, alpha=0.1)
    model = make([node], [tensor("x", SHAPE)], [tensor("y", SHAPE)], (("", 13),))
    sub = substitute(model)
    assert ops(sub.model.graph) == ["InstanceNormalization", "LeakyRelu"]
    x = rng_array(SHAPE, 3)
    (y,) = ort_run(sub.model, {"x": x})
    np.testing.assert_allclose(y, numpy_instance_norm(x, node), rtol=1e-5, atol=1e-6)


def test_node_inside_if_branch_is_substituted():
    then = helper.make_graph([instance_norm_node(out="t", relu=1, alpha=0.1)], "then", [],
                             [tensor("t", SHAPE)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [tensor("e", SHAPE)])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    model = make([node], [tensor("x", SHAPE), tensor("cond", [], TensorProto.BOOL)],
                 [tensor("y", SHAPE)])

    sub = substitute(model)

    assert sub.replaced == ["InstanceNormalization_TRT 'in1' -> Cast, InstanceNormalization, "
                            "LeakyRelu, CastLike"]
    branches = {a.name: a.g for a in sub.model.graph.node[0].attribute}
    assert ops(branches["else_branch"]) == ["Neg"]
    assert ops(branches["then_branch"]) == [
        "Cast", "InstanceNormalization", "LeakyRelu", "CastLike"]
    onnx.checker.check_model(sub.model, full_check=True)
    x = rng_array(SHAPE, 4)
    (y,) = ort_run(sub.model, {"x": x, "cond": np.array(True)})
    np.testing.assert_allclose(y, numpy_instance_norm(x, then.node[0]), rtol=1e-5, atol=1e-6)
    (y,) = ort_run(sub.model, {"x": x, "cond": np.array(False)})
    np.testing.assert_array_equal(y, -x)


def test_input_model_is_not_modified():
    model = make([instance_norm_node()], [tensor("x", SHAPE)], [tensor("y", SHAPE)])
    before = model.SerializeToString()
    sub = substitute(model)
    assert sub.model is not model
    assert model.SerializeToString() == before


def test_decomposition_names_do_not_collide_with_the_model():
    nodes = [helper.make_node("Relu", ["x"], ["y_gf_scales"]), instance_norm_node()]
    model = make(nodes, [tensor("x", SHAPE)], [tensor("y", SHAPE), tensor("y_gf_scales", SHAPE)])
    sub = substitute(model)
    onnx.checker.check_model(sub.model, full_check=True)
    assert [t.name for t in sub.model.graph.initializer] == ["y_gf_scales_1", "y_gf_bias"]
    x = rng_array(SHAPE, 5)
    y, r = ort_run(sub.model, {"x": x})
    np.testing.assert_allclose(y, numpy_instance_norm(x, nodes[1]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r, np.maximum(x, 0))


def test_decomposition_reusing_an_input_name_is_not_checkable():
    model = make([instance_norm_node(inp="y_gf_bias")], [tensor("y_gf_bias", SHAPE)],
                 [tensor("y", SHAPE)])
    assert substitute(model).not_checkable == [
        "InstanceNormalization_TRT (ai.onnx): its reference names tensors ['y_gf_bias'] "
        "like the node's inputs"]


def test_unknown_custom_op_is_not_checkable_and_stays():
    nodes = [helper.make_node("Foo", ["x"], ["f"], domain="custom.domain"),
             helper.make_node("Foo", ["f"], ["y"], domain="custom.domain")]
    model = make(nodes, [tensor("x", SHAPE)], [tensor("y", SHAPE)],
                 (("", 17), ("custom.domain", 1)))
    assert needs_reference(model)

    sub = substitute(model)

    assert sub.not_checkable == ["Foo (custom.domain)"]  # once, though two nodes
    assert sub.replaced == [] and sub.model is model and ops(model.graph) == ["Foo", "Foo"]
    with pytest.raises(GraphfixError, match=r"not checkable: Foo \(custom.domain\)"):
        references.run(sub, {"x": rng_array(SHAPE, 0)})


def test_plugin_version_without_reference_is_not_checkable():
    model = make([instance_norm_node(plugin_version="9")], [tensor("x", SHAPE)],
                 [tensor("y", SHAPE)])
    sub = substitute(model)
    assert sub.not_checkable == ["InstanceNormalization_TRT (ai.onnx) version 9: references "
                                 "exist for versions 1, 2, 3"]
    assert sub.model is model


def test_plugin_without_weights_is_not_checkable_with_the_reason():
    node = helper.make_node("InstanceNormalization_TRT", ["x"], ["y"], epsilon=1e-5)
    sub = substitute(make([node], [tensor("x", SHAPE)], [tensor("y", SHAPE)]))
    assert sub.not_checkable == ["InstanceNormalization_TRT (ai.onnx): needs one input and "
                                 "scales and bias of one length (got 0 and 0)"]


def test_needs_reference_knows_what_onnxruntime_runs():
    x, y = [tensor("x", SHAPE)], [tensor("y", SHAPE)]
    assert not needs_reference(make([helper.make_node("Relu", ["x"], ["y"])], x, y))
    # Split is a TensorRT plugin name too, but in the default domain it is the ONNX op
    split = helper.make_node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2)
    assert not needs_reference(make([split], x, y + [tensor("z", None)], (("", 18),)))
    gelu = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    assert not needs_reference(make([gelu], x, y, (("", 17), ("com.microsoft", 1))))
    unknown = helper.make_node("NotAnOp", ["x"], ["y"])
    assert needs_reference(make([unknown], x, y))
    plugin = instance_norm_node(domain="com.microsoft")
    assert needs_reference(make([plugin], x, y, (("", 17), ("com.microsoft", 1))))


def test_nothing_to_substitute_returns_the_model():
    model = make([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", SHAPE)],
                 [tensor("y", SHAPE)])
    sub = substitute(model)
    assert sub.model is model and not (sub.replaced or sub.not_checkable or sub.kernels)


def test_builtin_list_is_what_registered_reports():
    keys = [(r.domain, r.op_type, r.versions) for r in references.registered()]
    assert ("trt.plugins", "InstanceNormalization_TRT", ("1", "2", "3")) in keys


def test_duplicate_registration_raises():
    with pytest.raises(InternalError, match="already registered"):
        references.register("trt.plugins", "InstanceNormalization_TRT",
                            Decompose(lambda node, opset: Decomposition([])), versions=("2",))
    refs = References([Registration(TEST_DOMAIN, "Square", Kernel(square_kernel), ("1",))])
    refs.add(Registration(TEST_DOMAIN, "Square", Kernel(square_kernel), ("2",)))  # disjoint
    with pytest.raises(InternalError, match="already registered"):
        refs.add(Registration(TEST_DOMAIN, "Square", Kernel(square_kernel)))  # any version


# ----------------------------------------------------------------------------- a test-only op


def square_kernel(inputs, attrs):
    return [inputs[0] * inputs[0] * attrs.get("gain", 1.0)]


def square_decomposition(node, opset):
    x, y = node.input[0], node.output[0]
    gain = numpy_helper.from_array(
        np.float32(references.attributes(node).get("gain", 1.0)), f"{y}_gain")
    return Decomposition([helper.make_node("Mul", [x, x], [f"{y}_sq"]),
                          helper.make_node("Mul", [f"{y}_sq", gain.name], [y])], [gain])


def square_model(*extra):
    """x -> Square -> Relu(neg) -> Square(gain 0.5) -> y: ORT parts around two kernel nodes."""
    nodes = [helper.make_node("Square", ["x"], ["s1"], name="sq1", domain=TEST_DOMAIN),
             helper.make_node("Neg", ["s1"], ["n"]),
             helper.make_node("Add", ["n", "w"], ["a"]),
             helper.make_node("Square", ["a"], ["y"], name="sq2", domain=TEST_DOMAIN, gain=0.5),
             *extra]
    w = numpy_helper.from_array(rng_array(SHAPE, 7), "w")
    outs = [tensor("y", SHAPE)] + [tensor(o, SHAPE) for n in extra for o in n.output]
    return make(nodes, [tensor("x", SHAPE)], outs, (("", 17), (TEST_DOMAIN, 1)), [w])


def test_test_only_op_as_numpy_kernel_runs_by_stages():
    refs = References([Registration(TEST_DOMAIN, "Square", Kernel(square_kernel))])
    model = square_model(helper.make_node("Relu", ["s1"], ["r"]),
                         helper.make_node("Clip", ["s1", "", ""], ["c"]))  # omitted inputs
    sub = substitute(model, refs)
    assert sub.replaced == ["Square 'sq1' -> numpy kernel", "Square 'sq2' -> numpy kernel"]
    assert [k.node.name for k in sub.kernels] == ["sq1", "sq2"] and sub.model is model
    x = rng_array(SHAPE, 8)
    got = references.run(sub, {"x": x})
    w = numpy_helper.to_array(model.graph.initializer[0])
    a = -(x * x) + w
    assert list(got) == ["y", "r", "c"]
    np.testing.assert_allclose(got["y"], a * a * 0.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["r"], np.maximum(x * x, 0))


def test_kernel_inside_a_branch_is_not_checkable():
    refs = References([Registration(TEST_DOMAIN, "Square", Kernel(square_kernel))])
    body = helper.make_graph([helper.make_node("Square", ["x"], ["t"], domain=TEST_DOMAIN)],
                             "then", [], [tensor("t", SHAPE)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [tensor("e", SHAPE)])
    model = make([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)],
                 [tensor("x", SHAPE), tensor("c", [], TensorProto.BOOL)],
                 [tensor("y", SHAPE)], (("", 17), (TEST_DOMAIN, 1)))
    sub = substitute(model, refs)
    assert sub.not_checkable == [
        "Square (test.graphfix): numpy kernels run only in the main graph"]


@pytest.fixture(scope="module")
def square_registered():
    """The test-only op in the default registry, through the public register()."""
    if not any(r.domain == TEST_DOMAIN for r in references.registered()):
        references.register(TEST_DOMAIN, "Square", Decompose(square_decomposition), ("1",))


def test_test_only_op_registered_as_decomposition(square_registered):
    model = square_model()
    sub = substitute(model)
    assert sub.replaced == ["Square 'sq1' -> Mul, Mul", "Square 'sq2' -> Mul, Mul"]
    assert ops(sub.model.graph) == ["Mul", "Mul", "Neg", "Add", "Mul", "Mul"]
    onnx.checker.check_model(sub.model, full_check=True)
    x = rng_array(SHAPE, 9)
    w = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(references.run(sub, {"x": x})["y"], np.square(w - x * x) * 0.5,
                               rtol=1e-6, atol=1e-6)
    two = make(model.graph.node, [tensor("x", SHAPE)], [tensor("y", SHAPE)],
               (("", 17), (TEST_DOMAIN, 2)), model.graph.initializer)
    assert substitute(two).not_checkable == [
        "Square (test.graphfix) version 2: references exist for versions 1"]


def test_a_lookup_while_another_thread_loads_the_providers_waits_for_them(
        tmp_path, monkeypatch):
    """`graphfix run` looks references up from the original's thread and the passes' at
    once; a lookup that came while the other thread was importing the providers saw none
    of their forms (a ModelOpt FP8 export: "not checkable")."""
    import sys
    import threading
    import time

    (tmp_path / "slow_provider.py").write_text(
        "import time\n"
        "from graphfix.runtime.references import Kernel, Registration\n"
        "time.sleep(0.3)\n"
        "REFERENCES = (Registration('slow', 'Op', Kernel(lambda i, a: i)),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_provider", raising=False)
    monkeypatch.setattr(references, "_PROVIDERS", ("slow_provider",))
    monkeypatch.setattr(references, "_DEFAULT", references.References())
    monkeypatch.setattr(references, "_providers_loaded", False)
    first = threading.Thread(target=references._default)
    first.start()
    time.sleep(0.1)  # the first thread is inside the slow import now
    found = references._default().find("slow", "Op", "1")
    first.join()
    assert found is not None


def _fp8_model(scale: float) -> onnx.ModelProto:
    """x -> trt::TRT_FP8QuantizeLinear -> trt::TRT_FP8DequantizeLinear -> Relu, as torch
    exports NVIDIA ModelOpt's FP8 quantizers (the quantized tensor declared UINT8)."""
    s = numpy_helper.from_array(np.array(scale, np.float32), "s")
    nodes = [helper.make_node("TRT_FP8QuantizeLinear", ["x", "s"], ["q"], domain="trt"),
             helper.make_node("TRT_FP8DequantizeLinear", ["q", "s"], ["d"], domain="trt"),
             helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(
        nodes, "fp8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], [s],
        value_info=[helper.make_tensor_value_info("q", TensorProto.UINT8, [6])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("trt", 1)])


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_trt_fp8_quantize_dequantize_round_to_float8_and_saturate(scale):
    from graphfix.runtime.outputs import run_checkable

    x = np.array([0.1, 1.0, 1000.0, 3.3, 0.3, -2.0], np.float32) * scale
    got = run_checkable(_fp8_model(scale), {"x": x})["y"]
    # float8 e4m3fn: 0.1 -> 0.1015625, 3.3 -> 3.25, 0.3 -> 0.3125; 1000 saturates at 448
    want = np.array([0.1015625, 1.0, 448.0, 3.25, 0.3125, 0.0], np.float32) * scale
    np.testing.assert_array_equal(got, want)
