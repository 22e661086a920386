"""The Python API, one function per command; the CLI parses flags, calls these, prints.

    result = graphfix.run("model.onnx", passes="cleanup,fold-bn", check=True)
    graphfix.save(result.model, "model.fixed.onnx")
    print(result.to_json())

`run` and `bisect` are here; `doctor` too; `calibrate` lives in
`graphfix.calibration.command`, `check` in `graphfix.check.command` and the
`plugins list|match|apply` commands in `graphfix.plugins.command`, imported from here on
first use (PEP 562), so `graphfix run` does not load calibration, the layer-wise check
and the plugin catalog.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from graphfix import io, provenance, runfiles, weights
from graphfix._lazy import lazy_attributes
from graphfix.errors import GraphfixError
from graphfix.passes.base import PassContext, RewriteBudget
from graphfix.passes.defaults import default_pipeline
from graphfix.passes.manager import PassCallback, run_pipeline
from graphfix.passes.pipeline import Pipeline, parse_pipeline
from graphfix.report import FileRef, Report
from graphfix.runtime.feeds import (
    DEFAULT_SEED,
    NoTestData,
    graph_inputs,
    refuse_non_tensors,
    resolve_shapes,
)
from graphfix.runtime.outputs import OutputCheck
from graphfix.runtime.values import InputValue
from graphfix.spill import Spill

if TYPE_CHECKING:
    from graphfix.doctor import Diagnosis
    from graphfix.passes.bisect import Bisection, ProbeOutcome
    from graphfix.writeset import WriteSet

ModelLike = onnx.ModelProto | str | os.PathLike

# the commands defined elsewhere are module attributes once read (`__getattr__`)
__all__ = ["Calibration", "Result", "bisect", "calibrate", "check", "doctor",  # noqa: F822
           "plugins_apply", "plugins_list", "plugins_match", "run"]

_ELSEWHERE = {  # the commands defined elsewhere (`module:name` where named otherwise there)
    "Calibration": "graphfix.calibration.command",
    "calibrate": "graphfix.calibration.command",
    "check": "graphfix.check.command",
    "plugins_apply": "graphfix.plugins.command:apply",
    "plugins_list": "graphfix.plugins.command:catalog",
    "plugins_match": "graphfix.plugins.command:match",
}
__getattr__ = lazy_attributes(__name__, _ELSEWHERE)


@dataclass
class Result:
    """What `run` did: the rewritten model and the report of how it got there.

    `artifacts`: side models passes made, by pass name (split-nms: a
    `graphfix.nms.SplitModel`, the NMS part and its manifest; with `output` they are
    written beside it). `diagnosis`: with `trt`, `graphfix.doctor`'s findings on the
    result. `written`: a line per side file written (split-nms, `dump_after`), and what
    `dump_after` could not write."""

    model: onnx.ModelProto
    report: Report
    artifacts: dict[str, Any] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    written: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report, schema graphfix.run/1 (what `graphfix run --json` prints)."""
        return self.report.to_json()


