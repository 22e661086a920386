"""Doctor rules about custom ops: TensorRT plugins and ops nobody implements.

The ONNX parser imports a node with no builtin importer as a plugin, looked up by
op_type, attribute `plugin_version` and `plugin_namespace`
(`plugin_attribute_rules()["fallback_importer"]`). This module reports the nodes that
take that path (see `handles`): plugin specs and their status per TensorRT version come
from `graphfix.trt.plugin_for` (trt_plugins.json), attribute types from the parser's
attribute mapping in the same file.

Not reported here: `com.microsoft*` and `ai.onnx.ml` ops (rules_ops.custom_domains) and
standard-domain ONNX ops or ops listed in the operator table (rules_ops.op_support).
Calls of model-local functions are left alone from TensorRT 9.0, which inlines them
(parser notes "local_functions").
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx.defs

from graphfix.doctor.findings import ERROR, INFO, WARN, Finding
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.graph.ort_ops import ORT_ONNX_DOMAIN, TF_ONNX_DOMAIN
from graphfix.graph.protos import text
from graphfix.plugins.nodes import problems as node_problems
from graphfix.trt import (
    PluginSpec,
    TrtTarget,
    parser_behaviour_notes,
    plugin_attribute_rules,
    plugin_for,
)

IDS = ("plugin-available", "plugin-deprecated", "plugin-removed", "plugin-attribute",
       "custom-op-unknown")

_LOCAL_FUNCTIONS_FROM = "9.0"  # parser notes "local_functions": "supported from 9.0 EA"
_PARSER_ATTRS = ("plugin_version", "plugin_namespace")  # read by the parser, as STRING


def handles(ref: NodeRef, target: TrtTarget) -> bool:
    """Whether `plugins` reports this node: any node outside the standard domains except
    onnxruntime/ONNX-ML ones, and standard-domain op types that are neither ONNX ops
    (`onnx.defs.has`) nor listed in the target's table ("EfficientNMS_TRT" in domain "").
    op_support should skip exactly the standard-domain nodes this returns True for."""
    if ref.domain == "ai.onnx.ml" or ref.domain.startswith("com.microsoft"):
        return False
    if not ref.standard:
        return True
    return not onnx.defs.has(ref.op) and target.op(ref.op) is None


def plugins(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """Status findings once per (domain, op type, plugin version), with all their nodes;
    `plugin-attribute` once per node, listing every bad attribute."""
    functions = {(f.domain, f.name) for f in view.model.functions}
    groups: dict[tuple[str, str, str], list[NodeRef]] = {}
    for ref in view.nodes:
        if not handles(ref, target):
            continue
        if (ref.domain, ref.op) in functions and target.at_least(_LOCAL_FUNCTIONS_FROM):
            continue
        version = str(text(ref.attr("plugin_version", "1")))
        groups.setdefault((ref.domain, ref.op, version), []).append(ref)
    for (domain, op, version), refs in groups.items():
        spec = plugin_for(op)
        if (domain, op) in functions:
            yield _local_function(domain, op, refs, target)
        elif spec is None or spec.status_at(target) == "unavailable":
            yield _unknown(domain, op, refs, target, spec)
        else:
            yield _status(spec, version, refs, target)
            if spec.status_at(target) != "removed":
                for ref in refs:
                    yield from _attributes(spec, ref, target)


def _nodes(refs: list[NodeRef]) -> tuple[str, ...]:
    return tuple(r.label for r in refs)


def _qualified(domain: str, op: str) -> str:
    return f"{domain}::{op}" if domain else op


def _status(spec: PluginSpec, version: str, refs: list[NodeRef],
            target: TrtTarget) -> Finding:
    """plugin-removed / plugin-deprecated (whole plugin, then the node's plugin_version)
    / plugin-available, in that order."""
    op, status = spec.op_type, spec.status_at(target)
    where = _qualified(refs[0].domain, op)
    versions = ", ".join(spec.versions) or "not listed"
    fact = (f"trt_plugins.json: {op} plugin versions {versions}; deprecated since "
            f"{spec.deprecated_since or '-'}, removed in {spec.removed_in or '-'}"
            + (f", replacement: {spec.replacement}" if spec.replacement else ""))
    migrate = _migrate(op, version, target)
    replace = "; or ".join(t for t in (migrate, f"replace it: {spec.replacement}"
                                       if spec.replacement else "") if t)
    if status == "removed":
        return Finding(
            "plugin-removed", ERROR,
            f"plugin {op} was removed in TensorRT {spec.removed_in}; TensorRT "
            f"{target.effective} cannot build this node",
            nodes=_nodes(refs), op=where, fact=fact,
            fix=replace or f"use TensorRT older than {spec.removed_in}, or build and "
                           f"register your own plugin named {op}",
        )
    if status == "deprecated":
        removed = f", removed in {spec.removed_in}" if spec.removed_in else ""
        return Finding(
            "plugin-deprecated", WARN,
            f"plugin {op} is deprecated since TensorRT {spec.deprecated_since}{removed}",
            nodes=_nodes(refs), op=where, fact=fact,
            fix=replace or "plan to replace it; no replacement is named in the data",
        )
    deprecations = dict(spec.version_deprecations)
    since = deprecations.get(version)
    if since is not None and target.at_least(since):
        current = [v for v in spec.versions
                   if v not in deprecations or not target.at_least(deprecations[v])]
        return Finding(
            "plugin-deprecated", WARN,
            f"plugin {op} version {version} is deprecated since TensorRT {since}"
            + (f"; current: {', '.join(current)}" if current else ""),
            nodes=_nodes(refs), op=where,
            fact=f"trt_plugins.json: {op} version {version} deprecated since {since}",
            fix=(f"set the attribute plugin_version=\"{current[-1]}\" (check that its "
                 "inputs and fields match)" + (f"; or {migrate}" if migrate else ""))
            if current else replace or "plan to replace it",
        )
    return _available(spec, version, refs, target, fact)


def _migrate(op: str, version: str, target: TrtTarget) -> str:
    """The `migrate-plugins` command when graphfix has a standard ONNX form of the plugin."""
    from graphfix.plugins.native import migration_for

    form = migration_for(op, version)
    return (f"graphfix run model.onnx --trt {target.effective} --passes migrate-plugins "
            f"(standard ONNX: {form.native})") if form else ""


def _available(spec: PluginSpec, version: str, refs: list[NodeRef], target: TrtTarget,
               fact: str) -> Finding:
    if spec.added_in:
        what, fix = ("a TensorRT custom op its parser imports itself",
                     f"none for TensorRT {spec.added_in} or newer")
    else:
        interface = f", {spec.interface}" if spec.interface else ""
        what, fix = (f"a TensorRT OSS plugin, version {version}{interface}",
                     "load the TensorRT plugin library when building (trtexec and "
                     "polygraphy do)")
        fact = f"{fact}; {plugin_attribute_rules().get('plugin_library', '')}".rstrip("; ")
    return Finding(
        "plugin-available", INFO,
        f"{spec.op_type} is {what} ({spec.category}): not marked deprecated or removed by "
        f"TensorRT {target.effective}; it cannot run in onnxruntime",
        nodes=_nodes(refs), op=_qualified(refs[0].domain, spec.op_type), fact=fact, fix=fix,
    )


def _attributes(spec: PluginSpec, ref: NodeRef, target: TrtTarget) -> Iterator[Finding]:
    problems = node_problems(ref.node, spec, target)
    if not problems:
        return
    mapping = plugin_attribute_rules().get("attribute_mapping", "")
    fields = "; ".join(f"{a.name}: {a.type or '?'}{' (required)' if a.required else ''}"
                       + (f" since {a.since}" if a.since else "") for a in spec.attributes)
    yield Finding(
        "plugin-attribute", ERROR,
        f"{spec.op_type} node TensorRT {target.effective} cannot use as written: "
        + "; ".join(problems),
        nodes=(ref.label,), op=_qualified(ref.domain, spec.op_type),
        fact=f"trt_plugins.json {spec.op_type} fields: {fields or 'none listed'}; "
             f"onnx_parser_plugin_rules.attribute_mapping: {mapping}",
        fix="give the node the plugin's inputs, set each listed attribute with the ONNX type "
            "shown (onnx.helper.make_node: write floats as 1.0, not 1), and add the missing "
            "ones (graphfix.plugins.nodes.plugin_node writes them typed)",
    )


def _unknown(domain: str, op: str, refs: list[NodeRef], target: TrtTarget,
             spec: PluginSpec | None) -> Finding:
    rules = plugin_attribute_rules()
    namespace = str(text(refs[0].attr("plugin_namespace", "")))
    version = str(text(refs[0].attr("plugin_version", "1")))
    if spec is not None:
        why = (f"{op} is a TensorRT {spec.added_in} custom op; TensorRT {target.effective} "
               "has no importer for it, so it is looked up as a plugin")
        newer = f"target TensorRT {spec.added_in} or newer, or "
    else:
        why = (f"{_qualified(domain, op)} is not an ONNX op and not a TensorRT plugin "
               "graphfix knows: it needs a plugin")
        newer = ""
    from_domain = (f" (TensorRT 10.10+ also reads the namespace from the node's domain "
                   f"'{domain}')" if domain and target.at_least("10.10") else "")
    from graphfix.plugins.substitute import substitution_advice  # gs, only when needed

    advice = substitution_advice(domain, op, target)
    if domain in ("", "ai.onnx") and op in ORT_ONNX_DOMAIN:
        advice = (f"{op} is onnxruntime's op, which its transformer optimizer writes in the "
                  "ONNX domain: unfuse-contrib rewrites it as standard ONNX ops (trt-prep "
                  "runs it)")
    elif domain in ("", "ai.onnx") and op in TF_ONNX_DOMAIN:
        advice = (f"{op} is TensorFlow's op, which tf2onnx left in the ONNX domain: "
                  "unfuse-contrib rewrites it as standard ONNX ops (trt-prep runs it)")
    return Finding(
        "custom-op-unknown", ERROR,
        f"{why}; parsing fails unless a plugin creator named {op} is registered",
        nodes=_nodes(refs), op=_qualified(domain, op),
        fact=f"onnx_parser_plugin_rules.fallback_importer: {rules.get('fallback_importer', '')}",
        fix=(f"{advice}; otherwise " if advice else "")
        + (f"{newer}build a TensorRT plugin whose creator is named '{op}', version "
           f"'{version}', namespace '{namespace}'{from_domain}, and load its library "
           "before parsing; or rewrite the op into ONNX ops before export"),
    )


def _local_function(domain: str, op: str, refs: list[NodeRef], target: TrtTarget) -> Finding:
    note = parser_behaviour_notes().get("local_functions", "")
    return Finding(
        "custom-op-unknown", ERROR,
        f"{_qualified(domain, op)} calls a model-local ONNX function; TensorRT "
        f"{target.effective} does not read local functions and looks for a plugin instead",
        nodes=_nodes(refs), op=_qualified(domain, op),
        fact=f"parser notes, local_functions: {note}",
        fix="inline-functions (in trt-prep and every --trt pipeline), or target TensorRT "
            "9.0 or newer",
    )
