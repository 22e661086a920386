"""`fold-constants`: evaluate every node whose inputs are all constants.

`f(c1, c2, ...) -> c` for constant inputs, plus `Shape(x) -> c` where x's shape is
static (and Shape->Gather / Shape->Slice on partly static shapes). The work is
onnx-graphsurgeon's `fold_constants` (evaluated in onnxruntime), run with basic
partitioning so that one part that onnxruntime cannot evaluate does not stop the
rest from folding. `If` nodes with a constant condition are inlined.

`size-threshold` (bytes) keeps a node unfolded when its result would be larger,
so `Expand`/`Tile` of a constant is not materialised into a huge initializer
(default 16 MiB; 0 = no limit).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.graph import count_nodes
from graphfix.graph.shapes import infer_shapes
from graphfix.passes.base import Note, Pass, PassContext, PassResult


@dataclass(frozen=True)
class FoldConstantsOptions:
    """`size-threshold`: largest folded tensor in bytes (0 = unlimited); `shapes`: fold Shape."""

    size_threshold: int = 16 * 1024 * 1024
    shapes: bool = True


class FoldConstants(Pass):
    """Replaces constant subexpressions by their values."""

    name = "fold-constants"
    summary = "Evaluate nodes whose inputs are all constant (size-limited) and fold static Shape."
    Options = FoldConstantsOptions
    leaves_graph_clean = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        from onnx_graphsurgeon.logger import G_LOGGER

        before = count_nodes(graph)
        graph.toposort()
        if self.options.shapes:
            # gs folds Shape only where the graph already knows the shape; exporters
            # often write none for intermediates, so infer them first.
            infer_shapes(graph)
        # gs evaluates each subgraph as a model of its own, exported with the graph's
        # ir_version; subgraphs have none, so onnx's newest would be written, which
        # the installed onnxruntime may refuse (and folding silently does nothing).
        for sub in graph.subgraphs(recursive=True):
            sub.ir_version = getattr(graph, "ir_version", None)
        with G_LOGGER.suppress():
            graph.fold_constants(
                fold_shapes=self.options.shapes,
                recurse_subgraphs=True,
                partitioning="basic",
                error_ok=True,
                flatten_subgraphs=True,
                size_threshold=self.options.size_threshold or None,
            )
            graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True)
        folded = before - count_nodes(graph)
        result = PassResult(changed=folded != 0)
        if folded > 0:
            result.counts["folded nodes into constants"] = folded
        else:
            result.notes.append(Note("graph", "no node has only constant inputs"))
        return result
