"""`cleanup`: remove what does not compute anything.

- dead nodes and unused initializers (onnx-graphsurgeon's cleanup; graph inputs are kept);
- `Identity(x) -> x`;
- inference-mode `Dropout(x) -> x` (opset < 7: when `is_test=1`, its default being 0;
  opset 7-11: always inference; opset >= 12: when `training_mode` is absent or a
  constant false), provided its `mask` output is unused.

Graph output names are kept: when the removed node writes a graph output, the
producer of its input takes that output's name. Recurses into If/Loop/Scan bodies.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    bypass,
    constant_value,
    count_nodes,
    is_onnx,
    node_label,
    opset_of,
)
from graphfix.graph.prune import prune
from graphfix.passes.base import Note, Pass, PassContext, PassResult


@dataclass(frozen=True)
class CleanupOptions:
    """`identity`/`dropout`: remove those nodes too (default true)."""

    identity: bool = True
    dropout: bool = True


class Cleanup(Pass):
    """Removes dead nodes, unused initializers, Identity and inference Dropout."""

    name = "cleanup"
    keeps_computation = True
    summary = "Remove dead nodes, unused initializers, Identity and inference-mode Dropout."
    Options = CleanupOptions
    leaves_graph_clean = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        for g in all_graphs(graph):
            for node in list(g.nodes):
                reason = self._removable(node, opset)
                if reason is None:
                    why = bypass(g, node)
                    if why is None:
                        result.counts[f"removed {node.op}"] += 1
                    else:
                        result.notes.append(Note(node_label(node), f"kept: {why}"))
                elif reason:
                    result.notes.append(Note(node_label(node), f"kept: {reason}"))
        before = count_nodes(graph) - sum(result.counts.values())
        prune(graph)
        dead = before - count_nodes(graph)
        if dead > 0:
            result.counts["removed dead nodes"] += dead
        result.changed = bool(result.counts)
        if not result.changed:
            result.notes.append(Note("graph", "no dead node, Identity or inference Dropout"))
        return result

    def _removable(self, node: gs.Node, opset: int) -> str | None:
        """None if the node can go, a reason if it is a candidate that must stay, '' otherwise."""
        if is_onnx(node, "Identity") and self.options.identity:
            return None
        if not is_onnx(node, "Dropout") or not self.options.dropout:
            return ""
        if len(node.inputs) >= 3 and node.inputs[2].name:
            mode = constant_value(node.inputs[2])
            if mode is None:
                return "its training_mode input is not a constant"
            if bool(mode.reshape(-1)[0]):
                return "it is in training mode"
        if opset < 7 and not node.attrs.get("is_test", 0):
            return "it is in training mode (is_test=0, the default before opset 7)"
        if len(node.outputs) > 1 and node.outputs[1].outputs:
            return "its mask output is used"
        return None
