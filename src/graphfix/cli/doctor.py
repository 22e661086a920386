"""`graphfix doctor`: offline TensorRT compatibility, finding by finding, with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from graphfix.cli import options as opt
from graphfix.cli.common import EXIT_FAILED, console, user_errors
from graphfix.doctor.findings import SEVERITIES, Diagnosis, Finding
from graphfix.text import printable

_STYLE = {"error": "red", "warn": "yellow", "info": "dim"}


def doctor_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The ONNX model to examine (never modified)."),
    trt: str = opt.trt(),
    as_json: bool = opt.as_json(),
    json_out: Path = opt.json_out(),
    fail_on: str = opt.fail_on(),
    show_info: bool = typer.Option(False, "--info", help="Also list info findings in the table."),
    live: bool = typer.Option(
        True, "--parser/--no-parser",
        help="Also run TensorRT's own ONNX parser when tensorrt is installed.",
    ),
) -> None:
    """What TensorRT will reject in MODEL, node by node, and which pass fixes it."""
    from graphfix import api

    with user_errors(ctx):
        opt.check_fail_on(fail_on)
        diagnosis = api.doctor(model, trt, parser=live, json_out=json_out)
    if as_json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        print_diagnosis(diagnosis, show_info)
        if json_out is not None:
            console.print(f"wrote {json_out}", markup=False)
    if diagnosis.fails(fail_on):
        raise typer.Exit(EXIT_FAILED)


def print_diagnosis(diagnosis: Diagnosis, show_info: bool = False, names_shown: int = 3) -> None:
    console.print(f"{diagnosis.model}: {diagnosis.target}", markup=False)
    if diagnosis.target_note:
        console.print(diagnosis.target_note, markup=False, style="dim")
    for severity in SEVERITIES:
        found = diagnosis.by_severity(severity)
        if not found or (severity == "info" and not show_info):
            continue
        table = Table(title=f"{severity} ({_counted(len(found), 'finding')}"
                            f"{_on_nodes(len(diagnosis.nodes_of(severity)))})",
                      title_justify="left")
        for col in ("rule", "where", "what", "fix"):
            table.add_column(col, overflow="fold")
        for f in found:
            what = escape(f.message) + (f"\n[dim]{escape(f.fact)}[/dim]" if f.fact else "")
            table.add_row(f.rule, escape("\n".join(_where(f, names_shown))), what,
                          escape(f.fix or "-"), style=_STYLE[severity])
        console.print(table)
    infos = len(diagnosis.by_severity("info"))
    if infos and not show_info:
        console.print(f"{infos} info finding{'s' * (infos != 1)} not shown (--info, --json)",
                      markup=False)
    if diagnosis.parser is not None:
        console.print(f"TensorRT's own parser: {diagnosis.parser.get('verdict')}", markup=False)
    console.print(diagnosis.verdict(), markup=False,
                  style="bold red" if not diagnosis.parses() else "bold green")


def _where(finding: Finding, shown: int) -> list[str]:
    """The nodes a finding names (else its tensors, else "model"), one per line with a
    line break inside a name spelled out: a finding on several says how many first, and
    past `shown` names, how many more."""
    names = finding.nodes or finding.tensors
    if not names:
        return ["model"]
    lines = [printable(n) for n in names[:shown]]
    if len(names) > shown:
        lines.append(f"... and {len(names) - shown} more")
    if len(names) > 1:
        lines.insert(0, _counted(len(names), "node" if finding.nodes else "tensor"))
    return lines


def _counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _on_nodes(count: int) -> str:
    return f" on {_counted(count, 'node')}" if count else ""
