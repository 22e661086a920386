"""int64-to-int32: turn INT64 constants and graph inputs into INT32 where that is exact.

TensorRT up to 8.6 has no INT64 tensors: its ONNX parser casts INT64 down to INT32,
clamping values to +-INT_MAX (TensorRT data, `onnx_trt_operators.json`
`parser_behaviour_notes.INT64`; native INT64 from 9.0). This pass does that cast
itself where it is exact and valid ONNX, and says where it is not::

    c: INT64 constant, every value in INT32   -> c': INT32 constant, same values
    x: INT64 graph input        (inputs=true) -> x: INT32 graph input
    r = Op(t), Op needs INT64 there           -> r = Op(Cast(t, to=INT64))  (island with an input)
    y = f(t), y a graph output                -> y = Cast(f(t), to=INT64)   (same name and dtype)

ONNX ties types together: the inputs and outputs of a node that share a type
variable in its schema (`Add(A: T, B: T) -> C: T`) must have one type. The
tensors tied this way, across nodes and subgraphs, form a type island, and an
island changes type as a whole or not at all. An INT64 island becomes INT32 when

1. its sources are INT64 initializers and Constant nodes whose values all fit in
   INT32 and, with `inputs`, main-graph inputs; a tensor whose type an op fixes
   (Shape, NonZero, ArgMax, Cast...), a subgraph input, or the output of an op
   without an ONNX schema keeps the island INT64;
2. every op that computes an island tensor from it only selects or copies values
   (`_SELECTS`: Gather, Concat, Slice, Where, Max, Range...), so no value can
   leave INT32; arithmetic (Add, Mul...) could overflow INT32 where INT64 does not;
3. every reader accepts tensor(int32) at that input, by the schema of its op
   at the model's opset (and by onnx and onnxruntime in practice: Pad's `axes` is
   read only as INT64, `_READ_AS_INT64`), and no island tensor is a graph output. When the island
   has a graph input, readers that need INT64 and graph outputs get a Cast to
   INT64 instead (a constant keeps its INT64 original for them); an island of
   constants alone stays, since a Cast back would gain nothing.

Values outside INT32 are never truncated: their island stays INT64, and the note
names the tensor and the value. Every island that stays gets a note on each of its
constants and graph inputs; a converted graph input gets a note too, since the
model's interface changes (callers must feed INT32).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    fresh_name,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
    take_output,
)
from graphfix.graph.rewire import constant_value
from graphfix.passes.base import Note, Pass, PassContext, PassResult

_INT32 = np.iinfo(np.int32)
_NOTHING = "no INT64 initializers, Constant nodes or graph inputs"
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic
# Ops whose outputs hold only values taken from their inputs (or bounded by them,
# Range; 0 and 1, EyeLike), so an island through them cannot overflow INT32.
_SELECTS = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad", "Where", "Max",
    "Min", "ReduceMax", "ReduceMin", "Clip", "Relu", "TopK", "ScatterElements", "ScatterND",
    "Compress", "DepthToSpace", "SpaceToDepth", "Range", "Unique", "ReverseSequence", "Trilu",
    "EyeLike", "TensorScatter",
})
# Inputs whose schema allows tensor(int32) but that onnx's shape inference or
# onnxruntime read only as tensor(int64): converting them gives a model neither accepts
# ("ParseData type mismatch ... Expected:int64 Actual:int32"). (op, input index) -> why.
_READ_AS_INT64 = {
    ("Pad", 3): "as 'axes', which onnx's shape inference and onnxruntime read only as "
                "tensor(int64)",
    ("CenterCropPad", 1): "as 'shape', which onnxruntime's CenterCropPad expansion reads "
                          "only as tensor(int64)",
}


@dataclass(frozen=True)
class Int64ToInt32Options:
    """`inputs`: also convert INT64 graph inputs (changes the model's interface)."""

    inputs: bool = True


@dataclass
class _Reader:
    """A node input (or a graph output, node=None) reading an island tensor."""

    node: gs.Node | None
    index: int
    needs: str | None  # why it must read INT64; None when it accepts INT32
    graph: gs.Graph | None = None  # the graph whose output it is (node=None)


@dataclass
class _Typing:
    """Type islands of a graph and everything the rule needs to judge them."""

    parent: dict[int, int] = field(default_factory=dict)
    tensors: dict[int, gs.Tensor] = field(default_factory=dict)
    readers: dict[int, list[_Reader]] = field(default_factory=lambda: defaultdict(list))
    fixed: dict[int, str] = field(default_factory=dict)  # tensor -> why its type is fixed
    computed: dict[int, gs.Node] = field(default_factory=dict)  # follower -> its producer
    owner: dict[int, gs.Graph] = field(default_factory=dict)  # producer node -> its graph

    def find(self, t: gs.Tensor) -> int:
        key = id(t)
        self.tensors.setdefault(key, t)
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: gs.Tensor, b: gs.Tensor) -> None:
        self.parent[self.find(a)] = self.find(b)

    def islands(self) -> list[list[gs.Tensor]]:
        groups: dict[int, list[gs.Tensor]] = defaultdict(list)
        for t in list(self.tensors.values()):
            groups[self.find(t)].append(t)
        return list(groups.values())


