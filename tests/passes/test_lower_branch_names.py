"""lower-unsupported: If branches that return outputs under the same names (optimum's merged
decoders) get fresh names in the else branch, as every TensorRT table's If row asks."""

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.passes.base import PassContext
from graphfix.passes.lower_unsupported import BRANCH_NAMES, LowerUnsupported
from graphfix.trt import parse_target

F = TensorProto.FLOAT


def _merged(constant_in_else: bool) -> onnx.ModelProto:
    """then: (Add(x, 1), a Constant node's zeros); else: (Relu(x), Neg(x)), or with
    `constant_in_else` (Relu(x), an initializer of sevens) as optimum's with-past branch
    returns its empty `present.*.encoder.*` once graphfix made them initializers. Both
    branches name their outputs `logits` and `present`, as the If does."""
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    then_nodes = [helper.make_node("Add", ["x", "one"], ["logits"]),
                  helper.make_node("Constant", [], ["present"], value=numpy_helper
                                   .from_array(np.zeros((2, 3), np.float32)))]
    else_nodes = [helper.make_node("Relu", ["x"], ["logits"])]
    sevens = [numpy_helper.from_array(np.full((2, 3), 7, np.float32), "present")]
    if not constant_in_else:
        else_nodes.append(helper.make_node("Neg", ["x"], ["present"]))
    then = helper.make_graph(then_nodes, "with_past", [], [
        helper.make_tensor_value_info("logits", F, [2, 3]),
        helper.make_tensor_value_info("present", F, [2, 3])], [one])
    other = helper.make_graph(else_nodes, "no_past", [], [
        helper.make_tensor_value_info("logits", F, [2, 3]),
        helper.make_tensor_value_info("present", F, [2, 3])],
        sevens if constant_in_else else [])
    nodes = [helper.make_node("If", ["use_cache"], ["logits", "present"], name="merged",
                              then_branch=then, else_branch=other)]
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", F, [2, 3]),
                     helper.make_tensor_value_info("use_cache", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("logits", F, [2, 3]),
         helper.make_tensor_value_info("present", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _branch_outputs(model, name):
    branch, = [a.g for a in model.graph.node[0].attribute if a.name == name]
    return [o.name for o in branch.output], [n.op_type for n in branch.node]


def _restriction(model, version="10.16"):
    return [f for f in diagnose(model, parse_target(version)).findings
            if f.rule == "restriction-violated" and f.op == "If"]


@pytest.mark.parametrize("constant_in_else", [False, True])
@pytest.mark.parametrize("version", ["10.16", "8.6"])
def test_else_branch_outputs_named_like_the_then_branch_get_fresh_names(constant_in_else,
                                                                        version):
    model = _merged(constant_in_else)
    finding, = _restriction(model, version)
    assert "is 'logits' in both branches" in finding.message
    assert finding.fix.startswith("outputs named alike: lower-unsupported")
    ctx = PassContext(trt=parse_target(version))
    out, result = apply(LowerUnsupported(), model, ctx)
    assert dict(result.counts) == {BRANCH_NAMES: 2}
    assert ops(out) == ["If"] and [o.name for o in out.graph.output] == ["logits", "present"]
    assert _branch_outputs(out, "then_branch") == (["logits", "present"], ["Add", "Constant"])
    assert _branch_outputs(out, "else_branch") == (
        ["logits_else", "present_else"], ["Relu"] if constant_in_else else ["Relu", "Neg"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    for flag in (True, False):
        assert_same_outputs(model, out, {"x": x, "use_cache": np.array(flag)}, rtol=0, atol=0)
    assert not _restriction(out, version)
    assert_idempotent(LowerUnsupported(), out, ctx)
