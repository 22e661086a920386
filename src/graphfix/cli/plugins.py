"""`graphfix plugins list | match | apply`: plugin substitution as a reviewable plan."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from graphfix.cli import options as opt
from graphfix.cli.common import console, user_errors

plugins_app = typer.Typer(help="TensorRT plugin rules and specs: list them, match a model "
                               "against them as an editable plan, apply the plan.",
                          no_args_is_help=True)

@plugins_app.command("list")
def list_command(
    ctx: typer.Context,
    trt: str = opt.trt(),
    plugin_rules: list[Path] = opt.plugin_rules(),
    as_json: bool = opt.as_json(),
) -> None:
    """The substitution rules (built-in and user) and the plugin specs graphfix knows."""
    from graphfix import api

    with user_errors(ctx):
        found = api.plugins_list(trt, plugin_rules or ())
    if as_json:
        print(json.dumps(found.to_json(), indent=2))
        return
    target, rows, specs = found.target, found.rules, found.plugins
    table = Table(title="substitution rules" + (f" at {found.label}" if target else ""))
    for col in ("rule", "matches", "plugin", "source") + (("at target",) if target else ()):
        table.add_column(col)
    for r in rows:
        table.add_row(r["rule"], r["matches"], r["plugin"], r["source"],
                      *([r["at_target"]] if target else []))
    console.print(table)
    table = Table(title="plugin specs (trt_plugins.json)")
    for col in ("plugin", "versions", "status" if target else "deprecated / removed",
                "checkable on CPU"):
        table.add_column(col)
    for s in specs:
        status = s["status"] if target else (f"{s['deprecated_since'] or '-'} / "
                                             f"{s['removed_in'] or '-'}")
        table.add_row(s["plugin"], ", ".join(s["versions"]), status,
                      "yes" if s["reference"] else "no")
    console.print(table)


@plugins_app.command("match")
def match_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The ONNX model (never modified)."),
    output: Path = opt.output(),
    trt: str = opt.trt(),
    force: bool = typer.Option(False, "--force", help="Match even where the target parses "
                                                      "the op natively."),
    plugin_rules: list[Path] = opt.plugin_rules(),
) -> None:
    """Write which nodes each rule would replace, by which plugin, with which attributes."""
    from graphfix import api

    output = output or model.with_name(f"{model.stem}.plugins.yaml")
    with user_errors(ctx):
        plan = api.plugins_match(model, trt=trt, force=force, plugin_rules=plugin_rules or (),
                                 output=output)
    console.print(f"wrote {output}: {len(plan.entries)} substitution(s), "
                  f"{len(plan.skipped)} candidate(s) left alone", markup=False)
    for s in plan.skipped:
        console.print(f"  left alone: {s['node']}: {s['reason']}", markup=False)


@plugins_app.command("apply")
def apply_command(
    ctx: typer.Context,
    model: Path = typer.Argument(..., help="The ONNX model (never modified)."),
    plan: Path = typer.Argument(..., help="A plan from `graphfix plugins match`, edited or not."),
    output: Path = opt.output(),
    trt: str = opt.trt(),
    plugin_rules: list[Path] = opt.plugin_rules(),
) -> None:
    """Apply a plan: every entry's plugin node, validated against the plugin's spec."""
    from graphfix import api

    output = output or model.with_name(f"{model.stem}.plugins.onnx")
    with user_errors(ctx):
        done = api.plugins_apply(model, plan, trt=trt, plugin_rules=plugin_rules or (),
                                 output=output).done
    for line in done:
        console.print(line, markup=False)
    console.print(f"wrote {output} ({len(done)} substitution(s))", markup=False)
