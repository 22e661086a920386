"""Is a loaded ModelProto well formed enough for any command to work on it?

`check_wellformed` refuses (GraphfixError, exit 2) what no tool can make sense of and
what would otherwise surface deep inside a pass, onnxruntime or numpy as an internal
error or, worse, as a "successful" rewrite of a broken file:

- names that are not UTF-8 (protobuf hands them over as bytes);
- opset imports no ONNX release defines (default domain above the installed onnx's
  newest opset, or below 1);
- initializers without a valid data type, with negative dims, or whose data does not
  hold exactly the elements their dims declare (raw_data or typed fields);
- a tensor written by two nodes, a node output that shadows a graph input or
  initializer, a node input or graph output that nothing defines (scoping follows
  ONNX: a subgraph sees every name of the graphs around it);
- a cycle among the nodes of one graph (unsorted but acyclic graphs are fine);
- local functions that call themselves, directly or through others.

What a well-formed model may still lack (a valid op schema, runnable in onnxruntime,
shapes that agree) is for onnx.checker and the commands to report. The walk is
iterative: a model nesting If bodies thousands deep does not hit Python's recursion
limit here. External tensors are checked by `graphfix.io.load` before they are read.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import onnx
from onnx import TensorProto

from graphfix.errors import GraphfixError
from graphfix.graph.protos import proto_label, subgraphs
from graphfix.weights import PACKED_BITS, tensor_nbytes

_REEXPORT = "re-export the model from its framework; if it was edited by a script, fix " \
            "the script"
# Where each data type keeps its elements when it does not use raw_data, and how many
# field entries one element takes (complex: 2) or how many elements share one (4-bit).
_FIELDS = {
    TensorProto.FLOAT: ("float_data", 1), TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.INT64: ("int64_data", 1), TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1), TensorProto.STRING: ("string_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2), TensorProto.COMPLEX128: ("double_data", 2),
}
# Every other type (int8-int32, bool, float16, bfloat16, float8) keeps one element per
# int32_data entry.


def check_wellformed(model: onnx.ModelProto, where: str) -> None:
    """Raise GraphfixError naming the first defect found in `model` (loaded from
    `where`); see the module docstring for what is checked."""
    problem = _opset_problem(model) or _function_problem(model) or _graph_problem(model.graph)
    if problem:
        why, fix = problem
        raise GraphfixError(f"Cannot use '{where}': the model is malformed", why, fix)


def _opset_problem(model: onnx.ModelProto) -> tuple[str, str] | None:
    newest = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if isinstance(opset.domain, bytes):
            return "an opset import's domain is not UTF-8 text", _REEXPORT
        if opset.domain in ("", "ai.onnx") and not 1 <= opset.version <= newest:
            return (f"it imports ONNX opset {opset.version}, which no ONNX release defines "
                    f"(the installed onnx {onnx.__version__} knows opsets 1 to {newest})",
                    "export with an opset the installed onnx knows, or upgrade onnx if "
                    "the opset is newer")
    return None


def _function_problem(model: onnx.ModelProto) -> tuple[str, str] | None:
    """A local function that reaches itself through the functions it calls."""
    local = {(f.domain, f.name): f for f in model.functions}
    calls = {key: {(n.domain, n.op_type) for n in _function_nodes(f)} & local.keys()
             for key, f in local.items()}
    for start in calls:
        seen, todo = set(), deque(calls[start])
        while todo:
            key = todo.popleft()
            if key == start:
                return (f"the local function '{start[1]}' (domain '{start[0]}') calls itself"
                        ", directly or through other functions, so it has no finite "
                        "expansion", _REEXPORT)
            if key not in seen:
                seen.add(key)
                todo.extend(calls[key])
    return None


def _function_nodes(function: onnx.FunctionProto) -> Iterable[onnx.NodeProto]:
    todo = list(function.node)
    while todo:
        node = todo.pop()
        yield node
        for sub in subgraphs(node):
            todo.extend(sub.node)


def _graph_problem(main: onnx.GraphProto) -> tuple[str, str] | None:
    todo: list[tuple[onnx.GraphProto, frozenset[str], tuple[str, ...]]] = [
        (main, frozenset(), ())]
    while todo:
        graph, outer, path = todo.pop()
        nodes = _Nodes(graph)
        problem = _names_problem(graph, nodes, path) or _tensors_problem(graph, path)
        if problem:
            return problem
        problem, visible = _scope_problem(graph, nodes, outer, path)
        if problem:
            return problem
        problem = _cycle_problem(graph, nodes, path)
        if problem:
            return problem
        for inner, sub in nodes.bodies:
            todo.append((sub, visible, (*path, inner)))
    return None


class _Nodes:
    """What the checks read of a graph's nodes, read from protobuf once (each read of a
    repeated field makes a container object: swin_t's 6,285 nodes were read three times
    over, 40 of the 50 ms of loading it): each node's inputs and outputs, every name the
    nodes hold, and the bodies in their attributes."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.inputs: list[list[str]] = []
        self.outputs: list[list[str]] = []
        self.names: list = []  # str, or bytes where protobuf found no UTF-8
        self.bodies: list[tuple[str, onnx.GraphProto]] = []
        inputs, outputs, names = self.inputs.append, self.outputs.append, self.names
        for node in graph.node:
            ins, outs = list(node.input), list(node.output)
            inputs(ins)
            outputs(outs)
            names += ins
            names += outs
            names += (node.name, node.op_type, node.domain)
            for attr in node.attribute:
                names.append(attr.name)
                if attr.type == onnx.AttributeProto.GRAPH:
                    self.bodies.append((f"{proto_label(node)}.{attr.name}", attr.g))
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    self.bodies += [(f"{proto_label(node)}.{attr.name}", g)
                                    for g in attr.graphs]


