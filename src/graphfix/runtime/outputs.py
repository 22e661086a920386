"""The per-pass output check: run the original once, then each rewrite, and compare.

The original model runs in onnxruntime (`runtime.session`: CPU, graph optimizations off)
on seeded random inputs or the user's data; its outputs are the reference. It runs a
second time with onnxruntime's BASIC optimizations on (which fold BatchNorm and fuse
Conv with Add/Mul, as graphfix's passes do): max |r' - r| per float output is the
model's noise floor, what a correct reordering of this model's arithmetic moves it by.
That second run is used only when a check needs it: when a rewrite's outputs fail the
fixed bounds, which the floor can only widen (a larger allowed error, outputs not
judged), so a rewrite that passes without it passes with it. On a machine with cores to
spare, a model that selects among its values (where the floor is often needed) has it
measured ahead, in the background, while the passes still run (`_floor_when_needed`); a
check that passes without it stops that run, and the verdict never depends on whether
it was ahead. After a pass,
the rewritten model runs on the reference inputs and every graph output is measured by
`runtime.compare` against the bound in `runtime.tolerances` (scale-relative, or within
`FLOOR_FACTOR` times the floor). When onnxruntime cannot run the original (custom ops,
unsupported opset, ...), or would not finish (a Loop past `runtime.work`'s bound, found
before running it), the check is skipped with the reason.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from graphfix.errors import GraphfixError, said
from graphfix.graph.protos import graph_protos
from graphfix.runtime import pinning, references
from graphfix.runtime.compare import OutputDiff, compare_outputs, unstable
from graphfix.runtime.coverage import branch_inputs
from graphfix.runtime.failures import cannot_run
from graphfix.runtime.feeds import DEFAULT_SEED, NoTestData, model_feeds
from graphfix.runtime.measure import measure
from graphfix.runtime.precision import narrow_outputs
from graphfix.runtime.session import intra_op_threads, run_model
from graphfix.runtime.tolerances import FLOOR_FACTOR, ILL_CONDITIONED, tolerance_table
from graphfix.runtime.values import InputValue, with_values
from graphfix.runtime.work import TooMuchWork


@dataclass
class CheckOutcome:
    """The verdict on one rewritten model."""

    ok: bool
    diffs: list[OutputDiff] = field(default_factory=list)
    error: str = ""
    # selections that chose among near-ties, judged with the original's choice (`pinning`)
    pinned: list[str] = field(default_factory=list)
    where: str = ""  # the inputs it failed on, when not the check's own (`OutputCheck.others`)

    @property
    def max_abs(self) -> float | None:
        finite = [d.max_abs for d in self.diffs if np.isfinite(d.max_abs)]
        return max(finite) if finite else None

    def describe(self) -> str:
        where = f"{self.where}: " if self.where else ""
        if self.error:
            return where + self.error
        bad = [d for d in self.diffs if not d.ok]
        if bad:
            pins = (f" (with the original's choice at {', '.join(self.pinned)}, which chose "
                    "among values tied to within rounding)") if self.pinned else ""
            return where + "outputs differ" + pins + ": " + "; ".join(
                d.describe() for d in bad)
        skipped = [d.name for d in self.diffs if d.not_compared]
        empty = [d.name for d in self.diffs if d.not_compared == EMPTY]
        ill = [name for name in skipped if name not in empty]
        if skipped and len(skipped) == len(self.diffs):
            why = [f"ill-conditioned: {', '.join(ill)}"] if ill else []
            why += [f"empty: {', '.join(empty)}"] if empty else []
            return f"not judged: no output can be compared on this sample ({'; '.join(why)})"
        aside = f"; not compared, ill-conditioned on this sample: {', '.join(ill)}" \
            if ill else ""
        aside += f"; empty on this sample, nothing compared: {', '.join(empty)}" \
            if empty else ""
        if self.pinned:
            aside += (f"; {', '.join(self.pinned)} chose among values tied to within "
                      "rounding: what follows was judged with the original's choice")
        worst = self.max_abs
        if not worst:
            return f"passed (exact{aside})"
        scaled = max(d.scaled for d in self.diffs if np.isfinite(d.max_abs))
        return f"passed (max abs {worst:.2g}, {scaled:.2g} of scale{aside})"


class OutputCheck:
    """Reference outputs of the original model, and the check of any rewrite against them."""

    def __init__(
        self,
        feeds: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray] | None,
        skipped_reason: str = "",
        providers: Sequence[str] = ("cpu",),
        seed: int | None = None,
        data: str = "",
    ) -> None:
        self.feeds = dict(feeds)
        self._reference = reference
        self._skipped = skipped_reason
        self.providers = tuple(providers)
        self.seed = seed
        self.data = data
        self._floors: dict[str, float] = {}  # output -> the model's noise floor (max abs)
        self._unstable: dict[str, str] = {}  # output -> why it is not judged on this sample
        # the model whose floor a failing check measures (`verify`), until it is measured
        self.floor_of: onnx.ModelProto | None = None
        self.floor_measured = False
        # the original's selections, and their inputs and outputs on the feeds (`pinning`)
        self._selections: list[pinning.Selection] = []
        self._witness: dict[str, np.ndarray] = {}
        # outputs the last `verify` did not judge: they follow a choice among near-ties
        self._ties: dict[str, str] = {}
        # the thread running the original (`prepare(background=True)`), and what it raised
        self._worker: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._waiting = threading.Event()  # set once a caller waits for the original
        self._ahead: _FloorAhead | None = None  # the floor measured ahead, unused so far
        self.computed_in: dict[str, str] = {}  # output -> the narrow float it was cast from
        # BOOL graph inputs that pick If branches -> those Ifs (`coverage.branch_inputs`),
        # and the same check with each of them flipped (`prepare`)
        self.branches: dict[str, list[str]] = {}
        self.others: list[tuple[str, OutputCheck]] = []

    def _settled(self) -> None:
        """Wait for the original's run in the background, if one is under way; raise
        what it raised (a GraphfixError: the user's setup, e.g. a provider)."""
        self.join()
        if self._failure is not None:
            raise self._failure

    def join(self) -> None:
        """Wait for the original's run in the background to end, raising nothing (a
        caller that stops early: its own error is the one to report). The worker itself
        does not wait (`_floor_when_needed` runs in it)."""
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            self._waiting.set()
            worker.join()
            self._worker = None
        for _, other in self.others:
            other.join()

    def close(self) -> None:
        """Leave nothing running in the background: wait for the original's run, stop
        the floor's run ahead (`_floor_when_needed`). The check still works after: a
        check that needs the floor then measures it."""
        self.join()
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.stop()
        for _, other in self.others:
            other.close()

    @property
    def reference(self) -> Mapping[str, np.ndarray] | None:
        self._settled()
        return self._reference

    @property
    def skipped_reason(self) -> str:
        self._settled()
        return self._skipped

    @property
    def floors(self) -> dict[str, float]:
        self._settled()
        return self._floors

    @property
    def unstable(self) -> dict[str, str]:
        self._settled()
        return self._unstable

    @property
    def enabled(self) -> bool:
        return self.reference is not None

    @property
    def expected(self) -> bool:
        """Whether the check is on or may be: `enabled` without waiting for the original
        to finish running in the background (a check that turns out disabled then skips
        what it was expected to check)."""
        return self._worker is not None or self._reference is not None

    @classmethod
    def prepare(
        cls,
        model: onnx.ModelProto,
        shapes: Mapping[str, tuple[int, ...]],
        data: str | os.PathLike | None = None,
        seed: int = DEFAULT_SEED,
        providers: Sequence[str] = ("cpu",),
        values: Mapping[str, InputValue] | None = None,
        background: bool = False,
        data_key: str | None = None,
        preprocess: str | None = None,
        flip: bool = True,
    ) -> OutputCheck:
        """Make the inputs and run the original; a model onnxruntime cannot run is skipped,
        with why (`runtime.failures`). Inputs: the first run's worth of `data` (anything
        `open_data` reads; `data_key` picks a single .npz's array, `preprocess` reads an
        image folder), else `model_feeds`
        (seeded; `values` fixes inputs).

        With `background`, the original runs in a thread (onnxruntime releases the GIL)
        while the caller goes on (the passes of `graphfix run`: Mask R-CNN's 1.2 s run
        then costs 0.5 s on 2 cores); what needs its outputs waits for it, and
        `expected` tells what may be checked without waiting. The thread runs a copy of
        `model` (`_private`): the caller may go on reading it, or change it.

        With `flip`, each BOOL graph input that is the condition of If nodes
        (`coverage.branch_inputs`: optimum's merged decoders' `use_cache_branch`) gets a
        check of its own with that input flipped (`others`), so that `verify` runs both
        branches: a check on one value alone passed a rewrite that broke the other."""
        if data is not None:
            from graphfix.runtime.data import first_feeds

            feeds = first_feeds(data, model, data_key=data_key, preprocess=preprocess)
            feeds, used_seed = with_values(model, feeds, values), None
        else:
            try:
                feeds, used_seed = model_feeds(model, shapes, seed, values), seed
            except NoTestData as err:  # an input dtype onnxruntime cannot take
                return cls({}, None, f"{err.what}: {err.why}", providers, seed)
        check = cls(feeds, None, "", providers, used_seed, str(data or ""))
        if not background:
            check._run_original(model)
        else:
            own = _private(model)

            def run() -> None:
                try:
                    check._run_original(own)
                except BaseException as err:  # noqa: BLE001 - raised where the check is used
                    check._failure = err

            check._worker = threading.Thread(target=run, name="graphfix-original",
                                             daemon=True)
            check._worker.start()
        check.branches = branch_inputs(model, feeds)
        for name in check.branches if flip else ():
            flipped = {**(values or {}), name: int(not np.asarray(feeds[name]).reshape(()))}
            check.others.append((name, cls.prepare(
                model, shapes, data, seed, providers, flipped, background, data_key,
                preprocess, flip=False)))
        return check

    def _run_original(self, model: onnx.ModelProto) -> None:
        """The reference outputs (and the floor, when measured at once), or why there
        are none; and which outputs are float16 data cast up (in the original's thread
        when it has one: a walk of the graph that `graphfix run`'s passes need not wait
        for)."""
        self.computed_in = narrow_outputs(model)
        try:
            self._reference = self._with_witness(
                model, run_checkable(model, self.feeds, self.providers,
                                     extra_outputs=self._witnesses_of(model)))
        except TooMuchWork as err:  # a Loop that would never finish: checked before running
            self._skipped = f"{err.what}: {err.why}"
            return
        except NotCheckable as err:
            self._skipped = (f"{err}: onnxruntime cannot run it and graphfix has no "
                             "reference form for it (docs/references.md)")
            return
        except GraphfixError:  # the user's setup (a provider onnxruntime lacks), not the model
            raise
        except Exception as err:  # onnxruntime raises many types; all mean "cannot run it"
            source = (f"the data in '{self.data}'" if self.data else
                      "seeded random inputs")
            self._skipped = cannot_run(model, self.feeds, err, source, self.providers)
            return
        self._mark_random(model)
        self._floor_when_needed(model)

    def _mark_random(self, model: onnx.ModelProto) -> None:
        """Outputs that follow a training-mode Dropout are not judged: onnxruntime draws
        them anew on every run (`runtime.randomness`)."""
        from graphfix.runtime.randomness import FIX, downstream, random_sources

        follows = downstream(model, random_sources(model))
        for name in self._reference or {}:
            if name in follows:
                self._unstable[name] = f"random on every run: {follows[name]}; {FIX}"

    def rebased(self, model: onnx.ModelProto) -> OutputCheck:
        """The check with `model`'s outputs as the reference, on the same inputs (after
        a pass that changed the graph outputs); disabled, with why, when onnxruntime
        cannot run `model`. This check's floor, no longer needed, stops if it runs ahead."""
        self.close()
        feeds = feeds_as_declared(model, self.feeds)
        check = OutputCheck(self.feeds, None, "", self.providers, self.seed, self.data)
        check.computed_in = narrow_outputs(model)
        try:
            check._reference = check._with_witness(model, run_checkable(
                model, feeds, self.providers, extra_outputs=check._witnesses_of(model)))
        except Exception as err:  # NotCheckable or onnxruntime's own errors
            reason = f"onnxruntime cannot run the model a pass made: {said(err)}"
            return OutputCheck(self.feeds, None, reason, self.providers, self.seed, self.data)
        check._mark_random(model)
        check._floor_when_needed(model)
        check.branches = self.branches
        check.others = [(name, other.rebased(model)) for name, other in self.others]
        return check

    def _floor_when_needed(self, model: onnx.ModelProto) -> None:
        """`model`'s floor is measured the first time a check needs it. When it selects
        (NonMaxSuppression, TopK, ArgMax, ArgMin: with random weights its outputs are
        often ill-conditioned, and then a check needs the floor), the original ran in the
        background with no one waiting for it yet (the passes still run), and there are
        cores to spare (`AHEAD_MIN_CPUS`), the floor is measured ahead, in a thread of its
        own, as long as no check has passed without it (`verify`).

        On 2 cores a floor run ahead slows the passes and the rewrite's run, which share
        the cores with it. A B A B, three runs each, measured when needed against ahead:
        FCOS 1.43 -> 1.19 s, RetinaNet 1.49 -> 1.26, Keypoint R-CNN 1.74 -> 1.62, SSDlite
        (shared) 1.19 -> 1.13; SSDlite at 320x320 from the zoo, which needs the floor,
        1.36 -> 1.64; Faster R-CNN 2.53 -> 2.13 (noisy). With more cores the passes (one
        thread) leave the others idle while they run; that case was not measured here."""
        self.floor_of = model
        if (threading.current_thread() is self._worker and not self._waiting.is_set()
                and intra_op_threads() >= AHEAD_MIN_CPUS
                and any(n.op_type in _SELECTIONS
                        for g in graph_protos(model.graph) for n in g.node)):
            self._ahead = _FloorAhead(model, self.feeds, self.providers)

    @classmethod
    def disabled(cls, reason: str) -> OutputCheck:
        return cls({}, None, reason)

    def _witnesses_of(self, model: onnx.ModelProto) -> list[str]:
        """The tensors of the original's selections (`runtime.pinning`) that `model`
        computes (for the original itself, its selections are recorded here first)."""
        if self._reference is None and not self._selections:
            self._selections = pinning.selections(model)
        return pinning.witnesses(model, self._selections)

    def _with_witness(self, model: onnx.ModelProto, outputs: dict[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
        """The graph outputs of a run; the selections' tensors it also returned kept aside."""
        graph_outputs = {o.name for o in model.graph.output}
        for name in [n for n in outputs if n not in graph_outputs]:
            self._witness[name] = outputs.pop(name)
        return outputs

    def verify(self, model: onnx.ModelProto) -> CheckOutcome:
        """Run the rewritten model on the reference inputs and compare every output; where
        they differ after a selection that chose among near-ties, again with the
        original's choice there (`runtime.pinning`)."""
        assert self.reference is not None, "verify() on a disabled check"
        witnesses, following = [], None
        if self._witness:  # and what a pinned run would be fed (`_pinned`)
            following = pinning.after(model, self._selections)
            witnesses = list(dict.fromkeys(
                [*pinning.witnesses(model, self._selections), *following.boundary]))
        try:
            outputs = run_checkable(model, feeds_as_declared(model, self.feeds), self.providers,
                                    extra_outputs=witnesses)
        except NotCheckable as err:
            return CheckOutcome(False, error=str(err))
        except Exception as err:
            return CheckOutcome(False, error=f"onnxruntime cannot run it: {said(err)}")
        seen, outputs = outputs, _graph_outputs(model, outputs)
        self._ties = {}
        outcome = self._judge(outputs)
        if not outcome.ok and self.floor_of is not None:
            self._settle_floor()
            outcome = self._judge(outputs)
        elif outcome.ok and self._ahead is not None:  # not needed now: no more CPU for it
            self.close()
        if not outcome.ok and not outcome.error and seen:
            outcome = self._pinned(model, seen, outcome, outputs, following)
        for name, other in self.others if outcome.ok else ():
            if other.enabled:  # the original runs with the input flipped
                also = other.verify(model)
                if not also.ok:
                    also.where = f"with {name} = {bool(other.feeds[name].reshape(()))}"
                    return also
        return outcome

    def _pinned(self, model: onnx.ModelProto, seen: dict[str, np.ndarray],
                outcome: CheckOutcome, outputs: dict[str, np.ndarray],
                following: pinning.After | None = None) -> CheckOutcome:
        """`outcome` again with every selection that chose among near-ties given the
        original's choice, as long as more are found (module `runtime.pinning`). When
        outputs after them still differ, choices no output witnesses flipped too (a
        NonZero of a bool, NMS inside a Loop): those outputs are not judged on this
        sample, as `graphfix check` does; every other output is judged, those after
        the pinned choices from the last pinned run. A pinned run computes only what
        follows the selections (`pinning.after`), fed what precedes them from the first
        run, which computed it from the same inputs with the same kernels."""
        known = {**self.reference, **self._witness}  # the original's values
        first = seen
        if following is not None and not pinning.can_cut(following, first):
            following = None
        chosen: list[pinning.Selection] = []
        flips: dict[str, str] = {}  # an output that carries a choice -> why
        cut, last = model, outcome
        for _ in range(pinning.MAX_PINS):
            more = [s for s in pinning.tied(self._selections, known, seen, cut)
                    if s not in chosen]
            if not more:
                break
            for s in more:
                why = (f"ill-conditioned on this sample: {s.label} chose among values tied "
                       "to within rounding")
                flips.update(dict.fromkeys(pinning.differing(s, known, seen), why))
            chosen += more
            cut = pinning.pinned(model, chosen, known, following, first)
            feeds = feeds_as_declared(model, self.feeds)
            if following is not None:
                feeds.update({n: first[n] for n in following.boundary})
            feeds.update({n: known[n] for s in chosen for n in s.outputs})
            rest = pinning.witnesses(cut, self._selections)
            try:
                got = run_checkable(cut, feeds, self.providers, extra_outputs=rest)
            except Exception:  # noqa: BLE001 - the cut model does not run: judged unpinned
                break
            if following is not None:  # what precedes the selections: the first run's
                got = {**first, **got}
            seen, got = got, _graph_outputs(model, got)
            # a graph output that is itself a choice that flipped is not judged
            self._ties = {name: why for name, why in flips.items() if name in self.reference}
            last, outputs = self._judge(got, self._ties), got
            last.pinned = [s.label for s in chosen]
            if last.ok:
                return last
        if not chosen:
            return outcome
        from graphfix.runtime.randomness import downstream

        # the outputs that differ carry the choice; what only agreeing ones feed is judged
        follows = downstream(model, flips)
        failing = {d.name for d in last.diffs if not d.ok} | set(flips)
        self._ties = {name: follows[name] for name in self.reference
                      if name in follows and name in failing}
        judged = self._judge(outputs, self._ties)
        judged.pinned = last.pinned
        return judged

    @property
    def empty(self) -> dict[str, str]:
        """The outputs with no elements on this sample (a detector with no detections on
        random inputs, a batch of 0), with why they judge nothing: their shape and type
        are still compared, their values cannot be."""
        return {name: EMPTY for name, ref in (self.reference or {}).items()
                if ref is None or (isinstance(ref, np.ndarray) and ref.size == 0)}

    @property
    def unjudged(self) -> dict[str, str]:
        """Every output the check cannot judge on this sample, with why: ill-conditioned
        or random (`unstable`), or empty, or after a choice among near-ties in the last
        `verify` (`runtime.pinning`); none when the check is off."""
        return {**self.unstable, **self._ties, **self.empty} if self.enabled else {}

    def judges_nothing(self) -> bool:
        """Whether no output of the reference can be compared on this sample."""
        names = set(self.reference or {})
        return bool(names) and names <= set(self.unjudged)

    def _judge(self, outputs: Mapping[str, np.ndarray],
               ties: Mapping[str, str] | None = None) -> CheckOutcome:
        """The verdict on a run's `outputs`; `ties` (output -> why) are not judged on this
        sample either, besides the model's `unstable` outputs."""
        skip = {**(ties or {}), **self.unstable}
        stable = {k: v for k, v in self.reference.items() if k not in skip}
        empty = self.empty
        diffs = [unstable(d.name, EMPTY) if d.ok and d.name in empty else d
                 for d in compare_outputs(stable, outputs, floors=self.floors,
                                          computed_in=self.computed_in)]
        diffs += [unstable(name, why) for name, why in skip.items()]
        return CheckOutcome(all(d.ok for d in diffs), diffs)

    def _settle_floor(self) -> None:
        """The floor, from its run ahead when that one finished, else measured now."""
        ahead, self._ahead = self._ahead, None
        optimized = ahead.result() if ahead is not None else _STOPPED
        if optimized is _STOPPED:
            self.measure_floor(self.floor_of)
        else:
            self._take_floor(optimized)

    def measure_floor(self, model: onnx.ModelProto) -> None:
        """The noise floor of each float output (module docstring); none when
        onnxruntime's optimized run fails (then only the scale-relative bound applies).
        `verify` calls it the first time a check fails without it.

        An output whose shape, or integer or boolean values, the optimized run changes,
        or a float output it moves by more than `ILL_CONDITIONED` of its scale, is
        ill-conditioned on this sample: a selection (NonMaxSuppression, TopK, ArgMax)
        among values that tie to within rounding, typical of a model with random weights.
        A correct rewrite changes it the same way, so it is not judged (the verdict and
        the run's notes say so); every other output still is."""
        self._take_floor(_optimized(model, self.feeds, self.providers))

    def _take_floor(self, optimized: Mapping[str, np.ndarray] | None) -> None:
        """The floor and the ill-conditioned outputs from the optimized run's outputs
        (`measure_floor`); none when there are none."""
        assert self.reference is not None
        self.floor_of, self.floor_measured = None, True
        if optimized is None:
            return
        for name, ref in self.reference.items():
            other = optimized.get(name)
            if not isinstance(ref, np.ndarray) or not isinstance(other, np.ndarray) or (
                    name in self._unstable):  # random: not the optimizations' doing
                continue
            if other.shape != ref.shape:
                self.unstable[name] = (f"ill-conditioned on this sample: onnxruntime's own "
                                       f"optimizations change its shape {ref.shape} -> "
                                       f"{other.shape}")
            elif ref.dtype.kind == "f":
                self.floors[name], scale = _floor_and_scale(ref, other)
                if scale and self.floors[name] > ILL_CONDITIONED * scale:
                    self.unstable[name] = (
                        "ill-conditioned on this sample: onnxruntime's own optimizations "
                        f"change it by {self.floors[name] / scale:.2g} of its scale")
            elif ref.dtype.kind in "iub" and not np.array_equal(ref, other):
                changed = int(np.count_nonzero(ref != other))
                self.unstable[name] = (f"ill-conditioned on this sample: onnxruntime's own "
                                       f"optimizations change {changed} of its {ref.size} "
                                       "values (a selection among near-tied values)")

    def describe_inputs(self) -> dict[str, str]:
        return {k: f"{v.dtype}[{'x'.join(map(str, v.shape))}]" for k, v in self.feeds.items()}

    def tolerances(self) -> dict[str, dict[str, float]]:
        table = {k: t.to_json() for k, t in tolerance_table().items()}
        table["noise_floor"] = {"factor": FLOOR_FACTOR, "measured": self.floor_measured,
                                **self.floors}
        if self.computed_in:  # outputs judged by the narrow type they were cast up from
            table["computed_in"] = dict(self.computed_in)
        return table


def _floor_and_scale(ref: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """max |other - ref| and max |ref| over the elements finite in both (0 when none):
    `measure`'s numbers (a block at a time for large tensors: Mask R-CNN's masks
    0.19-0.44 -> 0.05-0.07 s), which are over those elements unless NaN or infinity sit
    in different places; then from the finite elements' float64 copies."""
    if ref.dtype == other.dtype:
        m = measure(ref, other)
        assert not isinstance(m, str), "same dtype and shape"
        if not m.problem:
            return m.max_abs, m.scale
    both = np.isfinite(ref) & np.isfinite(other)
    diff = np.abs(ref[both].astype(np.float64) - other[both])
    if not diff.size:
        return 0.0, 0.0
    return float(diff.max()), float(np.abs(ref[both]).max())


_SELECTIONS = frozenset({"NonMaxSuppression", "TopK", "ArgMax", "ArgMin"})
AHEAD_MIN_CPUS = 4
"""The CPUs (`session.intra_op_threads`) from which a floor may be measured ahead
(`OutputCheck._floor_when_needed`)."""
_STOPPED = object()  # a floor's run ahead that was stopped before it ended


def _private(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` for the thread that runs the original (`OutputCheck.prepare`),
    made before it starts, so that no protobuf message is shared between that thread
    and the passes: gs's lazy values keep the input's TensorProtos, and upb's messages
    are not safe to share between threads when one of them writes (a write of the
    input's `external_data` beside the thread's reads was a segfault; another, rarer
    one in that thread was never explained, `bench/RESULTS.md`). Cheap for a model
    whose weights were left in their file (`io.load(weights=False)`, as the CLI loads
    it): the copy has their references, not their bytes. A model given in memory with
    its weights is copied whole."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _optimized(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
               providers: Sequence[str], run_options=None) -> dict[str, np.ndarray] | None:
    """The floor's run: the outputs with onnxruntime's BASIC optimizations on; None when
    it fails (the optimizer's problem, not the model's: no floor) or was stopped."""
    try:
        return run_checkable(model, feeds, providers, basic=True, run_options=run_options)
    except Exception:  # noqa: BLE001 - onnxruntime raises many types
        return None


class _FloorAhead:
    """The optimized run of the noise floor (`OutputCheck.measure_floor`), in a thread
    of its own, which `stop` ends early (onnxruntime's terminate flag, checked between
    nodes)."""

    def __init__(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                 providers: Sequence[str]) -> None:
        import onnxruntime as ort

        self._options = ort.RunOptions()
        self._stopped = False
        self._outputs: Mapping[str, np.ndarray] | None = None
        self._thread = threading.Thread(target=self._run, args=(model, feeds, providers),
                                        name="graphfix-floor", daemon=True)
        self._thread.start()

    def _run(self, model, feeds, providers) -> None:
        self._outputs = _optimized(model, feeds, providers, self._options)

    def stop(self) -> None:
        self._stopped = True
        self._options.terminate = True
        self._thread.join()

    def result(self):
        """The optimized run's outputs; None when it failed; `_STOPPED` when `stop`
        ended it (it may have finished first: then its outputs)."""
        self._thread.join()
        if self._outputs is None and self._stopped:
            return _STOPPED
        return self._outputs

EMPTY = "empty on this sample: it has no elements to compare"


class NotCheckable(Exception):
    """The model has nodes onnxruntime cannot run and no reference form stands in for."""


def run_checkable(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
                  providers: Sequence[str] = ("cpu",), basic: bool = False,
                  extra_outputs: Sequence[str] = (), run_options=None
                  ) -> dict[str, np.ndarray]:
    """Every graph output, from onnxruntime; nodes it cannot run (TensorRT plugins,
    custom ops) run as their reference forms (`runtime.references`). Raises NotCheckable
    ("not checkable: <op> (<domain>)") for a node without one. With `basic`, onnxruntime's
    BASIC optimizations are on (the noise floor); a model with numpy-kernel nodes has none.
    `extra_outputs` (main-graph tensors) are returned too where onnxruntime runs the
    model as it is (not through reference forms). `run_options` (onnxruntime's
    RunOptions, to stop the run from another thread) apply to a `basic` run."""
    if not references.needs_reference(model):
        return run_model(model, feeds, providers, basic, extra_outputs, run_options)
    sub = references.substitute(model)
    if sub.not_checkable:
        raise NotCheckable("not checkable: " + ", ".join(sub.not_checkable))
    if basic and sub.kernels:
        raise NotCheckable("no noise floor for a model with numpy-kernel nodes")
    if basic:
        return run_model(sub.model, feeds, providers, basic, run_options=run_options)
    return references.run(sub, feeds, providers)


def _graph_outputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """The graph outputs among a run's `values` (it returned extra tensors too)."""
    names = {o.name for o in model.graph.output}
    return {name: value for name, value in values.items() if name in names}


def feeds_as_declared(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict:
    """The feeds, each cast to the dtype `model` declares for that input when a pass
    changed it (int64-to-int32) and the cast keeps every value exactly; others as given
    (onnxruntime then says what does not match)."""
    declared = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    out = {}
    for name, value in feeds.items():
        elem = declared.get(name, 0)
        try:
            dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else value.dtype
        except (KeyError, TypeError, ValueError):
            dtype = value.dtype
        if dtype != value.dtype:
            cast = value.astype(dtype)
            if np.array_equal(cast.astype(value.dtype), value):
                value = cast
        out[name] = value
    return out

