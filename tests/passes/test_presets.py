"""Presets: a named pipeline run in rounds until nothing changes."""

import onnx
import pytest
from gfhelpers import ops, parse, spy

from graphfix.errors import GraphfixError, InternalError
from graphfix.graph import bypass
from graphfix.passes import registry
from graphfix.passes.base import NoOptions, Note, Pass, PassContext, PassResult
from graphfix.passes.manager import Verifier, run_pipeline
from graphfix.passes.pipeline import parse_pipeline
from graphfix.passes.registry import Preset, build_presets
from graphfix.report import APPLIED, INVALID, ROLLED_BACK, UNCHANGED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2,3] x) => (float[2,3] y) {
    a = Identity(x)
    b = Identity(a)
    c = Identity(b)
    y = Relu(c)
}"""


class RemoveOneIdentity(Pass):
    """Removes one Identity per run, so a preset needs several rounds."""

    name = "remove-one-identity"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        for node in graph.nodes:
            if node.op == "Identity" and node.outputs:
                bypass(graph, node)
                return PassResult(changed=True, counts={"removed Identity": 1})
        return PassResult(changed=False, notes=[Note("graph", "no Identity")])


@pytest.fixture
def preset(monkeypatch):
    def make(max_rounds):
        monkeypatch.setitem(registry.REGISTRY, RemoveOneIdentity.name, RemoveOneIdentity)
        monkeypatch.setitem(registry.PRESET_REGISTRY, "peel", Preset(
            "peel", "test preset", ("remove-one-identity", "fold-bn"), max_rounds))
    return make


class BreaksChecker(Pass):
    """Gives the last node an op ONNX does not know."""

    name = "breaks-checker"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        graph.nodes[-1].op = "NoSuchOp"
        return PassResult(changed=True)


class SeesShapes(Pass):
    """Records whether it was told the graph carries the inferred shapes."""

    name = "sees-shapes"
    summary = "test only"
    Options = NoOptions
    told: list[bool] = []

    def run(self, graph, ctx):
        SeesShapes.told.append(ctx.shapes_inferred)
        return PassResult(changed=False, notes=[Note("graph", "looked")])


@pytest.fixture
def make_preset(monkeypatch):
    def make(*passes, max_rounds=10):
        for cls in (RemoveOneIdentity, BreaksChecker, SeesShapes):
            monkeypatch.setitem(registry.REGISTRY, cls.name, cls)
        monkeypatch.setitem(registry.PRESET_REGISTRY, "made", Preset(
            "made", "test preset", passes, max_rounds))
    return make


def run(text, model, check_each=False):
    inputs = graph_inputs(model)
    check = OutputCheck.prepare(model, resolve_shapes(inputs))
    return run_pipeline(model, parse_pipeline(text), check, PassContext(),
                        check_each=check_each)


def test_preset_runs_rounds_until_nothing_changes(preset):
    preset(max_rounds=10)
    model = parse(MODEL)
    out, report = run("peel", model)
    assert ops(out) == ["Relu"]
    assert report.rounds == {"peel": 4}
    assert [(r.round, r.spec, r.status) for r in report.passes] == [
        (1, "remove-one-identity", APPLIED), (1, "fold-bn", UNCHANGED),
        (2, "remove-one-identity", APPLIED), (2, "fold-bn", UNCHANGED),
        (3, "remove-one-identity", APPLIED), (3, "fold-bn", UNCHANGED),
        (4, "remove-one-identity", UNCHANGED), (4, "fold-bn", UNCHANGED),
    ]
    assert all(r.preset == "peel" for r in report.passes)
    assert report.pipeline == "peel"
    assert not any("round" in n for n in report.verify_notes)


def test_preset_stops_at_its_bound_and_says_so(preset):
    preset(max_rounds=2)
    out, report = run("peel,fold-bn", parse(MODEL))
    assert report.rounds == {"peel": 2}
    assert ops(out) == ["Identity", "Relu"]
    assert ("peel did not reach a fixed point: round 2, its safety bound, still changed the "
            "graph (remove-one-identity applied); passes may be undoing each other's work, "
            "please report it") in report.verify_notes
    assert report.passes[-1].preset == "" and report.passes[-1].spec == "fold-bn"


def test_preset_text_round_trips_and_takes_no_options(preset):
    preset(max_rounds=3)
    assert str(parse_pipeline("cleanup,peel,fold-bn")) == "cleanup,peel,fold-bn"
    names = [s.name for s in parse_pipeline("peel,cleanup").pass_specs()]
    assert names == ["remove-one-identity", "fold-bn", "cleanup"]
    with pytest.raises(GraphfixError, match="takes no options"):
        parse_pipeline("peel{x=1}")


def test_malformed_presets_are_programming_errors():
    with pytest.raises(InternalError, match="reuses the name"):
        build_presets((Preset("cleanup", "x", ("fold-bn",)),), registry.REGISTRY)
    with pytest.raises(InternalError, match="malformed"):
        build_presets((Preset("p", "x", ("no-such-pass",)),), registry.REGISTRY)


def test_a_round_has_its_structural_checks_once_at_its_end(make_preset, monkeypatch):
    """Each pass of a round changes the graph, and onnx.checker + shape inference run once
    per round, on the round's model; with a check after every pass, once per pass. The
    result is the same."""
    make_preset("remove-one-identity", "remove-one-identity")
    seen = spy(monkeypatch, Verifier, "problem", lambda self, model: ops(model))
    out, report = run("made", parse(MODEL))
    assert [r.status for r in report.passes] == [APPLIED, APPLIED, APPLIED, UNCHANGED,
                                                 UNCHANGED, UNCHANGED]
    assert seen == [["Identity", "Relu"], ["Relu"]]
    seen.clear()
    each, _ = run("made", parse(MODEL), check_each=True)
    assert seen == [["Identity", "Identity", "Relu"], ["Identity", "Relu"], ["Relu"]]
    assert ops(out) == ops(each) == ["Relu"]
    onnx.checker.check_model(out)


def test_a_pass_that_breaks_a_round_is_found_by_checking_each_pass(make_preset):
    """The round's one structural check fails: the run is repeated with a check after
    every pass, which rolls back the pass at fault, and the notes say so."""
    make_preset("remove-one-identity", "breaks-checker")
    out, report = run("made", parse(MODEL))
    assert ops(out) == ["Relu"]
    onnx.checker.check_model(out)
    broken = [r for r in report.passes if r.spec == "breaks-checker"]
    assert broken and all(r.status == ROLLED_BACK and r.rollback_cause == INVALID
                          for r in broken)
    assert any("structural check (onnx.checker, shape inference) after pass 2 "
               "(breaks-checker)" in n and "repeated with a check after every pass" in n
               for n in report.verify_notes), report.verify_notes


def test_passes_after_an_unchecked_change_are_not_told_shapes_are_inferred(make_preset,
                                                                           monkeypatch):
    """Until the round's end, the graph's shapes are those inferred before the round."""
    make_preset("sees-shapes", "remove-one-identity", "sees-shapes")
    monkeypatch.setattr(SeesShapes, "told", [])
    run("made", parse(MODEL))
    # rounds 1-3 remove an Identity each, round 4 changes nothing. The round's end finds
    # the shapes the graph has, so a round's first sees-shapes is not run again: it would
    # see the graph the last one left unchanged (which, told nothing, inferred shapes
    # itself if it needed them)
    assert SeesShapes.told == [True, False, False, False]


class RaisesOnRelu(Pass):
    """Raises once the graph has no Identity left (a pass with a bug)."""

    name = "raises-late"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        if not any(n.op == "Identity" for n in graph.nodes):
            raise RuntimeError("no Identity to work on")
        return PassResult(changed=False, notes=[Note("graph", "waiting")])


def test_a_round_exports_its_graph_once_at_its_end(make_preset, monkeypatch):
    """The passes of a round are exported with their structural checks, at the round's
    end; which pass removed what is still told pass by pass."""
    import graphfix.passes.manager as manager

    make_preset("remove-one-identity", "remove-one-identity")
    exports = spy(monkeypatch, manager, "to_model", lambda graph, like: len(graph.nodes))
    out, report = run("made", parse(MODEL))
    assert exports == [2, 1]  # round 1 (two passes applied), round 2 (one)
    assert ops(out) == ["Relu"]
    assert set(report.removed) == {"a", "b", "c"}
    assert set(report.removed.values()) == {"remove-one-identity"}
    exports.clear()
    run("made", parse(MODEL), check_each=True)
    assert exports == [3, 2, 1]  # after every pass


def test_a_pass_raising_after_unexported_ones_is_rolled_back_alone(make_preset,
                                                                   monkeypatch):
    """The model before the raising pass was never exported: the run is repeated with a
    check after every pass, where it is rolled back alone and the others are kept."""
    monkeypatch.setitem(registry.REGISTRY, RaisesOnRelu.name, RaisesOnRelu)
    make_preset("remove-one-identity", "remove-one-identity", "remove-one-identity",
                "raises-late")
    out, report = run("made", parse(MODEL))
    assert ops(out) == ["Relu"]
    raised = [r for r in report.passes if r.spec == "raises-late"]
    assert raised[0].status == ROLLED_BACK and "no Identity to work on" in \
        raised[0].rollback_reason
    assert any("raised RuntimeError: no Identity to work on, after passes of its round "
               "that were not exported yet" in n for n in report.verify_notes)


class CountsRuns(Pass):
    """Changes nothing; counts its runs."""

    name = "counts-runs"
    summary = "test only"
    Options = NoOptions
    runs = 0

    def run(self, graph, ctx):
        CountsRuns.runs += 1
        return PassResult(changed=False, notes=[Note("graph", "counted")])


class PeelsAndForgetsShapes(RemoveOneIdentity):
    """Removes one Identity per run and leaves every tensor it did not touch shapeless, so
    that the checks at the round's end give the graph new shapes."""

    name = "peel-and-forget"

    def run(self, graph, ctx):
        result = super().run(graph, ctx)
        if result.changed:
            for node in graph.nodes:
                for t in node.outputs:
                    if all(t is not o for o in graph.outputs):
                        t.shape = None
        return result


