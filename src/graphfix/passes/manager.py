"""The pass manager: runs a pipeline, verifies after every pass, rolls back what breaks.

For every pass, in order:
1. run it on the graph (an `onnx_graphsurgeon.Graph`, imported once);
2. if its structural fingerprint changed: cleanup (unless the pass just did it:
   `Pass.leaves_graph_clean`) + toposort, export, then verify —
   `onnx.checker` and ONNX shape inference (strict when the input model passes
   strict inference), both on a weightless skeleton (`graph.skeleton`), and the
   output check (`runtime.outputs`) when enabled;
   A pass that changes the graph outputs (`Pass.changes_outputs`: split-nms) is not
   compared with the reference; it must say what it verified itself
   (`PassResult.verified`), and the reference is then re-made from its result
   (`OutputCheck.rebased`, same inputs) for the passes after it;
3. a pass that raises, or fails any verification, is rolled back: the graph is
   re-imported from the last verified model, the pass context (`ctx.renamed`, ...)
   is restored to what it was before the pass, and the run goes on. The record says
   why (`rollback_cause`), which passes ran before it, and holds the rejected model
   (`rejected`, when one was exported) for the `on_pass_done` callback.
Checks are batched (not with `check_each` or a rewrite budget):
- a pass that says it changed nothing is taken at its word (unless it may annotate
  shapes, `Pass.annotates_shapes`, and does not say it annotated none,
  `PassResult.annotated`): the next fingerprint, of the pass after it or at the end of
  the run, covers it (a fingerprint of 7,000 nodes is 17-40 ms);
- a pass that keeps the computation (`Pass.keeps_computation`: cleanup,
  dedup-constants, merge-duplicates) defers its structural checks too: the next pass's
  candidate that passes them, or the end of the run, has them for both (such a pass
  does not change the shapes later passes read);
- in a preset's round every pass defers its structural checks to the end of the round:
  one onnx.checker and one shape inference of the round's model, whose shapes the graph
  then gets for the next round. Until then passes see the shapes inferred before the
  round (and what the passes since gave the tensors they made), and are not told the
  shapes are inferred (`PassContext.shapes_inferred`): fold-constants infers them itself
  where a Shape needs one. A round reaches the same fixed point (on every shared and zoo
  model: the same nodes and initializers as checking each pass); each check per pass was
  ~25 ms on 2,500 nodes (bench/RESULTS.md, sixth round). Unless each pass's model is asked
  for (`on_pass_done`), the round's passes are not exported either: the graph is exported
  once, for those checks (and before a pass that changes the outputs, whose check needs
  the model before it). A pass that raises after such passes cannot be rolled back to a
  model that was never made: the run is repeated with a check after every pass, as for a
  failed check. Which pass removed which tensor is still told pass by pass (from the
  graph's names);
- with the output check on, a pass that passes the structural checks is kept with its
  output check deferred, and one run of the model checks every deferred pass at once,
  at the end of the run (and before a pass that changes the outputs rebases the
  reference). A batch of only `keeps_computation` passes is shown the same from the
  graph instead (`graph.samecomp`: one comparison of the models before and after it,
  and no run). When that check passes, each deferred record says so
  (`PassRecord.max_abs_error` is on the last one, the model the check ran);
- when a batched check fails, the whole run is repeated from the input with every
  check after every pass, which finds and rolls back the pass at fault as before (the
  reference is not run again), and the run's notes say why. The result differs from
  checking every pass only where a pass breaks the numbers and a later one removes
  what it broke: the batch then keeps both, and the result agrees. `on_pass_done` is
  called for each pass once the run's checks have passed.
A pass whose fingerprint did not change needs no verification: the graph is the
one already verified. A pass is not run again on a graph it already left unchanged
(nothing applied, rolled back or annotated since): a preset's last round, which only
shows that nothing changes any more, then costs little (dedup-constants alone was 0.3 s
a round on wide_resnet50_2). Not with a rewrite budget, whose count a run would move.
A `GraphfixError` from a pass is the user's problem (a bad option) and stops the run.

With a rewrite budget (`ctx.rewrites`), passes that count their rewrites ask it
before each one; a pass that does not (`Pass.counts_rewrites` false) and changed
the graph is counted here as one rewrite, and undone when the budget refuses it.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.graph import count_nodes, fingerprint, to_graph, to_model
from graphfix.graph.convert import settle_constants
from graphfix.graph.declared import (
    Change,
    contradicts,
    describe,
    redeclare,
    set_declarations,
    unconfirmed,
)
from graphfix.graph.declared import dims as declared_dims
from graphfix.graph.protos import infer_shapes
from graphfix.graph.prune import prune
from graphfix.graph.samecomp import Digests, same_computation
from graphfix.graph.shapes import apply_inferred, contradicted_types
from graphfix.graph.skeleton import skeleton
from graphfix.graph.walk import all_graphs, same_structure, tensor_map, toposort
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext
from graphfix.passes.pipeline import Pipeline, PresetSpec
from graphfix.report import (
    APPLIED,
    INVALID,
    NUMBERS,
    RAISED,
    ROLLED_BACK,
    UNCHANGED,
    CheckInfo,
    PassRecord,
    Report,
)
from graphfix.runtime import references
from graphfix.runtime.coverage import branch_notes
from graphfix.runtime.outputs import OutputCheck

PassCallback = Callable[[PassRecord, onnx.ModelProto], None]
FinalCheckCallback = Callable[[onnx.ModelProto, dict[str, str], dict[str, str]], None]


@dataclass
class Verifier:
    """Structural checks after each pass, at the strictness the input model supports."""

    checker: bool
    strict_inference: bool
    notes: list[str]
    inferred: onnx.ModelProto | None = None
    """The shape-inferred skeleton of the model last verified (passes get its shapes)."""
    contradicted: tuple[str, ...] = ()
    """The input's value_info entries whose type its nodes contradict (`for_input`)."""
    input_skeleton: onnx.ModelProto | None = None
    """The input as the checks saw it: which output declarations its nodes bear out."""
    redeclared: dict[str, Change] = field(default_factory=dict)
    """Outputs whose declared shape gave way (`graph.declared`): (declared, computed)."""
    _unconfirmed: frozenset[str] | None = None

    @classmethod
    def for_input(cls, model: onnx.ModelProto) -> Verifier:
        """The checks the input model passes. A value_info whose element type contradicts
        what its node computes (onnxconverter-common's float16 conversion leaves such:
        onnxruntime cannot load the model) is dropped first, and said so: it is a
        declaration, not part of the computation (`_Runner` drops it from the graph)."""
        notes = []
        model = _checkable_skeleton(model)
        checker_error = _checker_error(model)
        checker = checker_error is None
        if not checker:
            notes.append(
                f"the input model fails onnx.checker ({checker_error}); passes are not held to it"
            )
        inferred, err = _inference(model, strict=True)
        contradicted: tuple[str, ...] = ()
        if inferred is None:
            contradicted = contradicted_types(model)
            if contradicted:
                keep = [vi for vi in model.graph.value_info if vi.name not in contradicted]
                del model.graph.value_info[:]  # the skeleton is a copy
                model.graph.value_info.extend(keep)
                notes.append(
                    f"the input model declares types its nodes contradict for "
                    f"{', '.join(repr(n) for n in contradicted[:5])}"
                    f"{' and more' if len(contradicted) > 5 else ''} (onnxruntime cannot "
                    "load it): graphfix dropped those value_info entries, so the output "
                    "has the types the nodes compute")
                inferred, err = _inference(model, strict=True)
        redeclared = {}
        if inferred is None:  # output shapes its own nodes contradict: they give way
            redone = redeclare(model, unconfirmed(model), strict=True)
            if redone is not None:
                inferred, redeclared = redone
                set_declarations(model.graph.output, redeclared)  # the skeleton is a copy
        strict = inferred is not None
        if not strict:  # err says where
            notes.append(f"the input model fails strict shape inference ({err}); passes get "
                         "the lenient one")
            inferred, _ = _inference(model, strict=False)
        verifier = cls(checker, strict, notes, inferred, contradicted, model)
        verifier.redeclared.update(redeclared)
        return verifier

    def problem(self, model: onnx.ModelProto) -> str | None:
        """What is structurally wrong with a pass's result, or None (then `inferred` holds
        its shape-inferred skeleton). A result that fails inference only on output shapes
        the input declared and its nodes did not bear out passes, and `model` declares
        the computed shapes instead (`graph.declared`; `redeclared` says which)."""
        skeleton_ = _checkable_skeleton(model)
        if self.checker:
            err = _checker_error(skeleton_)
            if err:
                return f"onnx.checker rejects the result: {err}"
        inferred, err = _inference(skeleton_, strict=self.strict_inference)
        if inferred is None:
            redone = self._without_declarations(skeleton_)
            if redone is None:
                return f"shape inference fails on the result: {err}"
            inferred, changes = redone
            for name, change in changes.items():
                self.redeclared.setdefault(name, change)
            set_declarations(model.graph.output, changes)
        self.inferred = inferred
        return None

    def _without_declarations(self, skeleton_: onnx.ModelProto):
        """`graph.declared.redeclare` of the outputs whose declared shape the input's
        nodes do not bear out (found once, when a result first needs it)."""
        if self._unconfirmed is None:
            self._unconfirmed = (unconfirmed(self.input_skeleton)
                                 if self.input_skeleton is not None else frozenset())
        if not self._unconfirmed:
            return None
        return redeclare(skeleton_, self._unconfirmed, self.strict_inference)


