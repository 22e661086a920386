"""The rewrite budget: rewrites numbered over a whole run, stopped at a limit."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import assert_same_outputs, feeds_for, ops, parse

from graphfix import samples
from graphfix.errors import GraphfixError
from graphfix.passes.base import (
    LIMIT_REACHED,
    NoOptions,
    Note,
    Pass,
    PassContext,
    PassResult,
    Rewrite,
    RewriteBudget,
)
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.fold_bn import FoldBatchNorm
from graphfix.passes.manager import run_passes
from graphfix.passes.registry import PASSES
from graphfix.report import APPLIED, UNCHANGED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

# Five Relus on five independent branches, summed.
MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2,3] x) => (float[2,3] y) {
    r1 = Relu(x)
    n = Neg(x)
    r2 = Relu(n)
    s = Sin(x)
    r3 = Relu(s)
    c = Cos(x)
    r4 = Relu(c)
    t = Neg(s)
    r5 = Relu(t)
    y = Sum(r1, r2, r3, r4, r5)
}"""


class ReluAsMax(Pass):
    """Relu(x) -> Max(x, 0), one rewrite per Relu; `wrong` makes the n-th use 0.5."""

    name = "relu-as-max"
    summary = "test only"
    Options = NoOptions
    counts_rewrites = True
    wrong = 0

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        for node in [n for n in graph.nodes if n.op == "Relu"]:
            if not ctx.allow_rewrite(self.name, f"Relu '{node.name or node.outputs[0].name}'"):
                result.notes.append(Note(node.outputs[0].name, LIMIT_REACHED))
                continue
            result.counts["rewrote Relu as Max"] += 1
            floor = 0.5 if result.counts["rewrote Relu as Max"] == self.wrong else 0.0
            node.op = "Max"
            node.inputs.append(gs.Constant(f"{node.outputs[0].name}_zero",
                                           np.array(floor, np.float32)))
            result.changed = True
        return result


class NegAsMul(Pass):
    """Neg(x) -> Mul(x, -1), one rewrite per Neg."""

    name = "neg-as-mul"
    summary = "test only"
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        for node in [n for n in graph.nodes if n.op == "Neg"]:
            if not ctx.allow_rewrite(self.name, f"Neg '{node.outputs[0].name}'"):
                result.notes.append(Note(node.outputs[0].name, LIMIT_REACHED))
                continue
            result.counts["rewrote Neg as Mul"] += 1
            node.op = "Mul"
            node.inputs.append(gs.Constant(f"{node.outputs[0].name}_m1",
                                           np.array(-1.0, np.float32)))
            result.changed = True
        return result


def op_by_output(model) -> dict[str, str]:
    """Each node's op by its output (the manager's toposort may reorder the nodes)."""
    return {n.output[0]: n.op_type for n in model.graph.node}


def run_with(model, budget: RewriteBudget | None, *passes: Pass):
    shapes = resolve_shapes(graph_inputs(model))
    ctx = PassContext(input_shapes=shapes, rewrites=budget)
    steps = [(p.name, p) for p in passes]
    return run_passes(model, steps, OutputCheck.prepare(model, shapes), ctx)


def test_budget_allows_the_first_n_and_numbers_them():
    budget = RewriteBudget(2)
    budget.start(4, "fold-bn")
    assert [budget.allow("fold-bn", s) for s in "abc"] == [True, True, False]
    assert budget.applied == [Rewrite(1, "fold-bn", "a", 4), Rewrite(2, "fold-bn", "b", 4)]
    assert budget.denied == 1
    assert str(budget.applied[1]) == "rewrite #2 (fold-bn: b)"
    assert PassContext().allow_rewrite("x", "y")  # no budget: everything, nothing counted
    with pytest.raises(GraphfixError, match="cannot be negative"):
        RewriteBudget(-1)