def _where(path: tuple[str, ...]) -> str:
    return f" (in {' > '.join(path)})" if path else ""


def _names_problem(graph: onnx.GraphProto, nodes: _Nodes, path: tuple[str, ...]
                   ) -> tuple[str, str] | None:
    """Protobuf returns a string field holding invalid UTF-8 as bytes."""
    named = [*graph.input, *graph.output, *graph.value_info, *graph.initializer]
    names = [v.name for v in named] + nodes.names
    try:
        "".join(names)  # one pass in C; a bytes name raises
        return None
    except TypeError:
        pass
    for name in names:
        if isinstance(name, bytes):
            return (f"the name {name!r}{_where(path)} is not UTF-8 text, which ONNX requires "
                    "of every name", _REEXPORT)
    return None


def _tensors_problem(graph: onnx.GraphProto, path: tuple[str, ...]) -> tuple[str, str] | None:
    for tensor in graph.initializer:
        why = tensor_data_problem(tensor)
        if why:
            return f"initializer '{tensor.name}'{_where(path)} {why}", _REEXPORT
    return None


_DATA_TYPES = frozenset(TensorProto.DataType.values())
"""Every data type this onnx knows (protobuf builds the list anew on each `values()`:
6 us, once per initializer of a model)."""


def tensor_data_problem(tensor: TensorProto) -> str:
    """Why the tensor's data cannot be what its type and dims declare ("" if it can).
    External data is left to `graphfix.io.load`, which checks it before reading."""
    if tensor.data_type == TensorProto.UNDEFINED or tensor.data_type not in _DATA_TYPES:
        return f"has no valid data type (data_type {tensor.data_type})"
    if any(d < 0 for d in tensor.dims):
        return f"has negative dims {list(tensor.dims)}"
    if tensor.data_location == TensorProto.EXTERNAL or tensor.HasField("segment"):
        return ""
    count = math.prod(tensor.dims)
    if tensor.HasField("raw_data"):
        if tensor.data_type == TensorProto.STRING:
            return "is a string tensor with raw_data, which ONNX does not allow"
        need = tensor_nbytes(tensor)
        have = len(tensor.raw_data)
        if have != need:
            return (f"declares dims {list(tensor.dims)} ({count} elements, {need} bytes) "
                    f"but holds {have} bytes of data")
        return ""
    field, per = _FIELDS.get(tensor.data_type, ("int32_data", 1))
    have = len(getattr(tensor, field))
    need = count * per
    if tensor.data_type in PACKED_BITS:  # packed into int32_data, one byte per entry
        need = tensor_nbytes(tensor)
    if have != need:
        return (f"declares dims {list(tensor.dims)} ({count} elements) but holds {have} "
                f"values in {field}")
    return ""


