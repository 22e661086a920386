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

def _rules(files: list[Path] | None, model=None):
    """`plugins.user.all_rules` for the model's default-domain opset (17 without one)."""
    from graphfix.plugins.user import all_rules

    opsets = {o.domain: o.version for o in model.opset_import} if model is not None else {}
    return all_rules(opsets.get("", opsets.get("ai.onnx", 17)), files=files or ())


def _given(model: Path, plan: Path | None, rule_files: list[Path] | None) -> list:
    """What a plugins command reads, for its WriteSet."""
    from graphfix.writeset import Given

    return [Given(model, "the input model", model=True),
            Given(plan, "the plan") if plan else None,
            *(Given(p, "--plugin-rules") for p in rule_files or ())]


@plugins_app.command("list")
def list_command(
    ctx: typer.Context,
    trt: str = opt.trt(),
    plugin_rules: list[Path] = opt.plugin_rules(),
    as_json: bool = opt.as_json(),
) -> None:
    """The substitution rules (built-in and user) and the plugin specs graphfix knows."""
    with user_errors(ctx):
        from graphfix.runtime.references import registered
        from graphfix.trt import parse_target
        from graphfix.trt.plugins import all_specs

        target = parse_target(trt) if trt else None
        rules = _rules(plugin_rules)
        checkable = {e.op_type for e in registered()}
        rows = []
        for rule in rules:
            useful = ("plugin unavailable" if rule.plugin_status(target) else
                      "not needed (native)" if rule.native_support(target) else "applies")
            rows.append({"rule": rule.name, "matches": f"{rule.domain or 'ai.onnx'}::"
                         f"{rule.anchor}", "plugin": rule.plugin, "source": rule.source,
                         "at_target": useful if target else "", "summary": rule.summary})
        specs = []
        for name, spec in sorted(all_specs().items()):
            specs.append({"plugin": name, "versions": list(spec.versions),
                          "status": spec.status_at(target) if target else "",
                          "deprecated_since": spec.deprecated_since,
                          "removed_in": spec.removed_in,
                          "reference": name in checkable,
                          "fields": [f"{a.name}: {a.type}" for a in spec.attributes]})
    if as_json:
        print(json.dumps({"target": target.effective if target else None, "rules": rows,
                          "plugins": specs}, indent=2))
        return
    table = Table(title="substitution rules" + (f" at {target.label()}" if target else ""))
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
    from graphfix.writeset import WriteSet

    output = output or model.with_name(f"{model.stem}.plugins.yaml")
    with user_errors(ctx), WriteSet(_given(model, None, plugin_rules)) as files:
        from graphfix import io
        from graphfix.plugins.plan import match
        from graphfix.trt import parse_target

        files.claim(output, "the plan (-o)")
        target = parse_target(trt) if trt else None
        loaded = io.load(model)
        plan = match(loaded, _rules(plugin_rules, loaded), target, force=force)
        files.text(output, plan.to_yaml(), "the plan (-o)")
        files.commit()
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
    from graphfix.writeset import WriteSet

    output = output or model.with_name(f"{model.stem}.plugins.onnx")
    with user_errors(ctx), WriteSet(_given(model, plan, plugin_rules)) as files:
        from graphfix import io
        from graphfix.plugins.plan import apply_plan, read
        from graphfix.trt import parse_target

        io.check_output_path(output, input_path=model, in_place=False)
        files.claim(output, "the output model (-o)", model=True)
        source = io.load(model)
        target = parse_target(trt) if trt else None
        result, done = apply_plan(source, read(plan), _rules(plugin_rules, source), target)
        files.model(result, output, "the output model (-o)")
        files.commit()
    for line in done:
        console.print(line, markup=False)
    console.print(f"wrote {output} ({len(done)} substitution(s))", markup=False)