def run(
    model: ModelLike,
    passes: str | Pipeline | None = None,
    check: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    data: str | os.PathLike | None = None,
    input_values: Mapping[str, InputValue] | None = None,
    seed: int = DEFAULT_SEED,
    providers: str | Sequence[str] = ("cpu",),
    on_pass_start: Callable[[int, str], None] | None = None,
    on_pass_done: PassCallback | None = None,
    trt: str | None = None,
    max_rewrites: int | None = None,
    plugin_rules: Sequence[str | os.PathLike] = (),
    *,
    explain: bool = False,
    output: str | os.PathLike | None = None,
    report: str | os.PathLike | None = None,
    dump_after: str | None = None,
    external_data: bool | None = None,
    in_place: bool = False,
    keep_weights: bool = True,
    check_each: bool = False,
    data_key: str | None = None,
    preprocess: str | None = None,
) -> Result:
    """Run a pipeline of passes, verifying after each (see `graphfix.passes.manager`):
    `graphfix run` (docs/cli/run.md) is this function and printing.

    `model` is a ModelProto (not modified) or a path. With `check`, outputs are
    compared with the original's after every pass on seeded random inputs (see
    `graphfix.runtime.feeds`: `input_values` fixes inputs, {"sr": 16000}), or on the
    first sample of `data` (anything `graphfix calibrate --data` reads; `data_key` picks
    the array of a single .npz, as --data-key does; `preprocess` reads an image folder,
    as --preprocess does); dynamic dims
    come from the data, else `input_shapes`, else axis 0 = 1, else a GraphfixError says
    what to pass. The passes that change numbers are checked together, by one run of the
    model at the end, and the run is repeated with a check after each when that fails
    (`graphfix.passes.manager`); `check_each` checks after each pass from the start, so
    that every record has its own error. `providers`: onnxruntime's, "cuda,cpu" or a sequence
    (`runtime.session.provider_names`).
    `trt` names the TensorRT version the model is prepared for ("8.6", "10", ...):
    passes that depend on it (detect-unsupported) read it from their context, and the
    result is diagnosed for it (`Result.diagnosis`, the report's `doctor`). `passes`
    None is the default pipeline: `trt-prep`, and with `trt` first `migrate-plugins`,
    `lower-unsupported` and `substitute-plugins{needed-only=true}`
    (`graphfix.passes.defaults`). `plugin_rules` are user rule files (.py is executed,
    .yaml) for substitute-plugins (`graphfix.plugins.user`).
    `max_rewrites` applies only the first N rewrites of the whole run (numbered in
    order over every pass, see `graphfix.passes.base.RewriteBudget`); the report lists
    them. `bisect` finds the first one that breaks the numbers.
    `explain`: the report's `explain` section (Conv chains TensorRT fuses, NMS regions;
    `graphfix.explain`).
    Files, all claimed before any work and written together at the end, or none
    (`graphfix.writeset`): `output` the model (`external_data` None: in a .data file only
    over 2 GB; `in_place` lets it replace the input), with split-nms's parts beside it;
    `report` the JSON report; `dump_after` (a pass name or "all", needs `output`) the
    model after that pass, and the model a rolled-back pass produced.
    The output model's provenance (`graphfix.provenance`) is composed with the input's.
    A path is loaded with its large weights left in their file (`io.load` with
    `weights=False`, `graphfix.weights`): passes read those they rewrite, the checks'
    onnxruntime maps the file, `output` is written by copying them from it, and the
    result's weights are read into it at the end, so `Result.model` is self-contained
    (docs/large-models.md). Large weights a pass computes go to a temporary spill file
    for the run (`graphfix.spill`) and are read from there the same way.
    `keep_weights=False` skips that last read (the CLI, which only writes the model):
    `Result.model` then refers to the input file for the weights no pass changed, and
    to the spill, deleted when run returns, for those a pass made, so its weights are
    not to be read (with `in_place` they are read anyway, before the input is
    replaced).
    """
    from graphfix.runtime.session import provider_names
    from graphfix.writeset import WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    with WriteSet(_inputs(path, data, plugin_rules)) as files, Spill() as spill:
        pipeline = _pipeline(passes, trt)
        out = _claim_outputs(files, pipeline, path, output, report, dump_after, in_place)
        providers = provider_names(providers)  # a usage error before any work
        source = io.load(path, weights=False) if path else model
        written: list[str] = []
        if dump_after:
            on_pass_done = runfiles.dumper(out, dump_after, files, written, on_pass_done)
        prepared = _prepare(source, pipeline, check, input_shapes, data, input_values, seed,
                            providers, trt, plugin_rules, data_key=data_key,
                            preprocess=preprocess)
        replaces = path if in_place else None
        # a model read from a path has its weights left in their files, so the early
        # copy is small; an in-memory one would be copied whole
        early = _EarlyOutput(files, out, source, external_data, replaces) \
            if out is not None and path is not None and not dump_after else None
        try:
            result = _execute(prepared, max_rewrites, on_pass_start, on_pass_done, spill,
                              check_each, early.start if early else None)
        except BaseException:
            if early:
                early.join()  # its temporaries are in `files` when `files` discards them
            raise
        finally:
            prepared.output_check.close()  # no onnxruntime left running behind the run
        result.written = written
        _review(result, prepared, explain, name=str(out or path or "model"))
        result.report.input = FileRef(str(path)) if path else None
        if out is not None:
            staged = early.take(result.model) if early else None
            if staged is None:
                staged = files.model(result.model, out, external_data=external_data,
                                     replaces=replaces)
            result.report.output = FileRef(str(out), staged)
            result.written[:0] = runfiles.save_split(result.artifacts, out, files)
        if report is not None:
            files.text(report, json.dumps(result.report.to_json(), indent=2) + "\n",
                       "--report")
        if keep_weights or in_place:  # in place: read before the file is replaced
            result.model = _with_weights(result.model, prepared.source)
        files.commit()
    return result


