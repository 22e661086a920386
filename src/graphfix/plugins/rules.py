"""The rule object: a pattern, a check that fails with a reason, and the plugin node it
builds, like the onnxscript rewriter's rules. `substitute-plugins`, `graphfix plugins
match/apply` and user rule files all use it.

A rule is anchored at one node: `pattern(node)` returns a `Match` (the anchor first, then
the other nodes of the subgraph it covers) or None; `check(match)` returns None or why the
rule must not apply there; `rewrite(match)` returns the `Replacement`: the plugin's inputs,
outputs (the matched subgraph's outputs, so their names stay), attributes and version.
`apply` builds the node through `plugins.nodes.plugin_gs_node` (typed, validated) and cuts the
matched nodes out; the pass manager's cleanup removes them.

When a rule is useful, per target:
- `native`: ONNX op types whose native support by the target's parser (the operator table,
  `graphfix.trt`) makes the rule unnecessary: RoiAlign -> ROIAlign_TRT is useful only where
  the target does not list RoiAlign as supported. Empty for custom-domain ops (useful on
  every version).
- The plugin must exist at the target: not removed, not newer than it.
- `force` applies a rule regardless of `native` (the plugin must still exist).
- `needed`: whether the target's parser cannot import the matched nodes at all (an op it
  lacks, a custom domain). A rule matching ops the target parses (a decomposed
  GroupNormalization: Reshape, InstanceNormalization, ...) is a speed choice; `graphfix run
  --trt V`'s default pipeline applies only needed rules (native ops first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.plugins.nodes import add_to_graph, plugin_gs_node
from graphfix.trt import TrtTarget, plugin_for


@dataclass
class Match:
    """The nodes a pattern covers (anchor first) and what it read on the way."""

    nodes: list[gs.Node]
    captures: dict[str, Any] = field(default_factory=dict)

    @property
    def anchor(self) -> gs.Node:
        return self.nodes[0]


@dataclass
class Replacement:
    """What a rule builds: the plugin node's inputs (graph tensors or new constants),
    outputs (the matched subgraph's output tensors) and attributes (untyped values;
    `plugin_node` types them)."""

    inputs: list[gs.Tensor]
    outputs: list[gs.Variable]
    attributes: dict[str, Any]
    version: str | None = None  # None: the rule's, else the spec's newest
    casts: dict[int, Any] = field(default_factory=dict)  # input index -> numpy dtype


@dataclass(frozen=True)
class Rule:
    """See the module docstring. `declared` gives field types ("int32", "float32[]") for a
    plugin graphfix's data does not know (a user's own plugin); `source` says where the
    rule came from ("built-in", a file, an entry point)."""

    name: str
    summary: str
    plugin: str
    anchor: str  # the anchor's op type
    pattern: Callable[[gs.Node], Match | None]
    rewrite: Callable[[Match], Replacement]
    check: Callable[[Match], str | None] = lambda match: None
    domain: str = ""  # the anchor's domain
    native: tuple[str, ...] = ()
    version: str | None = None
    namespace: str = ""
    declared: Mapping[str, str] | None = None
    source: str = "built-in"

    def plugin_status(self, target: TrtTarget | None) -> str | None:
        """Why the target cannot use the plugin ("removed in TensorRT 11.0"), else None."""
        spec = plugin_for(self.plugin)
        if spec is None or target is None:
            return None
        status = spec.status_at(target)
        if status == "removed":
            return f"{self.plugin} was removed in TensorRT {spec.removed_in}"
        if status == "unavailable":
            return f"{self.plugin} exists only from TensorRT {spec.added_in}"
        return None

    def native_support(self, target: TrtTarget | None) -> str | None:
        """Which of `native` the target parses, as a reason to skip; None if it lacks
        one (or there is no target)."""
        if target is None:
            return None
        for op in self.native:
            row = target.op(op)
            if row is not None and row.supported:
                return (f"{target.label()} parses {op} natively (operator table "
                        f"{row.matrix}); use force=true to substitute anyway")
        return None

    def needed(self, match: Match, target: TrtTarget | None) -> bool:
        """Whether the target's parser cannot import some matched node as it is."""
        for node in match.nodes:
            if node.domain not in ("", "ai.onnx", None):
                return True
            row = target.op(node.op) if target is not None else None
            if row is None or not row.supported:
                return True
        return False


@dataclass
class Found:
    rule: Rule
    match: Match


@dataclass
class Skipped:
    subject: str
    reason: str


def search(graph: gs.Graph, rules: Sequence[Rule], target: TrtTarget | None,
           force: bool = False, needed_only: bool = False
           ) -> tuple[list[Found], list[Skipped]]:
    """Every match of `rules` in the main graph, first rule first per anchor; a node is
    covered by at most one match. The skipped candidates come with their reason."""
    found: list[Found] = []
    skipped: list[Skipped] = []
    taken: set[int] = set()
    for node in list(graph.nodes):
        if id(node) in taken:
            continue
        for rule in rules:
            if node.op != rule.anchor or (node.domain or "") != rule.domain:
                continue
            match = rule.pattern(node)
            if match is None or any(id(n) in taken for n in match.nodes):
                continue
            where = f"{node.op} '{node.name}'"
            reason = (rule.plugin_status(target)
                      or (None if force else rule.native_support(target))
                      or rule.check(match))
            if reason is None and needed_only and not rule.needed(match, target):
                reason = (f"{target.label() if target else 'the target'} parses these ops; "
                          f"{rule.plugin} would be a speed choice, not needed to parse "
                          f"(run substitute-plugins alone to apply it)")
            if reason is not None:
                skipped.append(Skipped(where, f"{rule.name}: {reason}"))
                continue
            found.append(Found(rule, match))
            taken.update(id(n) for n in match.nodes)
            break
    return found, skipped


def apply(graph: gs.Graph, item: Found, overrides: Mapping[str, Any] | None = None,
          target: TrtTarget | None = None) -> gs.Node:
    """Build the plugin node of one match and cut the matched nodes out. `overrides`
    (from an edited plan) replace attributes, `plugin_version`, `plugin_namespace`."""
    rule, match = item.rule, item.match
    rep = rule.rewrite(match)
    attributes = dict(rep.attributes)
    overrides = dict(overrides or {})
    version = overrides.pop("plugin_version", rep.version or rule.version)
    namespace = overrides.pop("plugin_namespace", rule.namespace)
    attributes.update(overrides)
    name = match.anchor.name or rep.outputs[0].name
    plugin = plugin_gs_node(rule.plugin, rep.inputs, rep.outputs, attributes, name=name,
                            version=version, namespace=namespace, target=target,
                            declared=rule.declared)
    for node in match.nodes:
        node.outputs.clear()
        node.inputs.clear()
    for index, dtype in rep.casts.items():
        source = plugin.inputs[index]
        cast = gs.Variable(f"{source.name}_gf_{np.dtype(dtype).name}", np.dtype(dtype),
                           source.shape)
        graph.nodes.append(gs.Node("Cast", f"{name}_gf_cast{index}",
                                   {"to": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))},
                                   [source], [cast]))
        plugin.inputs[index] = cast
    return add_to_graph(graph, plugin)
