"""Lowering by function body: a node replaced by the nodes ONNX defines its op with.

    Op(inputs){attributes} -> the body of onnx.defs.get_schema(Op, opset) for this node

ONNX defines many ops by a function body; a context-dependent one is built for the node
(its attributes, which optional inputs and outputs it has, its input types), as for
RMSNormalization, RotaryEmbedding and Attention (opset 23), CastLike and the
normalizations. `function_lowering(op, opset)` offers that body as a `Lowering` for an
op that has one and no hand-written lowering (`LOWERINGS` wins: its arithmetic is the
spec text's). Expanding a node (`plan`):

1. The body is the newest one ONNX has at or below the model's opset; it is refused when
   one of its ops is another op at the model's opset than at the body's (the body
   would mean something else there: its inputs, outputs or attribute names differ; a
   version that only adds types is the same op), or when it uses another domain or a
   subgraph.
2. Attribute references take the node's attribute, else the schema's default (else the
   attribute is left out, ONNX's rule); formal inputs and outputs take the node's
   tensors, an absent optional input stays absent; every other value gets a fresh name
   `<node>_<body value>` (RMSNormalization's `XSquaredMean`).
3. A body op the target does not parse (or that `ops` forces), without a hand-written
   lowering, that has a function body itself is replaced by its own body, in turn
   (Attention's CastLike -> Cast on TensorRT 8.6).
4. Exact simplifications, until none applies: Constant nodes become initializers; a node
   whose inputs are all constants is computed (onnx.reference; results up to
   `FOLD_LIMIT` elements), as are Shape and Size of dims the graph declares static; an
   Identity, or a Cast to the type its input has, is dropped; nodes no used output needs
   are dropped. Axes computed from a rank become the constants TensorRT's rows and the
   opset pass's adapters need (RMSNormalization's ReduceMean axes).
5. The writers of the formal outputs write the node's output tensors (names and types
   kept). An output something reads that the body does not compute leaves the node,
   with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from graphfix.graph import fresh_name, is_graph_output
from graphfix.graph.convert import node_proto
from graphfix.graph.dtypes import np_dtype
from graphfix.plugins.lowering import LOWERINGS, Builder, Emit, Env, Lowering, parses

FOLD_LIMIT = 4096
"""The most elements a computed constant may have (shape arithmetic, scalars, small
masks); a larger result stays a node."""
_DEPTH = 4  # nested bodies expanded at most this deep (a body that contains its own op)
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                         "RandomUniformLike", "Multinomial", "Bernoulli"})


@cache
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def _body_version(schema: onnx.defs.OpSchema, opset: int) -> tuple[int, bool] | None:
    """(the newest body version at or below `opset`, whether it is context-dependent)."""
    found = [(v, True) for v in schema.context_dependent_function_opset_versions if v <= opset]
    found += [(v, False) for v in schema.function_opset_versions if v <= opset]
    return max(found) if found else None


def has_body(op: str, opset: int) -> bool:
    """Whether ai.onnx `op` has a function body at `opset`."""
    schema = _schema(op, opset)
    return schema is not None and _body_version(schema, opset) is not None


def function_lowering(op: str, opset: int) -> Lowering | None:
    """The lowering of `op` by its function body, or None (no body at `opset`). Its
    `emits` is empty: the ops depend on the node (`plan` says which, before any change)."""
    if not has_body(op, opset):
        return None
    return Lowering(op, frozenset(), _plan)


# ----------------------------------------------------------------------------- one body


def _type_proto(t: gs.Tensor) -> onnx.TypeProto | str:
    """The tensor type ONNX's body builders and shape inference read for `t`."""
    if t.dtype is None:
        return f"the type of its input '{t.name}' is unknown; run shape inference first"
    try:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
    except (KeyError, TypeError, ValueError):
        return f"its input '{t.name}' has a type ONNX does not name ({t.dtype})"
    shape = None if t.shape is None else [d if isinstance(d, int | str) else None
                                          for d in t.shape]
    return helper.make_tensor_type_proto(elem, shape)


def _function(call: onnx.NodeProto, types: list[onnx.TypeProto], opset: int
              ) -> tuple[onnx.FunctionProto, onnx.defs.OpSchema] | str:
    """The body of `call` (input types `types`) for a model at `opset`, or why none."""
    schema = _schema(call.op_type, opset)
    found = _body_version(schema, opset) if schema is not None else None
    if found is None:
        return f"ONNX defines {call.op_type} by no function body at opset {opset}"
    version, dependent = found
    try:
        raw = (schema.get_context_dependent_function_with_opset_version(
            version, call.SerializeToString(), [t.SerializeToString() for t in types])
            if dependent else schema.get_function_with_opset_version(version))
    except Exception as error:  # noqa: BLE001 - onnx's builders raise bare RuntimeErrors
        return f"ONNX could not build its function body: {error}"
    function = onnx.FunctionProto()
    function.ParseFromString(raw)
    if not function.node:
        return "ONNX gives no function body for this node"
    return function, schema