def _checkable_skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The weightless skeleton that onnx.checker and shape inference see: nodes onnx
    knows no schema for (TensorRT plugins in the default domain) stand in as their
    reference forms (`runtime.references`), which write the same outputs; those a numpy
    kernel computes move to a custom domain (`references.schema_free`)."""
    model = skeleton(model)
    if references.needs_reference(model):
        sub = references.substitute(model)  # the skeleton itself when nothing decomposed
        model = references.schema_free(sub) if sub.kernels else sub.model
    return model


def _checker_error(model: onnx.ModelProto) -> str | None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as err:
        return str(err).strip().splitlines()[0][:300]
    return None


def _inference(model: onnx.ModelProto, strict: bool) -> tuple[onnx.ModelProto | None, str]:
    try:
        return infer_shapes(model, strict), ""
    except Exception as err:  # onnx raises InferenceError, TypeError, RuntimeError...
        return None, str(err).strip().splitlines()[0][:300]


def run_pipeline(
    model: onnx.ModelProto,
    pipeline: Pipeline,
    output_check: OutputCheck,
    ctx: PassContext | None = None,
    on_pass_start: Callable[[int, str], None] | None = None,
    on_pass_done: PassCallback | None = None,
    spill=None,
    check_each: bool = False,
    on_final_check: FinalCheckCallback | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """Run every pass of `pipeline` on `model`; returns the verified result and a report.

    A preset runs its passes in rounds until a round applies nothing, at most its
    `max_rounds`; the report says how many rounds ran (and notes hitting the bound).
    With a `graphfix.spill.Spill`, the large weights passes make are written there and
    the models refer to them (the caller keeps it open while it uses them).
    `check_each` runs the output check after every pass that changes numbers, instead
    of once for all of them (module docstring).
    `on_final_check(model, renamed, removed)` is called when the run's last output check
    is about to run the model it will return if the check passes (with the report's
    renamed and removed tensors so far): the caller may start writing it meanwhile (`graphfix.api`
    stages the output file while onnxruntime runs), and must expect another model back.
    """

    def drive(runner: _Runner) -> tuple[onnx.ModelProto, Report]:
        runner.on_final_check = on_final_check
        for item in pipeline.specs:
            if isinstance(item, PresetSpec):
                steps = [(str(spec), spec.build()) for spec in item.pass_specs()]
                runner.rounds(item.name, steps, item.preset.max_rounds)
            else:
                runner.step(str(item), item.build())
        return runner.finish(str(pipeline))

    return _checked_run(model, drive, output_check, ctx, on_pass_start, on_pass_done, spill,
                        check_each)


def _checked_run(model, drive, output_check, ctx, on_pass_start, on_pass_done, spill,
                 check_each) -> tuple[onnx.ModelProto, Report]:
    """`drive` a runner with its checks batched, and again with every check after every
    pass when a batched check fails (module docstring)."""
    ctx = ctx or PassContext()
    if check_each or ctx.rewrites is not None:
        return drive(_Runner(model, output_check, ctx, on_pass_start, on_pass_done, spill))
    saved = ctx.snapshot()
    try:
        return drive(_Runner(model, output_check, ctx, on_pass_start, on_pass_done, spill,
                             batched=True))
    except _BatchFailed as failed:
        ctx.restore(saved)
        runner = _Runner(model, output_check, ctx, on_pass_start, on_pass_done, spill)
        runner.notes.append(str(failed))
        return drive(runner)


def run_passes(
    model: onnx.ModelProto,
    steps: Sequence[tuple[str, Pass]],
    output_check: OutputCheck,
    ctx: PassContext | None = None,
    on_pass_start: Callable[[int, str], None] | None = None,
    on_pass_done: PassCallback | None = None,
    check_each: bool = False,
) -> tuple[onnx.ModelProto, Report]:
    """Run configured passes, each named by its pipeline text (see the module docstring)."""

    def drive(runner: _Runner) -> tuple[onnx.ModelProto, Report]:
        for spec, pass_ in steps:
            runner.step(spec, pass_)
        return runner.finish(",".join(spec for spec, _ in steps))

    return _checked_run(model, drive, output_check, ctx, on_pass_start, on_pass_done, None,
                        check_each)


DEFERRED = "deferred: checked with the passes after it"


class _BatchFailed(Exception):
    """A check made once for several passes failed: the run is repeated, checking each."""

    def __init__(self, what: str, at: PassRecord, specs: list[str], outcome: str) -> None:
        super().__init__(
            f"the {what} after pass {at.index + 1} ({at.spec}), the one check of "
            f"{', '.join(specs)}, failed ({outcome}); the run was repeated with a check "
            "after every pass, to find and roll back the pass at fault")


class _RaisedUnexported(_BatchFailed):
    """A pass raised after passes of its round whose graph was not exported: the model to
    roll back to is not there, so the run is repeated with a check after every pass."""

    def __init__(self, at: PassRecord, err: Exception) -> None:
        Exception.__init__(
            self, f"pass {at.index + 1} ({at.spec}) raised {type(err).__name__}: {err}, "
            "after passes of its round that were not exported yet; the run was repeated "
            "with a check after every pass, to roll it back alone")


class _Runner:
    """One run: the state between passes, the records, and the verification settings."""

    def __init__(self, model, output_check, ctx, on_pass_start, on_pass_done,
                 spill=None, batched: bool = False) -> None:
        self.start = time.perf_counter()
        self.batched = batched
        self.pending: list[PassRecord] = []  # applied with their output check deferred
        self.pending_keep = True  # every pending pass keeps the computation
        # the last model checked before the pending passes, and its check (text, max abs)
        self.base: tuple[onnx.ModelProto, tuple[str, float | None]] | None = None
        self.held: list[tuple[PassRecord, onnx.ModelProto]] = []  # on_pass_done, batched
        self.output_check = output_check
        self.ctx = ctx or PassContext()
        self.ctx.spill = spill
        self.on_pass_start = on_pass_start
        self.on_pass_done = on_pass_done
        self.verifier = Verifier.for_input(model)
        graph = to_graph(model)
        if self.verifier.contradicted:  # stale declared types: the nodes' types instead
            dropped = set(self.verifier.contradicted)
            for g in all_graphs(graph):
                for t in tensor_map(g).values():
                    if t.name in dropped and isinstance(t, gs.Variable):
                        t.dtype, t.shape = None, None
            model = to_model(graph, model)
        if self.verifier.redeclared:  # output shapes the input's own nodes contradict
            _take_declarations(graph, self.verifier)
            model = to_model(graph, model)
        self.state = _State(graph, model, spill=spill)
        self.state.annotate(self.verifier.inferred)
        self.records: list[PassRecord] = []
        self.rounds_run: dict[str, int] = {}
        self.removed: dict[str, str] = {}  # tensor -> the pass whose rewrite removed it
        self.notes: list[str] = list(self.verifier.notes)
        self.names = graph_names(self.state.graph)  # of the graph after the last step
        # a preset round's passes leave their graph unexported until the round's end
        # (`_attempt`), unless each pass's model is asked for (on_pass_done)
        self.export_late = batched and on_pass_done is None
        self.on_final_check: FinalCheckCallback | None = None  # `run_pipeline`

    def step(self, spec: str, pass_: Pass, preset: str = "", round_: int = 0) -> PassRecord:
        index = len(self.records)
        if self.on_pass_start:
            self.on_pass_start(index, spec)
        ran_before = [r.spec for r in self.records]
        if pass_.changes_outputs:
            self._materialize()  # its check and rebase need the model before it
        before, checked = self.state.last_good, self.state.last_check
        record = _run_one(index, spec, pass_, self.state, self.ctx, self.verifier,
                          self.output_check, ran_before, self.batched, in_round=bool(preset),
                          export_late=self.export_late and bool(preset))
        if record.check == DEFERRED:
            if not self.pending:
                self.base = (before, checked)
            self.pending.append(record)
            self.pending_keep = self.pending_keep and pass_.keeps_computation
        if record.status == APPLIED and pass_.changes_outputs and self.output_check.enabled:
            self._check_pending(before)
            self._note_unjudged()
            # later passes are compared with this model's outputs, on the same inputs
            self.output_check = self.output_check.rebased(self.state.last_good)
            self.state.last_check = ("passed (exact)", 0.0)
        if record.status == APPLIED:
            now = graph_names(self.state.graph)
            for name in sorted(self.names - now - set(self.ctx.renamed)):
                self.removed.setdefault(name, spec)
            self.names = now
        record.preset, record.round = preset, round_
        self.records.append(record)
        if self.on_pass_done and self.batched:
            self.held.append((record, self.state.last_good))
        elif self.on_pass_done:
            self.on_pass_done(record, self.state.last_good)
        return record

    def _materialize(self) -> None:
        """Export the graph the passes of a round left unexported (`_attempt`) as the
        state's `last_good`; its structural checks stay deferred."""
        state = self.state
        if state.unexported:  # its passes settled their constants (`_attempt`)
            state.last_good = to_model(state.graph, state.last_good)
            state.unexported = False

    def _note_unjudged(self) -> None:
        """The run's note on the outputs its check could not judge (known once a check
        measured the noise floor, `runtime.outputs`)."""
        unjudged = self.output_check.unjudged
        if unjudged:
            self.notes.append(
                "the check cannot judge " + ", ".join(
                    f"'{name}' ({why})" for name, why in unjudged.items())
                + "; pass --data with real inputs to check them")

    def _check_unchanged(self) -> None:
        """That the passes taken at their word changed nothing (`_attempt`): the graph's
        fingerprint is still the one before them, or _BatchFailed."""
        state = self.state
        if state.untraced and fingerprint(state.graph) != state.fingerprint:
            raise _BatchFailed("fingerprint check", state.untraced[-1],
                               [r.spec for r in state.untraced],
                               "the graph changed under passes that said they changed "
                               "nothing")
        state.untraced = []

    def _check_pending(self, model: onnx.ModelProto, final: bool = False) -> None:
        """One output check of `model`, the model after the last deferred pass (every
        pass applied after the first deferred one is deferred), for all of them: each
        record says it passed, or _BatchFailed. The structural checks first."""
        _verify_deferred(self.state, self.verifier, model)
        pending, keep = self.pending, self.pending_keep
        self.pending, self.pending_keep = [], True
        if not pending:
            return
        if not self.output_check.enabled:  # the original turned out not to run: no check
            for record in pending:
                record.check = "skipped"
            return
        at, (base, checked) = pending[-1], self.base
        if keep and same_computation(base, model, self.state.digests):
            first = pending[0].index + 1
            for record in pending:
                record.check = (_shown_same(checked) if len(pending) == 1 else
                                _shown_same(checked, f"before pass {first}"))
                record.max_abs_error = checked[1]
            self.state.last_check = checked
            return
        if final and self.on_final_check is not None:
            self.on_final_check(model, dict(self.ctx.renamed), dict(self.removed))
        outcome = self.output_check.verify(model)
        if not outcome.ok:
            raise _BatchFailed("output check", at, [r.spec for r in pending],
                               outcome.describe())
        text = outcome.describe()
        numbers = ", ".join(str(r.index + 1) for r in pending)
        for record in pending:
            record.check = text if len(pending) == 1 else (
                f"{text}, in one check after pass {at.index + 1} (passes {numbers})")
        pending[-1].max_abs_error = outcome.max_abs
        self.state.last_check = (text, outcome.max_abs)

    def rounds(self, name: str, steps: list[tuple[str, Pass]], max_rounds: int) -> None:
        for round_ in range(1, max_rounds + 1):
            applied = [spec for spec, p in steps
                       if self.step(spec, p, name, round_).status == APPLIED]
            self.rounds_run[name] = round_
            self._end_round()
            if not applied:
                return
        self.notes.append(
            f"{name} did not reach a fixed point: round {max_rounds}, its safety bound, "
            f"still changed the graph ({', '.join(dict.fromkeys(applied))} applied); "
            "passes may be undoing each other's work, please report it"
        )

    def _end_round(self) -> None:
        """The structural checks deferred in a preset round, made once on the round's
        model (or _BatchFailed), whose inferred shapes the graph then gets for the next
        round."""
        self._materialize()
        state = self.state
        if state.unverified:
            _verify_deferred(state, self.verifier, state.last_good)
            state.accept(state.last_good, self.verifier.inferred, graph_changed=False)

    def finish(self, pipeline: str) -> tuple[onnx.ModelProto, Report]:
        self._materialize()
        self._check_unchanged()
        self._check_pending(self.state.last_good, final=True)  # the structural checks too
        for record, model in self.held:
            self.on_pass_done(record, model)
        self.held = []
        self._note_unjudged()
        self.notes += [describe(name, *types) for name, types in self.verifier.redeclared.items()]
        check = self.output_check
        if check.enabled:
            self.notes += branch_notes(check.branches, check.feeds,
                                       {name: other.enabled for name, other in check.others})
        report = Report(
            pipeline=pipeline,
            passes=self.records,
            check=CheckInfo(
                enabled=check.enabled,
                skipped_reason=check.skipped_reason,
                inputs=check.describe_inputs(),
                data=check.data,
                seed=check.seed,
                providers=list(check.providers),
                tolerances=check.tolerances(),
                unjudged=check.unjudged,
                judged_nothing=check.enabled and check.judges_nothing(),
            ),
            verify_notes=self.notes,
            renamed=dict(self.ctx.renamed),
            removed=dict(self.removed),
            rounds=dict(self.rounds_run),
            seconds=time.perf_counter() - self.start,
        )
        if self.ctx.rewrites is not None:
            report.rewrite_limit = self.ctx.rewrites.limit
            report.rewrites = list(self.ctx.rewrites.applied)
        return self.state.last_good, report


