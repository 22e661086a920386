"""Walking a graph and its subgraphs; a cheap structural fingerprint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

BODY_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
"""The ops of ONNX's own domain with graph attributes (an attribute a schema does not
declare makes the model invalid: onnx.checker and onnxruntime refuse it)."""
_DEFAULT_DOMAINS = (None, "", "ai.onnx")


def all_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
    """The graph, then every If/Loop/Scan body in it, recursively (depth first).

    Walks node attributes directly: gs's `subgraphs(recursive=True)` costs about
    ten times more on a 3,000-node graph, and passes call this often. Only the nodes
    that can have bodies are looked into: ONNX's If, Loop, Scan and SequenceMap, and
    every node of another domain (a custom op's graph attribute, ORT's BeamSearch);
    looking into every node's attributes was half a 7,000-node walk, 200 walks a run.
    """
    yield graph
    for node in graph.nodes:
        if node.op not in BODY_OPS and node.domain in _DEFAULT_DOMAINS:
            continue
        attrs = node.attrs
        if attrs:  # inlined `bodies`: a generator per node was a third of the walk
            for value in attrs.values():
                if isinstance(value, gs.Graph):
                    yield from all_graphs(value)
                elif type(value) is list and value and isinstance(value[0], gs.Graph):
                    for sub in value:
                        yield from all_graphs(sub)


def bodies(node: gs.Node) -> Iterator[gs.Graph]:
    """The node's graph-valued attributes (If branches, Loop and Scan bodies)."""
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            yield value
        elif isinstance(value, list) and value and isinstance(value[0], gs.Graph):
            yield from value