class _EarlyOutput:
    """The output model written while the run's last output check runs it (`run_pipeline`'s
    `on_final_check`): onnxruntime runs the model in the main thread, and the file is
    staged in another (the streamed weights, the fsync), as `run` would stage it after
    the run, provenance included. When the check fails, the run goes on and returns
    another model: `take` then withdraws the early file and `run` stages the one it got.
    With the check, A B A B against staging after the run: fcos 1.73-1.94 s -> 1.55-1.60 s,
    maxvit_t 1.44-1.62 s -> 1.35-1.47 s, swin_t 1.41-1.52 s -> 1.36-1.41 s."""

    def __init__(self, files, out: Path, source: onnx.ModelProto,
                 external_data: bool | None, replaces: Path | None) -> None:
        self.files, self.out, self.source = files, out, source
        self.external_data, self.replaces = external_data, replaces
        self.thread: threading.Thread | None = None
        self.model: onnx.ModelProto | None = None  # the model the early file holds
        self.path: str | None = None  # its staged temporary
        self.entries: list[tuple[str, str]] = []  # every file it staged
        self.error: BaseException | None = None

    def start(self, model: onnx.ModelProto, renamed: dict[str, str],
              removed: dict[str, str]) -> None:
        self.withdraw()
        copy = onnx.ModelProto()  # `_execute` writes provenance into `model` afterwards
        copy.CopyFrom(model)
        if renamed or removed:
            merged = provenance.compose(provenance.read(self.source), renamed, removed)
            provenance.attach(copy, *merged)
        self.model = model
        self.thread = threading.Thread(target=self._stage, args=(copy,), daemon=True,
                                       name="graphfix-output")
        self.thread.start()

    def _stage(self, copy: onnx.ModelProto) -> None:
        before = len(self.files.staged)
        try:
            self.path = self.files.model(copy, self.out, external_data=self.external_data,
                                         replaces=self.replaces)
        except BaseException as err:  # noqa: BLE001 - `run` stages it again and says it
            self.error = err
        self.entries = self.files.staged[before:]

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def take(self, model: onnx.ModelProto) -> str | None:
        """The staged temporary of `model`, or None (withdrawn) when the early file holds
        another model or could not be written."""
        self.join()
        if model is self.model and self.error is None and self.path is not None:
            return self.path
        self.withdraw()
        return None

    def withdraw(self) -> None:
        self.join()
        if self.entries:
            self.files.withdraw(self.entries)
        self.model, self.path, self.entries, self.error = None, None, [], None


def _inputs(path: Path | None, data: str | os.PathLike | None,
            plugin_rules: Sequence[str | os.PathLike]) -> list:
    """What run and bisect read, for their WriteSet: no output may land on these."""
    from graphfix.writeset import Given

    return [Given(path, "the input model", model=True) if path else None,
            Given(data, "--data") if data else None,
            *(Given(p, "--plugin-rules") for p in plugin_rules)]


