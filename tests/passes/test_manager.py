"""The manager: verification after every pass, rollback, the report."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import feeds_for, ops, parse, spy, unrunnable_model

from graphfix.errors import GraphfixError
from graphfix.graph import to_graph
from graphfix.passes import manager
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.manager import run_passes, run_pipeline
from graphfix.passes.pipeline import parse_pipeline
from graphfix.report import APPLIED, ROLLED_BACK, UNCHANGED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2,3] x) => (float[2,3] y) {
    a = Identity(x)
    r = Relu(a)
    y = Sigmoid(r)
}"""


class _TestPass(Pass):
    summary = "test only"
    Options = NoOptions


class Raises(_TestPass):
    name = "raises"

    def run(self, graph, ctx):
        graph.nodes[0].op = "Neg"  # a half-done edit must not survive
        raise RuntimeError("boom")


class BreaksNumbers(_TestPass):
    name = "breaks-numbers"

    def run(self, graph, ctx):
        for node in graph.nodes:
            if node.op == "Sigmoid":
                node.op = "Tanh"
        return PassResult(changed=True)


class BreaksChecker(_TestPass):
    name = "breaks-checker"

    def run(self, graph, ctx):
        graph.nodes[-1].op = "NoSuchOp"
        return PassResult(changed=True)


class LiesAboutChanging(_TestPass):
    name = "lies"

    def run(self, graph, ctx):
        for node in graph.nodes:
            if node.op == "Sigmoid":
                node.op = "Tanh"
        return PassResult(changed=False, notes=[Note("graph", "nothing")])


class AnnotatesShapes(_TestPass):
    """Re-annotates shapes (as fold-constants' shape inference does) and rewrites nothing."""

    name = "annotates-shapes"
    annotates_shapes = True

    def run(self, graph, ctx):
        for node in graph.nodes:
            node.outputs[0].shape = None
        return PassResult(changed=False, notes=[Note("graph", "nothing to rewrite")])


class ClaimsNoAnnotation(_TestPass):
    """Says it gave no tensor a shape (`PassResult.annotated` False); `lie`: it drops them."""

    name = "claims-no-annotation"
    annotates_shapes = True
    lie = False

    def run(self, graph, ctx):
        if self.lie:
            for node in graph.nodes:
                node.outputs[0].shape = None
        return PassResult(changed=False, annotated=False)


class UserError(_TestPass):
    name = "user-error"

    def run(self, graph, ctx):
        raise GraphfixError("bad option", "because", "fix it")


def check_for(model):
    inputs = graph_inputs(model)
    return OutputCheck.prepare(model, resolve_shapes(inputs))


def run(model, *passes, check_each=False):
    steps = [(p.name, p) for p in passes]
    return run_passes(model, steps, check_for(model), PassContext(), check_each=check_each)


def test_good_pass_is_applied_and_checked():
    model = parse(MODEL)
    out, report = run(model, Cleanup())
    (rec,) = report.passes
    assert rec.status == APPLIED
    assert rec.check.startswith("passed")
    assert (rec.nodes_before, rec.nodes_after) == (3, 2)
    assert ops(out) == ["Relu", "Sigmoid"]
    assert ops(model) == ["Identity", "Relu", "Sigmoid"], "the input model is not modified"


def test_raising_pass_rolls_back_and_names_the_passes_before_it():
    model = parse(MODEL)
    out, report = run(model, Cleanup(), Raises(), Cleanup())
    assert [r.status for r in report.passes] == [APPLIED, ROLLED_BACK, UNCHANGED]
    reason = report.passes[1].rollback_reason
    assert "RuntimeError: boom" in reason and "(after cleanup)" in reason
    assert "Traceback" in report.passes[1].traceback
    assert ops(out) == ["Relu", "Sigmoid"]
    assert report.rolled_back == [report.passes[1]]


def test_pass_that_breaks_numbers_is_rolled_back():
    model = parse(MODEL)
    out, report = run(model, BreaksNumbers())
    (rec,) = report.passes
    assert rec.status == ROLLED_BACK
    assert "outputs differ: y:" in rec.rollback_reason
    assert ops(out) == ops(model)