def names_in_use(graph: gs.Graph) -> set[str]:
    """Every tensor name in the graph and its subgraphs (what `fresh_name` must avoid)."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names.update(tensor_map(g))
    return names


def tensor_map(graph: gs.Graph) -> dict[str, gs.Tensor]:
    """onnx-graphsurgeon's `graph.tensors()` of one graph (not its bodies): the same
    tensors in the same order (graph inputs, node inputs and outputs, graph outputs; the
    last of a shared name; no empty names), without its check of each tensor against
    the one already under its name (a fifth of the time on 7,000 nodes)."""
    out: dict[str, gs.Tensor] = {}
    for t in graph.inputs:
        out[t.name] = t
    for node in graph.nodes:
        for t in node.inputs:
            out[t.name] = t
        for t in node.outputs:
            out[t.name] = t
    for t in graph.outputs:
        out[t.name] = t
    out.pop("", None)
    return out


def count_nodes(graph: gs.Graph) -> int:
    """Nodes in the graph and all its subgraphs."""
    return sum(len(g.nodes) for g in all_graphs(graph))


def node_label(node: gs.Node) -> str:
    """How notes and reports name a node: `Op 'name'`."""
    name = node.name or (node.outputs[0].name if node.outputs else "?")
    return f"{node.op} '{name}'"


def is_onnx(node: gs.Node, *ops: str) -> bool:
    """Whether the node is a standard ONNX op (gs gives the default domain as None or '')
    and, when `ops` are given, one of them."""
    return (node.domain or "") in ("", "ai.onnx") and (not ops or node.op in ops)


def producer_in(tensor: gs.Tensor, node_ids: set[int]) -> gs.Node | None:
    """The node among `node_ids` (a graph's nodes, by id) that writes `tensor`, if any."""
    if isinstance(tensor, gs.Constant) or len(tensor.inputs) != 1:
        return None
    producer = tensor.inputs[0]
    return producer if id(producer) in node_ids else None


def opset_of(graph: gs.Graph, domain: str = "") -> int:
    """The opset the graph imports for `domain` ('' = the default ONNX domain)."""
    if domain in ("", "ai.onnx"):
        return int(graph.opset)
    for d in graph.import_domains or []:
        if d.domain == domain:
            return int(d.version)
    return 0


def foreign_tensors(sub: gs.Graph) -> list[gs.Tensor]:
    """The tensors a body (and the bodies in it) reads from outside."""
    local: set[int] = set()
    read: dict[int, gs.Tensor] = {}
    for g in all_graphs(sub):
        local.update(id(t) for t in g.inputs)
        for node in g.nodes:
            local.update(id(t) for t in node.outputs)
            read.update((id(t), t) for t in node.inputs if t.name)
        read.update((id(t), t) for t in g.outputs)
    return [t for key, t in read.items() if key not in local]


def toposort(graph: gs.Graph) -> int:
    """Sort the nodes of the graph and of every body in it topologically; a graph that is
    sorted already keeps its order (the exporter's, usually program order). Returns how
    many graphs were reordered (by onnx-graphsurgeon's toposort, which orders by depth
    even a sorted graph, and costs 0.07 s a call on swin_t's 6,000 nodes; most graphs a
    pass leaves are sorted, so the check first is O(nodes))."""
    reordered = 0
    for g in list(all_graphs(graph)):
        if not _sorted(g):
            g.toposort(recurse_subgraphs=False)
            reordered += 1
    return reordered


def _sorted(g: gs.Graph) -> bool:
    """Whether every node comes after the nodes writing what it reads (its bodies' outer
    reads included)."""
    written = {id(t) for node in g.nodes for t in node.outputs}
    seen: set[int] = set()
    for node in g.nodes:
        reads = list(node.inputs)
        for sub in bodies(node) if node.attrs else ():
            reads += foreign_tensors(sub)
        if any(id(t) in written and id(t) not in seen for t in reads):
            return False
        seen.update(id(t) for t in node.outputs)
    return True


def fingerprint(graph: gs.Graph) -> tuple:
    """A structural fingerprint that changes whenever a pass edits the graph.

    It covers the opset imports, node identity, op, attributes, the identity of every input/output
    tensor and of every constant's value object, graph inputs/outputs, and the
    tensors' names, shapes and dtypes. It is O(nodes) and never reads weights, so
    it relies on the pass contract: passes replace arrays, never write into them.
    """
    parts: list[Any] = [
        ("opsets", graph.opset, tuple((d.domain, d.version) for d in graph.import_domains or ()))
    ]
    tensors: dict[int, gs.Tensor] = {}
    read: list[gs.Tensor] = []  # every node's inputs and outputs, in order, repeats kept
    append, collect = parts.append, read.extend
    for g in all_graphs(graph):
        append(("graph", id(g), _ids(g.inputs, tensors), _ids(g.outputs, tensors)))
        for node in g.nodes:  # the hot loop: inlined, plain attribute values as they are
            ins, outs, attrs = node.inputs, node.outputs, node.attrs
            collect(ins)
            collect(outs)
            append((id(node), node.op, node.name, node.domain, tuple(map(id, ins)),
                    tuple(map(id, outs)),
                    tuple([(k, v if type(v) in _PLAIN else _attr_key(v))
                           for k, v in attrs.items()]) if attrs else ()))
    tensors.update(zip(map(id, read), read, strict=True))  # one update, not 2 per node
    # each tensor's own state once, however many nodes read it; the shapes last, so that
    # `same_structure` can tell a pass that only annotated shapes
    values = tensors.values()
    append(tuple([_tensor_key(t) for t in values]))
    append(tuple([_shape_key(t) for t in values]))
    return tuple(parts)


_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
"""Attribute value types a fingerprint holds as they are (immutable)."""


def same_structure(a: tuple, b: tuple) -> bool:
    """Whether two fingerprints differ at most in tensor shapes (a pass that inferred shapes
    and rewrote nothing)."""
    return a[:-1] == b[:-1]


def _ids(ts: list[gs.Tensor], seen: dict[int, gs.Tensor]) -> tuple[int, ...]:
    ids = tuple(map(id, ts))
    seen.update(zip(ids, ts, strict=True))
    return ids


def _tensor_key(t: gs.Tensor) -> tuple:
    if isinstance(t, gs.Constant):
        return (id(t), t.name, id(t._values))
    return (id(t), t.name, t.dtype)  # compared with ==: a dtype or its type


def _shape_key(t: gs.Tensor) -> tuple | None:
    """A variable's shape; none for a constant, whose shape is its values' (the values
    object is in `_tensor_key`, and passes replace values, never reshape them)."""
    if isinstance(t, gs.Constant) or t.shape is None:
        return None
    return tuple(t.shape)


def _attr_key(value: Any) -> Any:
    if isinstance(value, (gs.Graph, gs.Tensor, np.ndarray)):
        return id(value)
    if isinstance(value, list):
        items = tuple(value)  # a copy: a later edit of the list must not edit the key
        if all(map(_PLAIN.__contains__, map(type, items))):
            return items
        return tuple(_attr_key(v) for v in items)
    return value


STANDARD_DOMAINS = ("", "ai.onnx")


def drop_unused_imports(graph: gs.Graph) -> int:
    """Drop opset imports of non-standard domains no live node uses (in any subgraph or
    local function); returns how many.

    gs's `import_domains` is the imported model's own `opset_import` container, so
    it is replaced by a new list, never edited in place.
    """
    if not graph.import_domains:
        return 0
    used = {n.domain or "" for g in all_graphs(graph) for n in g.nodes if n.outputs}
    for func in getattr(graph, "functions", None) or []:
        used.add(func.domain or "")
        used |= {n.domain or "" for n in func.nodes}
    keep = [d for d in graph.import_domains if d.domain in STANDARD_DOMAINS or d.domain in used]
    dropped = len(graph.import_domains) - len(keep)
    if dropped:
        graph.import_domains = [helper.make_opsetid(d.domain, d.version) for d in keep]
    return dropped
