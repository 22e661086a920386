"""`graphfix doctor`: offline TensorRT compatibility, finding by finding, with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from graphfix.cli.common import EXIT_FAILED, console, user_errors
from graphfix.doctor.findings import SEVERITIES, Diagnosis
from graphfix.errors import GraphfixError
from graphfix.text import printable

_STYLE = {"error": "red", "warn": "yellow", "info": "dim"}
FAIL_ON = ("error", "warn", "never")


def doctor_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The ONNX model to examine (never modified)."),
    trt: str = typer.Option(
        None, "--trt",
        help="TensorRT version to check against (8.6, 10, 10.12, 11.1, ...). Default: the "
             "installed tensorrt, else the newest version graphfix has data for.",
    ),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print the diagnosis as JSON (schema graphfix.doctor/1)."),
    fail_on: str = typer.Option(
        "error", "--fail-on",
        help="Exit 1 when a finding at or above this severity exists: error, warn or never.",
    ),
    show_info: bool = typer.Option(False, "--info", help="Also list info findings in the table."),
    live: bool = typer.Option(
        True, "--parser/--no-parser",
        help="Also run TensorRT's own ONNX parser when tensorrt is installed.",
    ),
) -> None:
    """What TensorRT will reject in MODEL, node by node, and which pass fixes it."""
    with user_errors(ctx):
        if fail_on not in FAIL_ON:
            raise GraphfixError(
                f"--fail-on {fail_on!r} is not a severity",
                "doctor exits 1 when a finding at or above that severity exists",
                f"use one of: {', '.join(FAIL_ON)}",
            )
        from graphfix.doctor import diagnose
        from graphfix.io import load
        from graphfix.trt import parse_target

        target = parse_target(trt)
        loaded = load(model, weights=False)  # doctor reads no weights
        diagnosis = diagnose(loaded, target, name=str(model))
        if live:
            from graphfix.doctor.live import live_verdict

            diagnosis.parser = live_verdict(str(model), loaded)
    if as_json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        print_diagnosis(diagnosis, show_info)
    if diagnosis.fails(fail_on):
        raise typer.Exit(EXIT_FAILED)


def print_diagnosis(diagnosis: Diagnosis, show_info: bool = False, nodes_shown: int = 4) -> None:
    console.print(f"{diagnosis.model}: {diagnosis.target}", markup=False)
    if diagnosis.target_note:
        console.print(diagnosis.target_note, markup=False, style="dim")
    for severity in SEVERITIES:
        found = diagnosis.by_severity(severity)
        if not found or (severity == "info" and not show_info):
            continue
        table = Table(title=f"{severity} ({len(found)})", title_justify="left")
        for col in ("rule", "where", "what", "fix"):
            table.add_column(col, overflow="fold")
        for f in found:
            # one name per line: a line break inside a name is spelled out too
            where = [printable(w) for w in f.nodes[:nodes_shown] or f.tensors[:nodes_shown]]
            where = where or ["model"]
            more = len(f.nodes or f.tensors) - len(where)
            if more > 0:
                where.append(f"... {more} more")
            what = escape(f.message) + (f"\n[dim]{escape(f.fact)}[/dim]" if f.fact else "")
            table.add_row(f.rule, escape("\n".join(where)), what, escape(f.fix or "-"),
                          style=_STYLE[severity])
        console.print(table)
    infos = len(diagnosis.by_severity("info"))
    if infos and not show_info:
        console.print(f"{infos} info finding{'s' * (infos != 1)} not shown (--info, --json)",
                      markup=False)
    if diagnosis.parser is not None:
        console.print(f"TensorRT's own parser: {diagnosis.parser.get('verdict')}", markup=False)
    console.print(diagnosis.verdict(), markup=False,
                  style="bold red" if not diagnosis.parses() else "bold green")