@dataclass
class _State:
    """The graph being rewritten, the last verified model, and the graph's fingerprint
    (kept between passes so an unchanged pass costs one fingerprint, not two)."""

    graph: gs.Graph
    last_good: onnx.ModelProto
    fingerprint: tuple | None = None
    inferred: onnx.ModelProto | None = None
    # the output check of `last_good` (text, max abs error); a candidate shown to compute
    # the same (`graph.samecomp`) has that outcome without running
    last_check: tuple[str, float | None] = ("passed (exact)", 0.0)
    digests: Digests = field(default_factory=Digests)
    version: int = 0  # bumped whenever the graph changes: accepted, rolled back, annotated
    # pipeline text -> (version, counts, notes) of the graph it last ran on and left
    # unchanged (`annotate` keeps the version when it gave no tensor a shape): on that
    # same graph it would do the same again (passes are deterministic), so a preset's next
    # round does not run it. A version, not a fingerprint: a fingerprint holds ids, which
    # objects freed since may have passed on
    unchanged_at: dict[str, tuple] = field(default_factory=dict)
    spill: Any = None  # where large new weights go (`graphfix.spill.Spill`), if anywhere
    # applied passes whose structural checks are deferred (batched: `_attempt`), since the
    # last model that had them: `last_good` has not been through onnx.checker and
    # inference, and `inferred` is still the shapes of the model before them
    unverified: list[PassRecord] = field(default_factory=list)
    # passes taken at their word that they changed nothing, since the last fingerprint
    # (batched: `_attempt`); `fingerprint` is then what the graph should still be
    untraced: list[PassRecord] = field(default_factory=list)
    # an unverified pass may have changed shapes: the graph's are those `inferred` found
    # for the model before it (tensors since made have what their pass gave them), so
    # passes are not told they are inferred (`PassContext.shapes_inferred`)
    stale: bool = False
    # passes of a round were applied to `graph` and not exported: `last_good` is the model
    # before them (`_Runner._materialize` exports it)
    unexported: bool = False

    def current_fingerprint(self) -> tuple:
        if self.fingerprint is None:
            self.fingerprint = fingerprint(self.graph)
        return self.fingerprint

    def roll_back(self) -> None:
        self.untraced = []  # whatever they did is gone with the graph
        self.graph = to_graph(self.last_good)
        self.annotate(self.inferred)

    def accept(self, model: onnx.ModelProto, inferred: onnx.ModelProto | None,
               graph_changed: bool = True) -> None:
        self.last_good = model
        self.annotate(inferred, graph_changed)
        self.unverified = []
        self.stale = False

    def accept_unverified(self, model: onnx.ModelProto | None, record: PassRecord,
                          keeps_computation: bool) -> None:
        """Keep a pass's model with its structural checks deferred (`_attempt`); the
        graph keeps its shapes, which a pass that keeps the computation does not change
        (another makes them `stale` until the checks are made). No model: the pass's
        graph is exported later (`unexported`)."""
        if model is None:
            self.unexported = True
        else:
            self.last_good = model
        self.unverified.append(record)
        self.stale = self.stale or not keeps_computation
        self.fingerprint = None
        self.version += 1

    def annotate(self, inferred: onnx.ModelProto | None, graph_changed: bool = True) -> None:
        """Give the graph's tensors the shapes inference found for the last verified model,
        so passes see them even where the exporter wrote none. The graph is a new version
        when it changed before this or a tensor got a shape here: a preset round's checks
        at its end (`_Runner._end_round`) mostly find the shapes the graph has, and the next
        round then skips the passes that left this same graph unchanged (`unchanged_at`;
        synthetic_1000's second round: 0.21 s -> 0.06 s). A pass that ran on stale shapes
        inferred what it needed itself (`PassContext.shapes_inferred`), so it saw no less
        than the graph now has."""
        self.inferred = inferred
        updated = apply_inferred(self.graph, inferred) if inferred is not None else 0
        if graph_changed or updated:
            self.fingerprint = None
            self.version += 1


