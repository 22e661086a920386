"""`graphfix calibrate`: INT8 calibration to a Q/DQ model TensorRT accepts, and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from graphfix.calibration import methods
from graphfix.cli.common import console, user_errors
from graphfix.errors import GraphfixError


def calibrate_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The FP32 ONNX model (never modified)."),
    data: Path = typer.Option(None, "--data", help="Calibration data: a folder of .npy/.npz "
                              "files or images, or one .npz with a leading batch axis."),
    data_key: str = typer.Option(None, "--data-key", help="The array to use in a single .npz."),
    preprocess: str = typer.Option(None, "--preprocess", help="For image folders: e.g. "
                                   "resize=224,layout=NCHW,scale=1/255,mean=0.485/0.456/"
                                   "0.406,std=0.229/0.224/0.225,bgr"),
    loader_script: str = typer.Option(None, "--data-loader-script", help="file.py:func, a "
                                      "generator of feed dicts (this runs the script)."),
    max_samples: int = typer.Option(None, "--max-samples", min=1),
    batch_size: int = typer.Option(1, "--batch-size", min=1,
                                   help="Samples per onnxruntime run (results do not depend "
                                   "on it)."),
    method: str = typer.Option(methods.DEFAULT, "--method", help=methods.cli_help()),
    percentile: float = typer.Option(methods.PERCENTILE.default, methods.PERCENTILE.flag,
                                     help=f"For percentile (and auto): {methods.PERCENTILE.help}."),
    per_tensor: bool = typer.Option(False, "--per-tensor", help="Pick per tensor, among the "
                                    "methods given, the one with the lowest simulated INT8 "
                                    "error (--method all --per-tensor is auto)."),
    output: Path = typer.Option(None, "-o", "--output", help="The Q/DQ model "
                                "[default: MODEL.int8.onnx beside the input]."),
    cache: Path = typer.Option(None, "--cache", help="Also write the legacy TensorRT "
                               "calibration cache (TensorRT <= 10)."),
    ranges: Path = typer.Option(None, "--ranges", help="Write per-tensor ranges as JSON."),
    from_cache: Path = typer.Option(None, "--from-cache", help="Turn an existing TensorRT "
                                    "calibration cache into a Q/DQ model (no data needed)."),
    trt: str = typer.Option(None, "--trt", help="TensorRT version for the cache header and "
                            "the doctor check of the output (default: installed, else 10.16)."),
    evaluate: bool = typer.Option(False, "--eval", help="Compare each Q/DQ model with FP32."),
    eval_split: int = typer.Option(None, "--eval-split", min=1, help="Hold the last N "
                                   "samples of --data apart for the comparison."),
    eval_data: Path = typer.Option(None, "--eval-data", help="Separate comparison data."),
    eval_key: str = typer.Option(None, "--eval-key", help="The array in --eval-data."),
    labels: str = typer.Option(None, "--labels", help="Key of the labels array (in "
                               "--eval-data, else --data) for accuracy."),
    exclude_nodes: str = typer.Option("", "--exclude-nodes", help="Node names kept in float."),
    exclude_op_types: str = typer.Option("", "--exclude-op-types",
                                         help="Op types kept in float (e.g. Gemm,Add)."),
    bins: int = typer.Option(2048, "--bins", help="Histogram bins (128 to 16384)."),
    memory_budget: str = typer.Option(None, "--memory-budget", help="Activation memory one "
                                      "onnxruntime run may expose, e.g. 512MB, 2GB."),
    providers: str = typer.Option("cpu", "--providers", help="onnxruntime execution providers "
                                  "for the statistics and the comparison, e.g. cuda,cpu."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Calibrate MODEL for INT8 and write a Q/DQ model TensorRT accepts."""
    from graphfix import io
    from graphfix.calibration import session
    from graphfix.runtime.session import provider_names
    from graphfix.sizes import parse_bytes
    from graphfix.writeset import Given, WriteSet

    script = loader_script.rpartition(":")[0] if loader_script and ":" in loader_script \
        else loader_script
    given = [Given(model, "the input model", model=True),
             *(Given(p, flag) for p, flag in ((data, "--data"), (eval_data, "--eval-data"),
                                              (from_cache, "--from-cache"),
                                              (script, "--data-loader-script")) if p)]
    with user_errors(ctx), WriteSet(given) as files:
        options = session.Options(  # checks the methods and their options first
            method=method, method_options={methods.PERCENTILE.flag: percentile},
            per_tensor=per_tensor, exclude_nodes=_names(exclude_nodes),
            exclude_op_types=_names(exclude_op_types), bins=bins,
            memory_budget=parse_bytes(memory_budget) if memory_budget else None, trt=trt,
            providers=provider_names(providers),
        )
        out = output or model.with_name(f"{model.stem}.int8.onnx")
        io.check_output_path(out, input_path=model)
        files.claim(out, "the output model", model=True)
        if cache is not None:
            files.claim(cache, "--cache")
            session.cache_version(options.trt)  # TensorRT 11 has none: say so before work
        files.claim(ranges, "--ranges")
        source = io.load(model)
        if from_cache is not None:
            files.model(session.quantize_from_cache(source, from_cache, options), out)
            files.commit()
            console.print(f"wrote {out} from {from_cache}", markup=False)
            return
        if data is None and loader_script is None:
            raise GraphfixError("no calibration data", "calibration needs sample inputs",
                                "give --data PATH (or --data-loader-script, or --from-cache)")
        loaded = session.load_data(source, data, data_key, preprocess, loader_script,
                                   max_samples, batch_size, eval_split, eval_data, eval_key,
                                   labels, evaluate or len(options.request.labels()) > 1)
        with _bar() as bar:
            result = session.run(source, loaded, options, for_cache=cache is not None,
                                 progress=_Progress(bar))
        written = session.write_outputs(result, files, out, cache, ranges, options)
        files.commit()
    summary = session.summary(result, loaded, written)
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    _print(summary)


