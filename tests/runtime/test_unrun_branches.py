"""The output check runs both branches an If takes by a BOOL graph input (optimum's merged
decoders' `use_cache_branch`): a rewrite that breaks the branch the check's own inputs do
not take is rolled back, and the run says what it ran."""

import numpy as np
import pytest
from gfhelpers import ops, parse

from graphfix.passes.base import NoOptions, Pass, PassContext, PassResult
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.manager import run_passes
from graphfix.report import APPLIED, NUMBERS, ROLLED_BACK
from graphfix.runtime.coverage import branch_inputs
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2,3] x, bool use_cache) => (float[2,3] y) {
    i = Identity(x)
    y = If(use_cache) <
        then_branch = g1 () => (float[2,3] a) { a = Relu(i) },
        else_branch = g2 () => (float[2,3] b) { b = Neg(i) }
    >
}"""


class _BreaksElse(Pass):
    """A wrong rewrite of the else branch alone (Neg becomes Abs)."""

    name = "breaks-else"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        for node in graph.nodes[-1].attrs["else_branch"].nodes:
            node.op = "Abs"
        return PassResult(changed=True)


def _check(model, value):
    return OutputCheck.prepare(model, resolve_shapes(graph_inputs(model)),
                               values={"use_cache": value})


@pytest.mark.parametrize("value", [1, 0])
def test_the_check_runs_both_branches_and_says_so(value):
    model = parse(MODEL)
    _, report = run_passes(model, [("cleanup", Cleanup())], _check(model, value),
                           PassContext())
    assert report.passes[0].status == APPLIED
    assert (f"the check runs the model with use_cache = {bool(value)} and again with "
            f"{not value}: If 'y' takes a branch by it") in report.verify_notes


@pytest.mark.parametrize("check_each", [False, True])
def test_a_rewrite_that_breaks_the_branch_not_fed_is_rolled_back(check_each):
    model = parse(MODEL)
    steps = [("cleanup", Cleanup()), ("breaks-else", _BreaksElse())]
    out, report = run_passes(model, steps, _check(model, 1), PassContext(),
                             check_each=check_each)
    record = report.passes[1]
    assert record.status == ROLLED_BACK and record.rollback_cause == NUMBERS
    assert record.rollback_reason.startswith("with use_cache = False: outputs differ")
    assert ops(out) == ["If"]
    else_ops = [n.op_type for a in out.graph.node[0].attribute if a.name == "else_branch"
                for n in a.g.node]
    assert else_ops == ["Neg"]


def test_a_branch_the_original_cannot_run_is_said_unrun():
    # the else branch reshapes [2, 3] to [5]: onnxruntime runs the model with True only
    model = parse(MODEL.replace("b = Neg(i)", "s = Constant<value = int64[1] {5}>() "
                                "b = Reshape(i, s)").replace("(float[2,3] b)", "(float[5] b)"
                                                             ).replace("(float[2,3] y)",
                                                                       "(float y)"))
    _, report = run_passes(model, [("cleanup", Cleanup())], _check(model, 1), PassContext())
    assert report.passes[0].status == APPLIED
    assert ("the check feeds use_cache = True: If 'y' takes only the then branch (the "
            "original does not run with False), so rewrites in the else branch were "
            "checked structurally but not run; run again with --input-value use_cache=0 "
            "to run it") in report.verify_notes


def test_only_a_one_element_bool_input_that_is_an_if_condition_counts():
    model = parse(MODEL)
    assert branch_inputs(model, {"use_cache": np.array([True])}) == {"use_cache": ["If 'y'"]}
    assert branch_inputs(model, {"x": np.zeros((2, 3), np.float32)}) == {}
    assert branch_inputs(model, {"use_cache": np.array([True, False])}) == {}
    assert _check(model, 1).others and not OutputCheck.disabled("test").others
