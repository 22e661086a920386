"""dedup-constants: let every reader of a duplicated constant read one copy.

Within one graph, with `c1` the first of a set of constants in node order that
have the same dtype, shape and bytes::

    op(..., c_k, ...) -> op(..., c1, ...)                 (initializers c_k == c1)
    op(..., Constant<v>(), ...) -> op(..., y1, ...)       (y1 = the first Constant<v>() output)

"Identical" is bitwise: same dtype, same shape, same bytes. So `0.0` and `-0.0`
differ, and NaN arrays are shared only when their bit patterns match. Constants
are grouped by (dtype, shape) first, which needs no weight; only groups with
more than one member are read, hashed (BLAKE2b) and, on a hash hit, compared
byte for byte. A model whose weights all differ in dtype or shape is never read.
Weights are read without caching (`constant_value`), so constants that are not
shared stay untouched for the manager's change detection.

Scope: each graph (the main graph, each If/Loop/Scan body) is deduplicated on
its own, and only the inputs of that graph's own nodes are rewired. A
subgraph's pool holds the constants its nodes read, including those of an
enclosing graph (onnx-graphsurgeon exports them as initializers of the
subgraph too), so a keeper is always in scope where it is read. Nothing is
moved across graph boundaries.

Initializers and Constant nodes are pooled separately (fold-constants turns
Constant nodes into initializers, so run it first to share across both).
The duplicates are left unread; `cleanup` removes them.

Each duplicate redirected to its keeper is one rewrite for a rewrite budget
(`PassContext.allow_rewrite`): a duplicate left alone changes no other pair.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import SparseValues
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import weights
from graphfix.graph import all_graphs, constant_value, is_onnx, node_label, replace_in
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult

SHARED_INITIALIZERS = "shared identical initializers"
SHARED_CONSTANT_NODES = "shared identical Constant nodes"

# Constant-node attributes other than `value`: (numpy dtype, rank).
_LIST_ATTRS = {
    "value_float": (np.float32, 0),
    "value_floats": (np.float32, 1),
    "value_int": (np.int64, 0),
    "value_ints": (np.int64, 1),
}
_UNREAD_ATTRS = ("value_string", "value_strings", "sparse_value")


@dataclass(frozen=True)
class DedupConstantsOptions:
    """`min-elements`: constants with fewer elements are left alone (default 1).

    The default shares everything but empty tensors: exporters duplicate scalars
    and small shape vectors (Reshape targets, Unsqueeze axes, 0 and 1) most of
    all, and grouping by (dtype, shape) keeps reading them cheap. Raise it to
    share only weights.
    """

    min_elements: int = 1


@dataclass(frozen=True)
class _Candidate:
    """One constant that may be shared: `item` is a gs.Constant or a Constant node."""

    item: Any
    key: tuple
    read: Callable[[], np.ndarray]
    sample: Callable[[], bytes | None] | None = None  # a few windows of the bytes, not all


class DedupConstants(Pass):
    """Share identical initializers and identical Constant nodes within each graph.

    Handles: initializers (lazily loaded or in memory, any dtype onnx-graphsurgeon
    loads, bfloat16 and float8 included), Constant nodes with `value`,
    `value_float(s)` or `value_int(s)`, constants read inside If/Loop/Scan bodies
    (each body deduplicated on its own), a node reading two duplicates. The first
    constant in node order is kept.

    Skips, with a note: a constant that is a graph output (it keeps its name and
    tensor), a sparse initializer, string constants, and Constant nodes whose
    value onnx-graphsurgeon does not expose (`value_string(s)`, `sparse_value`).
    Constants with fewer than `min-elements` elements are not considered.
    """

    name = "dedup-constants"
    keeps_computation = True
    summary = "Share identical initializers and Constant nodes (same dtype, shape, bytes)."
    Options = DedupConstantsOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        with G_LOGGER.suppress():
            for g in all_graphs(graph):
                self._share_initializers(g, ctx, result)
                self._share_constant_nodes(g, ctx, result)
        result.changed = bool(result.counts)
        if not result.changed and not any(n.reason == LIMIT_REACHED for n in result.notes):
            result.notes.append(Note("graph", (
                f"no two constants with at least {self.options.min_elements} element(s) "
                "in the same graph have the same dtype, shape and bytes"
            )))
        return result

    def _share_initializers(self, g: gs.Graph, ctx: PassContext, result: PassResult) -> None:
        candidates = _initializer_candidates(g, self.options.min_elements, result.notes)
        keeper_of = {}
        for keep, dup in _duplicates(candidates):
            subject = f"initializer '{dup.item.name}'"
            if ctx.allow_rewrite(self.name, f"{subject} as '{keep.item.name}'"):
                keeper_of[id(dup.item)] = keep.item
            else:
                result.notes.append(Note(subject, LIMIT_REACHED))
        if not keeper_of:
            return
        for node in g.nodes:
            for i, tensor in enumerate(node.inputs):
                if id(tensor) in keeper_of:
                    node.inputs[i] = keeper_of[id(tensor)]
        result.counts[SHARED_INITIALIZERS] += len(keeper_of)

    def _share_constant_nodes(self, g: gs.Graph, ctx: PassContext, result: PassResult) -> None:
        candidates = _constant_node_candidates(g, self.options.min_elements, result.notes)
        for keep, dup in _duplicates(candidates):
            label = f"{node_label(dup.item)} as {node_label(keep.item)}"
            if not ctx.allow_rewrite(self.name, label):
                result.notes.append(Note(node_label(dup.item), LIMIT_REACHED))
                continue
            kept, gone = keep.item.outputs[0], dup.item.outputs[0]
            # Readers may sit in nested bodies; the keeper's output is in scope there too.
            for consumer in list(gone.outputs):
                replace_in(consumer.inputs, gone, kept)
            result.counts[SHARED_CONSTANT_NODES] += 1


# ----------------------------------------------------------------------------- candidates


def _initializer_candidates(g: gs.Graph, min_elements: int, notes: list[Note]) -> list[_Candidate]:
    """The constants read by `g`'s own nodes, in the order they are first read."""
    outputs = {id(t) for t in g.outputs}
    seen: set[int] = set()
    candidates = []
    for node in g.nodes:
        for tensor in node.inputs:
            if not isinstance(tensor, gs.Constant) or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            values = tensor._values  # the value object itself: no load, no caching
            if math.prod(values.shape) < min_elements:
                continue
            reason = _initializer_skip(tensor, values, outputs)
            if reason:
                notes.append(Note(f"initializer '{tensor.name}'", reason))
                continue
            key = (_dtype_key(values.dtype), _dtype_key(tensor.export_dtype), _shape(values))
            candidates.append(_Candidate(tensor, key, _reader(tensor), _sampler(values)))
    return candidates


