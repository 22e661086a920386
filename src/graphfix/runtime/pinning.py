"""The run's output check across choices among near-ties: the original's choice, pinned.

A detector's proposals are a TopK of scores; with random weights (and often with real
ones) some scores near the cut tie to within rounding. A correct rewrite (fold-bn on
Faster R-CNN) changes their last bits, the TopK keeps another of the tied anchors, and
every box after it differs by whole boxes: the output check failed and rolled a correct
pass back (issue 18's report: Faster R-CNN). Thresholds do the same: a score compared
with 0.05, an RoI's pyramid level (Floor of a log) a rounding away from the next one.

Such a node is a *selection*: a main-graph TopK, ArgMax/ArgMin, NonMaxSuppression,
Floor/Ceil/Round, a comparison of floats, or a Cast from float to an integer or bool
type. The check sees each selection's computed inputs and its outputs in both runs
(`extra` outputs of the same runs, no copy of the model). When a rewrite's outputs fail
and a selection's inputs agree with the original's (the float bound; integers exactly)
while an output differs, and the rewritten model computes it with the same op,
attributes and constant inputs, it chose among values tied to within rounding: the
rewritten model is run again with that node cut out and the original's outputs fed in
its place (`pinned`), so what follows is computed from the same choice and judged
strictly, and what precedes it was judged by its inputs. New ties that the pinned run
shows (a threshold after the TopK) are pinned in turn, `MAX_PINS` runs at most. A
selection whose inputs differ is not a tie: the check fails as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix.graph.dtypes import np_dtype
from graphfix.graph.protos import node_reads
from graphfix.runtime.compare import compare_outputs

MAX_PINS = 3
"""Reruns of one rewritten model, each with more selections pinned."""

_ALWAYS = frozenset({"TopK", "ArgMax", "ArgMin", "NonMaxSuppression", "Floor", "Ceil",
                     "Round"})
_COMPARISONS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"})


@dataclass(frozen=True)
class Selection:
    """One selection node of the original's main graph (module docstring)."""

    label: str
    op: str
    attributes: bytes  # the node's attributes, serialized in order: compared as they are
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: tuple[tuple[int, np.ndarray], ...]  # (input position, value) of constants


def selections(model: onnx.ModelProto) -> list[Selection]:
    """The main graph's selection nodes (module docstring) whose outputs are all named."""
    constants = constants_of(model)
    shape_only = _shape_derived(model, constants)
    out = []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output or not all(node.output):
            continue
        if all(not name or name in shape_only for name in node.input):
            continue  # shape arithmetic: the same in any rewrite, whatever the weights
        # comparisons and Casts of integers are selections that never tie: their inputs
        # agree exactly whenever they do (exported models rarely declare which are floats)
        if not (node.op_type in _ALWAYS or node.op_type in _COMPARISONS or (
                node.op_type == "Cast" and _to_discrete(node))):
            continue
        fixed = tuple((i, constants[name]) for i, name in enumerate(node.input)
                      if name in constants)
        out.append(Selection(f"{node.op_type} '{node.name or node.output[0]}'", node.op_type,
                             _attributes(node), tuple(node.input), tuple(node.output), fixed))
    return out


def witnesses(model: onnx.ModelProto, found: Sequence[Selection]) -> list[str]:
    """The tensors of `found` (inputs a node computes, outputs) that `model`'s main graph
    computes (a pass may have merged or renamed one)."""
    produced = {name for node in model.graph.node for name in node.output}
    names = [name for s in found for name in (*s.inputs, *s.outputs) if name in produced]
    return list(dict.fromkeys(names))


def tied(found: Sequence[Selection], reference: Mapping[str, np.ndarray],
         candidate: Mapping[str, np.ndarray], model: onnx.ModelProto) -> list[Selection]:
    """The selections that chose among near-ties in `model` (the rewrite): an output
    differs while every input agrees and `model` computes it alike (module docstring)."""
    nodes = {node.output[0]: node for node in model.graph.node if node.output}
    constants = None
    out = []
    for s in found:
        node = nodes.get(s.outputs[0])
        if node is None or tuple(node.output) != s.outputs or not differing(
                s, reference, candidate):
            continue
        constants = constants_of(model) if constants is None else constants
        fixed = {i for i, _ in s.constants}
        if alike(s, node, constants) and all(
                _input_agrees(name, node.input[i], constants, reference, candidate)
                for i, name in enumerate(s.inputs) if i not in fixed):
            out.append(s)
    return out