class Int64ToInt32(Pass):
    """Convert INT64 initializers, Constant nodes and graph inputs to INT32 where exact.

    Handles initializers and Constant nodes (value, value_int, value_ints) in the
    main graph and in If/Loop/Scan bodies, outer tensors read inside bodies, and
    main-graph inputs (option `inputs`, default true). Readers are judged by the
    type constraints of their op's schema at the model's opset, per domain.

    Skips, with a note on each constant and input of the island: values outside
    INT32 (the note names the value), a type tied to a tensor an op computes as
    INT64, to a subgraph input, or to an op without a schema, arithmetic that could
    overflow, a reader that needs INT64 or a graph output in an island of constants
    alone, a graph input that is also a graph output, `inputs=false`.
    """

    name = "int64-to-int32"
    summary = "Convert INT64 constants and graph inputs to INT32 where values and readers allow"
    Options = Int64ToInt32Options

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        info = _analyse(graph)
        names = names_in_use(graph)
        names |= {n.name for g in all_graphs(graph) for n in g.nodes}
        inputs = {id(t) for t in graph.inputs}
        found = False
        for island in info.islands():
            sources = [t for t in island if _is_candidate(t, inputs)]
            if not sources:
                continue
            found = True
            why = _check(island, info, inputs, self.options.inputs)
            if why is not None:
                for t in sources:
                    result.notes.append(Note(t.name, _stays(t, *why)))
                continue
            _convert(graph, island, info, inputs, names, result)
        result.changed = bool(result.counts)
        if not found:
            result.notes.append(Note("graph", _NOTHING))
        return result


# ----------------------------------------------------------------------------- analysis


def _analyse(graph: gs.Graph) -> _Typing:
    """Walk every node of every graph: tie tensors by type variable, record readers."""
    info = _Typing()
    schemas: dict[tuple[str, str, int], onnx.defs.OpSchema | None] = {}
    for g in all_graphs(graph):
        for node in g.nodes:
            info.owner[id(node)] = g
            _tie_node(node, _schema(node, graph, schemas), info)
        for i, t in enumerate(g.outputs):
            owner = "the model" if g is graph else "a subgraph"
            info.find(t)
            info.readers[id(t)].append(_Reader(
                None, i, f"'{t.name}' is an output of {owner}, which keeps its dtype", g))
        if g is not graph:
            for t in g.inputs:
                info.fixed[id(t)] = f"'{t.name}' is an input of a subgraph, typed by its node"
    return info


def _schema(node: gs.Node, graph: gs.Graph, cache: dict) -> onnx.defs.OpSchema | None:
    domain = "" if is_onnx(node) else node.domain
    key = (node.op, domain, opset_of(graph, domain))
    if key not in cache:
        try:
            cache[key] = onnx.defs.get_schema(node.op, key[2], domain)
        except onnx.defs.SchemaError:
            cache[key] = None
    return cache[key]


def _tie_node(node: gs.Node, schema: onnx.defs.OpSchema | None, info: _Typing) -> None:
    """Tie the node's tensors by shared type variables; classify its readers and outputs."""
    label = node_label(node)
    if is_onnx(node, "Constant"):
        for t in node.outputs:
            info.find(t)
        return
    by_var: dict[str, list[gs.Tensor]] = defaultdict(list)
    for i, t in enumerate(node.inputs):
        if t.is_empty():
            continue
        var, accepts, why = _slot(schema, i, True)
        if accepts and is_onnx(node) and (node.op, i) in _READ_AS_INT64:
            accepts, why = False, _READ_AS_INT64[(node.op, i)]
        info.find(t)
        if var is not None:
            by_var[var].append(t)
        needs = None if accepts else f"{label} reads '{t.name}' {why}"
        info.readers[id(t)].append(_Reader(node, i, needs))
    bound = set(by_var)
    for j, t in enumerate(node.outputs):
        var, _, why = _slot(schema, j, False)
        info.find(t)
        if var is not None and var in bound:
            by_var[var].append(t)
            info.computed[id(t)] = node
        elif var is not None and _follows_first_input(node, schema):
            info.union(t, node.inputs[0])
            info.computed[id(t)] = node
        else:
            info.fixed[id(t)] = f"'{t.name}' is computed by {label}, which {why}"
    for tied in by_var.values():
        for t in tied[1:]:
            info.union(tied[0], t)


