"""inline-functions: exact ops after, numerics, checker, idempotence, and what passes see."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import apply, assert_rewrites, ops, seeded
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.passes.inline_functions import InlineFunctions


def _with_functions(nodes, functions, inits=(), domain="pkg") -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(domain, 1)],
                              functions=functions)
    onnx.checker.check_model(model)
    return model


def _conv_bn_relu_block() -> onnx.ModelProto:
    """Two calls of a Conv -> BatchNormalization -> Relu function (PyTorch's
    export_modules_as_functions of a block)."""
    block = helper.make_function(
        "pkg", "Block", ["a", "w", "g", "b", "m", "v"], ["out"],
        [helper.make_node("Conv", ["a", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
         helper.make_node("Relu", ["n"], ["out"])],
        [helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(seeded((3, 3, 3, 3)) * 0.3, "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 3).astype(np.float32), "g"),
             numpy_helper.from_array(rng.uniform(-0.2, 0.2, 3).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, 3).astype(np.float32), "m"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, 3).astype(np.float32), "v")]
    params = ["w", "g", "b", "m", "v"]
    return _with_functions([helper.make_node("Block", ["x", *params], ["h"], domain="pkg"),
                            helper.make_node("Block", ["h", *params], ["y"], domain="pkg")],
                           [block], inits)


def test_each_call_becomes_the_functions_nodes():
    out = assert_rewrites(InlineFunctions(), _conv_bn_relu_block(),
                          ["Conv", "BatchNormalization", "Relu"] * 2,
                          {"inlined calls of pkg.Block": 2})
    assert not out.functions


def test_the_default_pipeline_then_folds_what_the_function_held():
    """Before, fold-bn said 'no BatchNormalization in the graph': it was in the function."""
    result = graphfix.run(_conv_bn_relu_block(), check=True)
    assert ops(result.model) == ["Conv", "Relu"] * 2
    assert not result.model.functions
    assert all(r.status != "rolled_back" for r in result.report.passes)


def test_attribute_references_take_the_callers_values():
    node = helper.make_node("LeakyRelu", ["a"], ["out"])
    node.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    leaky = helper.make_function("pkg", "Leaky", ["a"], ["out"], [node],
                                 [helper.make_opsetid("", 17)], attributes=["alpha"])
    model = _with_functions([helper.make_node("Leaky", ["x"], ["h"], domain="pkg", alpha=0.5),
                             helper.make_node("Leaky", ["h"], ["y"], domain="pkg", alpha=0.1)],
                            [leaky])
    out = assert_rewrites(InlineFunctions(), model, ["LeakyRelu", "LeakyRelu"],
                          {"inlined calls of pkg.Leaky": 2})
    assert [n.attribute[0].f for n in out.graph.node] == [0.5, np.float32(0.1)]


def test_a_model_without_functions_is_left_alone():
    model = _with_functions([helper.make_node("Relu", ["x"], ["y"])], [])
    out, result = apply(InlineFunctions(), model)
    assert not result.changed and ops(out) == ["Relu"]
    assert [(n.subject, n.reason) for n in result.notes] == [
        ("graph", "the model has no local functions")]
