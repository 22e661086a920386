"""`graphfix check`: layer-wise agreement of two models, naming where they start to differ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from graphfix.cli import options as opt
from graphfix.cli.common import EXIT_FAILED, console, input_values, user_errors
from graphfix.cli.renamed import CHECK_TRT


def check_command(
    ctx: typer.Context,
    reference: Path = typer.Argument(..., help="The reference model (e.g. the FP32 original)."),
    candidate: Path = typer.Argument(None, help="The model to check (rewritten, or Q/DQ "
                                     "INT8); leave it out with --engine, or with "
                                     "--trt-engine to build REFERENCE."),
    data: Path = opt.data(),
    data_key: str = opt.data_key(),
    preprocess: str = opt.preprocess(),
    input_shape: list[str] = opt.input_shape(),
    input_value: list[str] = opt.input_value(),
    samples: int = opt.samples(),
    seed: int = opt.seed(),
    mode: str = typer.Option("auto", "--mode", help="strict (tolerances per dtype), sqnr "
                             "(quantized models), or auto: sqnr when CANDIDATE has Q/DQ."),
    atol: float = typer.Option(None, "--atol", help="Absolute tolerance for float tensors "
                               "(default: per dtype, graphfix.runtime.tolerances)."),
    rtol: float = typer.Option(None, "--rtol", help="Relative tolerance for float tensors."),
    sqnr: float = typer.Option(20.0, "--sqnr-threshold", help="SQNR (dB) a tensor needs in "
                               "sqnr mode."),
    run_report: Path = typer.Option(None, "--run-report", help="A `graphfix run --report` "
                                    "JSON whose renames/removals to use (default: "
                                    "CANDIDATE's metadata)."),
    memory_budget: str = opt.memory_budget(),
    providers: str = opt.providers(),
    trt: str = opt.trt(),
    engine: Path = typer.Option(None, "--engine", help="Run this serialized TensorRT engine "
                                "(.engine/.plan/.trt) as the candidate; its tensors are named "
                                "by REFERENCE (needs tensorrt and a GPU; docs/check.md)."),
    trt_engine: bool = typer.Option(False, "--trt-engine", help="Build a TensorRT engine "
                                    "from CANDIDATE (or REFERENCE) and run it as the candidate "
                                    "(needs tensorrt and a GPU; docs/check.md)."),
    trt_precision: str = typer.Option("fp32", "--trt-precision", help="The engine's "
                                      "precision: fp32 (TF32 off), fp16, bf16 or int8."),
    trt_workspace: str = typer.Option(None, "--trt-workspace", help="TensorRT's workspace "
                                      "limit, e.g. 2GB."),
    shown: int = typer.Option(15, "--show", min=1, help="Rows in each table."),
    detections: bool = typer.Option(False, "--detections", help="Compare the graph outputs "
                                    "as detections (NMS results), matching boxes by IoU: "
                                    "order and padding may differ (docs/nms-plugins.md)."),
    as_json: bool = opt.as_json(),
    json_out: Path = opt.json_out(),
    html: Path = opt.html(),
) -> None:
    """Compare every tensor REFERENCE and CANDIDATE share, in topological order; name the
    first diverging tensor and the nodes where the error starts. Exit 1 when they differ."""
    from graphfix import api
    from graphfix.runtime.feeds import parse_input_shape

    with user_errors(ctx):
        if trt is not None and CHECK_TRT.old(trt):  # `check --trt CANDIDATE`, the old flag
            raise CHECK_TRT.error(f"--trt {trt}")
        result = api.check(
            reference, candidate, data=data, data_key=data_key, preprocess=preprocess,
            input_shapes=dict(parse_input_shape(s) for s in input_shape or []),
            input_values=input_values(input_value), samples=samples, seed=seed, mode=mode,
            atol=atol, rtol=rtol, sqnr_threshold=sqnr, run_report=run_report,
            memory_budget=memory_budget, providers=providers, engine=engine,
            trt_engine=trt_engine, trt_precision=trt_precision, trt_workspace=trt_workspace,
            detections=detections, trt=trt, json_out=json_out, html=html)
    if as_json:
        print(json.dumps(result.to_json(), indent=2, default=str))
    elif detections:
        console.print(result.describe(), style="bold green" if result.ok else "bold red",
                      markup=False)
    else:
        _print(result, shown)
    for path in (json_out, html):
        if path is not None and not as_json:
            console.print(f"wrote {path}", markup=False)
    if not result.passed:
        raise typer.Exit(EXIT_FAILED)


def _num(value, spec: str = "{:.3g}") -> str:

    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return spec.format(value)


def _print(result, shown: int) -> None:
    from graphfix.check.status import UNJUDGED, TensorStatus

    compared = [t for t in result.tensors if t.status is TensorStatus.COMPARED]
    merged = [t for t in result.tensors if t.status is TensorStatus.MERGED]
    fused = [t for t in result.tensors if t.status is TensorStatus.FUSED]
    console.print(f"{result.mode} mode ({result.runtime}): {len(compared)} tensors compared "
                  f"over {result.samples} sample(s) in {result.chunks} run(s); {len(merged)} "
                  "merged by graphfix passes" + (f", {len(fused)} fused by TensorRT"
                                                  if fused else ""), markup=False)
    if result.mode == "sqnr":
        rows = result.sensitivity(shown)
        title = "quantization sensitivity (lowest SQNR first)"
    else:
        rows = sorted((t for t in compared if t.ok is False),
                      key=lambda t: -(t.max_rel or 0))[:shown]
        title = "diverging tensors (worst first)"
    if rows:
        table = Table(title=title, title_justify="left")
        for col in ("tensor", "node", "max abs", "max rel", "SQNR dB", "worst sample"):
            table.add_column(col, overflow="fold")
        for t in rows:
            table.add_row(escape(t.name), escape(t.node), _num(t.max_abs), _num(t.max_rel),
                          _num(t.sqnr_db, "{:.1f}"), _num(t.worst_sample, "{}"),
                          style="red" if t.ok is False else "")
        console.print(table)
    if result.origins:
        table = Table(title="where the error starts (origins, most amplifying first)",
                      title_justify="left")
        for col in ("node", "tensor", "error", "inputs' error", "amplification"):
            table.add_column(col, overflow="fold")
        for o in result.origins[:shown]:
            table.add_row(escape(o.node), escape(o.name), _num(o.error), _num(o.input_error),
                          o.describe_amplification())
        console.print(table)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    if result.doctor is not None:
        console.print(f"graphfix doctor: {result.doctor['verdict']}", markup=False)
    first = result.first_divergence
    exclude = result.exclude_nodes
    if exclude:
        console.print("to keep the most sensitive layers in float: graphfix calibrate ... "
                      f"--exclude-nodes {','.join(exclude)}", markup=False)
    if first is None and result.uncompared_outputs:
        console.print("check FAILED: graph output(s) not compared: "
                      + ", ".join(result.uncompared_outputs) + " (see the note)",
                      style="bold red", markup=False)
    elif first is None:
        verdict = ("every compared tensor agrees" if result.mode == "strict" else
                   f"every compared tensor is at or above {result.sqnr_threshold:g} dB SQNR")
        unjudged = sum(t.status in UNJUDGED for t in result.tensors)
        if unjudged:
            verdict += (f" ({unjudged} not judged: ill-conditioned on the samples or random "
                        "on every run, see the note)")
        console.print(f"check passed: {verdict}", style="bold green", markup=False)
    else:
        console.print(f"first divergence: {first.name} (from {first.node}), worst at sample "
                      f"{first.worst_sample}", style="bold red" if not result.passed else "",
                      markup=False)
        console.print("check " + ("passed" if result.passed else "FAILED"),
                      style="bold green" if result.passed else "bold red", markup=False)