def _slot(schema: onnx.defs.OpSchema | None, index: int,
          is_input: bool) -> tuple[str | None, bool, str]:
    """(type variable or None, accepts INT32, why not) for one input or output of a node.

    The reason continues "Op 'n' reads 't' ..." for inputs and "'t' is computed by
    Op 'n', which ..." for outputs.
    """
    reads = "as" if is_input else ""
    if schema is None:
        return None, False, ("but " if is_input else "") + "has no ONNX schema"
    if any(all(not s.startswith("tensor(") for s in c.allowed_type_strs)
           for c in schema.type_constraints):
        return None, False, ("but " if is_input else "") + "ties types to sequences or optionals"
    formals = schema.inputs if is_input else schema.outputs
    variadic = bool(formals) and formals[-1].option == _VARIADIC
    if index >= len(formals) and not variadic:
        return None, False, ("beyond the inputs of its schema" if is_input
                             else "has more outputs than its schema")
    formal = formals[min(index, len(formals) - 1)]
    if not formal.is_homogeneous:
        return None, False, (f"as '{formal.name}', which must have the type its subgraph has"
                             if is_input else "gives it the type its subgraph has")
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    if formal.type_str not in allowed:
        return None, formal.type_str == "tensor(int32)", (
            f"{reads} '{formal.name}', which must be {formal.type_str}" if is_input
            else f"always computes it as {formal.type_str}")
    types = allowed[formal.type_str]
    if is_input and "tensor(int32)" not in types:
        which = f"must be {types[0]}" if len(types) == 1 else "takes no tensor(int32)"
        return formal.type_str, False, f"as '{formal.name}', which {which}"
    if len(types) == 1:
        return formal.type_str, True, f"always computes it as {types[0]}"
    return formal.type_str, True, "sets its type from an attribute"


def _follows_first_input(node: gs.Node, schema: onnx.defs.OpSchema | None) -> bool:
    """EyeLike-style ops: an unset optional `dtype` without default means the input's type."""
    attr = schema.attributes.get("dtype") if schema is not None else None
    return (
        attr is not None and not attr.required and attr.default_value.type == 0
        and "dtype" not in node.attrs and bool(node.inputs) and not node.inputs[0].is_empty()
    )


# ----------------------------------------------------------------------------- check


def _is_candidate(t: gs.Tensor, inputs: set[int]) -> bool:
    """An INT64 initializer, Constant node output or main-graph input."""
    if isinstance(t, gs.Constant):
        return t.dtype == np.int64
    if id(t) in inputs:
        return t.dtype == np.int64
    value = _const_node_value(t)
    return value is not None and value.dtype == np.int64


def _const_node_value(t: gs.Tensor) -> np.ndarray | None:
    if len(t.inputs) != 1 or not is_onnx(t.inputs[0], "Constant"):
        return None
    attrs = t.inputs[0].attrs
    if "value_ints" in attrs:
        return np.asarray(attrs["value_ints"], dtype=np.int64)
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"], dtype=np.int64)
    return constant_value(t) if isinstance(attrs.get("value"), gs.Constant) else None


def _value(t: gs.Tensor) -> np.ndarray:
    return constant_value(t) if isinstance(t, gs.Constant) else _const_node_value(t)


def _check(island: list[gs.Tensor], info: _Typing, inputs: set[int],
           convert_inputs: bool) -> tuple[gs.Tensor, str] | None:
    """None when the island may become INT32, else (tensor it is about, why not)."""
    has_input = False
    for t in island:
        why = _check_source(t, info, inputs, convert_inputs)
        if why:
            return t, why
        has_input = has_input or id(t) in inputs
    for t in island:
        for r in info.readers[id(t)]:
            if r.needs is None:
                continue
            if not has_input:
                return t, r.needs
            if r.node is None and not _is_const(t) and not _computed_in(t, info, r.graph):
                return t, f"'{t.name}' is an output of a subgraph that does not compute it"
    return None


