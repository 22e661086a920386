"""The `graphfix` command: one thin module per subcommand."""

from __future__ import annotations

import sys
import traceback

import typer

from graphfix.cli.calibrate import calibrate_command
from graphfix.cli.check import check_command
from graphfix.cli.common import EXIT_INTERNAL, Settings
from graphfix.cli.demo import demo_command
from graphfix.cli.doctor import doctor_command
from graphfix.cli.passes import passes_command
from graphfix.cli.plugins import plugins_app
from graphfix.cli.run import run_command
from graphfix.text import printable

app = typer.Typer(
    name="graphfix",
    help="Get ONNX models through NVIDIA TensorRT: verified graph rewrites.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from graphfix import __version__

        print(f"graphfix {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks with errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    ctx.obj = Settings(debug=debug)


app.command("run")(run_command)
app.command("passes")(passes_command)
app.command("demo")(demo_command)
app.command("doctor")(doctor_command)
app.command("calibrate")(calibrate_command)
app.command("check")(check_command)
app.add_typer(plugins_app, name="plugins")


GC_THRESHOLDS = (100_000, 50, 100)
"""The process's cyclic-GC thresholds (CPython's default: 700, 10, 10). graphfix builds an
onnx-graphsurgeon graph of many small objects for every pass, and CPython then runs
full collections over all of them often: on a 1000-block synthetic model 17% of
`run --no-check` (5.25 s -> 4.34 s with the collector off). With these, measured A B A B:
5.38/5.71 s -> 4.71/4.81 s at +1.4% peak memory, swin_t 5.85 s -> 4.89 s at +13%
(213 -> 241 MB). The console script owns its process, so it sets them; the library
does not touch the interpreter's settings."""


def main() -> None:
    """Console-script entry point: internal errors get exit code 3 and a request to report."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    from graphfix.cli.common import EXIT_USER_ERROR
    from graphfix.cli.renamed import refuse_old_spellings
    from graphfix.errors import GraphfixError

    try:
        refuse_old_spellings(sys.argv[1:])
    except GraphfixError as err:
        print("error: " + printable(err.message, keep="\n"), file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    try:
        app()
    except Exception:
        print(printable(traceback.format_exc(), keep="\n"), end="", file=sys.stderr)
        print(
            "graphfix hit an internal error (a bug in graphfix, not in your model). "
            "Please report it with the traceback above.",
            file=sys.stderr,
        )
        sys.exit(EXIT_INTERNAL)


def entry() -> None:
    """The console script and `python -m graphfix`: `main`, then the process ends at once.

    Ending normally, CPython frees every object the command made before it exits: the
    graph, its tensors, the models and the modules' state, with nothing left to use them
    (swin_t: 0.10 s of a 1.35 s `run --no-check`, measured between the command's end and
    the process's). The command has written and closed everything by then (outputs are
    committed atomically, temporary directories removed by their context managers), so
    the process flushes its standard streams and logging and calls `os._exit` with the
    exit status Python would give: SystemExit's code (None: 0; text: printed, 1), and 120
    when flushing stdout fails, as CPython does. `main` itself, which tests and scripts
    call in-process, returns or raises as before."""
    import logging
    import os

    try:
        main()
        status: object = 0
    except SystemExit as stop:
        status = stop.code
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe: CPython's exit status then is 120
        status = 120
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    logging.shutdown()
    os._exit(status)