def _initializer_skip(tensor: gs.Constant, values: Any, outputs: set[int]) -> str | None:
    if id(tensor) in outputs:
        return "it is a graph output, so it keeps its own name"
    if isinstance(values, SparseValues):
        return "it is a sparse initializer, which this pass does not compare"
    if _is_text(values.dtype):
        return "it holds strings, which this pass does not compare"
    return None


def _constant_node_candidates(
    g: gs.Graph, min_elements: int, notes: list[Note]
) -> list[_Candidate]:
    """The live Constant nodes of `g` whose value can be read, in node order."""
    outputs = {id(t) for sub in all_graphs(g) for t in sub.outputs}
    candidates = []
    for node in g.nodes:
        if not is_onnx(node, "Constant") or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if id(out) in outputs:
            notes.append(Note(node_label(node), "its output is a graph output, so it keeps it"))
            continue
        if not out.outputs:  # dead: cleanup removes it
            continue
        found = _node_value(node)
        if isinstance(found, str):
            notes.append(Note(node_label(node), found))
            continue
        key, read = found
        if math.prod(key[2]) >= min_elements:
            candidates.append(_Candidate(node, key, read))
    return candidates


def _node_value(node: gs.Node) -> tuple[tuple, Callable[[], np.ndarray]] | str:
    """A Constant node's (dtype, dtype, shape) key and value reader, or why it has none."""
    value = node.attrs.get("value")
    if isinstance(value, gs.Constant):
        values = value._values
        if isinstance(values, SparseValues) or _is_text(values.dtype):
            return "its value is sparse or holds strings, which this pass does not compare"
        key = (_dtype_key(values.dtype), _dtype_key(value.export_dtype), _shape(values))
        return key, _reader(value)
    for attr, (dtype, rank) in _LIST_ATTRS.items():
        if attr in node.attrs and not isinstance(node.attrs[attr], gs.Node.AttributeRef):
            array = np.asarray(node.attrs[attr], dtype=dtype)
            if array.ndim != rank:
                return f"its {attr} attribute has rank {array.ndim}, not {rank}"
            name = _dtype_key(array.dtype)
            return (name, name, array.shape), lambda array=array: array
    if any(attr in node.attrs for attr in _UNREAD_ATTRS):
        return "its value is sparse or holds strings, which this pass does not compare"
    return "it has no value attribute this pass can read"


