"""Whether two models compute the same thing, shown from the graphs alone.

Value numbering (hash-consing): every tensor of a main graph gets a number from what it
is, not what it is called. A graph input is its name; a constant (initializer or
Constant node) is its dtype, shape and a digest of its bytes; a node output is its
op, domain, attributes and the numbers of its inputs; an Identity's output is its
input. Numbers are interned in one table for both models, so two tensors have the same
number exactly when the same ops compute them from the same inputs and constants. Two
models whose graph outputs (names, element types, order) get the same numbers, with the
same inputs, opsets and functions, compute bitwise the same outputs in onnxruntime:
the kernels and their inputs are the same, only names, node order, dead nodes, Identity
nodes and duplicate constants or nodes differ (what cleanup, dedup-constants and
merge-duplicates change). The run's check uses it to skip running such a candidate
(`passes.manager`).

If/Loop/Scan bodies are numbered the same way inside their node: a body's inputs are
its parameters (numbered by depth and position, not name), what it reads from outer
scopes has the outer number, and the body's value is its parameter types and its
outputs' types and numbers; so two nodes with bodies that compute the same function
of the same values get the same number (Mask R-CNN's Loops and Ifs: three of its
verification runs, 1.8 s each, are shown instead).

Anything this does not model (sparse or string constants, type-valued attributes)
answers "not shown", never "different": the check then runs the model as before.
"""

from __future__ import annotations

import hashlib
from collections import ChainMap
from collections.abc import Callable, Mapping
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto

from graphfix import weights

_A = AttributeProto
_SCALAR = {_A.FLOAT: "f", _A.INT: "i", _A.STRING: "s"}
_LISTS = {_A.FLOATS: "floats", _A.INTS: "ints", _A.STRINGS: "strings"}


class _Unsupported(Exception):
    pass


class Digests:
    """Digests of tensors' bytes, kept for weights left in their file (one read per run)."""

    def __init__(self) -> None:
        self._by_reference: dict[tuple, bytes] = {}

    def of(self, tensor: TensorProto) -> tuple:
        if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            raise _Unsupported("a string tensor")
        if weights.is_deferred(tensor):
            ref = weights.reference(tensor)
            key = tuple(sorted(ref.items()))
            if key not in self._by_reference:
                self._by_reference[key] = _digest(weights.read_bytes(tensor))
            digest = self._by_reference[key]
        elif tensor.data_location == TensorProto.EXTERNAL:
            raise _Unsupported("external data not loaded")
        else:
            array = weights.to_array(tensor)
            digest = _digest(array.tobytes()) + array.dtype.str.encode()
        return ("const", tensor.data_type, tuple(tensor.dims), digest)


def same_computation(a: onnx.ModelProto, b: onnx.ModelProto, digests: Digests | None = None
                     ) -> bool:
    """Whether `a` and `b` are shown to compute bitwise the same outputs (module
    docstring); False when they differ or when this cannot tell."""
    digests = digests or Digests()
    try:
        if not _same_frame(a, b):
            return False
        table: dict[Any, int] = {}
        return _outputs(a, table, digests) == _outputs(b, table, digests)
    except _Unsupported:
        return False


def _same_frame(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    def opsets(m):
        return sorted((o.domain or "ai.onnx", o.version) for o in m.opset_import)

    def inputs(m):
        inits = {t.name for t in m.graph.initializer}
        return [(i.name, i.type.SerializeToString()) for i in m.graph.input
                if i.name not in inits]

    return (opsets(a) == opsets(b) and inputs(a) == inputs(b)
            and [f.SerializeToString() for f in a.functions]
            == [f.SerializeToString() for f in b.functions]
            and not a.graph.sparse_initializer and not b.graph.sparse_initializer)


def _outputs(model: onnx.ModelProto, table: dict, digests: Digests) -> list[tuple]:
    ids = _numbers(model.graph, table, digests, {"": _intern(table, ("none",))}, 0)
    return [(o.name, o.type.tensor_type.elem_type, _lookup(ids, o.name))
            for o in model.graph.output]


def _numbers(graph: onnx.GraphProto, table: dict, digests: Digests, outer: Mapping[str, int],
             depth: int) -> ChainMap:
    """The number of every tensor of `graph` (depth 0: the main graph; deeper: a body,
    which sees its outer scopes' tensors through `outer`)."""
    if graph.sparse_initializer:
        raise _Unsupported("sparse initializers")
    ids: ChainMap = ChainMap({}, outer)
    for k, value in enumerate(graph.input):
        # a body's inputs are its parameters: their position, not their name, says which
        key = ("input", value.name) if depth == 0 else (
            "parameter", depth, k, value.type.SerializeToString())
        ids[value.name] = _intern(table, key)
    for tensor in graph.initializer:  # an initializer overrides an input of its name
        ids[tensor.name] = _intern(table, digests.of(tensor))

    def body(g: onnx.GraphProto) -> tuple:
        inner = _numbers(g, table, digests, ids, depth + 1)
        return ("body", tuple(i.type.SerializeToString() for i in g.input),
                tuple((o.type.SerializeToString(), _lookup(inner, o.name)) for o in g.output))

    for node in graph.node:  # topologically sorted (the manager sorts before export)
        inputs = tuple(_lookup(ids, name) for name in node.input)
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and len(inputs) == 1:
            ids[node.output[0]] = inputs[0]
            continue
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            ids[node.output[0]] = _intern(table, _constant(node, digests))
            continue
        head = (node.domain or "ai.onnx", node.op_type, _attributes(node, digests, body),
                inputs)
        for k, name in enumerate(node.output):
            if name:
                ids[name] = _intern(table, (*head, k))
    return ids


def _lookup(ids: Mapping[str, int], name: str) -> int:
    if name not in ids:
        raise _Unsupported(f"'{name}' is read before it is made (not sorted, or outer scope)")
    return ids[name]


def _intern(table: dict, key: Any) -> int:
    return table.setdefault(key, len(table))


def _constant(node: onnx.NodeProto, digests: Digests) -> tuple:
    (attr,) = node.attribute
    if attr.type == _A.TENSOR:
        return digests.of(attr.t)
    return ("constant", attr.name, _attribute_value(attr, digests, _no_body))


def _attributes(node: onnx.NodeProto, digests: Digests, body: Callable) -> tuple:
    return tuple(sorted((a.name, a.type, _attribute_value(a, digests, body))
                        for a in node.attribute))


def _no_body(g: onnx.GraphProto) -> tuple:
    raise _Unsupported("a graph-valued Constant")


def _attribute_value(attr: AttributeProto, digests: Digests, body: Callable) -> Any:
    if attr.type == _A.FLOAT:
        return float(attr.f).hex()
    if attr.type in _SCALAR:
        return getattr(attr, _SCALAR[attr.type])
    if attr.type == _A.FLOATS:
        return tuple(float(f).hex() for f in attr.floats)
    if attr.type in _LISTS:
        return tuple(getattr(attr, _LISTS[attr.type]))
    if attr.type == _A.TENSOR:
        return digests.of(attr.t)
    if attr.type == _A.TENSORS:
        return tuple(digests.of(t) for t in attr.tensors)
    if attr.type == _A.GRAPH:
        return body(attr.g)
    if attr.type == _A.GRAPHS:
        return tuple(body(g) for g in attr.graphs)
    raise _Unsupported(f"attribute type {attr.type}")  # sparse tensors, type protos


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()