def _check_source(t: gs.Tensor, info: _Typing, inputs: set[int],
                  convert_inputs: bool) -> str | None:
    """Why the island tensor `t` keeps its island INT64 by itself, or None."""
    if id(t) in inputs:
        if not convert_inputs:
            return f"'{t.name}' is a graph input, and inputs=false keeps the model's interface"
        if any(r.node is None for r in info.readers[id(t)]):
            return f"'{t.name}' is both a graph input and a graph output"
        return None
    if _is_const(t):
        value = _value(t)
        if value.size and (value.min() < _INT32.min or value.max() > _INT32.max):
            bad = int(value.max() if value.max() > _INT32.max else value.min())
            clamp = -_INT32.max if bad < 0 else _INT32.max
            return (f"'{t.name}' holds {bad}, which does not fit in INT32 "
                    f"(TensorRT <= 8.6 would clamp it to {clamp})")
        return None
    if id(t) in info.fixed:
        return info.fixed[id(t)]
    producer = info.computed.get(id(t))
    if producer is None:
        return f"'{t.name}' is not computed by any node"
    if producer.op not in _SELECTS:
        return (f"{node_label(producer)} computes '{t.name}' by arithmetic, "
                "which could overflow INT32 where INT64 does not")
    return None


def _is_const(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant) or _const_node_value(t) is not None


def _computed_in(t: gs.Tensor, info: _Typing, g: gs.Graph | None) -> bool:
    """Whether `t` is computed by a node of `g` (so a Cast there can take its place)."""
    producer = info.computed.get(id(t))
    return producer is not None and info.owner[id(producer)] is g


def _stays(t: gs.Tensor, about: gs.Tensor, why: str) -> str:
    if about is t:
        return f"stays INT64: {why}"
    return f"stays INT64: its type is tied to '{about.name}', and {why}"


# ----------------------------------------------------------------------------- rewrite


def _convert(graph: gs.Graph, island: list[gs.Tensor], info: _Typing, inputs: set[int],
             names: set[str], result: PassResult) -> None:
    """Make the island INT32; Casts to INT64 where a reader or a graph output needs it."""
    for t in island:
        readers = info.readers[id(t)]
        needing = [r for r in readers if r.needs is not None and r.node is not None]
        is_output = any(r.node is None for r in readers)
        if id(t) in inputs:
            t.dtype = np.int32
            result.counts["converted INT64 graph inputs to INT32"] += 1
            result.notes.append(Note(t.name, "graph input is now INT32: the model's interface "
                                             "changed, so callers must feed INT32"))
        elif _is_const(t):
            _convert_constant(t, readers, names, result)
            continue
        elif t.dtype is not None:
            t.dtype = np.int32
        wide = t
        if is_output:
            wide = _cast_output(t, info, names)
            result.counts["inserted Cast to INT64 before a graph output"] += 1
        elif needing:
            g = info.owner[id(t.inputs[0])] if t.inputs else graph
            wide = _cast(g, t, fresh_name(f"{t.name}_int64", names), names)
        for r in needing:
            r.node.inputs[r.index] = wide
        if needing:
            result.counts["inserted Cast to INT64 before an op that needs INT64"] += len(needing)


def _convert_constant(t: gs.Tensor, readers: list[_Reader], names: set[str],
                      result: PassResult) -> None:
    """Readers that accept INT32 read an INT32 copy; the others keep the INT64 original."""
    narrow = _value(t).astype(np.int32)
    keeps = [r for r in readers if r.needs is not None]
    if isinstance(t, gs.Constant):
        result.counts["converted INT64 initializers to INT32"] += 1
        name = fresh_name(f"{t.name}_int32", names) if keeps else t.name
        new = gs.Constant(name, narrow)
    else:
        result.counts["converted INT64 Constant nodes to INT32"] += 1
        if not keeps:
            t.inputs[0].attrs = {"value": gs.Constant(t.name, narrow)}
            t.dtype = np.int32
            return
        new = gs.Constant(fresh_name(f"{t.name}_int32", names), narrow)
    for r in readers:
        if r.needs is None:
            r.node.inputs[r.index] = new


def _cast(g: gs.Graph, source: gs.Tensor, out_name: str, names: set[str]) -> gs.Variable:
    """Append `Cast(source, to=INT64)` to `g`; returns its output."""
    out = gs.Variable(out_name, np.int64, source.shape)
    name = fresh_name(f"{source.name}_to_int64", names)
    g.nodes.append(gs.Node("Cast", name, {"to": onnx.TensorProto.INT64}, [source], [out]))
    return out


def _cast_output(t: gs.Tensor, info: _Typing, names: set[str]) -> gs.Tensor:
    """The output `t` keeps its name and INT64: its producer writes an INT32 tensor, cast back."""
    producer = info.computed[id(t)]
    narrow = gs.Variable(fresh_name(f"{t.name}_int32", names), np.int32, t.shape)
    take_output(producer, t, narrow)
    g = info.owner[id(producer)]
    node = gs.Node("Cast", fresh_name(f"{t.name}_to_int64", names), {"to": onnx.TensorProto.INT64},
                   [narrow], [t])
    g.nodes.append(node)
    t.dtype = np.int64
    return t
