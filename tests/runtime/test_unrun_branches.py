"""The run says which If branch its output check did not run (a BOOL graph input picks it:
optimum's merged decoders' `use_cache_branch`)."""

import numpy as np
import onnx
import pytest
from gfhelpers import parse

from graphfix.passes.base import PassContext
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.manager import run_passes
from graphfix.runtime.coverage import unrun_branches
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


@pytest.mark.parametrize(("value", "taken", "other", "again"),
                         [(1, "then", "else", 0), (0, "else", "then", 1)])
def test_the_run_names_the_branch_its_check_did_not_run(value, taken, other, again):
    model = parse(MODEL)
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model)),
                                values={"use_cache": value})
    _, report = run_passes(model, [("cleanup", Cleanup())], check, PassContext())
    assert (f"the check feeds use_cache = {bool(value)}: If 'y' runs only the {taken} "
            f"branch, so rewrites in the {other} branch were checked structurally but not "
            f"run; run again with --input-value use_cache={again} to run it"
            ) in report.verify_notes


def test_no_note_without_the_check_or_without_a_bool_condition_input():
    model = parse(MODEL)
    _, report = run_passes(model, [("cleanup", Cleanup())], OutputCheck.disabled("test"),
                           PassContext())
    assert not any("runs only" in n for n in report.verify_notes)
    onnx.checker.check_model(model)
    assert unrun_branches(model, {"x": np.zeros((2, 3), np.float32)}) == []
    assert len(unrun_branches(model, {"use_cache": np.array([True])})) == 1
    assert unrun_branches(model, {"use_cache": np.array([True, False])}) == []
