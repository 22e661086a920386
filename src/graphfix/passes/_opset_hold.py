"""The `opset` pass's way around onnx.version_converter's missing adapters.

The converter (onnx 1.23) converts node by node with an adapter per op and version step,
and fails the whole model on the first op it has none for: Split-18 and Pad-18/19 to 17,
and from 14 to 13 even Add, Mul, Sub, Relu and Reshape (opset 14 only added bfloat16, or
Reshape's `allowzero`). A node whose op means the same at the target for the way this node
uses it needs no adapter: it is moved to a domain of its own (`HOLD_DOMAIN`) around the
conversion, which the converter leaves alone, and comes back unchanged but for the
attributes the older op lacks (which it was checked not to use).

A node is held when the converter names its op as one it cannot convert, every version
of the op between the target and the model's opset is one `ADDITIVE` lists (what that
version added keeps the older behaviour at its default: a type, an attribute, an optional
input; read in ONNX's operator changelog), and, for every node of that op:
- every attribute the node sets exists in the target's schema, or is the newer schema's
  default (dropped on the way back); Split's `num_outputs` (18) also when it divides a
  static dim evenly (Split-13 then splits into equal parts with neither), and Reshape's
  `allowzero=1` (14; PyTorch's dynamo exporter writes it) when the shape is a constant
  without zeros (a 0 entry is all allowzero changes);
- it uses no input or output past the target schema's (Pad-18's `axes`), and the formal
  inputs and outputs it uses have the same names in both;
- its tensors' element types are ones the target's schema takes.
Versions that changed an op's meaning under the same signature (Softmax-13's axis,
RoiAlign-16's default coordinate mode, GridSample-20's mode names) are not listed: their
nodes are never held. The pass manager checks the converted model's numbers afterwards,
as after every pass. TensorRT plugin nodes in the default domain (no ONNX op) are always
held.
"""

from __future__ import annotations

import re

import onnx
import onnx.defs
import onnx_graphsurgeon as gs
from onnx import helper

from graphfix.graph import all_graphs, constant_value, is_onnx, node_label
from graphfix.graph.protos import all_nodes, text

HOLD_DOMAIN = "graphfix.opset.hold"
_NO_ADAPTER = re.compile(r"No Adapter (?:From|To) Version \$\d+ for (\w+)|"
                         r"No Previous Version of (\w+) exists")

ADDITIVE: dict[str, tuple[int, ...]] = {
    # op: the versions whose change keeps the previous version's behaviour at its default
    "Add": (14,), "Sub": (14,), "Mul": (14,), "Div": (14,),  # bfloat16
    "Relu": (14,), "Pow": (15,), "Where": (16,), "LeakyRelu": (16,), "PRelu": (16,),
    "GreaterOrEqual": (16,), "LessOrEqual": (16,),  # bfloat16
    "Reshape": (14, 19, 21),  # allowzero (default 0: the old behaviour); float8; int4
    "Identity": (14, 16, 19, 21),  # sequence, optional, float8, int4 types
    "Shape": (15, 19, 21),  # start/end (defaults: the whole shape); types
    "Size": (19, 21),  # types
    "Split": (18,),  # num_outputs (equal parts: checked per node)
    "Pad": (18, 19, 21),  # axes input; mode 'wrap' (checked per node); types
    # value types only: bfloat16/float8 (20), int4 (21), float4 (23), float8e8m0 (24),
    # int2 (25); a dynamic fill (the lowered causal mask of an opset-23 Attention)
    "ConstantOfShape": (20, 21, 23, 24, 25),
}

Held = dict[str, list[str]]
"""A held node's first output name -> the attributes to drop when it comes back."""


def plugin_holds(graph: gs.Graph) -> Held:
    """Default-domain nodes that are no ONNX op (plugin nodes): the converter cannot
    know them."""
    return {n.outputs[0].name: [] for g in all_graphs(graph) for n in g.nodes
            if is_onnx(n) and n.outputs and n.outputs[0].name and not onnx.defs.has(n.op)}


def adapterless_op(err: Exception) -> str | None:
    """The op the converter says it has no adapter for, if that is why it failed."""
    match = _NO_ADAPTER.search(str(err))
    return (match.group(1) or match.group(2)) if match else None


def same_meaning(graph: gs.Graph, op: str, current: int, target: int
                 ) -> tuple[Held | None, str]:
    """Every default-domain node of `op`, with what to drop, when each means the same at
    `target` (module docstring); else None and why (for the first node that does not).
    Downgrades only: an upgrade the converter cannot make is left to its message."""
    if target >= current:
        return None, "only downgrades hold nodes"
    try:
        newer = onnx.defs.get_schema(op, current)
        older = onnx.defs.get_schema(op, target)
    except onnx.defs.SchemaError:
        return None, f"{op} does not exist at opset {target}"
    versions = {onnx.defs.get_schema(op, v).since_version for v in range(target + 1, current + 1)}
    changed = sorted(versions - {older.since_version} - set(ADDITIVE.get(op, ())))
    if changed:
        return None, (f"{op}-{changed[0]} is not known to keep {op}-{older.since_version}'s "
                      "behaviour (graphfix holds only versions that add types, or attributes "
                      "and inputs whose default is the old behaviour)")
    held: Held = {}
    for g in all_graphs(graph):
        for node in g.nodes:
            if not is_onnx(node, op):
                continue
            if not node.outputs or not node.outputs[0].name:
                return None, f"{node_label(node)}: its first output is omitted"
            drop, why = _fits(node, newer, older)
            if why is not None:
                return None, f"{node_label(node)}: {why}"
            held[node.outputs[0].name] = drop
    return held, ""


