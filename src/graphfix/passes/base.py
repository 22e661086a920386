"""The pass contract: `Pass`, `PassResult`, `PassContext`.

A pass takes an `onnx_graphsurgeon.Graph` and mutates it in place. It does no file
I/O, keeps no global state, and never mutates a numpy array it did not create
(rollback and change detection rely on that): it reads constants with
`graphfix.graph.constant_value` (gs's `Constant.values` caches, which counts as
an edit) and gives a changed constant a new `gs.Constant`. It reports what it did in
`PassResult.counts` and why it skipped something in `PassResult.notes`.

Every pass class has a kebab-case `name`, a one-line `summary`, and an `Options`
dataclass (possibly empty). Options are parsed from pipeline text
(`fold-constants{size-threshold=1048576}`); field names are written there in
kebab-case.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError

_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Note:
    """Why a pass left something alone: `subject` (node or tensor) and `reason`."""

    subject: str
    reason: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.reason}"


@dataclass
class PassResult:
    """What one run of a pass did.

    `counts` maps a past-tense phrase ("folded BatchNormalization into Conv") to how
    many times it happened; `notes` say why candidates were skipped.
    """

    changed: bool
    counts: Counter[str] = field(default_factory=Counter)
    notes: list[Note] = field(default_factory=list)
    verified: str = ""
    """What a pass that changes the graph outputs (`Pass.changes_outputs`) checked
    itself, for the report ("backbone + NMS part reproduce the outputs on 3 inputs")."""
    annotated: bool | None = None
    """A pass that annotates shapes (`Pass.annotates_shapes`) and changed nothing: False
    when it gave no tensor a new shape or dtype either. A claim like changed=False, checked
    the same way (the batched fingerprint); None, not said: the manager fingerprints."""

    def summary(self) -> str:
        if not self.counts:
            return "nothing to do"
        return "; ".join(f"{what}: {n}" for what, n in self.counts.items())


@dataclass
class PassContext:
    """What a pass may know beyond the graph.

    `input_shapes` holds the resolved shape of every graph input (from
    `--input-shape`, `--data` or the default), for passes such as `fix-shapes`.
    `renamed` records tensor names a pass had to change (old -> new), so tensors
    can still be matched across rewrites. `trt` is the TensorRT target the run
    prepares for (`graphfix.trt.TrtTarget`), None when none was given. `artifacts`
    holds side models a pass produces, by pass name (split-nms: the NMS part and its
    manifest); the API returns them and the CLI writes them beside the output.
    `samples` are the inputs the run's output check uses (the first `--data` batch, or
    seeded inputs with `--input-value`s fixed), empty with `--no-check`: a pass that
    checks itself (split-nms, nms-to-plugin, add-nms) tests them first, then its own
    seeded inputs, so what the user gave is what it proves.
    """

    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)
    trt: Any = None  # the graphfix.trt.TrtTarget given with --trt, if any
    samples: tuple[Mapping[str, np.ndarray], ...] = ()
    plugin_rules: tuple[Any, ...] = ()
    """User rules for `substitute-plugins` (`graphfix.plugins.rules.Rule`), loaded from
    --plugin-rules files by the caller."""
    rewrites: RewriteBudget | None = None
    """Counts rewrites over the whole run and stops them at a limit (`--max-rewrites`,
    `--bisect`); None: every rewrite is allowed and nothing is counted."""
    shapes_inferred: bool = False
    """The graph's tensors already carry what ONNX shape inference finds for the graph as
    it is: the pass manager says so while a pass runs (it gives the graph the inferred
    shapes of every verified model, and passes that skip verification keep shapes). A
    pass that infers shapes only because exporters record none for intermediates skips
    that then (fcos_resnet50_fpn: two needless inferences, 75 ms)."""
    static_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Static shapes, by tensor name, that ONNX shape inference found at `input_shapes`
    for a pass earlier in the run (`_conv_copy.ShapeBook`). A rewrite keeps what a name
    holds, so a later pass reads them instead of inferring the whole graph again
    (maxvit_t: fold-bn's second round inferred 38 ms to size one Conv). Only a cost
    model reads them; never restored (they were true of the graph they were found in)."""

    rounds_follow: bool = False
    """The pass runs in a preset's round: the manager infers the whole graph's shapes at
    the round's end and runs another round when any pass changed the graph. A pass may
    then leave to that round what only a whole-graph inference would show it
    (fold-constants' last inference, which decides its fixed point when it runs alone)."""

    spill: Any = None
    """The run's spill file (`graphfix.spill.Spill`), or None: the pass manager sets it for
    the passes it runs. A pass that computes large weights in worker threads may write
    them there from the workers (fold-bn); the manager spills what else is large after
    the pass (`graph.convert.settle_constants`)."""

    def allow_rewrite(self, pass_name: str, label: str) -> bool:
        """Whether a pass may apply its next independent rewrite, described by `label`
        ("BatchNormalization 'bn1' into Conv 'conv1'"). A pass calls it right before each
        rewrite and, on False, leaves that candidate alone with a `LIMIT_REACHED` note."""
        return self.rewrites is None or self.rewrites.allow(pass_name, label)

    def snapshot(self) -> dict[str, Any]:
        """Copies of what a pass may change here, for `restore` when it is rolled back.

        Every field but `trt` (read only) and `rewrites` (its count goes on over a
        rollback, so rewrite numbers stay the same in every run of a pipeline). The
        containers are copied, not their values: a pass adds or replaces entries (a
        rename, split-nms's side model) and never edits one in place, so a snapshot
        per pass does not copy a side model every time."""
        return {f.name: copy.copy(getattr(self, f.name))
                for f in dataclasses.fields(self) if f.name not in _NOT_RESTORED}

    def restore(self, snapshot: dict[str, Any]) -> None:
        for name, value in snapshot.items():
            setattr(self, name, value)


