"""What every command shares: error display, the pass table, the console.

Every string a command prints goes through `console` or `err_console`, which spell out
control and bidi characters (`graphfix.text.printable`): names from a model cannot
drive the terminal. Only JSON, which escapes them itself, is printed around them.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from graphfix.errors import GraphfixError
from graphfix.report import APPLIED, ROLLED_BACK, UNCHANGED, PassRecord, Report
from graphfix.text import printable

EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERNAL = 3
NOTES_SHOWN = 5


class SafeConsole(Console):
    """A rich Console that shows control and bidi characters as escapes (`\\x1b`) in
    every string it renders (printed text, table cells and titles), keeping the line
    breaks and tabs; `:name:` stays text, not an emoji. Objects rich renders without
    `render_str` (a `Text` built by hand) are not covered: commands print strings."""

    def __init__(self, **kwargs) -> None:
        super().__init__(highlight=False, emoji=False, **kwargs)

    def render_str(self, text: str, **kwargs):
        return super().render_str(printable(text, keep="\n\t"), **kwargs)


console = SafeConsole()
err_console = SafeConsole(stderr=True)


@dataclass
class Settings:
    debug: bool = False


@contextmanager
def user_errors(ctx: typer.Context) -> Iterator[None]:
    """Show a GraphfixError as one paragraph and exit 2 (with a traceback under --debug).

    Also quiets onnxruntime's own process-wide log lines unless --debug
    (`runtime.session.quiet_onnxruntime`): the CLI, not the library, decides what
    reaches the terminal.
    """
    debug = bool(ctx.obj and ctx.obj.debug)
    if not debug:
        from graphfix.runtime.session import quiet_onnxruntime

        quiet_onnxruntime()  # graphfix says the errors itself
    try:
        yield
    except GraphfixError as err:
        if debug:
            print(printable(traceback.format_exc(), keep="\n"), end="", file=sys.stderr)
        print("error: " + printable(err.message, keep="\n"), file=sys.stderr)
        raise typer.Exit(EXIT_USER_ERROR) from None


def shown_records(report: Report) -> list[PassRecord]:
    """The passes the table shows: all of them, except the runs of a preset's passes that
    changed nothing (a preset runs tens of passes); those get one summary line."""
    return [rec for rec in report.passes if not (rec.preset and rec.status == UNCHANGED)]


def pass_table(report: Report) -> Table:
    table = Table(title=f"graphfix run: {escape(str(report.pipeline))}", title_justify="left")
    table.add_column("#", justify="right")
    rounds = any(rec.preset for rec in report.passes)
    if rounds:
        table.add_column("round", justify="right")
    table.add_column("pass")
    table.add_column("time", justify="right")
    table.add_column("nodes", justify="right")
    table.add_column("what it did", ratio=3)
    table.add_column("check", ratio=2)
    for rec in shown_records(report):
        style = {APPLIED: "green", ROLLED_BACK: "red"}.get(rec.status, "dim")
        table.add_row(
            str(rec.index + 1),
            *([str(rec.round) if rec.preset else ""] if rounds else []),
            escape(rec.spec),
            f"{rec.seconds * 1000:.0f} ms",
            f"{rec.nodes_before} → {rec.nodes_after}",
            escape(rec.did()),
            escape(rec.check),
            style=style,
        )
    return table


def print_explain(section: dict, shown: int = 20) -> None:
    """The --explain section: chain counts before -> after, then each broken chain."""
    before, after = section["before"], section["after"]
    counts = ", ".join(f"{k} {before[k]} → {after[k]}" for k in after)
    console.print(f"Conv chains (TensorRT fusion): {counts}", markup=False)
    _print_nms(section.get("nms", []))
    broken = section["broken"]
    if not broken:
        return
    table = Table(title="chains still broken", title_justify="left")
    for col in ("conv", "in the way", "why", "fix"):
        table.add_column(col)
    for chain in broken[:shown]:
        table.add_row(*(escape(chain[k] or "-") for k in ("conv", "blocker", "reason", "fix")))
    console.print(table)
    if len(broken) > shown:
        console.print(f"... {len(broken) - shown} more (see --report)", markup=False)


def _print_nms(regions: list[dict]) -> None:
    """The NMS regions of the --explain section, one block each (nothing without any)."""
    if not regions:
        return
    console.print(f"NMS regions: {len(regions)}", markup=False)
    for r in regions:
        console.print(f"  {r['where']} ({r['kind']}): {r['region']}\n    pass: {r['pass']}",
                      markup=False)


def print_report(report: Report, show_traceback: bool = False, warn_skipped: bool = False
                 ) -> None:
    """The pass table and notes; `warn_skipped`: a check that was asked for and could
    not run gets a warning line (the reason says how to give inputs the model accepts)."""
    console.print(pass_table(report))
    shown = shown_records(report)
    hidden = len(report.passes) - len(shown)
    if hidden:
        console.print(f"{hidden} more pass runs changed nothing (their reasons: --report)",
                      markup=False)
    for name, count in report.rounds.items():
        console.print(f"{name}: {count} round{'s' if count > 1 else ''}", markup=False)
    for note in report.verify_notes:
        console.print(f"note: {note}", markup=False)
    if not report.check.enabled and warn_skipped:
        console.print(f"warning: numerical check skipped: {report.check.skipped_reason}",
                      markup=False, style="bold yellow")
    elif not report.check.enabled:
        console.print(f"numerical check skipped: {report.check.skipped_reason}", markup=False)
    printed: set[str] = set()
    for rec in shown:
        if rec.status == ROLLED_BACK:
            console.print(f"[red]rolled back[/red] {escape(rec.spec)}: "
                          f"{escape(rec.rollback_reason)}")
            if show_traceback and rec.traceback:
                console.print(rec.traceback, markup=False)
        if not rec.counts and len(rec.notes) == 1:
            continue  # already in the table
        notes = [n for n in rec.notes if f"{rec.spec}: {n}" not in printed]
        for note in notes[:NOTES_SHOWN]:
            printed.add(f"{rec.spec}: {note}")
            console.print(f"  {rec.spec}: {note}", markup=False)
        if len(notes) > NOTES_SHOWN:
            console.print(f"  {rec.spec}: ... {len(notes) - NOTES_SHOWN} more notes "
                          "(see --report)", markup=False)


def input_values(specs: list[str] | None) -> dict[str, list[float | int]]:
    """--input-value NAME=VALUE flags as {name: numbers}; a bad one is a GraphfixError."""
    from graphfix.runtime.values import parse_input_value

    return dict(parse_input_value(spec) for spec in specs or [])
