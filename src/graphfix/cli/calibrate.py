"""`graphfix calibrate`: INT8 calibration to a Q/DQ model TensorRT accepts, and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from graphfix.calibration import methods
from graphfix.cli import options as opt
from graphfix.cli.common import console, user_errors


def calibrate_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The FP32 ONNX model (never modified)."),
    data: Path = opt.data(),
    data_key: str = opt.data_key(),
    preprocess: str = opt.preprocess(),
    loader_script: str = opt.data_loader_script(),
    samples: int = opt.samples(),
    batch_size: int = typer.Option(1, "--batch-size", min=1,
                                   help="Samples per onnxruntime run (results do not depend "
                                   "on it)."),
    method: str = typer.Option(methods.DEFAULT, "--method", help=methods.cli_help()),
    percentile: float = typer.Option(methods.PERCENTILE.default, methods.PERCENTILE.flag,
                                     help=f"For percentile (and auto): {methods.PERCENTILE.help}."),
    per_tensor: bool = typer.Option(False, "--per-tensor", help="Pick per tensor, among the "
                                    "methods given, the one with the lowest simulated INT8 "
                                    "error (--method all --per-tensor is auto)."),
    output: Path = opt.output(),
    cache: Path = typer.Option(None, "--cache", help="Also write the legacy TensorRT "
                               "calibration cache (TensorRT <= 10)."),
    ranges: Path = typer.Option(None, "--ranges", help="Write per-tensor ranges as JSON."),
    from_cache: Path = typer.Option(None, "--from-cache", help="Turn an existing TensorRT "
                                    "calibration cache into a Q/DQ model (no data needed)."),
    trt: str = opt.trt(),
    evaluate: bool = typer.Option(False, "--eval", help="Compare each Q/DQ model with FP32."),
    eval_split: int = typer.Option(None, "--eval-split", min=1, help="Hold the last N "
                                   "samples of --data apart for the comparison."),
    eval_data: Path = typer.Option(None, "--eval-data", help="Separate comparison data."),
    eval_key: str = typer.Option(None, "--eval-key", help="The array in --eval-data."),
    labels: str = typer.Option(None, "--labels", help="'folders' for an image folder of "
                               "class subfolders (index of the sorted folder names), or the "
                               "key of the labels array (in "
                               "--eval-data, else --data) for accuracy."),
    exclude_nodes: str = typer.Option("", "--exclude-nodes", help="Node names kept in float, "
                                      "comma-separated (check --json suggests them)."),
    exclude_op_types: str = typer.Option("", "--exclude-op-types",
                                         help="Op types kept in float (e.g. Gemm,Add)."),
    bins: int = typer.Option(2048, "--bins", help="Histogram bins, 128 to 16384."),
    memory_budget: str = opt.memory_budget(),
    providers: str = opt.providers(),
    as_json: bool = opt.as_json(),
    json_out: Path = opt.json_out(),
    html: Path = opt.html(),
) -> None:
    """Calibrate MODEL for INT8 and write a Q/DQ model TensorRT accepts."""
    from graphfix import api

    with user_errors(ctx), _Progress() as bar:
        made = api.calibrate(
            model, data=data, data_key=data_key, preprocess=preprocess,
            data_loader_script=loader_script, samples=samples, batch_size=batch_size,
            method=method, percentile=percentile, per_tensor=per_tensor,
            output=output or model.with_name(f"{model.stem}.int8.onnx"), cache=cache,
            ranges=ranges, from_cache=from_cache, trt=trt, evaluate=evaluate,
            eval_split=eval_split, eval_data=eval_data, eval_key=eval_key, labels=labels,
            exclude_nodes=_names(exclude_nodes), exclude_op_types=_names(exclude_op_types),
            bins=bins, memory_budget=memory_budget, providers=providers, json_out=json_out,
            html=html, progress=None if as_json else bar)
    if as_json:
        print(json.dumps(made.to_json(), indent=2))
    elif made.details is None:
        for path in made.written:
            console.print(f"wrote {path}", markup=False)
    else:
        _print(made.to_json())


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
    """One bar per phase (a statistics pass, an evaluation) over its samples, with ETA;
    started at the first report (an option refused before any work prints no bar) and
    stopped when the `with` block ends."""

    def __init__(self) -> None:
        self.bar, self.phase, self.task = None, "", None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = _bar()
            self.bar.start()
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
