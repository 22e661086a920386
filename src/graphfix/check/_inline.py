"""Making If-branch tensors comparable: inline the branch each sample takes.

An ONNX graph output can only name a main-graph tensor, so a tensor inside an If
branch cannot be read from onnxruntime as it stands. For each sample the If's
condition is read (one run with the conditions exposed); samples that take the same
branches form a group, and for each group a copy of the model is made in which every
main-graph If is replaced by the nodes of the branch it takes:

    If(cond) {then: A -> B -> t_out}  ==>  A -> B -> t_out -> Identity -> if_out

The branch's tensor names are kept (so they match between the reference and the
candidate), its initializers move to the main graph, and each If output is an
Identity of the branch output, so the If output keeps its name and its producer
stays the If node. Ifs inside an inlined branch are handled the same way, a level at
a time. Loop and Scan bodies run a variable number of times and are not inlined.

What users see: a branch node is labelled with its path, as `graph.protos` does
everywhere (`If 'sel'.then_branch > Conv 'c'`); the If's outputs are labelled by the
If itself (`If 'sel'`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from graphfix import weights
from graphfix.graph.protos import node_reads, proto_label, subgraphs

MAX_IF_DEPTH = 8  # nesting levels of If inlined; deeper Ifs stay (their tensors uncompared)


@dataclass(frozen=True)
class Producer:
    """The node that produces a main-graph tensor, as users see it.

    `key` is what calibrate's --exclude-nodes takes (the node name, else its first
    output); `inputs` are the tensors it reads, including names its subgraphs read
    from the outer scope."""

    label: str
    op: str
    key: str
    inputs: tuple[str, ...]


@dataclass
class Prepared:
    """A model (possibly with Ifs inlined) and the producer of each of its tensors."""

    model: onnx.ModelProto
    producers: dict[str, Producer]


@dataclass
class Group:
    """Samples (indices into the feeds) that take the same If branches in both models."""

    reference: Prepared
    candidate: Prepared
    samples: list[int]
    notes: list[str] = field(default_factory=list)


def node_key(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def prepare(model: onnx.ModelProto) -> Prepared:
    producers = {}
    for node in model.graph.node:
        info = Producer(proto_label(node), node.op_type, node_key(node),
                        tuple(node_reads(node)))
        producers.update({o: info for o in node.output if o})
    return Prepared(model, producers)


def topo_order(model: onnx.ModelProto) -> dict[str, int]:
    """Position of every tensor a comparison can show: graph inputs, then node outputs
    in node order, an If's branch tensors (then, else) just before the If's outputs."""
    order: dict[str, int] = {}
    for vi in model.graph.input:
        order.setdefault(vi.name, len(order))

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type == "If":
                for attr in ("then_branch", "else_branch"):
                    walk(next(a.g for a in node.attribute if a.name == attr))
            for o in node.output:
                if o:
                    order.setdefault(o, len(order))

    walk(model.graph)
    return order


def hidden_tensors(model: onnx.ModelProto) -> int:
    """How many tensors live in Loop/Scan bodies (never compared)."""
    count = 0

    def walk(graph: onnx.GraphProto, hidden: bool) -> None:
        nonlocal count
        for node in graph.node:
            if hidden:
                count += sum(1 for o in node.output if o)
            for sub in subgraphs(node):
                walk(sub, hidden or node.op_type != "If")

    walk(model.graph, False)
    return count


Runner = Callable[[onnx.ModelProto, list[str], int, str], list[np.ndarray]]


def split_by_branches(reference: Prepared, candidate: Prepared, samples: list[int],
                      run: Runner, depth: int = 0) -> list[Group]:
    """Groups of samples with every main-graph If of both models inlined (module
    docstring). `run(model, names, sample, which)` returns the named tensors of one
    sample ("reference" or "candidate" says which model it is, for errors); it is
    called for the condition tensors only."""
    ref_ifs = _if_indices(reference.model)
    cand_ifs = _if_indices(candidate.model)
    if not ref_ifs and not cand_ifs:
        return [Group(reference, candidate, samples)]
    if depth >= MAX_IF_DEPTH:
        note = (f"If nodes nested deeper than {MAX_IF_DEPTH} levels were not inlined; "
                "the tensors inside them are not compared")
        return [Group(reference, candidate, samples, [note])]
    keys: dict[tuple, list[int]] = {}
    for s in samples:
        key = (_conditions(reference.model, ref_ifs, s, run, "reference"),
               _conditions(candidate.model, cand_ifs, s, run, "candidate"))
        keys.setdefault(key, []).append(s)
    groups = []
    for (ref_key, cand_key), members in keys.items():
        ref = _inline_all(reference, ref_ifs, ref_key)
        cand = _inline_all(candidate, cand_ifs, cand_key)
        groups.extend(split_by_branches(ref, cand, members, run, depth + 1))
    return groups


def _if_indices(model: onnx.ModelProto) -> list[int]:
    return [i for i, n in enumerate(model.graph.node) if n.op_type == "If"]


def _conditions(model: onnx.ModelProto, ifs: Sequence[int], sample: int,
                run: Runner, which: str) -> tuple[bool, ...]:
    if not ifs:
        return ()
    graph = model.graph
    names = [graph.node[i].input[0] for i in ifs]
    consts = {t.name: weights.to_array(t) for t in graph.initializer if t.name in names}
    wanted = [n for n in dict.fromkeys(names) if n not in consts]
    values = dict(zip(wanted, run(model, wanted, sample, which), strict=True)) if wanted else {}
    values.update(consts)
    return tuple(bool(np.asarray(values[n]).reshape(-1)[0]) for n in names)


def _inline_all(prepared: Prepared, ifs: Sequence[int], taken: Sequence[bool]) -> Prepared:
    if not ifs:
        return prepared
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    producers = dict(prepared.producers)
    for index, branch in sorted(zip(ifs, taken, strict=True), reverse=True):
        _inline_one(model.graph, index, branch, producers)
    return Prepared(model, producers)


def _inline_one(graph: onnx.GraphProto, index: int, then: bool,
                producers: dict[str, Producer]) -> None:
    """Replace the If at graph.node[index] by the nodes of its taken branch, in place."""
    node = graph.node[index]
    attr = "then_branch" if then else "else_branch"
    branch = onnx.GraphProto()
    branch.CopyFrom(next(a.g for a in node.attribute if a.name == attr))
    if_info = producers.get(node.output[0]) if node.output else None
    if_label = if_info.label if if_info else proto_label(node)
    new_nodes = list(branch.node)
    prefix = f"{if_label}.{attr}"
    for inner in new_nodes:
        info = Producer(proto_label(inner, (prefix,)), inner.op_type, node_key(inner),
                        tuple(node_reads(inner)))
        producers.update({o: info for o in inner.output if o})
    for k, (src, dst) in enumerate(zip(branch.output, node.output, strict=False)):
        if dst and dst != src.name:
            new_nodes.append(helper.make_node("Identity", [src.name], [dst],
                                              name=f"{node_key(node)}/output_{k}"))
            producers[dst] = Producer(if_label, "If", node_key(node), (src.name,))
    graph.initializer.extend(branch.initializer)
    graph.sparse_initializer.extend(branch.sparse_initializer)
    rest = list(graph.node[index + 1:])
    del graph.node[index:]
    graph.node.extend(new_nodes + rest)