def test_pass_that_breaks_the_checker_is_rolled_back():
    model = parse(MODEL)
    out, report = run(model, BreaksChecker())
    assert report.passes[0].status == ROLLED_BACK
    assert "onnx.checker" in report.passes[0].rollback_reason
    assert ops(out) == ops(model)


@pytest.mark.parametrize("check_each", [True, False])
def test_a_change_is_verified_even_when_the_pass_says_unchanged(check_each):
    _, report = run(parse(MODEL), LiesAboutChanging(), check_each=check_each)
    assert report.passes[0].status == ROLLED_BACK
    # batched, it is taken at its word until the fingerprint at the end; the run is then
    # repeated with a fingerprint after every pass
    assert any("the fingerprint check after pass 1 (lies)" in n and "repeated" in n
               for n in report.verify_notes) != check_each


def test_a_change_under_a_pass_taken_at_its_word_is_checked_with_the_next_pass():
    # the lie (Sigmoid -> Tanh) is in the next pass's candidate, whose check fails; the
    # repeated run fingerprints every pass and rolls back the liar itself
    model = parse(MODEL)
    out, report = run(model, LiesAboutChanging(), DoublesRelu())
    _, each = run(model, LiesAboutChanging(), DoublesRelu(), check_each=True)
    assert [r.status for r in report.passes] == [ROLLED_BACK, APPLIED]
    assert [(r.status, r.check) for r in report.passes] == [
        (r.status, r.check) for r in each.passes]
    assert ops(out) == ["Identity", "Relu", "Relu", "Sigmoid"]


def test_a_pass_that_only_annotates_shapes_is_unchanged():
    # else a preset after a rollback "changes" the graph every round (maskrcnn)
    _, report = run(parse(MODEL), AnnotatesShapes())
    assert report.passes[0].status == UNCHANGED
    assert report.passes[0].check == "unchanged"


def test_a_pass_that_says_it_annotated_nothing_is_taken_at_its_word(monkeypatch):
    calls = []
    real = manager.fingerprint
    monkeypatch.setattr(manager, "fingerprint", lambda g: calls.append(1) or real(g))
    _, said = run(parse(MODEL), ClaimsNoAnnotation(), ClaimsNoAnnotation())
    taken_at_word = len(calls)
    calls.clear()
    _, unsaid = run(parse(MODEL), AnnotatesShapes(), AnnotatesShapes())
    assert [r.status for r in said.passes + unsaid.passes] == [UNCHANGED] * 4
    # the claims cost one fingerprint before them and one at the end for both; passes
    # that do not say are fingerprinted after each
    assert (taken_at_word, len(calls)) == (2, 3)
    assert not any("fingerprint check" in n for n in said.verify_notes)


def test_a_pass_that_surely_changed_the_graph_is_not_fingerprinted(monkeypatch):
    calls = []
    real = manager.fingerprint
    monkeypatch.setattr(manager, "fingerprint", lambda g: calls.append(1) or real(g))
    out, report = run(parse(MODEL), CountsRuns(), DoublesRelu())
    assert [r.status for r in report.passes] == [UNCHANGED, APPLIED]
    assert ops(out) == ["Identity", "Relu", "Relu", "Sigmoid"]
    # one fingerprint, before the first pass: the second changed the node count, which
    # tells a change as surely as a fingerprint after it would (one taken at its word
    # before it can no longer be told apart from it either way)
    assert len(calls) == 1
    assert not any("fingerprint check" in n for n in report.verify_notes)


def test_a_false_claim_of_no_annotation_is_caught_at_the_end():
    liar = ClaimsNoAnnotation()
    liar.lie = True
    _, report = run(parse(MODEL), liar)
    # the shapes it dropped are a change it did not say: the fingerprint at the end finds
    # it and the run is repeated with a fingerprint after every pass, which sees the
    # pass only annotated shapes
    assert any("the fingerprint check after pass 1 (claims-no-annotation)" in n
               and "repeated" in n for n in report.verify_notes)
    assert report.passes[0].status == UNCHANGED


def test_unchanged_pass_needs_no_check():
    model = parse(MODEL)
    _, report = run(model, Cleanup(), Cleanup())
    assert report.passes[1].status == UNCHANGED
    assert report.passes[1].check == "unchanged"


def test_user_error_from_a_pass_stops_the_run():
    with pytest.raises(GraphfixError, match="bad option"):
        run(parse(MODEL), UserError())