def _fits(node: gs.Node, newer, older) -> tuple[list[str], str | None]:
    drop = []
    for name, value in node.attrs.items():
        if name in older.attributes:
            if node.op == "Pad" and name == "mode" and text(value) == "wrap":
                return drop, f"mode 'wrap' (from opset {newer.since_version})"
            continue
        if node.op == "Split" and name == "num_outputs":
            why = _equal_parts(node, value)
            if why is not None:
                return drop, why
        elif node.op == "Reshape" and name == "allowzero" and not _is_default(
                newer, name, value):
            shape = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
            if shape is None or (shape == 0).any():
                return drop, ("allowzero=1 with a shape that is not a constant without zeros "
                              "(only then is it the older Reshape)")
        elif not _is_default(newer, name, value):
            return drop, f"it sets {name} (from opset {newer.since_version})"
        drop.append(name)
    used_inputs = _used(node.inputs)
    for kind, used, old, new in (("input", used_inputs, older.inputs, newer.inputs),
                                 ("output", _used(node.outputs), older.outputs, newer.outputs)):
        if not _positions_fit(len(used), old, new):
            return drop, (f"it uses {kind} {new[min(len(used), len(new)) - 1].name} "
                          f"(from opset {newer.since_version})")
    for i, tensor in enumerate(used_inputs):
        if tensor is not None and not _type_allowed(older, older.inputs, i, tensor):
            return drop, (f"its input {i} is {tensor.dtype}, which {node.op}-"
                          f"{older.since_version} does not take")
    return drop, None


def _used(tensors: list[gs.Tensor]) -> list[gs.Tensor | None]:
    out = [t if t.name else None for t in tensors]
    while out and out[-1] is None:
        out.pop()
    return out


def _positions_fit(count: int, old, new) -> bool:
    """The node's first `count` formal inputs (outputs) exist at the older version, with
    the same names as at the newer."""
    if not old:
        return count == 0
    variadic = old[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    if count > len(old) and not variadic:
        return False
    return all(old[min(i, len(old) - 1)].name == new[min(i, len(new) - 1)].name
               for i in range(min(count, len(new))))


def _type_allowed(schema, formals, index: int, tensor: gs.Tensor) -> bool:
    if tensor.dtype is None or not formals:
        return True
    formal = formals[min(index, len(formals) - 1)]
    allowed = next((c.allowed_type_strs for c in schema.type_constraints
                    if c.type_param_str == formal.type_str), [formal.type_str])
    try:
        name = helper.tensor_dtype_to_string(helper.np_dtype_to_tensor_dtype(tensor.dtype))
    except (KeyError, TypeError, ValueError):
        return True  # a type numpy cannot name: left to onnx.checker
    return f"tensor({name.removeprefix('TensorProto.').lower()})" in allowed


def _is_default(schema, name: str, value) -> bool:
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return False
    return helper.get_attribute_value(attr.default_value) == (
        value.encode() if isinstance(value, str) else value)


def _equal_parts(node: gs.Node, parts) -> str | None:
    if len(node.inputs) > 1 and node.inputs[1].name:
        return "num_outputs and a split input"
    shape = node.inputs[0].shape
    axis = int(node.attrs.get("axis", 0))
    dim = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
    if not isinstance(dim, int) or dim < 0:
        return "num_outputs on a dim that is not static (the older Split needs equal parts)"
    if dim % int(parts):
        return f"num_outputs={parts} does not divide the dim {dim} into equal parts"
    return None


def hold(model: onnx.ModelProto, held: Held) -> None:
    """Move the held nodes of the exported `model` out of the default domain."""
    if not held:
        return
    for node in all_nodes(model.graph):
        if node.domain in ("", "ai.onnx") and node.output and node.output[0] in held:
            node.domain = HOLD_DOMAIN
    if HOLD_DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(HOLD_DOMAIN, 1))


def release(model: onnx.ModelProto, held: Held) -> None:
    """Bring the held nodes of the converted `model` back, without the dropped attributes."""
    if not held:
        return
    for node in all_nodes(model.graph):
        if node.domain == HOLD_DOMAIN:
            node.domain = ""
            drop = set(held.get(node.output[0], ()))
            for attr in [a for a in node.attribute if a.name in drop]:
                node.attribute.remove(attr)
    kept = [o for o in model.opset_import if o.domain != HOLD_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
