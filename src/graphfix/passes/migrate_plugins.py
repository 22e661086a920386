"""`migrate-plugins`: TensorRT plugin nodes the target deprecates or removed become standard ONNX.

    Clip_TRT(x){clipMin, clipMax}              -> Clip(x, clipMin, clipMax)
    InstanceNormalization_TRT(x){scales, bias} -> InstanceNormalization(x, scales, bias)
    GroupNormalizationPlugin(x, scale, bias)   -> GroupNormalization | Reshape, InstanceNorm, ...
    ... every form of `graphfix.plugins.native` (its docstring lists them and their corners)
    EfficientNMS_TRT / BatchedNMS(Dynamic)_TRT / NMS(Dynamic)_TRT
                                               -> the `plugin-to-nms` forms (`graphfix.nms`)

Which nodes: with a TensorRT target (`--trt`), the plugin nodes whose plugin the target
marks deprecated or removed (`PluginSpec.status_at`), or whose `plugin_version` it
deprecates (`version_deprecations`); with `all=true`, every plugin node that has a standard
form, whatever the target. With neither, nothing changes and a note says so. Every node
left alone gets a note: current at the target, no standard form, or why its form cannot
express this node (`Unavailable`). The forms are the plugins' reference forms for the
numerical check too, so the check compares the result with the same numbers.

The new nodes write the plugin node's output tensors (names, dtypes and shapes kept).
When the model imported no default ONNX domain (only plugin domains), the forms are built
for opset 17 and that import is added; imports of domains no node uses any more are
dropped. Nodes in If/Loop/Scan bodies are migrated too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
import onnx.defs
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import all_graphs, names_in_use, node_label, opset_of
from graphfix.graph.convert import node_proto
from graphfix.graph.walk import drop_unused_imports
from graphfix.nms.efficient import batched_nms, efficient_nms
from graphfix.nms.onnxops import made_names, replace_node
from graphfix.nms.ssd import SSD_PLUGINS, detection_output
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult
from graphfix.plugins.native import migration_for
from graphfix.runtime.references import FALLBACK_OPSET, Decomposition, Unavailable
from graphfix.trt import PluginSpec, TrtTarget, plugin_for

Build = Callable[[onnx.NodeProto, int], Decomposition]
_NMS: dict[str, Build] = {"EfficientNMS_TRT": efficient_nms, "BatchedNMS_TRT": batched_nms,
                          "BatchedNMSDynamic_TRT": batched_nms,
                          **{op: detection_output for op in SSD_PLUGINS}}
_NMS_FORM = "NonMaxSuppression (the plugin-to-nms form)"
_STANDARD = ("", "ai.onnx")


@dataclass(frozen=True)
class MigratePluginsOptions:
    """`all`: migrate every plugin node that has a standard form, not only those the
    target (`--trt`) deprecates or removed."""

    all: bool = False


class MigratePlugins(Pass):
    """Replaces TensorRT plugin nodes (main graph and subgraphs) by their standard-ONNX form
    from `graphfix.plugins.native` (NMS plugins: `graphfix.nms`, as `plugin-to-nms`):
    those deprecated or removed at `ctx.trt`, or all of them with `all=true`."""

    name = "migrate-plugins"
    summary = ("Replace TensorRT plugin nodes the target deprecates or removed (all=true: "
               "every plugin with a standard form) by standard ONNX ops computing the same "
               "(Clip_TRT -> Clip, GroupNormalizationPlugin -> GroupNormalization, ...).")
    Options = MigratePluginsOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        if ctx.trt is None and not self.options.all:
            result.notes.append(Note("graph", "no TensorRT target: give one (--trt 11.1) to "
                                     "migrate the plugins it deprecates or removed, or use "
                                     "migrate-plugins{all=true}; nothing changed"))
            return result
        has_default = graph.import_domains is None or any(
            d.domain in _STANDARD for d in graph.import_domains)
        opset = opset_of(graph) if has_default else FALLBACK_OPSET
        taken = names_in_use(graph)
        found = False
        for g in list(all_graphs(graph)):
            for node in list(g.nodes):
                spec = _plugin(node)
                if spec is None:
                    continue
                found = True
                self._migrate(g, node, spec, opset, taken, ctx, result)
        if result.changed:
            if not has_default:
                graph.import_domains = [*(helper.make_opsetid(d.domain, d.version)
                                          for d in graph.import_domains),
                                        helper.make_opsetid("", opset)]
                graph.opset = opset
            drop_unused_imports(graph)
        if not found:
            result.notes.append(Note("graph", "no TensorRT plugin node"))
        return result

    def _migrate(self, g: gs.Graph, node: gs.Node, spec: PluginSpec, opset: int,
                 taken: set[str], ctx: PassContext, result: PassResult) -> None:
        label = node_label(node)
        version = str(node.attrs.get("plugin_version", "1"))
        if not self.options.all and (why := _current(spec, version, ctx.trt)):
            result.notes.append(Note(label, why))
            return
        migration = migration_for(node.op, version)
        build = migration.build if migration else _NMS.get(node.op)
        native = migration.native if migration else _NMS_FORM
        if build is None:
            result.notes.append(Note(label, f"graphfix has no standard ONNX form for {node.op} "
                                            f"version {version}"))
            return
        try:
            dec = build(node_proto(node), opset)
        except Unavailable as err:
            result.notes.append(Note(label, f"not migrated: {err}"))
            return
        own = {t.name for t in node.outputs}
        if clash := sorted((made_names(dec) - own) & taken):
            result.notes.append(Note(label, f"its standard form's names {clash[:3]} are taken "
                                            "in the graph"))
            return
        if not ctx.allow_rewrite(self.name, label):
            result.notes.append(Note(label, LIMIT_REACHED))
            return
        replace_node(g, node, dec)
        taken |= made_names(dec)
        result.counts[f"migrated {node.op} to {native}"] += 1
        result.changed = True


def _plugin(node: gs.Node) -> PluginSpec | None:
    """The plugin a node names; None for other nodes and for the ONNX ops that share a
    plugin's name (Split, ScatterND in the default domain)."""
    if (node.domain or "") in _STANDARD and onnx.defs.has(node.op):
        return None
    return plugin_for(node.op)


def _current(spec: PluginSpec, version: str, target: TrtTarget) -> str:
    """Why the node stays at `target` ("" when the target deprecates or removed it)."""
    status = spec.status_at(target)
    if status in ("deprecated", "removed"):
        return ""
    since = dict(spec.version_deprecations).get(version)
    if since is not None and target.at_least(since):
        return ""
    return (f"{spec.op_type} version {version} is {status} at {target.label()}, not "
            "deprecated: left as it is (migrate-plugins{all=true} migrates it anyway)")
