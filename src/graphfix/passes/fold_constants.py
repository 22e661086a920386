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

from graphfix.graph import all_graphs, count_nodes, is_graph_output, is_onnx
from graphfix.graph.shapes import infer_shapes, reads_unnamed_dims
from graphfix.passes._fold_eval import (
    excluded,
    fold_node_by_node,
    fold_static_shapes,
    inline_constant_ifs,
    scalar_range_inputs,
)
from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.runtime.session import bounded_sessions
from graphfix.runtime.work import runaway_loops

MAX_ROUNDS = 8
"""Rounds of shape folding and evaluation in one run (each after shape inference)."""


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
        if self.options.shapes and (any(t.shape is None for t in _shape_inputs(graph))
                                    or reads_unnamed_dims(graph)):
            # gs folds Shape only where the graph already knows the shape; exporters
            # often write none for intermediates, so infer them first (symbolically too
            # where dims are computed by arithmetic, RAFT: graph.shapes.symbolic_shapes)
            infer_shapes(graph, symbolic=True)
        if not _has_candidates(graph, self.options.shapes):
            return PassResult(changed=False, notes=[Note(
                "graph", "no node has only constant inputs, and no Shape reads a known dim")])
        graph.toposort()
        # gs evaluates each subgraph as a model of its own, exported with the graph's
        # ir_version; subgraphs have none, so onnx's newest would be written, which
        # the installed onnxruntime may refuse (and folding silently does nothing).
        for sub in graph.subgraphs(recursive=True):
            sub.ir_version = getattr(graph, "ir_version", None)
        threshold = self.options.size_threshold or None
        runaway = runaway_loops(graph)  # refused by bounded_sessions, said in a note
        shapes = inlined = 0
        # gs makes its own onnxruntime sessions: bounded threads, runaway Loops refused
        with G_LOGGER.suppress(), bounded_sessions():
            for _ in range(MAX_ROUNDS):
                folded_shapes = fold_static_shapes(graph) if self.options.shapes else 0
                inlined += _evaluate(graph, threshold)
                graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=True)
                shapes += folded_shapes
                if not folded_shapes:
                    break
                # a Reshape whose target just became constant has a known output shape
                # now, which a Shape further down may read: fold again (one run is
                # then enough, as the pass contract asks)
                infer_shapes(graph)
        if inlined and any(t.shape is None for t in _range_inputs(graph)):
            infer_shapes(graph)  # inlined If outputs have shapes now
        ranges = scalar_range_inputs(graph)
        if ranges:
            graph.toposort()
        folded = before - count_nodes(graph)
        result = PassResult(changed=folded != 0 or shapes != 0 or bool(ranges))
        result.notes += [Note(r, "Range read a 1-element tensor where ONNX wants a scalar: "
                              "reshaped to one (onnxruntime runs both alike)") for r in ranges]
        result.notes += [Note(loop.node, f"not folded: {loop.describe()}") for loop in runaway]
        if folded > 0:
            result.counts["folded nodes into constants"] = folded
        else:
            result.notes.append(Note("graph", "no node has only constant inputs"))
        return result


def _evaluate(graph: gs.Graph, threshold: int | None) -> int:
    """Fold every constant subexpression: gs's folding in one session per graph, node by
    node where onnxruntime fails on that, then the If nodes whose condition is constant
    (returns how many Ifs were inlined)."""
    try:
        _gs_fold(graph, threshold, error_ok=False)
    except Exception:  # noqa: BLE001 - onnxruntime cannot evaluate some part
        # evaluate node by node instead, then let gs do what is left (subgraphs,
        # If nodes with a constant condition) without what failed
        fold_node_by_node(graph, threshold)
        try:
            _gs_fold(graph, threshold, error_ok=True)
        except Exception:  # noqa: BLE001 - gs's export fails on some types
            pass  # (optional tensors: UnboundLocalError); node by node is done
    inlined = inline_constant_ifs(graph)
    if inlined:
        _gs_fold(graph, threshold, error_ok=True)  # the inlined branches' constants
    return inlined


def _gs_fold(graph: gs.Graph, threshold: int | None, error_ok: bool) -> None:
    """gs's folding in one onnxruntime session per graph (no partitioning: gs's retries
    recurse on the same part, see `_fold_eval`), without shape folding (graphfix's own,
    `fold_static_shapes`, honours Shape's start/end)."""
    graph.fold_constants(
        fold_shapes=False,
        recurse_subgraphs=True,
        partitioning=None,
        error_ok=error_ok,
        flatten_subgraphs=False,  # `inline_constant_ifs` does it
        size_threshold=threshold,
        should_exclude_node=excluded,
    )


def _range_inputs(graph: gs.Graph) -> list[gs.Tensor]:
    return [t for g in all_graphs(graph) for n in g.nodes if is_onnx(n, "Range")
            for t in n.inputs]


def _shape_inputs(graph: gs.Graph) -> list[gs.Tensor]:
    """The tensors that Shape and Size nodes read."""
    return [n.inputs[0] for g in all_graphs(graph) for n in g.nodes
            if is_onnx(n, "Shape", "Size") and n.inputs]


def _has_candidates(graph: gs.Graph, shapes: bool) -> bool:
    """Whether gs could fold anything: a Constant node (it becomes an initializer: one
    node less, and one form of constant for the passes after), a node whose inputs are
    all constants, or, with `shapes`, a Shape/Size of a tensor with at least one known
    dim. Checking first skips gs's export + onnxruntime round trip when nothing can fold."""
    for g in all_graphs(graph):
        for node in g.nodes:
            if not node.outputs:
                continue
            if node.op == "Constant":
                if "value" in node.attrs and not is_graph_output(g, node.outputs[0]):
                    return True
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