def _refusal(function: onnx.FunctionProto, opset: int) -> str | None:
    """Why the body cannot stand in a model at `opset` (module docstring, step 1)."""
    imports = {o.domain or "": o.version for o in function.opset_import}
    version = imports.get("", opset)
    for n in function.node:
        if n.domain not in ("", "ai.onnx"):
            return f"its function body uses {n.domain}.{n.op_type}"
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):
            return f"its function body has a subgraph ({n.op_type})"
        there, here = _schema(n.op_type, version), _schema(n.op_type, opset)
        if there is None or here is None or _signature(there) != _signature(here):
            return (f"its function body is written for opset {version}, and its "
                    f"{n.op_type} has other inputs, outputs or attributes at the model's "
                    f"opset {opset}")
    return None


def _signature(schema: onnx.defs.OpSchema) -> tuple:
    """What a body's node depends on beyond types: a version that only adds types (most
    of them: Constant 24, Cast 25) keeps it; ReduceMean 18 (axes an input), Split 18
    (num_outputs) and Shape 15 (start, end) change it."""
    return (tuple((f.name, f.option) for f in schema.inputs),
            tuple((f.name, f.option) for f in schema.outputs), tuple(sorted(schema.attributes)))


def _attributes(n: onnx.NodeProto, call: onnx.NodeProto, schema: onnx.defs.OpSchema) -> None:
    """Resolve `n`'s attribute references from `call`, else `schema`'s defaults."""
    given = {a.name: a for a in call.attribute}
    kept = []
    for attr in n.attribute:
        if not attr.ref_attr_name:
            kept.append(attr)
            continue
        source = given.get(attr.ref_attr_name)
        if source is None and attr.ref_attr_name in schema.attributes:
            default = schema.attributes[attr.ref_attr_name].default_value
            source = default if default.type else None
        if source is not None:
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(source)
            resolved.name = attr.name
            kept.append(resolved)
    del n.attribute[:]
    n.attribute.extend(kept)


def _inline(call: onnx.NodeProto, function: onnx.FunctionProto, schema: onnx.defs.OpSchema,
            taken: set[str]) -> list[onnx.NodeProto]:
    """The body's nodes, on `call`'s tensors (module docstring, step 2)."""
    names = dict(zip(function.input, call.input, strict=False))
    names.update({f: a for f, a in zip(function.output, call.output, strict=False) if a})
    names.update({f: "" for f in function.input if f not in names})
    nodes = []
    for body_node in function.node:
        n = onnx.NodeProto()
        n.CopyFrom(body_node)
        for field in (n.input, n.output):
            for i, name in enumerate(field):
                if name and name not in names:
                    names[name] = fresh_name(name, taken)
                field[i] = names.get(name, "")
        n.name = ""
        n.domain = ""
        _attributes(n, call, schema)
        nodes.append(n)
    return nodes


@dataclass
class _Body:
    """A node's body as it is being simplified: nodes (protos, topological), computed
    constants by name, and the types shape inference gives every value."""

    nodes: list[onnx.NodeProto]
    values: dict[str, np.ndarray]
    types: dict[str, onnx.TypeProto]
    inputs: dict[str, onnx.TypeProto]  # the node's input tensors
    outputs: list[str]                  # the node's used output tensors
    opset: int


def _model(body: _Body, nodes: list[onnx.NodeProto] | None = None) -> onnx.ModelProto:
    inputs = [helper.make_value_info(name, t) for name, t in body.inputs.items()]
    graph = helper.make_graph(
        nodes if nodes is not None else body.nodes, "body", inputs,
        [helper.make_empty_tensor_value_info(o) for o in body.outputs],
        [numpy_helper.from_array(v, k) for k, v in body.values.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", body.opset)],
                             ir_version=onnx.IR_VERSION)


def _infer(body: _Body) -> None:
    try:
        inferred = onnx.shape_inference.infer_shapes(_model(body))
    except Exception:  # noqa: BLE001 - types stay as they were; folding needs none
        return
    body.types = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output)
                  if v.type.HasField("tensor_type")}
    body.types.update(body.inputs)


def _dims(name: str, body: _Body) -> list[int | None] | None:
    t = body.types.get(name)
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in t.tensor_type.shape.dim]


def _elem(name: str, body: _Body) -> int:
    if name in body.values:
        return helper.np_dtype_to_tensor_dtype(body.values[name].dtype)
    t = body.types.get(name)
    return t.tensor_type.elem_type if t is not None else 0


