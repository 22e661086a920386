"""`fold-constants`: evaluate every node whose inputs are all constants.

`f(c1, c2, ...) -> c` for constant inputs, plus `Shape(x) -> c` where x's shape is
static (and Shape->Gather / Shape->Slice on partly static shapes). What numpy computes
exactly (small shape arithmetic, `_fold_numpy`) is folded in numpy; the rest of each
graph's constant part in one onnxruntime session (`_fold_closure`), node by node where
onnxruntime fails on it, so that one node it cannot evaluate does not stop the rest
from folding (`_fold_eval`). `If` nodes with a constant condition are inlined.

`size-threshold` (bytes) keeps a node unfolded when its result would be larger,
so `Expand`/`Tile` of a constant is not materialised into a huge initializer
(default 16 MiB; 0 = no limit).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.graph import all_graphs, count_nodes, is_graph_output, is_onnx
from graphfix.graph.propagate import propagate_shapes
from graphfix.graph.prune import prune
from graphfix.graph.shapes import infer_shapes, reshape_dims, unnamed_dims_may_be_static
from graphfix.graph.walk import opset_of, tensor_map, toposort
from graphfix.passes._fold_closure import fold_closure, fold_node_exactly, lower_constant_nodes
from graphfix.passes._fold_eval import (
    excluded,
    fold_node_by_node,
    fold_shape,
    fold_static_shapes,
    inline_constant_ifs,
    scalar_range_inputs,
)
from graphfix.passes._shape_values import Dim as ShapeDim
from graphfix.passes._shape_values import evaluate as evaluate_shape_value
from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.runtime.work import runaway_loops

MAX_ROUNDS = 12
"""Rounds of shape folding and evaluation in one run (each after shape inference, node
by node or of the whole graph: `FoldConstants._rounds`)."""


@dataclass(frozen=True)
class FoldConstantsOptions:
    """`size-threshold`: largest folded tensor in bytes (0 = unlimited); `shapes`: fold Shape."""

    size_threshold: int = 16 * 1024 * 1024
    shapes: bool = True


class FoldConstants(Pass):
    """Replaces constant subexpressions by their values."""

    name = "fold-constants"
    annotates_shapes = True  # its shape inference
    summary = "Evaluate nodes whose inputs are all constant (size-limited) and fold static Shape."
    Options = FoldConstantsOptions
    leaves_graph_clean = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        from onnx_graphsurgeon.logger import G_LOGGER

        before = count_nodes(graph)
        annotated = 0  # tensors given a new shape or dtype (`PassResult.annotated`)
        if self.options.shapes and not ctx.shapes_inferred and any(
                t.shape is None for t in _shape_inputs(graph)):
            # Shape folds only where the graph knows the shape; exporters often write
            # none for intermediates (the manager gives the graph what inference found)
            annotated += infer_shapes(graph)
        refined = False  # symbolic shapes given to the graph as it is now
        if not _has_candidates(graph, self.options.shapes):
            may_fold, updated = (_refine_symbolically(graph, ctx.input_shapes)
                                 if self.options.shapes else (False, 0))
            annotated += updated
            if not may_fold:
                return PassResult(changed=False, annotated=annotated > 0, notes=[Note(
                    "graph", "no node has only constant inputs, and no Shape reads a "
                    "known dim")])
            refined = True
        toposort(graph)
        threshold = self.options.size_threshold or None
        runaway = runaway_loops(graph)  # refused by make_session, said in a note
        with G_LOGGER.suppress():
            shapes, inlined, updated = self._rounds(graph, threshold, ctx.rounds_follow)
            annotated += updated
            again = self.options.shapes and (shapes or not refined)
            may_fold, updated = (_refine_symbolically(graph, ctx.input_shapes)
                                 if again else (False, 0))
            annotated += updated
            if may_fold:
                more = self._rounds(graph, threshold, ctx.rounds_follow)
                shapes, inlined = shapes + more[0], inlined + more[1]
                annotated += more[2]
        if inlined and any(t.shape is None for t in _range_inputs(graph)):
            annotated += infer_shapes(graph)  # inlined If outputs have shapes now
        ranges = scalar_range_inputs(graph)
        if ranges:
            toposort(graph)
        folded = before - count_nodes(graph)
        # an inlined If whose branch is one node leaves the count as it was
        result = PassResult(changed=folded != 0 or shapes != 0 or inlined != 0
                            or bool(ranges), annotated=annotated > 0)
        result.notes += [Note(r, "Range read a 1-element tensor where ONNX wants a scalar: "
                              "reshaped to one (onnxruntime runs both alike)") for r in ranges]
        result.notes += [Note(loop.node, f"not folded: {loop.describe()}") for loop in runaway]
        if folded > 0:
            result.counts["folded nodes into constants"] = folded
        else:
            result.notes.append(Note("graph", "no node has only constant inputs"))
        return result

    def _rounds(self, graph: gs.Graph, threshold: int | None,
                rounds_follow: bool = False) -> tuple[int, int, int]:
        """Fold shapes and evaluate until no Shape folds (at most `MAX_ROUNDS`); returns
        how many Shapes folded, how many Ifs were inlined and how many tensors inference
        gave a new shape or dtype.

        A round that folded something gives the next its shapes by node-by-node inference
        from the tensors it made constant (`graph.propagate`), which also folds on the
        way the Shapes that get static dims and the shape arithmetic numpy computes
        (`_fold_on_the_way`); when a round finds nothing more to fold, one whole-graph
        inference decides whether the fixed point is reached (swin_t: 5 whole-graph
        inferences, 0.3 s, became 4 node-by-node ones and 1 whole-graph one; then seven
        rounds, 0.35 s, became three, 0.24 s)."""
        shapes = inlined = annotated = 0
        whole = True  # the shapes are those of a whole-graph inference
        for _ in range(MAX_ROUNDS):
            variables = _variables(graph)
            folded_shapes = fold_static_shapes(graph) if self.options.shapes else 0
            inlined += _evaluate(graph, threshold)
            prune(graph)
            shapes += folded_shapes
            if folded_shapes:
                # a Reshape whose target just became constant has a known output shape
                # now, which a Shape further down may read: fold again (one run is then
                # enough, as the pass contract asks)
                annotated += propagate_shapes(
                    graph, _now_constant(graph, variables),
                    functools.partial(_fold_on_the_way, threshold=threshold, read={}),
                    functools.partial(_reshaped, opset=opset_of(graph)))
                whole = False
            elif whole or rounds_follow:
                # in a preset's round the manager's inference at the round's end, and the
                # round after, decide the fixed point (`PassContext.rounds_follow`)
                break
            else:
                annotated += infer_shapes(graph)
                whole = True
        return shapes, inlined, annotated


def _fold_on_the_way(node: gs.Node, threshold: int | None, read: dict) -> list[gs.Tensor]:
    """What `propagate_shapes` folds as it goes: a Shape or Size whose dims are static now
    (or the Gather/Slice of one that reads only static dims), a node numpy computes
    exactly from constants (`fold_node_exactly`); the tensors that became constants."""
    made = fold_shape(node)
    if made or excluded(node) or any(True for _ in node.subgraphs()):
        return made
    if any(isinstance(v, gs.Node.AttributeRef) for v in node.attrs.values()):
        return []
    out = fold_node_exactly(node, threshold, read)  # None unless every input is constant
    return [out] if out is not None else []


def _reshaped(node: gs.Node, opset: int) -> list | None:
    """A Reshape's output dims from its target's entries (`_shape_values`): a known int,
    the dim of another tensor (its size or its name, as whole-graph inference's data
    propagation names it), None where not known; None when the target is not read or
    is a constant (ONNX's own inference has it then)."""
    data, target = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if target is None or isinstance(target, gs.Constant) or data.shape is None:
        return None
    value = evaluate_shape_value(target, opset)
    if isinstance(value, str) or value.scalar:
        return None
    entries: list = []
    for entry in value.entries:
        if isinstance(entry, int):
            entries.append(entry)
        elif isinstance(entry, ShapeDim) and entry.tensor.shape is not None and (
                entry.axis < len(entry.tensor.shape)):
            dim = entry.tensor.shape[entry.axis]
            entries.append(dim if isinstance(dim, (int, str)) and dim != -1 else None)
        else:
            entries.append(None)
    return reshape_dims(list(data.shape), entries, bool(node.attrs.get("allowzero", 0)))


def _variables(graph: gs.Graph) -> set[int]:
    """The ids of the main graph's variable tensors."""
    return {id(t) for t in tensor_map(graph).values() if isinstance(t, gs.Variable)}


def _now_constant(graph: gs.Graph, variables: set[int]) -> list[gs.Tensor]:
    """The main graph's tensors that were variables (`_variables`) and are constants now."""
    return [t for t in tensor_map(graph).values()
            if isinstance(t, gs.Constant) and id(t) in variables]


def _refine_symbolically(graph: gs.Graph, sizes: dict[str, tuple[int, ...]]
                         ) -> tuple[bool, int]:
    """Where a Shape still reads a dim that ONNX's inference leaves unnamed and that
    might be static (`unnamed_dims_may_be_static`), refine the shapes with onnxruntime's
    symbolic inference (dims computed by arithmetic, RAFT: `graph.shapes.
    symbolic_shapes`; not on graphs with bodies); whether a Shape may fold now, and how
    many tensors got a new shape or dtype. It runs after the folding ONNX's shapes allow,
    on the folded graph (swin_t: 810 nodes instead of 6,194)."""
    if any(True for _ in graph.subgraphs()) or not unnamed_dims_may_be_static(graph, sizes):
        return False, 0
    updated = infer_shapes(graph, symbolic=True)
    return _has_candidates(graph, shapes=True), updated


def _evaluate(graph: gs.Graph, threshold: int | None) -> int:
    """Fold every constant subexpression: all of them in one session per graph
    (`_fold_closure`), node by node where onnxruntime fails on that, then the If nodes
    whose condition is constant (returns how many Ifs were inlined)."""
    lower_constant_nodes(graph)
    try:
        fold_closure(graph, threshold, excluded)
    except Exception:  # noqa: BLE001 - onnxruntime cannot evaluate some part
        # evaluate node by node instead, then what is left (nodes with bodies, in the
        # graphs where that fails again: none)
        fold_node_by_node(graph, threshold)
        fold_closure(graph, threshold, excluded, error_ok=True)
    inlined = inline_constant_ifs(graph)
    if inlined:
        lower_constant_nodes(graph)
        fold_closure(graph, threshold, excluded, error_ok=True)  # the inlined branches
    return inlined


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