# ----------------------------------------------------------------------------- matching


def _duplicates(candidates: Iterable[_Candidate]) -> list[tuple[_Candidate, _Candidate]]:
    """(keeper, duplicate) pairs; the keeper is the earliest identical candidate.

    Only (dtype, shape) groups with two or more members are read, one at a time.
    A hash hit is confirmed byte for byte before it counts; a keeper's bytes are
    read again and held only once it has a hit, so memory stays near the size of
    the duplicated constants, not of the whole group.
    """
    groups: dict[tuple, list[_Candidate]] = defaultdict(list)
    for candidate in candidates:
        groups[candidate.key].append(candidate)
    pairs = []
    for members in (sub for group in groups.values() for sub in _by_sample(group)):
        if len(members) < 2:
            continue
        # digest -> [keeper, its bytes once a hash hit needed them, else None]
        keepers: dict[bytes, list[list]] = defaultdict(list)
        for candidate in members:
            data = _bytes(candidate.read())
            digest = hashlib.blake2b(data, digest_size=16).digest()
            keeper = None
            for entry in keepers[digest]:
                if entry[1] is None:
                    entry[1] = _bytes(entry[0].read())
                if _same_bytes(entry[1], data):
                    keeper = entry[0]
                    break
            if keeper is None:
                keepers[digest].append([candidate, None])
            else:
                pairs.append((keeper, candidate))
    return pairs


def _by_sample(members: list[_Candidate]) -> list[list[_Candidate]]:
    """`members` split by their samples (weights left in their file: a few windows read
    instead of the whole tensor), order kept; one group when any member has no sample
    (it could equal any of them)."""
    if len(members) < 2 or any(m.sample is None for m in members):
        return [members]
    split: dict[bytes, list[_Candidate]] = defaultdict(list)
    for member in members:
        taken = member.sample()
        if taken is None:  # no raw bytes to sample after all
            return [members]
        split[taken].append(member)
    return list(split.values())


def _sampler(values: Any) -> Callable[[], bytes | None] | None:
    """Samples of a weight's raw bytes (`graphfix.weights.sample`: a deferred weight's
    file read in a few windows; an inline one's proto or array sliced), or None where the
    value has no such bytes. fold-bn's 2,000 new 36 KB weights of synthetic_1000 (one
    dtype and shape) were all hashed whole in the round after it: 144 ms -> 77 ms."""
    if isinstance(values, np.ndarray):
        return lambda: weights.sample(values)
    known = getattr(values, "sample", None)  # taken as it was spilled (`graph.convert`)
    if isinstance(known, bytes):
        return lambda: known
    tensor = getattr(values, "tensor", None)
    if tensor is None:
        return None
    return lambda: weights.sample(tensor)


def _reader(constant: gs.Constant) -> Callable[[], np.ndarray]:
    """Reads the constant's value without caching it on the gs object."""

    def read() -> np.ndarray:
        value = constant_value(constant)
        assert value is not None  # a gs.Constant always has a value
        return value

    return read


def _bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).tobytes()


def _same_bytes(a: bytes, b: bytes) -> bool:
    """Bitwise equality: -0.0 differs from 0.0, NaNs are equal only with equal bits."""
    return np.array_equal(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


@functools.cache
def _dtype_key(dtype: Any) -> tuple:
    """A hashable dtype: numpy's name and byte layout, or the ONNX type number gs kept
    (once per dtype: numpy makes the name anew each time it is asked).

    The name separates ml_dtypes types that share a layout ('<V1' for every float8).
    """
    if isinstance(dtype, (np.dtype, type)):
        d = np.dtype(dtype)
        return (d.name, d.str)
    return ("onnx", int(dtype))


def _is_text(dtype: Any) -> bool:
    return isinstance(dtype, (np.dtype, type)) and np.dtype(dtype).kind in "OSU"


def _shape(values: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in values.shape)