def _static(n: onnx.NodeProto, body: _Body) -> np.ndarray | None:
    """Shape or Size of dims the types say are static, else None."""
    dims = _dims(n.input[0], body)
    if dims is None:
        return None
    if n.op_type == "Size":
        return np.array(np.prod(dims), np.int64) if None not in dims else None
    attrs = {a.name: a.i for a in n.attribute}
    rank = len(dims)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank)
                  for v in (attrs.get("start", 0), attrs.get("end", rank)))
    part = dims[start:end]
    return np.array(part, np.int64) if None not in part else None


def _computed(n: onnx.NodeProto, body: _Body) -> list[np.ndarray] | None:
    """The outputs of a node whose inputs are all constants, else None."""
    if n.op_type in _NOT_FOLDED or not all(i in body.values for i in n.input if i):
        return None
    from onnx.reference import ReferenceEvaluator

    names = [i for i in n.input if i]
    graph = helper.make_graph(
        [n], "fold", [helper.make_tensor_value_info(i, _elem(i, body), None)
                      for i in dict.fromkeys(names)],
        [helper.make_empty_tensor_value_info(o) for o in n.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", body.opset)],
                              ir_version=onnx.IR_VERSION)
    try:
        results = ReferenceEvaluator(model).run(None, {i: body.values[i] for i in names})
    except Exception:  # noqa: BLE001 - a node the reference cannot compute stays
        return None
    results = [np.asarray(r) for r in results]
    return results if all(r.size <= FOLD_LIMIT for r in results) else None


def _fold_once(body: _Body) -> bool:
    """One pass of step 4's folding and dropping; whether anything changed."""
    alias: dict[str, str] = {}
    kept, changed = [], False
    for n in body.nodes:
        for i, name in enumerate(n.input):
            n.input[i] = alias.get(name, name)
        if n.op_type == "Shape" or n.op_type == "Size":
            value = _static(n, body)
            results = None if value is None else [value]
        else:
            results = _computed(n, body)
        if results is not None and n.output[0] not in body.outputs:
            body.values.update({o: r for o, r in zip(n.output, results, strict=False) if o})
            changed = True
            continue
        if _identity(n, body) and n.output[0] not in body.outputs:
            alias[n.output[0]] = n.input[0]
            changed = True
            continue
        kept.append(n)
    body.nodes = kept
    return changed


def _identity(n: onnx.NodeProto, body: _Body) -> bool:
    if n.op_type == "Identity":
        return True
    if n.op_type != "Cast":
        return False
    to = next((a.i for a in n.attribute if a.name == "to"), None)
    return to is not None and to == _elem(n.input[0], body) != 0


def _hand_output_writers(body: _Body) -> None:
    """An Identity (or same-type Cast) writing a used output from a value its producer
    alone reads: the producer writes the output instead."""
    producers = {o: n for n in body.nodes for o in n.output if o}
    for n in list(body.nodes):
        source = n.input[0] if n.input else ""
        producer = producers.get(source)
        if (n.output[0] not in body.outputs or not _identity(n, body) or producer is None
                or source in body.outputs):
            continue
        body.nodes.remove(n)
        for other in body.nodes:
            for field in (other.input, other.output):
                for i, name in enumerate(field):
                    if name == source:
                        field[i] = n.output[0]
        producers[n.output[0]] = producer


def _live(body: _Body) -> None:
    """Drop nodes and constants no used output needs."""
    needed, kept = set(body.outputs), []
    for n in reversed(body.nodes):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed.update(i for i in n.input if i)
    body.nodes = kept[::-1]
    body.values = {k: v for k, v in body.values.items() if k in needed}


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Expansion:
    """A node's body, simplified: what `emit` creates."""

    nodes: tuple[onnx.NodeProto, ...]
    values: dict[str, np.ndarray]
    types: dict[str, onnx.TypeProto]


def _used_outputs(node: gs.Node, env: Env) -> list[str]:
    return [t.name for t in node.outputs
            if t.name and (t.outputs or is_graph_output(env.graph, t))]


def expand(node: gs.Node, env: Env) -> Expansion | str:
    """`node`'s function body, inlined and simplified (module docstring), or why not."""
    types = []
    for t in node.inputs:
        typed = _type_proto(t) if t.name else onnx.TypeProto()
        if isinstance(typed, str):
            return typed
        types.append(typed)
    call = node_proto(node)
    found = _function(call, types, env.opset)
    if isinstance(found, str):
        return found
    function, schema = found
    refused = _refusal(function, env.opset)
    if refused:
        return refused
    taken = {t.name for t in (*node.inputs, *node.outputs) if t.name}
    nodes = _inline(call, function, schema, taken)
    written = {o for n in nodes for o in n.output}
    used = _used_outputs(node, env)
    unwritten = [name for name in used if name not in written]
    if unwritten:
        return (f"its output '{unwritten[0]}' is read, and its function body does not "
                "compute it")
    inputs = {t.name: ty for t, ty in zip(node.inputs, types, strict=True) if t.name}
    body = _Body(nodes, {}, {}, inputs, used, env.opset)
    _infer(body)
    refused = _nested(body, env, taken)
    if refused:
        return refused
    for _ in range(16):
        changed = _fold_once(body)
        _live(body)
        _infer(body)
        if not changed:
            break
    _hand_output_writers(body)
    _live(body)
    return Expansion(tuple(body.nodes), dict(body.values), dict(body.types))


def _expands(op: str, env: Env, opset: int) -> bool:
    """Whether a body op is replaced by its own body (module docstring, step 3)."""
    if op in LOWERINGS or not has_body(op, opset):
        return False
    return op in env.forced or (env.target is not None and not parses(env.target, op))


def _nested(body: _Body, env: Env, taken: set[str]) -> str | None:
    for _ in range(_DEPTH):
        inner = [n for n in body.nodes if _expands(n.op_type, env, body.opset)]
        if not inner:
            return None
        for n in inner:
            types = [body.types.get(i, onnx.TypeProto()) if i else onnx.TypeProto()
                     for i in n.input]
            found = _function(n, types, body.opset)
            refused = found if isinstance(found, str) else _refusal(found[0], body.opset)
            if refused:
                return f"its function body's {n.op_type} cannot be expanded: {refused}"
            at = body.nodes.index(n)
            body.nodes[at:at + 1] = _inline(n, found[0], found[1], taken)
        _infer(body)
    return f"its function body nests more than {_DEPTH} deep"


def _plan(node: gs.Node, env: Env) -> Emit | str:
    expansion = expand(node, env)
    if isinstance(expansion, str):
        return expansion
    tensors = {t.name: t for t in (*node.inputs, *node.outputs) if t.name}

    def emit(b: Builder) -> None:
        made = dict(tensors)
        for name, value in expansion.values.items():
            made[name] = b.const(name, value)
        for n in expansion.nodes:
            outputs = []
            for name in n.output:
                if name and name not in made:
                    made[name] = b.variable(name, _np_type(expansion.types.get(name)))
                outputs.append(made[name] if name else gs.Variable.empty())
            inputs = [made[name] if name else gs.Variable.empty() for name in n.input]
            b.outputs(n.op_type, inputs, _gs_attributes(n), outputs)

    return emit


def _np_type(t: onnx.TypeProto | None) -> np.dtype | None:
    if t is None or not t.tensor_type.elem_type:
        return None
    return np_dtype(t.tensor_type.elem_type)


def _gs_attributes(n: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes as onnx-graphsurgeon holds them."""
    attrs: dict[str, Any] = {}
    for attr in n.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, onnx.TensorProto):
            value = gs.Constant(value.name or attr.name, numpy_helper.to_array(value))
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        attrs[attr.name] = value
    return attrs


def typical_ops(op: str, target: Any) -> tuple[str, ...] | None:
    """The ops the body of a typical `op` node emits for `target` (doctor's question,
    which has an op, not a node): its required inputs only, rank 4 of unknown dims, of
    float32 (or the first type allowed), its attributes' defaults, in a model at the
    opset of its newest body; None where ONNX has no body for it or cannot build one
    for that node."""
    schema = _schema(op, onnx.defs.onnx_opset_version())
    found = _body_version(schema, onnx.defs.onnx_opset_version()) if schema else None
    if found is None or any(a.required for a in schema.attributes.values()):
        return None
    opset = found[0]
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    inputs = []
    for k, formal in enumerate(schema.inputs):
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
            break
        types = allowed.get(formal.type_str, [formal.type_str])
        name = "tensor(float)" if "tensor(float)" in types else types[0]
        dtype = _np_type(_parse_type(name))
        if dtype is None:
            return None
        inputs.append(gs.Variable(f"in{k}", dtype, [f"d{k}_{i}" for i in range(4)]))
    outputs = [gs.Variable("out0")]
    node = gs.Node(op, "typical", {}, inputs, outputs)
    graph = gs.Graph(nodes=[node], inputs=inputs, outputs=outputs, opset=opset)
    env = Env(graph, opset, None, target)
    expansion = expand(node, env)
    if isinstance(expansion, str):
        return None
    return tuple(n.op_type for n in expansion.nodes)


def _parse_type(text: str) -> onnx.TypeProto | None:
    """'tensor(float)' as a TypeProto; None for other kinds."""
    if not (text.startswith("tensor(") and text.endswith(")")):
        return None
    elem = getattr(onnx.TensorProto, text[len("tensor("):-1].upper(), 0)
    return helper.make_tensor_type_proto(elem, None) if elem else None