def test_max_rewrites_2_applies_exactly_the_first_two():
    model = parse(MODEL)
    out, report = run_with(model, RewriteBudget(2), ReluAsMax())
    assert op_by_output(out) == {"r1": "Max", "n": "Neg", "r2": "Max", "s": "Sin", "r3": "Relu",
                                 "c": "Cos", "r4": "Relu", "t": "Neg", "r5": "Relu", "y": "Sum"}
    (rec,) = report.passes
    assert rec.status == APPLIED and rec.counts == {"rewrote Relu as Max": 2}
    assert rec.notes == [f"{r}: {LIMIT_REACHED}" for r in ("r3", "r4", "r5")]
    assert [(r.index, r.spec, r.label, r.step) for r in report.rewrites] == [
        (1, "relu-as-max", "Relu 'r1'", 0), (2, "relu-as-max", "Relu 'r2'", 0)]
    assert report.rewrite_limit == 2
    assert_same_outputs(model, out, feeds_for(model))


def test_budget_counts_across_passes_in_order():
    model = parse(MODEL)
    out, report = run_with(model, RewriteBudget(7), ReluAsMax(), NegAsMul())
    assert op_by_output(out) == {"r1": "Max", "n": "Mul", "r2": "Max", "s": "Sin", "r3": "Max",
                                 "c": "Cos", "r4": "Max", "t": "Mul", "r5": "Max", "y": "Sum"}
    assert [(r.index, r.spec, r.step) for r in report.rewrites] == [
        (i, "relu-as-max", 0) for i in range(1, 6)] + [(6, "neg-as-mul", 1), (7, "neg-as-mul", 1)]
    assert [r.label for r in report.rewrites[5:]] == ["Neg 'n'", "Neg 't'"]
    _, report = run_with(model, RewriteBudget(5), ReluAsMax(), NegAsMul())
    assert report.passes[1].status == UNCHANGED
    assert report.passes[1].notes == [f"n: {LIMIT_REACHED}", f"t: {LIMIT_REACHED}"]
    assert_same_outputs(model, out, feeds_for(model))


def test_a_pass_that_does_not_count_is_one_rewrite_undone_past_the_limit():
    model = parse(MODEL.replace("y = Sum(", "i = Identity(r1)\n    y = Sum(i, r2, r3, r4, r5, "))
    out, report = run_with(model, RewriteBudget(0), Cleanup())
    assert ops(out) == ops(model)
    (rec,) = report.passes
    assert rec.status == UNCHANGED and rec.notes == ["all of its changes: " + LIMIT_REACHED]
    out, report = run_with(model, RewriteBudget(1), Cleanup(), ReluAsMax())
    assert "Identity" not in ops(out) and "Max" not in ops(out)
    assert [str(r) for r in report.rewrites] == ["rewrite #1 (cleanup: all of its changes)"]


def test_fold_bn_with_a_budget_folds_the_first_n_batchnorms():
    model = samples.conv_bn_relu_residual()
    bns = [n.name for n in model.graph.node if n.op_type == "BatchNormalization"]
    out, report = run_with(model, RewriteBudget(2), FoldBatchNorm())
    assert [n.name for n in out.graph.node if n.op_type == "BatchNormalization"] == bns[2:]
    assert [r.label.split("'")[1] for r in report.rewrites] == bns[:2]
    assert report.passes[0].notes == [f"BatchNormalization '{bns[2]}': {LIMIT_REACHED}"]
    assert_same_outputs(model, out, feeds_for(model, input=(1, 3, 32, 32)), rtol=1e-4, atol=1e-5)


def test_the_passes_with_many_independent_rewrites_count_them():
    counting = {cls.name for cls in PASSES if cls.counts_rewrites}
    assert counting == {
        "fold-bn", "fuse-conv-bias", "fuse-conv-mul", "fuse-pad-conv", "normalize-activations",
        "eliminate-noops", "dedup-constants", "merge-duplicates", "fold-reshape-targets",
        "unflatten-linear", "merge-parallel-convs",
        "bound-nms", "plugin-to-nms", "nms-to-plugin", "nms-for-trt", "lower-unsupported",
        "substitute-plugins", "migrate-plugins"}