@pytest.mark.parametrize("peel, runs", [(RemoveOneIdentity, 3), (PeelsAndForgetsShapes, 4)])
def test_a_round_skips_a_pass_on_the_graph_it_left_unchanged_unless_shapes_came(
        monkeypatch, peel, runs):
    """The round's end checks the graph and gives it the inferred shapes. When those are
    the shapes it had, the last round's passes that came after the last change see the
    graph they left unchanged and are not run again; when they add shapes, they are."""
    from graphfix.passes.manager import NOT_RERUN

    for cls in (peel, CountsRuns):
        monkeypatch.setitem(registry.REGISTRY, cls.name, cls)
    monkeypatch.setitem(registry.PRESET_REGISTRY, "made", Preset(
        "made", "test preset", (peel.name, CountsRuns.name), 10))
    monkeypatch.setattr(CountsRuns, "runs", 0)
    out, report = run("made", parse(MODEL.replace("y = Relu(c)", "d = Relu(c)\n    y = Relu(d)")))
    assert ops(out) == ["Relu", "Relu"]
    assert report.rounds == {"made": 4}
    assert CountsRuns.runs == runs
    last = report.passes[-1]
    assert (last.round, last.spec, last.status) == (4, CountsRuns.name, UNCHANGED)
    assert last.notes == ["graph: counted"]
    assert (last.check == NOT_RERUN) == (runs == 3)
