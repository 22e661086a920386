"""graphfix.plugins.lowering: the op table, which lowerings a target can take, Einsum
equations, the restrictions each lowering reads, and doctor's fix text.

The rewrites themselves (exact ops, numerics) are tested through the pass, in
tests/passes/test_lower_unsupported.py.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.graph import fingerprint
from graphfix.plugins.einsum import ELLIPSIS, parse_einsum
from graphfix.plugins.lowering import (
    LOWERINGS,
    NO_DTYPE,
    Env,
    emitted_ops,
    lowering_for,
    unavailable,
)
from graphfix.trt import parse_target

F = TensorProto.FLOAT


class _Without:
    """A TensorRT target whose table lacks `ops`."""

    def __init__(self, version: str, *ops: str) -> None:
        self.base, self.lacks = parse_target(version), set(ops)

    def op(self, op: str):
        return None if op in self.lacks else self.base.op(op)


def _graph(op: str, inputs: int = 1, opset: int = 17, shape=(2, 6, 4, 4), **attrs) -> gs.Graph:
    names = ["x", "s", "b"][:inputs]
    inits = [numpy_helper.from_array(np.ones([shape[1]], np.float32), n) for n in names[1:]]
    if op == "Resize":  # X, roi, scales
        names = ["x", "", "scales"]
        inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, shape)], inits)
    return gs.import_onnx(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)]))


SAMPLES = {  # one node per op type, with the attributes that make it emit the most
    "LayerNormalization": dict(inputs=3, stash_type=TensorProto.DOUBLE),
    "GroupNormalization": dict(inputs=3, opset=21, num_groups=2, stash_type=TensorProto.DOUBLE),
    "InstanceNormalization": dict(inputs=3),
    "Gelu": dict(opset=20, approximate="tanh"),
    "HardSigmoid": {}, "HardSwish": dict(opset=14), "Mish": dict(opset=18), "Softplus": {},
    "Einsum": dict(opset=12, shape=(3, 3), equation="ij->ji"),
    "Resize": dict(opset=13, mode="cubic", exclude_outside=1,
                   coordinate_transformation_mode="pytorch_half_pixel"),
}


def test_every_lowering_has_a_sample_and_emits_only_what_it_declares():
    assert set(SAMPLES) == set(LOWERINGS)
    for op, sample in SAMPLES.items():
        graph = _graph(op, **sample)
        before = fingerprint(graph)
        node = graph.nodes[0]
        emit = LOWERINGS[op].plan(node, Env(graph, sample.get("opset", 17), np.dtype("float32")))
        assert not isinstance(emit, str), (op, emit)
        emitted = emitted_ops(emit, Env(graph, sample.get("opset", 17), np.dtype("float32")))
        assert emitted and set(emitted) <= LOWERINGS[op].emits, (op, emitted)
        assert fingerprint(graph) == before  # a dry run changes nothing


def _node(op: str, inputs: int, **attrs) -> tuple[gs.Node, gs.Graph]:
    tensors = [gs.Variable(f"i{i}", dtype=np.float32, shape=[2, 4, 3]) for i in range(inputs)]
    node = gs.Node(op, "n", attrs, tensors, [gs.Variable("y", dtype=np.float32)])
    return node, gs.Graph(nodes=[node], inputs=tensors, outputs=node.outputs)


@pytest.mark.parametrize(("op", "inputs", "attrs", "dtype", "opset", "reason"), [
    ("Gelu", 1, {"approximate": "erf"}, "float32", 20,
     "its approximate='erf' is neither 'none' nor 'tanh'"),
    ("Gelu", 1, {}, None, 20, NO_DTYPE),
    ("HardSigmoid", 1, {}, None, 17, NO_DTYPE),
    ("Softplus", 1, {}, None, 17, NO_DTYPE),
    ("LayerNormalization", 1, {}, "float32", 17, "it has no Scale input"),
    ("LayerNormalization", 2, {}, None, 17, NO_DTYPE),
    ("LayerNormalization", 2, {"stash_type": TensorProto.INT32}, "float32", 17,
     "its stash_type 6 is not a floating-point type numpy can compute in"),
    ("GroupNormalization", 2, {"num_groups": 2}, "float32", 21, "it has 2 inputs, not 3"),
    ("GroupNormalization", 3, {"num_groups": 2}, None, 21, NO_DTYPE),
    ("InstanceNormalization", 3, {}, None, 17, NO_DTYPE),
    ("Einsum", 2, {"equation": "ij,jk->ik->i"}, "float32", 12,
     "its equation 'ij,jk->ik->i' is not one this pass can read"),
])
def test_a_node_without_an_exact_lowering_says_why(op, inputs, attrs, dtype, opset, reason):
    node, graph = _node(op, inputs, **attrs)
    env = Env(graph, opset, np.dtype(dtype) if dtype else None)
    assert LOWERINGS[op].plan(node, env) == reason


@pytest.mark.parametrize(("op", "trt", "lowers"), [
    ("LayerNormalization", "8.4", True),
    ("LayerNormalization", "8.6", True),  # a lowering exists; whether to apply it is the pass's
    ("Gelu", "8.0", True),
    ("Einsum", "8.0", True),
    ("Hardmax", "8.6", False),
    ("ReduceMean", "10.16", False),  # axes handling is a note, not a lowering
])
def test_lowering_for_a_documented_target(op, trt, lowers):
    found = lowering_for(op, parse_target(trt))
    assert (found is LOWERINGS.get(op)) if lowers else found is None


def test_emitted_ops_may_themselves_be_lowered_but_not_forever():
    no_hard_sigmoid = _Without("8.4", "HardSwish", "HardSigmoid")
    assert lowering_for("HardSwish", no_hard_sigmoid) is LOWERINGS["HardSwish"]
    assert unavailable(["HardSigmoid", "Mul"], no_hard_sigmoid) == []
    no_max = _Without("8.4", "HardSwish", "HardSigmoid", "Max")
    assert lowering_for("HardSwish", no_max) is None
    assert unavailable(["HardSigmoid", "Mul", "Max"], no_max) == ["HardSigmoid", "Max"]
    assert lowering_for("Gelu", _Without("10.0", "Gelu", "Erf")) is None
    assert lowering_for("Mish", _Without("8.4", "Softplus")) is LOWERINGS["Mish"]


@pytest.mark.parametrize(("equation", "operands", "expected"), [
    ("ij,jk->ik", 2, ([["i", "j"], ["j", "k"]], ["i", "k"])),
    ("ij, jk", 2, ([["i", "j"], ["j", "k"]], ["i", "k"])),
    ("ba", 1, ([["b", "a"]], ["a", "b"])),
    ("...ij,...jk", 2, ([[ELLIPSIS, "i", "j"], [ELLIPSIS, "j", "k"]], [ELLIPSIS, "i", "k"])),
    ("ij,jk->ik", 3, "its equation 'ij,jk->ik' names 2 operands, not 3"),
    ("i1,jk->ik", 2, "its equation 'i1,jk->ik' is not one this pass can read"),
    ("aB,Bc", 2, "its implicit equation 'aB,Bc' mixes upper and lower case letters"),
])
def test_parse_einsum(equation, operands, expected):
    assert parse_einsum(equation, operands) == expected


def _einsum(equation: str, *shapes) -> tuple[gs.Node, Env]:
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], name="es", equation=equation)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F, s)
                                            for n, s in zip(names, shapes, strict=True)],
                              [helper.make_tensor_value_info("y", F, None)])
    g = gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    return g.nodes[0], Env(g, 12, np.dtype("float32"))


@pytest.mark.parametrize(("equation", "shapes", "reason"), [
    ("ii->i", [[3, 3]], "it repeats a letter within one term (a diagonal), which is not a "
                        "matrix multiply"),
    ("ij->i", [[3, 3]], "it sums over a letter of its one operand, which is not a transpose"),
    ("ij,jk,kl->il", [[2, 2]] * 3, "it has 3 operands; only 1 (a transpose) or 2 (a matrix "
                                   "multiply) lower"),
    ("ij,jk->i", [[2, 3], [3, 4]], "it sums over k of one operand alone, which is not a matrix "
                                   "multiply"),
    ("ijk,jkl->il", [[2, 3, 4], [3, 4, 5]], "it is not a (batched) matrix multiply: it contracts "
     "2 letters and keeps 1 of the first and 1 of the second operand alone (a MatMul needs 1, "
     "1 and 1)"),
    ("i...j,jk->ik", [[2, 3, 4], [4, 5]], "its ellipsis is not the leading term of every "
                                          "operand and of the output"),
    ("...ji,...jk->...ik", [None, None], "an operand with an ellipsis of unknown rank needs a "
                                         "transpose"),
])
def test_einsum_that_does_not_lower_says_why(equation, shapes, reason):
    node, env = _einsum(equation, *shapes)
    assert LOWERINGS["Einsum"].plan(node, env) == reason


def test_einsum_restrictions_text_of_8_4():
    text = parse_target("8.4").op("Einsum").restrictions
    restricted = LOWERINGS["Einsum"].restricted
    assert restricted(*_einsum("...ij,...jk->...ik", [2, 3, 4], [2, 4, 5]), text) == (
        f"its equation has an ellipsis, and the table says: {text}")
    assert restricted(*_einsum("bij,bjk->bik", [1, 3, 4], [2, 4, 5]), text) == (
        f"its inputs broadcast against each other, and the table says: {text}")
    assert restricted(*_einsum("bij,bjk->bik", [2, 3, 4], [2, 4, 5]), text) is None
    assert restricted(*_einsum("ii->i", [3, 3]), text) == (
        f"its equation takes a diagonal, and the table says: {text}")


def test_instance_norm_restrictions_text_of_8_4():
    text = parse_target("8.4").op("InstanceNormalization").restrictions
    restricted = LOWERINGS["InstanceNormalization"].restricted
    graph = _graph("InstanceNormalization", inputs=3)
    assert restricted(graph.nodes[0], Env(graph, 17, None), text) is None
    graph = _graph("InstanceNormalization", inputs=3, shape=(1, 2, 2, 2, 2, 2))
    assert restricted(graph.nodes[0], Env(graph, 17, None), text) == (
        f"its input has rank 6, and the table says: {text}")


def _single_op(op: str, opset: int, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [2, 4])],
                              [helper.make_tensor_value_info("y", F, [2, 4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "s")]
                              if op == "LayerNormalization" else [])
    if op == "LayerNormalization":
        graph.node[0].input.append("s")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(("op", "opset", "trt", "fix"), [
    ("LayerNormalization", 17, "8.4", "TensorRT 8.6 supports it; otherwise lower-unsupported "
     "rewrites it into ops this version parses: graphfix run model.onnx --trt 8.4 --passes "
     "lower-unsupported"),
    ("Gelu", 20, "9.3", "TensorRT 10.0 supports it; otherwise lower-unsupported rewrites it "
     "into ops this version parses: graphfix run model.onnx --trt 9.3 --passes "
     "lower-unsupported"),
    ("Hardmax", 13, "8.6", "TensorRT 9.3 supports it; otherwise rewrite that part of the model "
     "before export or implement the op as a TensorRT plugin"),
])
def test_doctor_names_lower_unsupported_when_a_lowering_exists(op, opset, trt, fix):
    found = [f for f in diagnose(_single_op(op, opset), parse_target(trt)).findings
             if f.rule == "op-unsupported"]
    assert [(f.op, f.fix) for f in found] == [(op, fix)]