def alike(s: Selection, node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> bool:
    """Whether `node` (of another model; `constants`: that model's, `constants_of`)
    computes `s`'s selection: the same op, attributes and number of inputs and outputs,
    and constants of the same values where `s` reads constants."""
    if node.op_type != s.op or len(node.output) != len(s.outputs) or (
            len(node.input) != len(s.inputs) or _attributes(node) != s.attributes):
        return False
    for index, value in s.constants:
        there = constants.get(node.input[index])
        if there is None or there.dtype != value.dtype or not np.array_equal(there, value):
            return False
    return True


def differing(s: Selection, reference: Mapping[str, np.ndarray],
              candidate: Mapping[str, np.ndarray]) -> list[str]:
    """The outputs of `s` whose values differ between the runs (what carries the choice)."""
    return [name for name in s.outputs if not _agree(name, reference, candidate)]


@dataclass(frozen=True)
class After:
    """What follows a model's selections (`after`): the indices of its main-graph nodes
    that read an output of one (directly, through other nodes, or in a body), and the
    tensors those nodes read that the other nodes compute (the boundary)."""

    nodes: frozenset[int]
    boundary: tuple[str, ...]


def after(model: onnx.ModelProto, found: Sequence[Selection]) -> After:
    """What follows `found` in `model` (`After`). A run that also returns the boundary
    lets a pinned run of the same model compute only what follows: everything before
    every selection would compute the same values again (Faster R-CNN: 395 of 2,006
    nodes, 55 % of a run's kernel time, fed 9 MB)."""
    sources = {name for s in found for name in s.outputs}
    producer: dict[str, int] = {}
    reads: list[list[str]] = []
    nodes: set[int] = set()
    for i, node in enumerate(model.graph.node):
        reads.append(node_reads(node))
        if sources.intersection(reads[-1]):
            nodes.add(i)
            sources.update(name for name in node.output if name)
        producer.update((name, i) for name in node.output if name)
    boundary = {name for i in nodes for name in reads[i]
                if name in producer and producer[name] not in nodes}
    return After(frozenset(nodes), tuple(sorted(boundary)))


def pinned(model: onnx.ModelProto, chosen: Sequence[Selection],
           reference: Mapping[str, np.ndarray], follows: After | None = None,
           upstream: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """`model` without the nodes computing `chosen` selections, whose outputs are graph
    inputs instead (to be fed the original's `reference` values). With `follows`
    (`after(model, ...)`) and `upstream` (a run of `model` that returned its boundary),
    only the nodes that follow the selections stay, the boundary is fed as inputs too,
    and graph outputs none of them computes are left out (the caller takes them from
    `upstream`). A copy: `model` is unchanged (deferred weights stay references)."""
    names = {n for s in chosen for n in s.outputs}
    fed = {n: reference[n] for s in chosen for n in s.outputs}
    keep = None
    if follows is not None and upstream is not None:
        keep = follows.nodes
        fed = {**{n: upstream[n] for n in follows.boundary if n not in names}, **fed}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    kept = [node for i, node in enumerate(graph.node)
            if not names.intersection(node.output) and (keep is None or i in keep)]
    del graph.node[:]
    graph.node.extend(kept)
    infos = [v for v in graph.value_info if v.name not in fed]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    graph.input.extend(
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in fed.items())
    if keep is not None:
        known = {n for node in kept for n in node.output} | {i.name for i in graph.input}
        outputs = [o for o in graph.output if o.name in known]
        del graph.output[:]
        graph.output.extend(outputs)
    return out


def can_cut(follows: After, run: Mapping[str, object]) -> bool:
    """Whether `run` returned every boundary tensor of `follows` as an array (a sequence
    or an optional cannot be fed as a graph input of a plain type)."""
    return all(isinstance(run.get(n), np.ndarray) for n in follows.boundary)


def _agree(name: str, reference: Mapping[str, np.ndarray],
           candidate: Mapping[str, np.ndarray]) -> bool:
    ref, cand = reference.get(name), candidate.get(name)
    if ref is None or cand is None:
        return False
    if ref.dtype.kind != "f":
        return ref.dtype == cand.dtype and np.array_equal(ref, cand)
    (diff,) = compare_outputs({name: ref}, {name: cand})
    return diff.ok


def _input_agrees(name: str, name_there: str, constants: Mapping[str, np.ndarray],
                  reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]
                  ) -> bool:
    """A non-constant input (the original's `name`, the rewrite's `name_there`) agrees:
    a computed tensor within the bound, or the same graph input (constants: `alike`)."""
    if not name:
        return not name_there
    if name in reference:
        return name_there == name and _agree(name, reference, candidate)
    return name_there == name and name_there not in constants  # a graph input


def constants_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The main graph's small constants (initializers, Constant nodes) by name (what
    `alike` compares)."""
    out = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and len(t.dims) <= 1 and (
                np.prod(t.dims, dtype=np.int64) <= 64):
            out[t.name] = numpy_helper.to_array(t)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.attribute and (
                node.attribute[0].name == "value"):
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def _shape_derived(model: onnx.ModelProto, constants: Mapping[str, np.ndarray]
                   ) -> set[str]:
    """Main-graph tensors computed from shapes and constants alone (Shape, Size and what
    only reads them and constants): they do not depend on the inputs' values, so no
    rewrite's rounding moves them between two runs of one model."""
    out = set(constants) | {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("Shape", "Size") or (
                node.input and all(not name or name in out for name in node.input)
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                            for a in node.attribute)):
            out.update(name for name in node.output if name)
    return out


def _to_discrete(node: onnx.NodeProto) -> bool:
    """A Cast to an integer or bool type."""
    dtype = np_dtype(next((a.i for a in node.attribute if a.name == "to"), 0))
    return dtype is not None and dtype.kind in "biu"


def _attributes(node: onnx.NodeProto) -> bytes:
    return b"".join(a.SerializeToString() for a in node.attribute)