def _run_one(index, spec, pass_: Pass, state: _State, ctx: PassContext, verifier, output_check,
             ran_before, defer: bool = False, in_round: bool = False,
             export_late: bool = False) -> PassRecord:
    """Run one pass; its context changes last only when its graph is kept (not when it is
    rolled back, refused by the rewrite budget, or changed nothing)."""
    saved = ctx.snapshot()
    if ctx.rewrites is not None:
        ctx.rewrites.start(index, spec)
    record = _attempt(index, spec, pass_, state, ctx, verifier, output_check, ran_before,
                      defer, in_round, export_late)
    if record.status != APPLIED:
        ctx.restore(saved)
    return record


LIMIT_NOTE = str(Note("all of its changes", LIMIT_REACHED))
NOT_RERUN = "unchanged (not run: the graph it left unchanged before)"


def _shown_same(last: tuple[str, float | None], since: str = "before this pass") -> str:
    """The check of a candidate shown to compute what the model before it did."""
    return f"{last[0]}: the same computation as {since}, shown from the graph (not run)"


def _attempt(index, spec, pass_: Pass, state: _State, ctx: PassContext, verifier, output_check,
             ran_before, defer: bool, in_round: bool = False,
             export_late: bool = False) -> PassRecord:
    t0 = time.perf_counter()
    nodes_before = count_nodes(state.graph)
    record = PassRecord(index, spec, UNCHANGED, 0.0, nodes_before, nodes_before)
    version = state.version
    seen = state.unchanged_at.get(spec)
    if seen and seen[0] == version and ctx.rewrites is None:
        record.counts, record.notes = dict(seen[1]), list(seen[2])
        record.check = NOT_RERUN
        record.seconds = time.perf_counter() - t0
        return record
    before = state.current_fingerprint()
    graph = state.graph
    try:
        ctx.shapes_inferred = state.inferred is not None and not state.stale
        ctx.rounds_follow = in_round
        try:
            result = pass_.run(graph, ctx)
        finally:
            ctx.shapes_inferred = ctx.rounds_follow = False
        if defer and not result.changed and (not pass_.annotates_shapes
                                             or result.annotated is False):
            after = before  # taken at its word, checked later (`_Runner._check_unchanged`)
            state.untraced.append(record)
        elif defer and result.changed and count_nodes(graph) != nodes_before:
            # it says it changed the graph and did for sure: no fingerprint needed (a
            # 6,000-node one is 10-40 ms). The passes taken at their word before it are
            # not checked: a fingerprint now would differ whatever they did.
            after = None
            state.untraced = []
        else:
            after = fingerprint(graph)  # covers the passes taken at their word before it
            state.untraced = []
        record.counts = dict(result.counts)
        record.notes = [str(n) for n in result.notes]
        if after != before and not result.changed and same_structure(after, before):
            # it inferred shapes and rewrote nothing (fold-constants does, and after a
            # rollback every round would "change" the graph, never reaching a fixed point)
            state.fingerprint = after
            state.version += 1  # the shapes passes see did change
            after = before
        if after != before and not _within_budget(pass_, ctx):
            state.roll_back()  # the pass's changes, all counted as one rewrite, are refused
            record.counts, record.notes = {}, [LIMIT_NOTE]
            after = before
        if after == before:
            record.check = "unchanged"
            if record.notes != [LIMIT_NOTE] and state.version == version:
                state.unchanged_at[spec] = (version, record.counts, record.notes)
            record.seconds = time.perf_counter() - t0
            return record
        if not pass_.leaves_graph_clean:
            prune(graph)
        toposort(graph)
        # large new weights go to the spill now: later passes read them lazily (dedup-
        # constants compares samples of deferred weights, whole arrays otherwise)
        settle_constants(graph, state.spill)
        # a round's pass whose checks wait for the round's end is exported with them
        # (`export_late`: batched, in a preset's round, no model asked for per pass)
        late = export_late and not pass_.changes_outputs
        candidate = None if late else to_model(graph, state.last_good)
    except GraphfixError:
        raise
    except Exception as err:
        if state.unexported:  # `last_good` is not the model before this pass
            raise _RaisedUnexported(record, err) from err
        where = f" (after {', '.join(ran_before)})" if ran_before else " (the first pass)"
        record.traceback = traceback.format_exc()
        return _rolled_back(record, RAISED, f"{type(err).__name__}: {err}{where}", state, t0)
    # a pass that only removes or shares what computes the same, or any pass of a preset
    # round, has its structural checks made on the model of a later pass or at the end of
    # the round (`_verify_deferred`)
    checked_later = defer and not pass_.changes_outputs and (
        pass_.keeps_computation or in_round)
    problem = None if checked_later else verifier.problem(candidate)
    if problem:
        record.rejected = candidate
        return _rolled_back(record, INVALID, problem, state, t0)
    if pass_.changes_outputs:  # the outputs are new: the pass verified itself
        if not result.verified:
            return _rolled_back(record, INVALID, "the pass changes the graph outputs but "
                                "does not say how it verified them", state, t0)
        record.check = f"verified by the pass: {result.verified}"
    elif defer and output_check.expected:  # not waiting for the original's run
        record.check = DEFERRED  # one check covers it (`_Runner._check_pending`)
        state.last_check = (DEFERRED, None)
    elif output_check.enabled and pass_.keeps_computation and same_computation(
            state.last_good, candidate, state.digests):
        record.check = _shown_same(state.last_check)
        record.max_abs_error = state.last_check[1]
    elif output_check.enabled:
        outcome = output_check.verify(candidate)
        record.max_abs_error = outcome.max_abs
        record.check = outcome.describe()
        if not outcome.ok:
            record.rejected = candidate
            return _rolled_back(record, NUMBERS, record.check, state, t0)
        state.last_check = (record.check, record.max_abs_error)
    else:
        record.check = "skipped"
    if checked_later:
        state.accept_unverified(candidate, record, pass_.keeps_computation)
    else:
        state.accept(candidate, verifier.inferred)
        _take_declarations(state.graph, verifier)
    record.status = APPLIED
    record.nodes_after = count_nodes(graph)
    record.seconds = time.perf_counter() - t0
    return record


