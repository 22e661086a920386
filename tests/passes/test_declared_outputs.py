"""Declared output shapes the nodes contradict (`graph.declared`): a declaration the
input's nodes do not bear out gives way to the computed shape when a rewrite makes it
known; one they bear out still rolls back the pass that contradicts it."""

import onnx
import pytest
from gfhelpers import assert_same_outputs, feeds_for, ops, parse

from graphfix.graph.declared import unconfirmed
from graphfix.passes.base import NoOptions, Pass, PassContext, PassResult
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.fold_constants import FoldConstants
from graphfix.passes.manager import run_passes, run_pipeline
from graphfix.passes.pipeline import parse_pipeline
from graphfix.passes.unflatten_linear import UnflattenLinear
from graphfix.report import APPLIED, INVALID, ROLLED_BACK, UNCHANGED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

# ddddocr's OCR model in small: a linear layer on a flattened [N, 4, 6] tensor whose
# second Reshape's target is computed at run time (its length through an Abs, which ONNX's
# data propagation does not follow), and an output declared [1, S] (rank 2) while the
# nodes make [N, 4, 5]; onnxruntime runs it and warns
WRONG = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[N,4,6] x) => (float[1,S] y) {
    flat = Constant<value = int64[2] {-1, 6}>()
    f = Reshape(x, flat)
    w = Constant<value = float[6,5] {0.1, -0.2, 0.3, 0.4, -0.5, 0.6, 0.7, -0.8, 0.9, 1.0,
        -1.1, 1.2, 1.3, -1.4, 1.5, 1.6, -1.7, 1.8, 1.9, -2.0, 2.1, 2.2, -2.3, 2.4, 2.5,
        -2.6, 2.7, 2.8, -2.9, 3.0}>()
    c = Constant<value = float[5] {0.5, -0.25, 0.125, 1.0, -2.0}>()
    h = Gemm(f, w, c)
    s = Shape(x)
    start = Constant<value = int64[1] {0}>()
    one = Constant<value = int64[1] {1}>()
    rank = Shape(s)
    back = Sub(rank, one)
    end = Abs(back)
    lead = Slice(s, start, end)
    width = Constant<value = int64[1] {5}>()
    target = Concat<axis = 0>(lead, width)
    y = Reshape(h, target)
}"""


def _run(model, *passes, checked=True, **shapes):
    inputs = graph_inputs(model)
    check = (OutputCheck.prepare(model, resolve_shapes(inputs, shapes)) if checked
             else OutputCheck.disabled("--no-check"))
    return run_passes(model, [(p.name, p) for p in passes], check, PassContext())


def _shape(model):
    return [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]


def test_the_input_passes_inference_with_the_wrong_declaration():
    model = onnx.parser.parse_model(WRONG)
    onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    assert unconfirmed(model) == {"y"}


def test_the_default_pipeline_folds_what_the_declaration_stopped():
    # the old manager rolled back fold-constants (its folded target made the rank known)
    model = onnx.parser.parse_model(WRONG)
    out, report = run_pipeline(model, parse_pipeline("trt-prep"), OutputCheck.prepare(
        model, resolve_shapes(graph_inputs(model), {"x": (3, 4, 6)})), PassContext())
    assert not [r for r in report.passes if r.status == ROLLED_BACK]
    assert ops(out) == ["MatMul", "Add"] and _shape(out) == ["N", 4, 5]
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(model, out, feeds_for(model, x=(3, 4, 6)))


@pytest.mark.parametrize("checked", [True, False])
def test_a_rewrite_that_makes_the_shape_known_is_kept_and_the_output_declares_it(checked):
    model = onnx.parser.parse_model(WRONG)
    passes = FoldConstants(), UnflattenLinear()
    out, report = _run(model, *passes, checked=checked, x=(3, 4, 6))
    # fold-constants computes the target's length (the rank is known from then on)
    assert [r.status for r in report.passes] == [APPLIED, APPLIED]
    assert ops(out) == ["MatMul", "Add"]
    assert _shape(out) == ["N", 4, 5]
    assert any("output 'y' was declared with shape [1, 'S'], but its nodes compute "
               "['N', 4, 5]" in n for n in report.verify_notes)
    onnx.checker.check_model(out, full_check=True)
    feeds = feeds_for(model, x=(3, 4, 6))
    assert_same_outputs(model, out, feeds)
    again, report2 = _run(out, *passes, checked=checked, x=(3, 4, 6))
    assert [r.status for r in report2.passes] == [UNCHANGED] * 2
    assert ops(again) == ops(out) and _shape(again) == ["N", 4, 5]
    assert not any("was declared" in n for n in report2.verify_notes)


class _Flattens(Pass):
    """A wrong rewrite: the output becomes a flat [6] where the nodes made [2, 3]."""

    name = "flattens"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        import numpy as np
        import onnx_graphsurgeon as gs

        y = graph.outputs[0]
        relu = y.inputs[0]
        mid = gs.Variable("mid", dtype=np.float32)
        relu.outputs = [mid]
        graph.nodes.append(gs.Node("Reshape", "flat", inputs=[
            mid, gs.Constant("six", np.array([6], np.int64))], outputs=[y]))
        return PassResult(changed=True)


@pytest.mark.parametrize("checked", [True, False])
def test_a_declaration_the_nodes_bear_out_still_rolls_back_the_pass_that_contradicts_it(
        checked):
    model = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[2,3] x) => (float[2,3] y) {
        y = Relu(x)
    }""")
    assert unconfirmed(model) == frozenset()
    out, report = _run(model, _Flattens(), checked=checked)
    record = report.passes[0]
    assert record.status == ROLLED_BACK and record.rollback_cause == INVALID
    assert "shape inference fails on the result" in record.rollback_reason
    assert ops(out) == ["Relu"] and _shape(out) == [2, 3]
    assert not any("was declared" in n for n in report.verify_notes)


def test_a_declaration_the_input_itself_contradicts_gives_way_at_once():
    # [2, 6] reshaped to [3, 4], declared [4, 3]: strict inference failed on the input, so
    # every pass was held to lenient inference and the output kept the wrong declaration
    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[2,6] x) => (float[4,3] y) {
        t = Constant<value = int64[2] {3, 4}>()
        i = Identity(x)
        y = Reshape(i, t)
    }""")
    out, report = _run(model, Cleanup())
    assert [r.status for r in report.passes] == [APPLIED]
    assert ops(out) == ["Constant", "Reshape"] and _shape(out) == [3, 4]
    assert report.verify_notes == [
        "output 'y' was declared with shape [4, 3], but its nodes compute [3, 4] "
        "(onnxruntime warns of it on every run): the output declares the computed shape now"]
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(model, out, feeds_for(model))