def _bar():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                    transient=True)


class _Progress:
    """One bar per phase (a statistics pass, an evaluation) over its samples, with ETA."""

    def __init__(self, bar) -> None:
        self.bar, self.phase, self.task = bar, "", None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase != self.phase:
            if self.task is not None:
                self.bar.remove_task(self.task)
            self.phase = phase
            self.task = self.bar.add_task(phase, total=total or None)
        self.bar.update(self.task, completed=done)


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _print(summary: dict) -> None:
    console.print(summary["data"], markup=False)
    table = Table(title="calibration methods", title_justify="left")
    for col in ("method", "SQNR dB", "top-1 agreement", "accuracy", "bad clips", "time"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for row in summary["methods"]:
        acc = row.get("accuracy")
        ref = row.get("reference_accuracy")
        table.add_row(
            row["method"] + (" *" if row["method"] == summary["recommended"] else ""),
            _fmt(row.get("sqnr_db"), "{:.1f}"), _fmt(row.get("top1_agreement"), "{:.1%}"),
            f"{acc:.1%} (fp32 {ref:.1%})" if acc is not None else "-",
            str(row["clipped_tensors"]), f"{row['seconds']:.2f} s",
        )
    console.print(table)
    console.print(f"statistics: {summary['tensors']} tensors, {summary['stats_seconds']:.2f} s; "
                  f"recommended (*): {summary['recommended']}", markup=False)
    for row in summary["methods"]:
        if row.get("chosen"):
            picked = ", ".join(f"{m} {n}" for m, n in row["chosen"].items())
            console.print(f"{row['method']} chose per tensor: {picked}", markup=False)
    for note in summary["notes"]:
        console.print(f"note: {note}", markup=False)
    _print_clips(summary)
    for path in summary["written"]:
        console.print(f"wrote {path}", markup=False)


def _print_clips(summary: dict, shown: int = 10) -> None:
    clips = summary["clipping"]
    if not clips:
        return
    console.print(f"warning: {len(clips)} tensor(s) of the written model lose more than "
                  f"{summary['clipping_threshold_db']:.2f} dB (one bit) of simulated SQNR "
                  "against another method's range:", style="yellow", markup=False)
    for clip in clips[:shown]:
        console.print(f"  {clip['message']}", markup=False)
    if len(clips) > shown:
        console.print(f"  ... and {len(clips) - shown} more (all in --json)", markup=False)


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return spec.format(value)