def _verify_deferred(state: _State, verifier: Verifier, model: onnx.ModelProto) -> None:
    """The structural checks of the passes that deferred them (`_attempt`), made on
    `model`, the model after them, or _BatchFailed."""
    deferred = state.unverified
    if deferred:
        problem = verifier.problem(model)
        if problem:
            raise _BatchFailed("structural check (onnx.checker, shape inference)",
                               deferred[-1], [r.spec for r in deferred], problem)
        state.unverified = []
        _take_declarations(state.graph, verifier)


def _take_declarations(graph: gs.Graph, verifier: Verifier) -> None:
    """The graph's outputs whose declaration gave way (`Verifier.redeclared`) take the
    computed shape, so that the passes after see it and their models declare it."""
    for t in graph.outputs if verifier.redeclared else ():
        if t.name in verifier.redeclared:
            computed = verifier.redeclared[t.name][1]
            if contradicts(t.shape, computed):
                t.shape = declared_dims(computed)


def graph_names(graph: gs.Graph) -> set[str]:
    """Every graph input and node output name, bodies included (what a pass removed is
    what was here before it and is not after)."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names.update(t.name for t in g.inputs)
        names.update(t.name for node in g.nodes for t in node.outputs if t.name)
    return names


def _within_budget(pass_: Pass, ctx: PassContext) -> bool:
    """Whether a pass that changed the graph may keep its changes: always for a pass that
    asked the budget rewrite by rewrite, else when the budget allows one more rewrite."""
    if ctx.rewrites is None or pass_.counts_rewrites:
        return True
    return ctx.rewrites.allow(pass_.name, "all of its changes")


def _rolled_back(
    record: PassRecord, cause: str, reason: str, state: _State, t0: float
) -> PassRecord:
    record.status = ROLLED_BACK
    record.rollback_cause = cause
    record.rollback_reason = reason
    if not record.check:
        record.check = "not run"
    state.roll_back()
    record.nodes_after = count_nodes(state.graph)
    record.seconds = time.perf_counter() - t0
    return record
