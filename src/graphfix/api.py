"""The Python API; the CLI is a thin layer over it.

    result = graphfix.run("model.onnx", passes="cleanup,fold-bn", check=True)
    graphfix.save(result.model, "model.fixed.onnx")
    print(result.report.to_json())
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import onnx

from graphfix import io, provenance
from graphfix.errors import GraphfixError
from graphfix.passes.base import PassContext
from graphfix.passes.manager import PassCallback, run_pipeline
from graphfix.passes.pipeline import Pipeline, parse_pipeline
from graphfix.passes.registry import DEFAULT_PIPELINE
from graphfix.report import Report
from graphfix.runtime.feeds import DEFAULT_SEED, graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck

ModelLike = onnx.ModelProto | str | os.PathLike


@dataclass
class Result:
    """The rewritten model and the report of how it got there."""

    model: onnx.ModelProto
    report: Report


def run(
    model: ModelLike,
    passes: str | Pipeline = DEFAULT_PIPELINE,
    check: bool = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    data: str | os.PathLike | None = None,
    seed: int = DEFAULT_SEED,
    providers: Sequence[str] = ("cpu",),
    on_pass_start: Callable[[int, str], None] | None = None,
    on_pass_done: PassCallback | None = None,
    trt: str | None = None,
) -> Result:
    """Run a pipeline of passes, verifying after each (see `graphfix.passes.manager`).

    `model` is a ModelProto (not modified) or a path. With `check`, outputs are
    compared with the original's after every pass on seeded random inputs (or the
    arrays in `data`, an .npz keyed by input name); dynamic dims come from
    `input_shapes`, else axis 0 = 1, else a GraphfixError says what to pass.
    `trt` names the TensorRT version the model is prepared for ("8.6", "10", ...):
    passes that depend on it (detect-unsupported) read it from their context.
    """
    pipeline = passes if isinstance(passes, Pipeline) else parse_pipeline(passes)
    if isinstance(model, onnx.ModelProto):
        source = model
    else:
        source = io.load(model)
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
    inputs = graph_inputs(source)
    if check:
        shapes = resolve_shapes(inputs, given)
        output_check = OutputCheck.prepare(source, shapes, data, seed, providers)
    else:
        shapes = resolve_shapes(inputs, given, lenient=True)
        output_check = OutputCheck.disabled("--no-check was given")
    ctx = PassContext(input_shapes=shapes)
    if trt is not None:
        from graphfix.trt import parse_target

        ctx.trt = parse_target(trt)
    result_model, report = run_pipeline(
        source, pipeline, output_check, ctx, on_pass_start, on_pass_done
    )
    if result_model is not source and (report.renamed or report.removed):
        provenance.attach(result_model, report.renamed, report.removed)
    return Result(result_model, report)