def test_model_onnxruntime_cannot_run_skips_the_check_with_reason():
    model = unrunnable_model()
    check = check_for(model)
    assert not check.enabled
    assert check.skipped_reason == (
        "not checkable: Frobnicate (acme): onnxruntime cannot run it and graphfix has no "
        "reference form for it (docs/references.md)")
    out, report = run_passes(model, [("cleanup", Cleanup())], check, PassContext())
    assert report.passes[0].status == APPLIED
    assert report.passes[0].check == "skipped"
    assert not report.check.enabled
    assert [n.op_type for n in out.graph.node] == ["Frobnicate"]


FROBNICATES = onnx.parser.parse_model(
    '<ir_version: 8, opset_import: ["" : 17, "acme" : 1]>' + """
    g (float[2,3] x) => (float[2,3] y) {
        a = Identity(x)
        r = Relu(a)
        y = acme.Frobnicate(r)
    }""")


def _slow_original(monkeypatch, seconds=0.3):
    """The original's run takes `seconds` (the passes go on meanwhile); returns the
    (start, end) times of each run of the original."""
    import threading
    import time

    from graphfix.runtime import outputs

    real, runs = outputs.run_checkable, []

    def slow(model, feeds, providers=("cpu",), basic=False, extra_outputs=()):
        start = time.perf_counter()
        if threading.current_thread() is not threading.main_thread():
            time.sleep(seconds)
        try:
            return real(model, feeds, providers, basic, extra_outputs)
        finally:
            runs.append((start, time.perf_counter()))

    monkeypatch.setattr(outputs, "run_checkable", slow)
    return runs


def test_the_original_runs_in_the_background_while_the_passes_run(monkeypatch):
    import time

    runs = _slow_original(monkeypatch)
    model = parse(MODEL)
    check = OutputCheck.prepare(model, {"x": (2, 3)}, background=True)
    assert check.expected and not runs  # still running
    started = time.perf_counter()
    out, report = run_passes(model, _steps(Cleanup(), DoublesRelu()), check, PassContext())
    (original, rewrite) = runs
    assert original[0] < started < original[1] <= rewrite[0]  # passes overlapped it
    assert [r.check for r in report.passes] == [
        "passed (exact), in one check after pass 2 (passes 1, 2)"] * 2
    assert report.check.enabled


def test_an_original_that_turns_out_not_to_run_leaves_the_deferred_passes_unchecked(
        monkeypatch):
    _slow_original(monkeypatch)
    check = OutputCheck.prepare(FROBNICATES, {"x": (2, 3)}, background=True)
    assert check.expected
    out, report = run_passes(FROBNICATES, _steps(Cleanup(), DoublesRelu()), check,
                             PassContext())
    assert [(r.status, r.check) for r in report.passes] == [(APPLIED, "skipped")] * 2
    assert not report.check.enabled
    assert report.check.skipped_reason.startswith("not checkable: Frobnicate (acme)")
    assert ops(out) == ["Relu", "Relu", "Frobnicate"]


def test_a_failure_of_the_users_setup_in_the_background_is_raised_where_the_check_is_used(
        monkeypatch):
    from graphfix.runtime import outputs

    def refuses(model, feeds, providers=("cpu",), basic=False, extra_outputs=()):
        raise GraphfixError("no such provider", "because", "fix it")

    monkeypatch.setattr(outputs, "run_checkable", refuses)
    check = OutputCheck.prepare(parse(MODEL), {"x": (2, 3)}, background=True)
    with pytest.raises(GraphfixError, match="no such provider"):
        check.enabled  # noqa: B018


def test_report_to_json_has_pipeline_tools_and_records():
    model = parse(MODEL)
    _, report = run_pipeline(
        model, parse_pipeline("cleanup,fold-constants"), check_for(model), PassContext()
    )
    data = report.to_json()
    assert data["pipeline"] == "cleanup,fold-constants"
    assert data["schema"] == "graphfix.run/1"
    assert {"onnx", "onnxruntime", "onnx-graphsurgeon", "graphfix"} <= set(data["tools"])
    assert [p["spec"] for p in data["passes"]] == ["cleanup", "fold-constants"]
    assert data["check"]["enabled"] and data["check"]["seed"] == 0
    assert data["check"]["tolerances"]["float32"] == {"rtol": 0.0, "atol": 1e-7, "scale": 1e-5}
    assert data["check"]["tolerances"]["noise_floor"]["factor"] == 10