def _pipeline(passes: str | Pipeline | None, trt: str | None) -> Pipeline:
    if passes is None:
        passes = default_pipeline(trt)
    return passes if isinstance(passes, Pipeline) else parse_pipeline(passes)


def _claim_outputs(files: WriteSet, pipeline: Pipeline, path: Path | None,
                   output: str | os.PathLike | None, report: str | os.PathLike | None,
                   dump_after: str | None, in_place: bool) -> Path | None:
    """Check and claim run's output files before any work; the output model's path."""
    runfiles.check_dump_after(dump_after, pipeline)
    if dump_after and output is None:
        raise GraphfixError("dump_after needs an output path",
                            "the dumped models are written beside the output",
                            "give output= (the CLI always has one)")
    files.claim(report, "--report")
    if output is None:
        return None
    out = Path(output)
    io.check_output_path(out, input_path=path, in_place=in_place)
    files.claim(out, "the output model", model=True, replaces=path if in_place else None)
    runfiles.claim_split(pipeline, out, files)
    return out


def _review(result: Result, prepared: _Prepared, explain: bool, name: str) -> None:
    """The report's explain section (with `explain`) and doctor's diagnosis of the result
    for the target (with `trt`)."""
    report = result.report
    if explain:
        from graphfix.explain import explain_change

        report.explain = explain_change(prepared.source, result.model, prepared.trt,
                                        prepared.shapes)
    if prepared.trt is not None:
        from graphfix.doctor import diagnose

        result.diagnosis = diagnose(result.model, prepared.trt, name=name)
        result.diagnosis.after_run(_left_by(report))
        report.doctor = result.diagnosis.to_json()


def _left_by(report: Report) -> dict[str, dict[str, str]]:
    """pass name -> {node label: the reason its last run noted for the node}."""
    left: dict[str, dict[str, str]] = {}
    for record in report.passes:
        said = left.setdefault(record.spec.split("{")[0], {})
        for note in record.notes:
            subject, _, reason = note.partition(": ")
            if reason:
                said[subject] = reason
    return left


@dataclass
class _Prepared:
    """What every run of one pipeline on one model shares: the model, the pipeline, the
    input shapes, the output check (the original already run) and the target."""

    source: onnx.ModelProto
    pipeline: Pipeline
    shapes: dict[str, tuple[int, ...]]
    output_check: OutputCheck
    trt: Any = None
    plugin_rules: tuple[Any, ...] = ()


