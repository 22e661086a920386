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

from graphfix.graph import all_graphs, count_nodes, is_onnx
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
        if self.options.shapes and any(
            t.shape is None for t in _shape_inputs(graph)
        ):
            # gs folds Shape only where the graph already knows the shape; exporters
            # often write none for intermediates, so infer them first.
            infer_shapes(graph)
        if not _has_candidates(graph, self.options.shapes):
            return PassResult(changed=False, notes=[Note(
                "graph", "no node has only constant inputs, and no Shape reads a known dim")])
        graph.toposort()
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


def _shape_inputs(graph: gs.Graph) -> list[gs.Tensor]:
    """The tensors that Shape and Size nodes read."""
    return [n.inputs[0] for g in all_graphs(graph) for n in g.nodes
            if is_onnx(n, "Shape", "Size") and n.inputs]


def _has_candidates(graph: gs.Graph, shapes: bool) -> bool:
    """Whether gs could fold anything: a node (not a Constant) whose inputs are all
    constants, or, with `shapes`, a Shape/Size of a tensor with at least one known dim.
    Checking first skips gs's export + onnxruntime round trip when nothing can fold."""
    for g in all_graphs(graph):
        for node in g.nodes:
            if node.op == "Constant" or not node.outputs:
                continue
            inputs = [t for t in node.inputs if t.name]
            if inputs and all(_is_constant(t) for t in inputs):
                return True
            if shapes and is_onnx(node, "Shape", "Size") and node.inputs:
                shape = node.inputs[0].shape
                if shape is not None and any(isinstance(d, int) and d >= 0 for d in shape):
                    return True
    return False


def _is_constant(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant) or (len(t.inputs) == 1 and t.inputs[0].op == "Constant")