_NOT_RESTORED = ("trt", "rewrites", "plugin_rules", "shapes_inferred", "static_shapes",
                 "spill", "rounds_follow")
LIMIT_REACHED = "rewrite limit reached"


def may_rewrite(result: PassResult, ctx: PassContext, pass_name: str, subject: str,
                plan: Any) -> bool:
    """Whether a pass may apply `plan` to `subject` (a node label): not when the plan is
    a reason (a str: noted as why the node stays), nor when the rewrite budget refuses
    it (noted as `LIMIT_REACHED`)."""
    if isinstance(plan, str):
        result.notes.append(Note(subject, plan))
        return False
    if not ctx.allow_rewrite(pass_name, subject):
        result.notes.append(Note(subject, LIMIT_REACHED))
        return False
    return True


@dataclass(frozen=True)
class Rewrite:
    """One rewrite a budget allowed: its number over the run (from 1), the pass (its
    pipeline text when run by the manager), what it did, and the index of the pass run
    in the report (-1 outside the manager)."""

    index: int
    spec: str
    label: str
    step: int = -1

    def __str__(self) -> str:
        return f"rewrite #{self.index} ({self.spec}: {self.label})"


class RewriteBudget:
    """Numbers the rewrites of a run in order and allows only the first `limit` of them
    (None: all), like LLVM's -opt-bisect-limit. `applied` lists every allowed rewrite.

    Passes that do not count their rewrites one by one (`Pass.counts_rewrites` false)
    are counted by the manager as one rewrite, "all of its changes", when they change
    the graph.
    """

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit < 0:
            raise GraphfixError(f"The rewrite limit is {limit}", "it cannot be negative",
                                "give 0 or more (0 applies no rewrite)")
        self.limit = limit
        self.applied: list[Rewrite] = []
        self.denied = 0
        self._spec = ""
        self._step = -1

    def start(self, step: int, spec: str) -> None:
        """The manager says which pass run the next rewrites belong to."""
        self._spec, self._step = spec, step

    def allow(self, pass_name: str, label: str) -> bool:
        if self.limit is not None and len(self.applied) >= self.limit:
            self.denied += 1
            return False
        index = len(self.applied) + 1
        self.applied.append(Rewrite(index, self._spec or pass_name, label, self._step))
        return True


