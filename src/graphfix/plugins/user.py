"""User rules: a Python file, a YAML file, or an installed package's entry points.

- Python (`--plugin-rules my_rules.py`, an explicit flag because it executes the file):
  the file defines `RULES`, a list of `graphfix.plugins.rules.Rule`, or a function
  `rules()` returning one.
- YAML, for the common case "op X (domain D) -> plugin P, version V, attribute mapping":

      rules:
        - name: myop-to-plugin          # required, unique
          match: {op: MyOp, domain: my.ops}
          plugin: MyPlugin_TRT          # op type of the plugin node
          version: "1"                  # plugin_version (default: the spec's newest, or "1")
          namespace: ""                 # plugin_namespace
          fields: {alpha: float32, size: int32, axes: "int32[]"}  # a plugin graphfix
                                        # does not know must declare its fields' types
          attributes:                   # plugin field: a value, or {from: node attribute,
            alpha: {from: alpha, default: 0.5}   #  default: used when it is absent,
                                        #  required: true: no match without it}
            size: 3
          inputs: [0, 1]                # which node inputs, in order (default: all)
          native: [Gelu]                # ONNX ops whose native support makes it unneeded

- Entry points: an installed distribution exposing the group `graphfix.plugin_rules`;
  each entry loads to a list of rules or a function returning one. They are loaded on
  every run of `substitute-plugins` and `graphfix plugins`.

Any problem (a missing file, a YAML error, a rule file that raises, a malformed rule) is a
GraphfixError naming the file and what is wrong: exit 2, nothing written.
"""

from __future__ import annotations

import runpy
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.plugins.rules import Match, Replacement, Rule
from graphfix.trt import plugin_for

ENTRY_POINT_GROUP = "graphfix.plugin_rules"
_YAML_KEYS = {"name", "match", "plugin", "version", "namespace", "fields", "attributes",
              "inputs", "native", "summary"}


def all_rules(opset: int, extra: Iterable[Rule] = (),
              files: Iterable[str | Path] = ()) -> list[Rule]:
    """Every rule a substitution uses, in order: the built-in rules for the model's
    default-domain opset (RoiAlign's defaults and GroupNormalization's scale layout depend
    on it), installed entry points' rules, `extra` (already loaded), then `files`."""
    from graphfix.plugins.substitute import builtin_rules

    rules = builtin_rules(opset) + entry_point_rules() + list(extra)
    for path in files:
        rules += load_rules(path)
    return rules


def load_rules(path: str | Path) -> list[Rule]:
    """The rules of one file (.py, .yaml or .yml)."""
    path = Path(path)
    if not path.is_file():
        raise GraphfixError(f"Plugin rule file {path} does not exist",
                            "--plugin-rules and rules= name a .py or .yaml file",
                            "fix the path")
    if path.suffix in (".yaml", ".yml"):
        return _yaml_rules(path)
    if path.suffix != ".py":
        raise GraphfixError(f"Plugin rule file {path} is neither .py nor .yaml",
                            "graphfix reads Python rule files and YAML rule files",
                            "rename it, or write the rules in one of those forms")
    try:
        space = runpy.run_path(str(path), run_name="graphfix_plugin_rules")
    except Exception as err:  # the user's code: any exception is the file's problem
        raise GraphfixError(f"Plugin rule file {path} raised {type(err).__name__}: {err}",
                            "graphfix ran the file to read its rules",
                            "fix the file (run it with python to see the traceback)") from None
    rules = space.get("RULES")
    if rules is None and callable(space.get("rules")):
        rules = _call(space["rules"], str(path))
    if rules is None:
        raise GraphfixError(f"Plugin rule file {path} defines no rules",
                            "it must define RULES (a list of Rule) or a function rules()",
                            "see docs/plugins.md for an example")
    return _checked(rules, str(path))


def entry_point_rules() -> list[Rule]:
    """The rules of every installed `graphfix.plugin_rules` entry point."""
    rules: list[Rule] = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"entry point {entry.name} ({entry.value})"
        try:
            loaded = entry.load()
        except Exception as err:
            raise GraphfixError(f"Plugin rules {where} cannot be loaded: {err}",
                                "an installed package registers it", "fix or uninstall "
                                "the package") from None
        rules += _checked(_call(loaded, where) if callable(loaded) else loaded, where)
    return rules


def _call(function: Any, where: str) -> Any:
    try:
        return function()
    except Exception as err:
        raise GraphfixError(f"Plugin rules {where} raised {type(err).__name__}: {err}",
                            "graphfix called it to get the rules", "fix it") from None


