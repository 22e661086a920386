"""The Python API; the CLI is a thin layer over it.

    result = graphfix.run("model.onnx", passes="cleanup,fold-bn", check=True)
    graphfix.save(result.model, "model.fixed.onnx")
    print(result.report.to_json())
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from graphfix import io, provenance, weights
from graphfix.errors import GraphfixError
from graphfix.passes.base import PassContext, RewriteBudget
from graphfix.passes.bisect import Bisection, ProbeOutcome, bisect_rewrites
from graphfix.passes.defaults import default_pipeline
from graphfix.passes.manager import PassCallback, run_pipeline
from graphfix.passes.pipeline import Pipeline, parse_pipeline
from graphfix.report import Report
from graphfix.runtime.feeds import (
    DEFAULT_SEED,
    NoTestData,
    graph_inputs,
    refuse_non_tensors,
    resolve_shapes,
)
from graphfix.runtime.outputs import OutputCheck
from graphfix.runtime.values import InputValue

ModelLike = onnx.ModelProto | str | os.PathLike


@dataclass
class Result:
    """The rewritten model and the report of how it got there; `artifacts`: side models
    passes made, by pass name (split-nms: a `graphfix.nms.SplitModel`, the NMS part
    and its manifest; `graphfix.nms.save_split` writes them beside the model)."""

    model: onnx.ModelProto
    report: Report
    artifacts: dict[str, Any] = field(default_factory=dict)


def run(
    model: ModelLike,
    passes: str | Pipeline | None = None,
    check: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    data: str | os.PathLike | None = None,
    input_values: Mapping[str, InputValue] | None = None,
    seed: int = DEFAULT_SEED,
    providers: Sequence[str] = ("cpu",),
    on_pass_start: Callable[[int, str], None] | None = None,
    on_pass_done: PassCallback | None = None,
    trt: str | None = None,
    max_rewrites: int | None = None,
    plugin_rules: Sequence[str | os.PathLike] = (),
) -> Result:
    """Run a pipeline of passes, verifying after each (see `graphfix.passes.manager`).

    `model` is a ModelProto (not modified) or a path. With `check`, outputs are
    compared with the original's after every pass on seeded random inputs (see
    `graphfix.runtime.feeds`: `input_values` fixes inputs, {"sr": 16000}), or on the
    first sample of `data` (anything `graphfix calibrate --data` reads); dynamic dims
    come from the data, else `input_shapes`, else axis 0 = 1, else a GraphfixError says
    what to pass.
    `trt` names the TensorRT version the model is prepared for ("8.6", "10", ...):
    passes that depend on it (detect-unsupported) read it from their context. `passes`
    None is the default pipeline: `trt-prep`, and with `trt` first `migrate-plugins`,
    `lower-unsupported` and `substitute-plugins{needed-only=true}`
    (`graphfix.passes.defaults`). `plugin_rules` are user rule files (.py is executed,
    .yaml) for substitute-plugins (`graphfix.plugins.user`).
    `max_rewrites` applies only the first N rewrites of the whole run (numbered in
    order over every pass, see `graphfix.passes.base.RewriteBudget`); the report lists
    them. `bisect` finds the first one that breaks the numbers.
    The output model's provenance (`graphfix.provenance`) is composed with the input's.
    A path is loaded with its large external weights left in their file (`io.load`
    with `weights=False`, `graphfix.weights`): passes read those they rewrite, the
    checks' onnxruntime maps the file, and the result's weights are read into it at
    the end, so `Result.model` is self-contained (docs/large-models.md).
    """
    prepared = _prepare(model, passes, check, input_shapes, data, input_values, seed,
                        providers, trt, plugin_rules)
    result = _execute(prepared, max_rewrites, on_pass_start, on_pass_done)
    result.model = _with_weights(result.model, prepared.source)
    return result


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
             plugin_rules: Sequence[str | os.PathLike] = ()) -> _Prepared:
    if passes is None:
        passes = default_pipeline(trt)
    pipeline = passes if isinstance(passes, Pipeline) else parse_pipeline(passes)
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
    shapes, output_check = _prepare_check(source, given, check, data, input_values, seed,
                                          providers)
    target = None
    if trt is not None:
        from graphfix.trt import parse_target

        target = parse_target(trt)
    return _Prepared(source, pipeline, shapes, output_check, target, tuple(rules))


def _execute(prepared: _Prepared, max_rewrites: int | None,
             on_pass_start: Callable[[int, str], None] | None = None,
             on_pass_done: PassCallback | None = None) -> Result:
    source = prepared.source
    check = prepared.output_check
    ctx = PassContext(input_shapes=dict(prepared.shapes), trt=prepared.trt,
                      samples=(dict(check.feeds),) if check.feeds else (),
                      plugin_rules=prepared.plugin_rules)
    if max_rewrites is not None:
        ctx.rewrites = RewriteBudget(max_rewrites)
    result_model, report = run_pipeline(
        source, prepared.pipeline, prepared.output_check, ctx, on_pass_start, on_pass_done
    )
    if result_model is not source and (report.renamed or report.removed):
        merged = provenance.compose(provenance.read(source), report.renamed, report.removed)
        provenance.attach(result_model, *merged)
    return Result(result_model, report, dict(ctx.artifacts))


def bisect(
    model: ModelLike,
    passes: str | Pipeline | None = None,
    on_probe: Callable[[ProbeOutcome], None] | None = None,
    **run_options: Any,
) -> Bisection:
    """Find the first rewrite of the run whose application breaks the output check,
    by binary search over `max_rewrites` (see `graphfix.passes.bisect`).

    `run_options` are `run`'s other keyword arguments (input shapes, data, seed, ...),
    used by every probe; the check is always on, and prepared once (the original runs
    once, not once per probe). The result's model has only the rewrites before the
    culprit (all of them when none breaks the numbers).
    """
    if not run_options.pop("check", True):
        raise GraphfixError("Cannot bisect without the output check", "--no-check was given",
                            "drop --no-check: bisect looks for the rewrite the check rejects")
    if run_options.pop("max_rewrites", None) is not None:
        raise GraphfixError("--max-rewrites and --bisect were both given",
                            "bisect chooses the limit of each of its runs itself",
                            "give one of them")
    hooks = {k: run_options.pop(k) for k in ("on_pass_start", "on_pass_done")
             if k in run_options}
    options = {"input_shapes": None, "data": None, "input_values": None, "seed": DEFAULT_SEED,
               "providers": ("cpu",), "trt": None, "plugin_rules": ()}
    unknown = set(run_options) - set(options)
    if unknown:
        raise TypeError(f"bisect() got unexpected keyword arguments {sorted(unknown)}")
    options.update(run_options)
    prepared = _prepare(model, passes, True, **options)  # the original runs once

    def probe(limit: int | None) -> tuple[onnx.ModelProto, Report]:
        budget = _EVERY_REWRITE if limit is None else limit
        result = _execute(prepared, budget, **hooks)
        return result.model, result.report

    found = bisect_rewrites(probe, on_probe)
    found.model = _with_weights(found.model, prepared.source)
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
                   seed: int, providers: Sequence[str]
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
    if data is None:
        shapes = resolve_shapes(inputs, given)
        return shapes, OutputCheck.prepare(source, shapes, None, seed, providers, values)
    output_check = OutputCheck.prepare(source, {}, data, seed, providers, values)
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