@dataclass(frozen=True)
class NoOptions:
    """A pass without options."""


class Pass:
    """Base class of every pass. Subclasses set `name`, `summary`, `Options`, and `run`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    # True when run() ends with onnx-graphsurgeon's cleanup, so the manager skips its own.
    leaves_graph_clean: ClassVar[bool] = False
    # True when run() asks `ctx.allow_rewrite` before each independent rewrite; otherwise
    # the manager counts the whole pass as one rewrite when a rewrite budget is set.
    counts_rewrites: ClassVar[bool] = False
    # True when run() may change the graph outputs (split-nms makes the backbone's cut
    # tensors the outputs): the manager then does not compare outputs with the reference
    # but requires `PassResult.verified` (the pass checked itself), and later passes are
    # compared with the new model's outputs. The manager reads it after run(), so a pass
    # whose choice depends on the run (nms-for-trt delegates to nms-to-plugin or bound-nms
    # by ctx.trt) sets it on the instance in run().
    changes_outputs: bool = False
    # True when run() only renames, removes dead or Identity nodes, or shares identical
    # constants or nodes: the manager first tries to show from the graphs that the
    # candidate computes what the model before it did (`graph.samecomp`), and runs the
    # check only when that cannot be shown. A claim, verified every time, never trusted.
    keeps_computation: ClassVar[bool] = False
    # The pass may give existing tensors shapes (running shape inference) and still say
    # changed=False. The manager fingerprints the graph after such a pass, unless it says
    # it annotated nothing either (`PassResult.annotated` False); after another pass that
    # says it changed nothing it does so once, at the end of a batched run
    # (`passes.manager`), and a pass that did change the graph then makes the run repeat
    # with every check after every pass.
    annotates_shapes: ClassVar[bool] = False

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    def implied_input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Input shapes this configured pass sets; the run tests with exactly these."""
        return {}

    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls.Options))

    @classmethod
    def parse_options(cls, pairs: list[tuple[str, str]]) -> Any:
        """Build `Options` from `key=value` text pairs; unknown keys are user errors.

        Passes whose option keys are not fixed (fix-shapes: one key per model
        input) override this.
        """
        fields = {f.name.replace("_", "-"): f for f in cls.option_fields()}
        values: dict[str, Any] = {}
        for key, text in pairs:
            f = fields.get(key)
            if f is None:
                known = ", ".join(sorted(fields)) or "none"
                raise GraphfixError(
                    f"Pass '{cls.name}' has no option '{key}'",
                    f"its options are: {known}",
                    "fix the pipeline text, or run `graphfix passes` to see every option",
                )
            values[f.name] = _convert(cls.name, key, text, f.type)
        return cls.Options(**values)


def _convert(pass_name: str, key: str, text: str, type_: Any) -> Any:
    type_name = type_ if isinstance(type_, str) else getattr(type_, "__name__", str(type_))
    try:
        if type_name == "bool":
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if type_name == "int":
            return int(text)
        if type_name == "float":
            return float(text)
    except ValueError:
        raise GraphfixError(
            f"Option '{key}' of pass '{pass_name}' got '{text}'",
            f"it takes a {type_name}",
            f"write for example {pass_name}{{{key}={_EXAMPLES.get(type_name, 'value')}}}",
        ) from None
    return text


_EXAMPLES = {"bool": "true", "int": "1024", "float": "0.5"}


def check_pass_class(cls: type[Pass]) -> None:
    """Programming-error checks for a pass class, used by the registry."""
    from graphfix.errors import InternalError

    if not _KEBAB.match(getattr(cls, "name", "")):
        raise InternalError(f"pass {cls.__name__} has a name that is not kebab-case")
    if not getattr(cls, "summary", ""):
        raise InternalError(f"pass {cls.name} has no summary")
    if not dataclasses.is_dataclass(cls.Options):
        raise InternalError(f"pass {cls.name}: Options must be a dataclass")