def _prepare(model: ModelLike, passes: str | Pipeline | None, check: bool,
             input_shapes: Mapping[str, Sequence[int]] | None, data: str | os.PathLike | None,
             input_values: Mapping[str, InputValue] | None, seed: int,
             providers: Sequence[str], trt: str | None,
             plugin_rules: Sequence[str | os.PathLike] = (),
             data_key: str | None = None, preprocess: str | None = None) -> _Prepared:
    pipeline = _pipeline(passes, trt)
    rules: list[Any] = []
    if plugin_rules:
        from graphfix.plugins.user import load_rules

        for path in plugin_rules:
            rules += load_rules(path)
    source = model if isinstance(model, onnx.ModelProto) else io.load(model, weights=False)
    given = {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    for spec in pipeline.pass_specs():
        for name, shape in spec.build().implied_input_shapes().items():
            if given.setdefault(name, shape) != shape:
                raise GraphfixError(
                    f"{spec} sets input '{name}' to {'x'.join(map(str, shape))}, but "
                    f"{'x'.join(map(str, given[name]))} was given for it",
                    "the check must test the model with the shapes it will have",
                    "give the same shape in both places, or drop one",
                )
    target = None
    if trt is not None:
        from graphfix.trt import parse_target

        target = parse_target(trt)
    # last: the original starts running in the background here, and a process that exits
    # on an error while onnxruntime runs in a thread aborts (exit 134, not the error's 2)
    shapes, output_check = _prepare_check(source, given, check, data, input_values, seed,
                                          providers, data_key, preprocess)
    return _Prepared(source, pipeline, shapes, output_check, target, tuple(rules))


def _execute(prepared: _Prepared, max_rewrites: int | None,
             on_pass_start: Callable[[int, str], None] | None = None,
             on_pass_done: PassCallback | None = None, spill=None,
             check_each: bool = False, on_final_check=None) -> Result:
    source = prepared.source
    check = prepared.output_check
    ctx = PassContext(input_shapes=dict(prepared.shapes), trt=prepared.trt,
                      samples=(dict(check.feeds),) if check.feeds else (),
                      plugin_rules=prepared.plugin_rules)
    if max_rewrites is not None:
        ctx.rewrites = RewriteBudget(max_rewrites)
    result_model, report = run_pipeline(
        source, prepared.pipeline, prepared.output_check, ctx, on_pass_start, on_pass_done,
        spill, check_each, on_final_check)
    if result_model is not source and (report.renamed or report.removed):
        merged = provenance.compose(provenance.read(source), report.renamed, report.removed)
        provenance.attach(result_model, *merged)
    return Result(result_model, report, dict(ctx.artifacts))


def bisect(
    model: ModelLike,
    passes: str | Pipeline | None = None,
    on_probe: Callable[[ProbeOutcome], None] | None = None,
    *,
    output: str | os.PathLike | None = None,
    report: str | os.PathLike | None = None,
    in_place: bool = False,
    **run_options: Any,
) -> Bisection:
    """Find the first rewrite of the run whose application breaks the output check,
    by binary search over `max_rewrites` (see `graphfix.passes.bisect`):
    `graphfix run --bisect`.

    `run_options` are `run`'s other keyword arguments (input shapes, data, seed, ...),
    used by every probe; the check is always on, and prepared once (the original runs
    once, not once per probe). The result's model has only the rewrites before the
    culprit (all of them when none breaks the numbers); `output` writes it, `report`
    the report of its run (both claimed before any work, as in `run`).
    """
    from graphfix.passes.bisect import bisect_rewrites

    if run_options.pop("dump_after", None):
        raise GraphfixError("--dump-after and --bisect were both given",
                            "bisect runs the pipeline many times, each with another limit",
                            "bisect first; it prints the --max-rewrites --dump-after command "
                            "that writes the rejected model")
    if not run_options.pop("check", True):
        raise GraphfixError("Cannot bisect without the output check", "--no-check was given",
                            "drop --no-check: bisect looks for the rewrite the check rejects")
    if run_options.pop("max_rewrites", None) is not None:
        raise GraphfixError("--max-rewrites and --bisect were both given",
                            "bisect chooses the limit of each of its runs itself",
                            "give one of them")
    run_options.pop("check_each", None)  # a rewrite budget checks after each pass anyway
    hooks = {k: run_options.pop(k) for k in ("on_pass_start", "on_pass_done")
             if k in run_options}
    options = {"input_shapes": None, "data": None, "data_key": None, "preprocess": None,
               "input_values": None,
               "seed": DEFAULT_SEED, "providers": ("cpu",), "trt": None, "plugin_rules": ()}
    unknown = set(run_options) - set(options)
    if unknown:
        raise TypeError(f"bisect() got unexpected keyword arguments {sorted(unknown)}")
    options.update(run_options)
    from graphfix.runtime.session import provider_names
    from graphfix.writeset import WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    with WriteSet(_inputs(path, options["data"], options["plugin_rules"])) as files:
        pipeline = _pipeline(passes, options["trt"])
        out = _claim_outputs(files, pipeline, path, output, report, None, in_place)
        options["providers"] = provider_names(options["providers"])
        source = io.load(path, weights=False) if path else model
        prepared = _prepare(source, pipeline, True, **options)  # the original runs once

        def probe(limit: int | None) -> tuple[onnx.ModelProto, Report]:
            budget = _EVERY_REWRITE if limit is None else limit
            result = _execute(prepared, budget, **hooks)
            return result.model, result.report

        try:
            found = bisect_rewrites(probe, on_probe)
        finally:
            prepared.output_check.close()  # no onnxruntime left running behind an error
        found.model = _with_weights(found.model, prepared.source)
        if out is not None:
            files.model(found.model, out, replaces=path if in_place else None)
        if report is not None:
            files.text(report, json.dumps(found.report.to_json(), indent=2) + "\n",
                       "--report")
        files.commit()
    return found


def _with_weights(model: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
    """The result with its weights in it: passes ran with the input's large weights left
    in their file (`io.load(weights=False)`, `graphfix.weights`); they are read now,
    into the result (a copy when it is the caller's `source`)."""
    if model is source:
        return weights.materialized(model)
    return weights.materialize(model)


_EVERY_REWRITE = 2**62  # a limit no run reaches: the probe that counts every rewrite


def _prepare_check(source: onnx.ModelProto, given: dict[str, tuple[int, ...]], check: bool,
                   data: str | os.PathLike | None, values: Mapping[str, InputValue] | None,
                   seed: int, providers: Sequence[str], data_key: str | None = None,
                   preprocess: str | None = None
                   ) -> tuple[dict[str, tuple[int, ...]], OutputCheck]:
    """(every input's shape, the output check): with `data`, the data's shapes."""
    inputs = graph_inputs(source)
    if not check:
        return (resolve_shapes(inputs, given, lenient=True),
                OutputCheck.disabled("--no-check was given"))
    try:
        refuse_non_tensors(source)
    except NoTestData as err:  # a sequence or optional input: rewrite, unchecked
        return (resolve_shapes(inputs, given, lenient=True),
                OutputCheck.disabled(f"{err.what}: {err.why}"))
    # the original runs in the background while the passes do (`OutputCheck.prepare`)
    if data is None:
        shapes = resolve_shapes(inputs, given)
        return shapes, OutputCheck.prepare(source, shapes, None, seed, providers, values,
                                           background=True)
    output_check = OutputCheck.prepare(source, {}, data, seed, providers, values,
                                       background=True, data_key=data_key,
                                       preprocess=preprocess)
    shapes = {k: tuple(v.shape) for k, v in output_check.feeds.items()}
    for name, shape in given.items():
        if name in shapes and shapes[name] != shape:
            raise GraphfixError(
                f"The shape {'x'.join(map(str, shape)) or 'scalar'} given for input "
                f"'{name}' is not the data's ({'x'.join(map(str, shapes[name])) or 'scalar'})",
                "with --data, the check runs on the data's shapes",
                f"drop --input-shape for '{name}', or give data of that shape",
            )
    return {**resolve_shapes(inputs, given, lenient=True), **shapes}, output_check


def doctor(model: ModelLike, trt: str | None = None, *, parser: bool = True,
           json_out: str | os.PathLike | None = None) -> Diagnosis:
    """What TensorRT `trt` ("8.6", "10", ...; None: the installed tensorrt, else the newest
    version graphfix has data for) will reject in `model`, finding by finding, with the
    fix: `graphfix doctor` (docs/doctor.md). Offline: no TensorRT, no GPU, no weights read.

    `parser`: also run TensorRT's own ONNX parser when tensorrt is installed
    (`Diagnosis.parser`; it needs the file, so not for a ModelProto). `json_out`: write
    `Diagnosis.to_json()` there.
    """
    from graphfix.doctor import diagnose
    from graphfix.trt import parse_target
    from graphfix.writeset import Given, WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    with WriteSet([Given(path, "the input model", model=True) if path else None]) as files:
        files.claim(json_out, "--json-out")
        target = parse_target(trt)
        loaded = io.load(path, weights=False) if path else model  # doctor reads no weights
        diagnosis = diagnose(loaded, target, name=str(path) if path else "model")
        if parser and path is not None:
            from graphfix.doctor.live import live_verdict

            diagnosis.parser = live_verdict(str(path), loaded)
        if json_out is not None:
            files.text(json_out, json.dumps(diagnosis.to_json(), indent=2) + "\n",
                       "--json-out")
        files.commit()
    return diagnosis
