"""A reviewable substitution: `match` writes which nodes each rule would replace, by which
plugin, with which attributes (a YAML plan the user may edit: attribute values,
plugin_version, plugin_namespace, or delete an entry); `apply` performs an edited plan.
Applying an unedited plan gives the model `substitute-plugins` gives (the same rules,
the same order; `apply` re-finds each match from the plan's anchor node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.plugins.nodes import default_version
from graphfix.plugins.rules import Found, Rule, apply, search
from graphfix.trt import TrtTarget, plugin_for

SCHEMA = "graphfix.plugins-plan/1"


@dataclass
class Plan:
    target: str | None
    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "target": self.target, "substitutions": self.entries,
                "skipped": self.skipped}

    def to_yaml(self) -> str:
        import yaml

        head = ("# graphfix plugin plan: edit attributes, plugin_version or plugin_namespace,\n"
                "# or delete an entry, then: graphfix plugins apply MODEL PLAN -o OUT\n")
        return head + yaml.safe_dump(self.to_json(), sort_keys=False, width=100)


def _graph(model: onnx.ModelProto) -> gs.Graph:
    from graphfix.graph.convert import to_graph

    return to_graph(model)


def match(model: onnx.ModelProto, rules: list[Rule], target: TrtTarget | None,
          force: bool = False) -> Plan:
    """The plan of `substitute-plugins{force=...}` with these rules on `model`."""
    graph = _graph(model)
    found, skipped = search(graph, rules, target, force=force)
    plan = Plan(target.effective if target is not None else None)
    for item in found:
        rep = item.rule.rewrite(item.match)
        plan.entries.append({
            "rule": item.rule.name,
            "nodes": [n.name for n in item.match.nodes],
            "plugin": item.rule.plugin,
            "plugin_version": str(rep.version or item.rule.version
                                  or default_version(plugin_for(item.rule.plugin), target)),
            "plugin_namespace": item.rule.namespace,
            "attributes": {k: _plain(v) for k, v in rep.attributes.items()},
        })
    plan.skipped = [{"node": s.subject, "reason": s.reason} for s in skipped]
    return plan


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    return value


def read(path: Path) -> Plan:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise GraphfixError(f"Cannot read the plan {path}", str(err).splitlines()[0],
                            "give a plan written by `graphfix plugins match`") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or \
            not isinstance(data.get("substitutions"), list):
        raise GraphfixError(f"{path} is not a graphfix plugin plan",
                            f"a plan has schema: {SCHEMA} and a substitutions list",
                            "write one with `graphfix plugins match MODEL -o plan.yaml`")
    return Plan(data.get("target"), data["substitutions"], data.get("skipped") or [])


def apply_plan(model: onnx.ModelProto, plan: Plan, rules: list[Rule],
               target: TrtTarget | None) -> tuple[onnx.ModelProto, list[str]]:
    """The model with every plan entry applied; what was done, one line per entry."""
    from graphfix.graph.convert import to_model

    graph = _graph(model)
    by_name = {r.name: r for r in rules}
    nodes = {n.name: n for n in graph.nodes}
    done: list[str] = []
    for i, entry in enumerate(plan.entries):
        where = f"plan entry {i + 1}"
        if not isinstance(entry, dict) or not entry.get("nodes"):
            raise GraphfixError(f"{where} is malformed", "it needs rule, nodes, plugin",
                                "regenerate the plan with `graphfix plugins match`")
        rule = by_name.get(entry.get("rule"))
        if rule is None:
            raise GraphfixError(f"{where} names rule '{entry.get('rule')}', which is not loaded",
                                f"the rules are: {', '.join(by_name)}",
                                "give the rule file with --plugin-rules, or fix the name")
        if entry.get("plugin", rule.plugin) != rule.plugin:
            raise GraphfixError(f"{where} changes the plugin to '{entry.get('plugin')}'",
                                f"rule {rule.name} builds {rule.plugin}, with its inputs",
                                "write a rule for the other plugin (docs/plugins.md)")
        anchor = nodes.get(entry["nodes"][0])
        if anchor is None:
            raise GraphfixError(f"{where} names node '{entry['nodes'][0]}', which does not "
                                "exist in the model", "the plan was made for another model "
                                "or the model changed", "run `graphfix plugins match` again")
        found = rule.pattern(anchor) if anchor.op == rule.anchor else None
        if found is None or [n.name for n in found.nodes] != list(entry["nodes"]):
            raise GraphfixError(f"{where}: rule {rule.name} no longer matches nodes "
                                f"{entry['nodes']}", "the model changed since the plan",
                                "run `graphfix plugins match` again")
        overrides = dict(entry.get("attributes") or {})
        for key in ("plugin_version", "plugin_namespace"):
            if entry.get(key) is not None:
                overrides[key] = str(entry[key])
        apply(graph, Found(rule, found), overrides=overrides, target=target)
        done.append(f"{rule.name}: {', '.join(entry['nodes'])} -> {rule.plugin}")
    graph.cleanup().toposort()
    return to_model(graph, model), done