def _scope_problem(graph: onnx.GraphProto, nodes: _Nodes, outer: frozenset[str],
                   path: tuple[str, ...]) -> tuple[tuple[str, str] | None, frozenset[str]]:
    """(problem, the names a subgraph of this graph sees)."""
    given = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    given |= {s.values.name for s in graph.sparse_initializer}
    produced: dict[str, int] = {}
    for i, outs in enumerate(nodes.outputs):
        for out in outs:
            if not out:
                continue
            if out in produced:
                return ((f"tensor '{out}'{_where(path)} is written by two nodes, "
                         f"{proto_label(graph.node[produced[out]])} and "
                         f"{proto_label(graph.node[i])}; a tensor has one producer in ONNX",
                         _REEXPORT), frozenset())
            if out in given:
                return ((f"{proto_label(graph.node[i])}{_where(path)} writes '{out}', which "
                         "is also a graph input or initializer", _REEXPORT), frozenset())
            produced[out] = i
    visible = outer | given | produced.keys()
    for i, ins in enumerate(nodes.inputs):
        for name in ins:
            if name and name not in visible:
                return ((f"{proto_label(graph.node[i])}{_where(path)} reads '{name}', which "
                         "no node, graph input or initializer defines", _REEXPORT),
                        frozenset())
    for out in graph.output:
        if out.name not in visible:
            return ((f"graph output '{out.name}'{_where(path)} is not defined by any node, "
                     "input or initializer", _REEXPORT), frozenset())
    return None, frozenset(visible)


def _cycle_problem(graph: onnx.GraphProto, nodes: _Nodes, path: tuple[str, ...]
                   ) -> tuple[str, str] | None:
    """Kahn's algorithm over the graph's own edges (outer names are always ready); a
    graph whose nodes read only what nodes before them wrote (every exporter's order)
    has no cycle, and is seen so in one pass."""
    outputs = nodes.outputs
    producer = {out: i for i, outs in enumerate(outputs) for out in outs if out}
    if _in_order(nodes.inputs, producer):
        return None
    waiting = [0] * len(outputs)
    readers: dict[int, list[int]] = {}
    for i, ins in enumerate(nodes.inputs):
        for name in set(ins):
            j = producer.get(name)
            if j is not None:
                waiting[i] += 1
                readers.setdefault(j, []).append(i)
    ready = deque(i for i, n in enumerate(waiting) if n == 0)
    done = 0
    while ready:
        j = ready.popleft()
        done += 1
        for i in readers.get(j, ()):
            waiting[i] -= 1
            if waiting[i] == 0:
                ready.append(i)
    if done == len(outputs):
        return None
    stuck = [proto_label(graph.node[i]) for i, n in enumerate(waiting) if n > 0]
    return (f"its nodes form a cycle{_where(path)}: {', '.join(stuck[:4])}"
            f"{' and more' if len(stuck) > 4 else ''} wait on each other's outputs, so no "
            "order runs them", _REEXPORT)


def _in_order(inputs: list[list[str]], producer: dict[str, int]) -> bool:
    """Whether every node reads only what a node before it wrote (or an outer name)."""
    at = producer.get
    for k, ins in enumerate(inputs):
        for name in ins:
            if at(name, -1) >= k:
                return False
    return True
