"""`graphfix plugins list | match | apply`: the commands' whole work, for the API and the
CLI (which parses, calls these and prints). Never prints."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from graphfix.plugins.plan import Plan

PathLike = str | os.PathLike
CATALOG_SCHEMA = "graphfix.plugins/1"


@dataclass
class Catalog:
    """The substitution rules (built-in and user) and the plugin specs graphfix knows;
    with a target, whether each rule applies there and each plugin's status."""

    target: str | None
    label: str
    rules: list[dict[str, Any]] = field(default_factory=list)
    plugins: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "rules": self.rules, "plugins": self.plugins}


@dataclass
class Applied:
    """A plan applied: the model with the plugin nodes, and a line per substitution."""

    model: onnx.ModelProto
    done: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"substitutions": list(self.done)}


def rules_for(files: Sequence[PathLike], model: onnx.ModelProto | None = None) -> list:
    """Built-in, entry-point and file rules, for the model's default-domain opset (17
    without one)."""
    from graphfix.plugins.user import all_rules

    opsets = {o.domain: o.version for o in model.opset_import} if model is not None else {}
    return all_rules(opsets.get("", opsets.get("ai.onnx", 17)), files=tuple(files))


def catalog(trt: str | None = None, plugin_rules: Sequence[PathLike] = ()) -> Catalog:
    """`graphfix plugins list`."""
    from graphfix.runtime.references import registered
    from graphfix.trt import parse_target
    from graphfix.trt.plugins import all_specs

    target = parse_target(trt) if trt else None
    checkable = {e.op_type for e in registered()}
    rows = []
    for rule in rules_for(plugin_rules):
        useful = ("plugin unavailable" if rule.plugin_status(target) else
                  "not needed (native)" if rule.native_support(target) else "applies")
        rows.append({"rule": rule.name, "matches": f"{rule.domain or 'ai.onnx'}::"
                     f"{rule.anchor}", "plugin": rule.plugin, "source": rule.source,
                     "at_target": useful if target else "", "summary": rule.summary})
    specs = [{"plugin": name, "versions": list(spec.versions),
              "status": spec.status_at(target) if target else "",
              "deprecated_since": spec.deprecated_since, "removed_in": spec.removed_in,
              "reference": name in checkable,
              "fields": [f"{a.name}: {a.type}" for a in spec.attributes]}
             for name, spec in sorted(all_specs().items())]
    return Catalog(target.effective if target else None, target.label() if target else "",
                   rows, specs)


def _given(model: Path | None, plan: Path | None, rule_files: Sequence[PathLike]) -> list:
    from graphfix.writeset import Given

    return [Given(model, "the input model", model=True) if model else None,
            Given(plan, "the plan") if plan else None,
            *(Given(p, "--plugin-rules") for p in rule_files)]


def match(model: onnx.ModelProto | PathLike, *, trt: str | None = None, force: bool = False,
          plugin_rules: Sequence[PathLike] = (), output: PathLike | None = None) -> Plan:
    """`graphfix plugins match`: which nodes each rule would replace, by which plugin, with
    which attributes (`Plan`, editable as YAML); `output` writes the YAML."""
    from graphfix import io
    from graphfix.plugins.plan import match as match_rules
    from graphfix.trt import parse_target
    from graphfix.writeset import WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    with WriteSet(_given(path, None, plugin_rules)) as files:
        files.claim(output, "the plan (-o)")
        target = parse_target(trt) if trt else None
        loaded = io.load(path) if path else model
        plan = match_rules(loaded, rules_for(plugin_rules, loaded), target, force=force)
        if output is not None:
            files.text(output, plan.to_yaml(), "the plan (-o)")
        files.commit()
    return plan


def apply(model: onnx.ModelProto | PathLike, plan: Plan | PathLike, *, trt: str | None = None,
          plugin_rules: Sequence[PathLike] = (), output: PathLike | None = None) -> Applied:
    """`graphfix plugins apply`: every entry's plugin node, validated against the plugin's
    spec; `plan` is a `Plan` or the path of one (`match`'s YAML, edited or not)."""
    from graphfix import io
    from graphfix.plugins.plan import apply_plan, read
    from graphfix.trt import parse_target
    from graphfix.writeset import WriteSet

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    plan_path = None if isinstance(plan, Plan) else Path(plan)
    with WriteSet(_given(path, plan_path, plugin_rules)) as files:
        if output is not None:
            io.check_output_path(output, input_path=path, in_place=False)
            files.claim(output, "the output model (-o)", model=True)
        source = io.load(path) if path else model
        target = parse_target(trt) if trt else None
        result, done = apply_plan(source, read(plan_path) if plan_path else plan,
                                  rules_for(plugin_rules, source), target)
        if output is not None:
            files.model(result, output, "the output model (-o)")
        files.commit()
    return Applied(result, done)
