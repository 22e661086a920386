"""Walking ONNX protos (not gs graphs): subgraphs, and nodes labelled with their path.

The label form is shared by doctor findings and TensorRT parser messages:
`Op 'name'` (the first output when the node has no name), prefixed by the nodes
whose subgraphs hold it, `If 'cond'.then_branch > Relu 'r'`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import onnx


def text(value: object) -> object:
    """A STRING attribute's value as text (onnx gives bytes; bytes that are not UTF-8 are
    replaced, not raised on); any other value as it is."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The bodies in one node's attributes (If branches, Loop/Scan bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads that it does not define itself (its outer-scope reads)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for sub in subgraphs(node):
            used.update(outer_reads(sub))
        defined.update(n for n in node.output if n)
    used.update(o.name for o in graph.output)
    return used - defined


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The node's inputs, then what its subgraphs read from enclosing graphs."""
    reads = [n for n in node.input if n]
    for sub in subgraphs(node):
        reads.extend(sorted(outer_reads(sub) - set(reads)))
    return reads


def graph_protos(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph, then every subgraph in its node attributes, recursively."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from graph_protos(sub)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, each followed by the nodes of its subgraphs, depth first."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def proto_label(node: onnx.NodeProto, path: tuple[str, ...] = ()) -> str:
    name = node.name or (node.output[0] if node.output else "?")
    return " > ".join([*path, f"{node.op_type} '{name}'"])


def walk_protos(
    graph: onnx.GraphProto | onnx.FunctionProto, path: tuple[str, ...] = ()
) -> Iterator[tuple[onnx.NodeProto, tuple[str, ...], int]]:
    """(node, path of enclosing subgraphs, index in its own graph), depth first."""
    for index, node in enumerate(graph.node):
        yield node, path, index
        for attr in node.attribute:
            inner = f"{proto_label(node)}.{attr.name}"
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from walk_protos(attr.g, (*path, inner))
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for k, sub in enumerate(attr.graphs):
                    yield from walk_protos(sub, (*path, f"{inner}[{k}]"))


TYPE_NAMES = {name.lower(): value for name, value in onnx.TensorProto.DataType.items()}
"""ONNX element type by its lower-case name, as `type_source` gives fixed types."""


@functools.cache
def type_source(op: str, index: int) -> int | str | None:
    """Where output `index` of the standard op `op` gets its element type: the index of
    the input sharing its type variable, the type name its schema fixes ('int64'; its
    element type is `TYPE_NAMES`[name]), or None (a type variable no input has, or no
    schema)."""
    try:
        schema = onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return None
    outputs = list(schema.outputs)
    if not outputs:
        return None
    formal = outputs[min(index, len(outputs) - 1)]
    if index >= len(outputs) and formal.option != formal.option.Variadic:
        return None
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    if formal.type_str not in allowed:  # a fixed type: "tensor(int64)"
        return _tensor_type_name(formal.type_str)
    for i, param in enumerate(schema.inputs):
        if param.type_str == formal.type_str:
            return i
    only = allowed[formal.type_str]
    return _tensor_type_name(only[0]) if len(only) == 1 else None


def _tensor_type_name(type_str: str) -> str | None:
    """'int64' for 'tensor(int64)'; None for sequences, maps and optionals."""
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[len("tensor("):-1]
    return None


_BODY_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def data_propagation_safe(graph: onnx.GraphProto) -> bool:
    """Whether ONNX's shape inference may propagate values (`data_prop=True`) through
    `graph`: no tensor name is made in two of its graphs (main graph and bodies). ONNX
    keeps propagated values by name across scopes, so two If branches that name their
    tensors alike (optimum's merged decoders: both branches are the decoder) collide:
    strict inference stops ("Data for input 0 already exists") and lenient inference
    gives one branch's tensors the other's shapes (a rank-4 Reshape declared rank 3).
    A graph without bodies is always safe."""
    if not any(node.op_type in _BODY_OPS or node.domain not in ("", "ai.onnx")
               for node in graph.node):  # only these can hold bodies (a walk of the
        return True                      # attributes is 5 ms on 7,000 nodes)
    seen: set[str] = set()
    for g in graph_protos(graph):
        made = {name for node in g.node for name in node.output if name}
        if made & seen:
            return False
        seen |= made
    return True


def infer_shapes(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    """`onnx.shape_inference.infer_shapes` with data propagation where it is safe
    (`data_propagation_safe`); raises what onnx raises."""
    return onnx.shape_inference.infer_shapes(
        model, strict_mode=strict, data_prop=data_propagation_safe(model.graph))