def _checked(rules: Any, where: str) -> list[Rule]:
    if not isinstance(rules, Iterable) or not all(isinstance(r, Rule) for r in rules):
        raise GraphfixError(f"Plugin rules from {where} are not a list of Rule",
                            "each rule must be a graphfix.plugins.rules.Rule",
                            "see docs/plugins.md")
    import dataclasses

    return [r if r.source != "built-in" else dataclasses.replace(r, source=where)
            for r in rules]


def _yaml_rules(path: Path) -> list[Rule]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise GraphfixError(f"Plugin rule file {path} is not valid YAML",
                            str(err).splitlines()[0], "fix the YAML") from None
    entries = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise GraphfixError(f"Plugin rule file {path} has no 'rules:' list",
                            "a YAML rule file holds `rules:` with one mapping per rule",
                            "see docs/plugins.md for the form")
    return [_yaml_rule(entry, f"{path} rule {i + 1}") for i, entry in enumerate(entries)]


def _bad(where: str, problem: str) -> GraphfixError:
    return GraphfixError(f"Plugin rule {where} is malformed: {problem}",
                         "a YAML rule needs name, match {op, domain}, plugin, and may have "
                         "version, namespace, fields, attributes, inputs, native",
                         "fix the rule (see docs/plugins.md)")


def _yaml_rule(entry: Any, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise _bad(where, "it is not a mapping")
    if unknown := sorted(set(entry) - _YAML_KEYS):
        raise _bad(where, f"unknown keys {unknown}")
    match = entry.get("match")
    if not entry.get("name") or not entry.get("plugin") or not isinstance(match, dict) \
            or not match.get("op"):
        raise _bad(where, "name, plugin and match.op are required")
    attributes = entry.get("attributes") or {}
    fields = entry.get("fields")
    inputs = entry.get("inputs")
    if not isinstance(attributes, dict) or (fields is not None and not isinstance(fields, dict)):
        raise _bad(where, "attributes and fields must be mappings")
    if inputs is not None and not (isinstance(inputs, list)
                                   and all(isinstance(i, int) and i >= 0 for i in inputs)):
        raise _bad(where, "inputs must be a list of input indices (0, 1, ...)")
    name = str(entry["name"])
    if plugin_for(str(entry["plugin"])) is None and not fields:
        raise GraphfixError(
            f"Plugin rule {where} names unknown plugin '{entry['plugin']}'",
            "it is not a TensorRT plugin in graphfix's data, so graphfix cannot type its "
            "attributes", "fix the name, or declare the plugin's attribute types under "
            "`fields:` (e.g. {alpha: float32, size: int32})")

    def rewrite(found: Match) -> Replacement:
        node = found.anchor
        values = {}
        for field, spec in attributes.items():
            if isinstance(spec, dict):
                source = spec.get("from")
                if source in node.attrs:
                    value = node.attrs[source]
                elif "default" in spec:
                    value = spec["default"]
                else:
                    continue  # absent: the plugin's own default
            else:
                value = spec
            values[field] = value.decode() if isinstance(value, bytes) else value
        chosen: list[gs.Tensor] = list(node.inputs)
        if inputs is not None:
            chosen = [node.inputs[i] for i in inputs]
        return Replacement(chosen, list(node.outputs), values)

    def check(found: Match) -> str | None:
        if inputs is not None and max(inputs, default=-1) >= len(found.anchor.inputs):
            return f"the node has {len(found.anchor.inputs)} inputs; the rule reads {inputs}"
        for spec in attributes.values():
            if isinstance(spec, dict) and "default" not in spec and \
                    spec.get("from") not in found.anchor.attrs and spec.get("required"):
                return f"attribute {spec.get('from')} is missing"
        return None

    return Rule(
        name=name, summary=str(entry.get("summary") or
                               f"{match.get('domain') or 'ai.onnx'}::{match['op']} -> "
                               f"{entry['plugin']}"),
        plugin=str(entry["plugin"]), anchor=str(match["op"]),
        pattern=lambda node: Match([node]), rewrite=rewrite, check=check,
        domain=str(match.get("domain") or ""), native=tuple(entry.get("native") or ()),
        version=str(entry["version"]) if entry.get("version") is not None else None,
        namespace=str(entry.get("namespace") or ""),
        declared={str(k): str(v) for k, v in fields.items()} if fields else None,
        source=where)
