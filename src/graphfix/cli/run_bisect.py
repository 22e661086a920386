"""`graphfix run --bisect`: print which rewrite breaks the numbers (`graphfix.api.bisect`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from graphfix.cli.common import EXIT_FAILED, console

if TYPE_CHECKING:
    from graphfix.passes.bisect import Bisection
    from graphfix.passes.pipeline import Pipeline


def run_bisect(model_path: Path, pipeline: Pipeline, output: Path | None,
               report: Path | None, as_json: bool, dump_after: str | None,
               options: dict[str, Any], in_place: bool) -> None:
    """Bisect, print the culprit (or that there is none) and the command that shows its
    rejected model; `output` gets the model without it. Exit 1 when a rewrite breaks the
    numbers."""
    from graphfix import api

    status = None if as_json else console.status("bisect: counting rewrites", spinner="dots")
    if status:
        status.start()
    try:
        found = api.bisect(
            model_path, pipeline, **options, dump_after=dump_after, output=output,
            report=report, in_place=in_place,
            on_probe=(lambda p: status.update(
                f"bisect: the run with {'every' if p.limit is None else p.limit} rewrite(s) "
                f"{'breaks' if p.broken else 'keeps'} the numbers")) if status else None,
        )
    finally:
        if status:
            status.stop()
    if as_json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        _print(found, model_path, pipeline, output)
    if found.culprit is not None:
        raise typer.Exit(EXIT_FAILED)
def _print(found: Bisection, model_path: Path, pipeline: Pipeline, output: Path | None) -> None:
    console.print(found.describe(), markup=False)
    runs = len(found.probes)
    console.print(f"({runs} run{'s' if runs != 1 else ''} of the pipeline, {found.total} "
                  "rewrites in all)", markup=False)
    if found.culprit is not None:
        name = found.culprit.spec.split("{")[0]
        console.print(
            f"to get the model it produced: graphfix run {model_path} --passes '{pipeline}' "
            f"--max-rewrites {found.culprit.index} --dump-after {name} (with the same check "
            f"options) writes <output stem>.after-NN-{name}.REJECTED.onnx", markup=False)
    if output is not None:
        console.print(f"wrote {output} (the first {found.applied} rewrites)", markup=False)
