"""`graphfix run`: rewrite a model with a pipeline of passes, checked after each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from graphfix.cli import options as opt
from graphfix.cli.common import (
    EXIT_FAILED,
    console,
    err_console,
    input_values,
    print_explain,
    print_report,
    user_errors,
)
from graphfix.passes.defaults import DEFAULT_PIPELINE, TRT_PIPELINE, default_pipeline
from graphfix.report import Report
from graphfix.runfiles import default_output
from graphfix.runtime.feeds import parse_input_shape


def run_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The ONNX model to rewrite (never modified)."),
    output: Path = opt.output(),
    passes: str = typer.Option(
        None, "--passes", "-p",
        help="Pipeline text: pass names separated by commas, options in braces, e.g. "
        f"'cleanup,fold-bn,fix-shapes{{input=1x3x224x224}}'. See `graphfix passes`. "
        f"Default: {DEFAULT_PIPELINE}; with --trt: {TRT_PIPELINE}.",
        show_default=False,
    ),
    check: bool = typer.Option(
        True, "--check/--no-check",
        help="Compare outputs with the original's (onnxruntime, CPU, graph optimizations "
        "off) and roll back passes that change them: one run of the model checks all the "
        "passes that change numbers, and when it fails the run is repeated with a check "
        "after each of them, which finds the pass to roll back.",
    ),
    check_each_pass: bool = typer.Option(
        False, "--check-each-pass",
        help="Run the output check after every pass that changes numbers (the report "
        "then has each pass's own error); slower: one run of the model per pass.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 when any pass was rolled back, or when the "
        "numerical check could not run or compared no value (every output empty or "
        "ill-conditioned on its sample; the output is still written; not with --no-check)."),
    input_shape: list[str] = opt.input_shape(),
    data: Path = opt.data(),
    data_key: str = opt.data_key(),
    preprocess: str = opt.preprocess(),
    input_value: list[str] = opt.input_value(),
    seed: int = opt.seed(),
    providers: str = opt.providers(),
    report: Path = typer.Option(None, "--report", help="Write the run's report as JSON here "
                                "(what --json prints)."),
    dump_after: str = typer.Option(
        None, "--dump-after",
        help="Write the model after this pass (a pass name, or 'all') next to the output.",
    ),
    in_place: bool = typer.Option(
        False, "--in-place", help="Allow the output to overwrite the input file."
    ),
    external_data: Optional[bool] = typer.Option(  # noqa: UP045 (typer < 0.17 needs Optional)
        None, "--external-data/--no-external-data",
        help="Store weights in <output>.data (default: only when over 2 GB).",
    ),
    as_json: bool = opt.as_json(),
    explain: bool = typer.Option(
        False, "--explain",
        help="Show which Conv -> (bias) -> activation chains TensorRT can fuse after the run, "
        "for each broken one the node in the way, why, and the pass that fixes it, "
        "and the NMS regions with the NMS pass for the --trt target (also in the JSON report).",
    ),
    trt: str = opt.trt(),
    fail_on: str = opt.fail_on(),
    plugin_rules: list[Path] = opt.plugin_rules(),
    max_rewrites: int = typer.Option(
        None, "--max-rewrites", min=0,
        help="Apply only the first N rewrites of the whole run (numbered in order over all "
        "passes; a pass that does not count its rewrites one by one counts as one). "
        "See docs/debugging.md.",
    ),
    bisect: bool = typer.Option(
        False, "--bisect",
        help="Find the first rewrite that breaks the output check (binary search over "
        "--max-rewrites, about log2(rewrites) runs): exit 1 when one does, 0 when none. "
        "With -o, writes the model with only the rewrites before it.",
    ),
) -> None:
    """Rewrite MODEL with a pipeline of passes, verifying the numbers after each pass."""
    from graphfix import api
    from graphfix.passes.pipeline import parse_pipeline

    with user_errors(ctx):
        opt.check_fail_on(fail_on)
        pipeline = parse_pipeline(passes if passes is not None else default_pipeline(trt))
        shapes = dict(parse_input_shape(s) for s in input_shape or [])
        options = dict(check=check, check_each=check_each_pass, data_key=data_key,
                       preprocess=preprocess,
                       input_shapes=shapes, data=data,
                       input_values=input_values(input_value), seed=seed,
                       providers=providers, trt=trt, max_rewrites=max_rewrites,
                       plugin_rules=plugin_rules or ())
        if bisect:
            from graphfix.cli.run_bisect import run_bisect

            run_bisect(model, pipeline, output, report, as_json, dump_after, options,
                       in_place)
            return
        out = output or default_output(model)
        status = console.status("loading", spinner="dots") if not as_json else None
        if status:
            status.start()
        try:
            result = api.run(
                model, pipeline, **options,
                on_pass_start=(lambda i, s: status.update(f"pass {i + 1}: {s}"))
                if status else None,
                explain=explain, output=out, report=report, dump_after=dump_after,
                external_data=external_data, in_place=in_place, keep_weights=False,
            )
        finally:
            if status:
                status.stop()
    _print_result(ctx, result, out, as_json, check)
    rep, diagnosis = result.report, result.diagnosis
    if strict and rep.rolled_back:
        names = ", ".join(r.spec for r in rep.rolled_back)
        console.print(f"--strict: {names} rolled back", style="red")
        raise typer.Exit(EXIT_FAILED)
    if strict and check and not rep.check.enabled:
        (err_console if as_json else console).print(
            f"--strict: the numerical check did not run ({rep.check.skipped_reason}), so "
            "nothing shows the output computes what the input did", style="red",
            markup=False)
        raise typer.Exit(EXIT_FAILED)
    if strict and check and rep.check.enabled and rep.check.judged_nothing:
        (err_console if as_json else console).print(
            "--strict: the numerical check compared no value: every output is empty or "
            "ill-conditioned on its sample (" + ", ".join(rep.check.unjudged) + "); pass "
            "--data with real inputs", style="red", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if diagnosis is not None and fail_on != "never":
        worst = diagnosis.by_severity("error") + (diagnosis.by_severity("warn")
                                                  if fail_on == "warn" else [])
        if worst:
            (err_console if as_json else console).print(
                f"exit 1: {len(worst)} doctor finding(s) at or above '{fail_on}' remain for "
                f"{diagnosis.target} (--fail-on never to exit 0)", markup=False)
            raise typer.Exit(EXIT_FAILED)


def _print_result(ctx: typer.Context, result, out: Path, as_json: bool, check: bool) -> None:
    """The JSON (stdout) or the pass table, explain, doctor's blocking findings and the
    files written; side lines go to stderr with --json."""
    rep = result.report
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        if check and not rep.check.enabled:
            err_console.print(f"warning: numerical check skipped: "
                              f"{rep.check.skipped_reason}", markup=False)
    else:
        print_report(rep, show_traceback=bool(ctx.obj and ctx.obj.debug), warn_skipped=check)
        if rep.explain:
            print_explain(rep.explain)
        if result.diagnosis is not None:
            _print_blocking(result.diagnosis)
        console.print(f"wrote {out} ({rep.nodes_before} → {rep.nodes_after} nodes, "
                      f"{rep.seconds:.2f} s)", markup=False)
    target = err_console if as_json else console
    for line in result.written:
        target.print(line, markup=False)
    _print_debugging(rep, as_json)


def _print_debugging(rep: Report, as_json: bool) -> None:
    """The last rewrite --max-rewrites let through (on stderr with --json, which keeps
    stdout for the JSON)."""
    target = err_console if as_json else console
    if rep.rewrite_limit is not None:
        last = f"; the last: {rep.rewrites[-1]}" if rep.rewrites else ""
        target.print(f"--max-rewrites {rep.rewrite_limit}: {len(rep.rewrites)} rewrite(s) "
                     f"allowed{last}", markup=False)


def _print_blocking(diagnosis) -> None:
    """The findings that still stop the target's parser, then doctor's verdict."""
    from graphfix.cli.doctor import print_diagnosis
    from graphfix.doctor import Diagnosis

    blocking = Diagnosis(diagnosis.model, diagnosis.target, diagnosis.target_note,
                         diagnosis.matrix, diagnosis.by_severity("error"))
    if blocking.findings:
        print_diagnosis(blocking)
    else:
        console.print(diagnosis.verdict(), markup=False, style="bold green")
    warns = len(diagnosis.by_severity("warn"))
    if warns:
        console.print(f"{warns} warning(s) more: graphfix doctor {diagnosis.model} "
                      f"--trt {diagnosis.matrix}", markup=False)

