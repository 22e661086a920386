"""unflatten-linear: Reshape(x, [-1, K]) -> Gemm/MatMul -> Reshape(x's leading dims, N)
becomes MatMul (+ Add) on x (onnxsim's Gemm fusion of a transformer's linear layers)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import apply, assert_idempotent, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import fingerprint
from graphfix.passes.base import PassContext
from graphfix.passes.unflatten_linear import UnflattenLinear
from graphfix.runtime.session import run_model

K, N = 8, 6
F = TensorProto.FLOAT


def _w(name, *shape, seed=0):
    return numpy_helper.from_array(
        (np.random.default_rng(seed).standard_normal(shape) * 0.5).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _restore(prefix: str, source: str, n: int = N) -> list[onnx.NodeProto]:
    """prefix_t = Concat(Shape(source)[:-1], [n]): what onnxsim writes for the target."""
    return [helper.make_node("Shape", [source], [f"{prefix}_shape"]),
            helper.make_node("Slice", [f"{prefix}_shape", "zero", "minus_one"],
                             [f"{prefix}_lead"]),
            helper.make_node("Concat", [f"{prefix}_lead", f"{prefix}_n"], [f"{prefix}_t"],
                             axis=0)]


def _model(layers: int = 1, gemm_attrs=None, source: str = "x", c_shape=(N,),
           middle: str = "Gemm", extra_reader: bool = False) -> onnx.ModelProto:
    """x [b, s, K] -> Relu -> Reshape [-1, K] -> `layers` linear layers reading it -> each
    Reshape back (target from Shape(`source`)) -> Add of all."""
    nodes = [helper.make_node("Relu", ["x0"], ["x"]),
             helper.make_node("Reshape", ["x", "flat_shape"], ["flat"])]
    inits = [_i64("flat_shape", [-1, K]), _i64("zero", [0]), _i64("minus_one", [-1])]
    outs = []
    for i in range(layers):
        attrs = dict(gemm_attrs or {})
        b_shape = (N, K) if attrs.get("transB") else (K, N)
        inits.append(_w(f"b{i}", *b_shape, seed=i))
        inputs = ["flat", f"b{i}"]
        if middle == "Gemm" and c_shape is not None:
            inits.append(_w(f"c{i}", *c_shape, seed=10 + i))
            inputs.append(f"c{i}")
        nodes.append(helper.make_node(middle, inputs, [f"y{i}"], name=f"linear{i}", **attrs))
        inits.append(_i64(f"r{i}_n", [N]))
        nodes += _restore(f"r{i}", source)
        nodes.append(helper.make_node("Reshape", [f"y{i}", f"r{i}_t"], [f"o{i}"]))
        outs.append(f"o{i}")
    if extra_reader:
        nodes.append(helper.make_node("ReduceSum", ["flat"], ["side"], keepdims=0))
    nodes.append(helper.make_node("Sum", outs, ["out"]) if len(outs) > 1 else
                 helper.make_node("Identity", outs, ["out"]))
    outputs = [helper.make_tensor_value_info("out", F, ["b", "s", N])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("side", F, []))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", F,
                                                                         ["b", "s", K])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return onnx.shape_inference.infer_shapes(model)  # as the pass manager has them


def _rewrites(model, expected_ops, counts):
    out, result = apply(UnflattenLinear(), model)
    assert result.changed and dict(result.counts) == counts, result.counts
    assert ops(out) == expected_ops
    for shape in ((2, 3, K), (1, 5, K)):  # dynamic leading dims: equal at both
        feeds = {"x0": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
        want, got = run_model(model, feeds)["out"], run_model(out, feeds)["out"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert_idempotent(UnflattenLinear(), out)
    return out


def test_a_gemm_between_a_flatten_and_its_inverse_becomes_matmul_and_add():
    _rewrites(_model(), ["Relu", "MatMul", "Add", "Identity"],
              {"wrote Gemm on the unflattened tensor": 1})


def test_three_projections_sharing_one_flatten_are_all_rewritten():
    _rewrites(_model(layers=3), ["Relu", "MatMul", "MatMul", "MatMul", "Add", "Add", "Add",
                                 "Sum"], {"wrote Gemm on the unflattened tensor": 3})


def test_alpha_beta_and_trans_b_are_folded_into_the_constants():
    out = _rewrites(_model(gemm_attrs={"alpha": 0.5, "beta": 2.0, "transB": 1}, c_shape=(1, N)),
                    ["Relu", "MatMul", "Add", "Identity"],
                    {"wrote Gemm on the unflattened tensor": 1})
    weight = next(t for t in out.graph.initializer if t.name == out.graph.node[1].input[1])
    assert list(weight.dims) == [K, N]


def test_a_matmul_between_them_becomes_one_matmul():
    _rewrites(_model(middle="MatMul"), ["Relu", "MatMul", "Identity"],
              {"wrote MatMul on the unflattened tensor": 1})


@pytest.mark.parametrize("case, reason", [
    ("shape of another tensor", "Gemm 'linear0': entry 0 of the second Reshape's target is "
                                "not dim 0 of x"),
    ("c per row", "Gemm 'linear0': its C is not a constant of one row"),
    ("another reader", "ReduceSum 'side' reads the flattened tensor too"),
])
def test_what_it_cannot_prove_stays_with_the_reason(case, reason):
    model = _model(source="x0" if case == "shape of another tensor" else "x",
                   c_shape=(4, N) if case == "c per row" else (N,),
                   extra_reader=case == "another reader")
    graph = gs.import_onnx(model)
    before = fingerprint(graph)
    result = UnflattenLinear().run(graph, PassContext())
    assert not result.changed and fingerprint(graph) == before
    note = result.notes[0]
    assert (note.subject, note.reason) == ("Reshape 'flat'", reason)