def test_check_uses_user_data(tmp_path):
    model = parse(MODEL)
    x = np.full((2, 3), -1.0, np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    check = OutputCheck.prepare(model, {"x": (2, 3)}, data=tmp_path / "in.npz")
    np.testing.assert_array_equal(check.feeds["x"], x)
    assert check.seed is None
    # With all-negative inputs Relu gives 0, so Sigmoid -> Tanh changes 0.5 into 0.
    _, report = run_passes(model, [("b", BreaksNumbers())], check, PassContext())
    assert report.passes[0].status == ROLLED_BACK


def test_input_shapes_reach_the_context():
    model = parse(MODEL.replace("float[2,3] x", "float[N,3] x").replace(
        "float[2,3] y", "float[N,3] y"))
    seen = {}

    class Spy(_TestPass):
        name = "spy"

        def run(self, graph: gs.Graph, ctx):
            seen.update(ctx.input_shapes)
            return PassResult(changed=False, notes=[Note("graph", "spy")])

    inputs = graph_inputs(model)
    shapes = resolve_shapes(inputs)
    run_passes(model, [("spy", Spy())], OutputCheck.prepare(model, shapes),
               PassContext(input_shapes=shapes))
    assert seen == {"x": (1, 3)}
    assert feeds_for(model)["x"].shape == (1, 3)


def test_passes_see_inferred_shapes_of_intermediate_tensors():
    model = parse(MODEL)
    assert not model.graph.value_info
    seen = {}

    class Spy(_TestPass):
        name = "spy"

        def run(self, graph, ctx):
            seen.update({t.name: t.shape for t in graph.tensors().values()})
            return PassResult(changed=False, notes=[Note("graph", "spy")])

    run(model, Spy(), Cleanup(), Spy())
    assert seen["r"] == [2, 3]


def test_passes_are_told_the_shapes_are_inferred_and_fold_constants_does_not_infer_again(
        monkeypatch):
    """fold-constants infers shapes first where a Shape reads a tensor without one
    (exporters record none); under the manager the graph has them already, and a tensor
    still without one stays so whatever inference runs."""
    import graphfix.passes.fold_constants as fold_constants
    from graphfix.passes.fold_constants import FoldConstants

    model = parse('<ir_version: 8, opset_import: ["" : 17, "custom" : 1]>' + """
    g (float[2,3] x) => (float[2,3] y) {
        c = custom.Op(x)
        s = Shape(c)
        y = Reshape(x, s)
    }""")
    told = []

    class Spy(_TestPass):
        name = "spy"

        def run(self, graph, ctx):
            told.append(ctx.shapes_inferred)
            return PassResult(changed=False, notes=[Note("graph", "spy")])

    inferred = spy(monkeypatch, fold_constants, "infer_shapes",
                   lambda graph, **kwargs: kwargs.get("symbolic", False))
    ctx = PassContext()
    _, report = run_passes(model, [("spy", Spy()), ("fold-constants", FoldConstants())],
                           OutputCheck.disabled("test"), ctx)
    assert told == [True] and not ctx.shapes_inferred  # only while a pass runs
    # ONNX's inference not again (onnxruntime's symbolic one may refine c, and does)
    assert report.passes[1].status == UNCHANGED and False not in inferred
    inferred.clear()
    FoldConstants().run(to_graph(model), PassContext())
    assert inferred[0] is False  # outside the manager it infers first


def test_rollback_keeps_the_rejected_model_for_the_callback_not_the_json():
    import json

    from graphfix.report import INVALID, NUMBERS, RAISED

    model = parse(MODEL)
    seen = []
    _, report = run_passes(
        model, [(p.name, p) for p in (BreaksNumbers(), Raises(), BreaksChecker(), Cleanup())],
        check_for(model), PassContext(),
        on_pass_done=lambda rec, m: seen.append((rec.rejected, ops(m))))
    numbers, raised, invalid, cleanup = report.passes
    assert [r.rollback_cause for r in report.passes] == [NUMBERS, RAISED, INVALID, ""]
    assert ops(numbers.rejected) == ["Identity", "Relu", "Tanh"]  # the candidate, checkable
    onnx.checker.check_model(numbers.rejected)
    assert raised.rejected is None  # nothing was exported
    assert ops(invalid.rejected) == ["Identity", "Relu", "NoSuchOp"]
    assert [r for r, _ in seen] == [numbers.rejected, None, invalid.rejected, None]
    assert [m for _, m in seen][:3] == [ops(model)] * 3  # the callback's model: the last good
    data = report.to_json()
    assert all("rejected" not in p for p in data["passes"])
    assert data["passes"][0]["rollback_cause"] == NUMBERS
    json.dumps(data)


class RenamesThenBreaks(_TestPass):
    name = "renames-then-breaks"

    def run(self, graph, ctx):
        ctx.renamed["r"] = "r_renamed"
        ctx.input_shapes["x"] = (9, 9)
        for node in graph.nodes:
            if node.op == "Sigmoid":
                node.op = "Tanh"
        return PassResult(changed=True)


def test_rollback_restores_the_pass_context():
    model = parse(MODEL)
    ctx = PassContext(input_shapes={"x": (2, 3)}, renamed={"a": "b"})
    trt = ctx.trt = object()  # read only: kept as the same object
    out, report = run_passes(model, [("r", RenamesThenBreaks()), ("cleanup", Cleanup())],
                             check_for(model), ctx)
    assert [r.status for r in report.passes] == [ROLLED_BACK, APPLIED]
    assert ctx.renamed == {"a": "b"} and ctx.input_shapes == {"x": (2, 3)}
    assert ctx.trt is trt
    assert report.renamed == {"a": "b"}
    assert ops(out) == ["Relu", "Sigmoid"]


class CutsAtRelu(_TestPass):
    """Makes the Relu's output the graph output, as split-nms makes its cut tensors."""

    name = "cuts-at-relu"
    changes_outputs = True
    says = "toy check"

    def run(self, graph, ctx):
        relu = next(n for n in graph.nodes if n.op == "Relu")
        graph.outputs = [relu.outputs[0].to_variable(dtype=np.float32, shape=[2, 3])]
        return PassResult(changed=True, verified=self.says)


class BreaksRelu(_TestPass):
    name = "breaks-relu"

    def run(self, graph, ctx):
        next(n for n in graph.nodes if n.op == "Relu").op = "Abs"
        return PassResult(changed=True)


def test_pass_that_changes_outputs_is_verified_by_itself_and_rebases_the_check():
    model = parse(MODEL)
    out, report = run(model, CutsAtRelu(), BreaksRelu(), Cleanup())
    cut, broken, cleanup = report.passes
    assert cut.status == APPLIED and cut.check == "verified by the pass: toy check"
    assert [o.name for o in out.graph.output] == ["r"]
    # later passes are compared with the new outputs: Abs for Relu changes r
    assert broken.status == ROLLED_BACK and "outputs differ: r:" in broken.rollback_reason
    assert cleanup.status == APPLIED and cleanup.check.startswith("passed")
    assert ops(out) == ["Relu"]


def test_pass_that_changes_outputs_without_saying_how_it_checked_is_rolled_back():
    class Silent(CutsAtRelu):
        name = "silent"
        says = ""

    model = parse(MODEL)
    out, report = run(model, Silent())
    (rec,) = report.passes
    assert rec.status == ROLLED_BACK
    assert rec.rollback_reason == ("the pass changes the graph outputs but does not say how "
                                   "it verified them")
    assert [o.name for o in out.graph.output] == ["y"]


class CountsRuns(_TestPass):
    """Changes nothing, and counts how often it ran."""

    name = "counts-runs"

    def __init__(self, options=None):
        super().__init__(options)
        self.runs = 0

    def run(self, graph, ctx):
        self.runs += 1
        return PassResult(changed=False, notes=[Note("graph", f"run {self.runs}")])


def test_a_pass_is_not_run_again_on_the_graph_it_left_unchanged():
    from graphfix.passes.manager import NOT_RERUN

    counter = CountsRuns()
    _, report = run(parse(MODEL), counter, counter, Cleanup(), counter, counter)
    assert counter.runs == 2  # once, then again after cleanup changed the graph
    assert [r.check for r in report.passes] == [
        "unchanged", NOT_RERUN, report.passes[2].check, "unchanged", NOT_RERUN]
    assert report.passes[1].notes == ["graph: run 1"]  # what it said on that graph
    assert report.passes[4].notes == ["graph: run 2"]


def test_after_a_rollback_the_pass_runs_again():
    counter = CountsRuns()
    _, report = run(parse(MODEL), counter, BreaksNumbers(), counter, check_each=True)
    assert report.passes[1].status == ROLLED_BACK
    assert counter.runs == 2  # the graph was re-imported: not "the same graph"


def test_with_a_rewrite_budget_every_pass_runs():
    from graphfix.passes.base import RewriteBudget

    counter = CountsRuns()
    model = parse(MODEL)
    steps = [(counter.name, counter)] * 3
    run_passes(model, steps, check_for(model), PassContext(rewrites=RewriteBudget(5)))
    assert counter.runs == 3


def test_after_a_pass_changed_only_shapes_the_pass_runs_again():
    counter = CountsRuns()
    _, report = run(parse(MODEL), counter, AnnotatesShapes(), counter)
    assert report.passes[1].status == UNCHANGED
    assert counter.runs == 2  # the shapes it would see are not the ones it saw


class DoublesRelu(_TestPass):
    """Puts a second Relu after the first: the same numbers, not the same graph."""

    name = "doubles-relu"

    def run(self, graph, ctx):
        relu = next(n for n in graph.nodes if n.op == "Relu")
        out = relu.outputs[0]
        mid = gs.Variable(out.name + "_once", dtype=out.dtype, shape=out.shape)
        relu.outputs = [mid]
        graph.nodes.append(gs.Node("Relu", inputs=[mid], outputs=[out]))
        return PassResult(changed=True)


def _counting(monkeypatch, check):
    """The check, and the models its `verify` runs (as op lists)."""
    return check, spy(monkeypatch, check, "verify", ops)


def _steps(*passes):
    return [(p.name, p) for p in passes]


def test_one_run_of_the_model_checks_every_pass_that_changes_numbers(monkeypatch):
    model = parse(MODEL)
    check, calls = _counting(monkeypatch, check_for(model))
    out, report = run_passes(model, _steps(DoublesRelu(), DoublesRelu(), Cleanup()), check,
                             PassContext())
    assert calls == [["Relu", "Relu", "Relu", "Sigmoid"]]  # the last model, once
    assert [r.status for r in report.passes] == [APPLIED] * 3
    for rec in report.passes:  # cleanup too: a run was due anyway, so no graph comparison
        assert rec.check == "passed (exact), in one check after pass 3 (passes 1, 2, 3)"
    assert [r.max_abs_error for r in report.passes] == [None, None, 0.0]
    assert ops(out) == ["Relu", "Relu", "Relu", "Sigmoid"]

    check, calls = _counting(monkeypatch, check_for(model))
    _, each = run_passes(model, _steps(DoublesRelu(), DoublesRelu(), Cleanup()), check,
                         PassContext(), check_each=True)
    assert len(calls) == 2  # cleanup is shown the same from the graph
    assert [r.check for r in each.passes][:2] == ["passed (exact)"] * 2


def test_when_the_one_check_fails_the_run_is_repeated_checking_each_pass(monkeypatch):
    model = parse(MODEL)
    steps = _steps(DoublesRelu(), BreaksNumbers(), DoublesRelu())
    check, calls = _counting(monkeypatch, check_for(model))
    seen = []
    out, report = run_passes(model, steps, check, PassContext(),
                             on_pass_done=lambda rec, m: seen.append((rec.index, rec.status)))
    _, each = run_passes(model, steps, check_for(model), PassContext(), check_each=True)
    assert [r.status for r in report.passes] == [APPLIED, ROLLED_BACK, APPLIED]
    assert [(r.status, r.check, r.rollback_reason) for r in report.passes] == [
        (r.status, r.check, r.rollback_reason) for r in each.passes]
    assert report.passes[1].rollback_reason.startswith("outputs differ: y:")
    assert len(calls) == 4  # the batch's, then one per pass that changes numbers
    assert any("the run was repeated with a check after every pass" in n
               and "breaks-numbers" in n for n in report.verify_notes)
    assert seen == [(0, APPLIED), (1, ROLLED_BACK), (2, APPLIED)]  # once each, final
    assert ops(out) == ["Identity", "Relu", "Relu", "Relu", "Sigmoid"]


def test_a_pass_that_changes_the_outputs_is_preceded_by_the_check_of_the_passes_before_it():
    # Tanh for Sigmoid changes y, which the cut then drops: compared with the outputs of
    # the time (y), not with the rebased reference (r), the breaking pass is rolled back
    model = parse(MODEL)
    out, report = run(model, BreaksNumbers(), CutsAtRelu())
    assert [r.status for r in report.passes] == [ROLLED_BACK, APPLIED]
    assert [o.name for o in out.graph.output] == ["r"]


def test_a_batch_of_passes_that_keep_the_computation_is_shown_the_same_without_a_run(monkeypatch):
    model = parse(MODEL)
    check, calls = _counting(monkeypatch, check_for(model))
    _, report = run_passes(model, _steps(Cleanup(), Cleanup()), check, PassContext())
    assert calls == []
    (rec, again) = report.passes
    assert rec.status == APPLIED and again.status == UNCHANGED
    assert rec.check == ("passed (exact): the same computation as before this pass, shown "
                         "from the graph (not run)")


class BreaksCheckerQuietly(BreaksChecker):
    """Says it keeps the computation (as cleanup does), and breaks the checker."""

    name = "breaks-checker-quietly"
    keeps_computation = True


def _counting_verifier(monkeypatch):
    from graphfix.passes.manager import Verifier

    return spy(monkeypatch, Verifier, "problem", lambda self, model: ops(model))


@pytest.mark.parametrize("checked", [True, False])
def test_a_pass_that_keeps_the_computation_is_verified_with_the_next_one(monkeypatch, checked):
    model = parse(MODEL)
    seen = _counting_verifier(monkeypatch)
    check = check_for(model) if checked else OutputCheck.disabled("--no-check")
    out, report = run_passes(model, _steps(Cleanup(), DoublesRelu()), check, PassContext())
    assert [r.status for r in report.passes] == [APPLIED, APPLIED]
    assert seen == [["Relu", "Relu", "Sigmoid"]]  # once, on the second pass's candidate
    onnx.checker.check_model(out)

    seen.clear()
    run_passes(model, _steps(Cleanup(), DoublesRelu()), check, PassContext(), check_each=True)
    assert seen == [["Relu", "Sigmoid"], ["Relu", "Relu", "Sigmoid"]]


def test_a_deferred_structural_check_is_made_at_the_end_of_the_run(monkeypatch):
    model = parse(MODEL)
    seen = _counting_verifier(monkeypatch)
    _, report = run_passes(model, _steps(DoublesRelu(), Cleanup()),
                           OutputCheck.disabled("--no-check"), PassContext())
    assert [r.status for r in report.passes] == [APPLIED, APPLIED]
    assert seen == [["Identity", "Relu", "Relu", "Sigmoid"], ["Relu", "Relu", "Sigmoid"]]


def test_a_pass_after_a_deferred_one_is_rolled_back_for_its_own_fault():
    model = parse(MODEL)
    out, report = run(model, Cleanup(), BreaksChecker())
    cleanup, broken = report.passes
    assert cleanup.status == APPLIED and broken.status == ROLLED_BACK
    assert broken.rollback_reason.startswith("onnx.checker rejects the result")
    assert not any("repeated" in n for n in report.verify_notes)  # no second run needed
    assert ops(out) == ["Relu", "Sigmoid"]


@pytest.mark.parametrize("checked", [True, False])
def test_a_deferred_pass_that_breaks_the_checker_is_found_by_a_second_run(checked):
    model = parse(MODEL)
    check = check_for(model) if checked else OutputCheck.disabled("--no-check")
    for after in ([DoublesRelu()], [BreaksChecker()], []):
        out, report = run_passes(model, _steps(BreaksCheckerQuietly(), *after), check,
                                 PassContext())
        quiet = report.passes[0]
        assert quiet.status == ROLLED_BACK, after
        assert quiet.rollback_reason.startswith("onnx.checker rejects the result")
        assert any("structural check (onnx.checker, shape inference) after pass 1 "
                   "(breaks-checker-quietly)" in n and "repeated" in n
                   for n in report.verify_notes), report.verify_notes
        onnx.checker.check_model(out)
