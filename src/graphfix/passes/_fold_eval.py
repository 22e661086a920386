"""fold-constants' own steps, where onnx-graphsurgeon's are wrong or recurse.

- Shape folding (`fold_static_shapes`): `Shape(x)`, `Size(x)`, and `Gather`/`Slice` of a
  `Shape(x)`, folded where the dims they read are static. gs's own shape folding ignores
  Shape's `start`/`end` attributes (opset 15): `Shape(x, start=-2)` became the whole
  shape, and the folded graph contradicted its declared shapes.
- If flattening (`inline_constant_ifs`): gs's loses outputs of a multi-output If.
- Node-by-node evaluation (`fold_node_by_node`): gs's "basic" partitioning retries a
  part that onnxruntime cannot evaluate by calling itself on the very same part, until
  Python's recursion limit (and one onnxruntime session per level: 80 s on an expanded
  attention graph). graphfix evaluates the whole constant part in one session
  (`_fold_closure`) and, only when that fails, here: each node whose inputs are all
  constants, one at a time in topological order, in a plain loop; a node onnxruntime
  cannot evaluate stays, and so do the nodes after it.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import (
    all_graphs,
    constant_value,
    fresh_name,
    is_onnx,
    names_in_use,
    replace_in,
)
from graphfix.passes._fold_closure import closure_model, run_closure
from graphfix.passes._fold_numpy import shape_slice

# Ops whose result is not a tensor (gs cannot hold it as a constant) or not a function of
# the inputs (folding would freeze one draw).
NOT_FOLDED = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli", "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase",
    "SplitToSequence", "SequenceMap", "Optional", "OptionalGetElement", "OptionalHasElement",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
})


def excluded(node: gs.Node) -> bool:
    """Whether fold-constants leaves the node alone whatever its inputs (`NOT_FOLDED`)."""
    return node.op in NOT_FOLDED and is_onnx(node)


def _static(shape) -> list[int | None] | None:
    if shape is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else None for d in shape]


def shape_dims(node: gs.Node) -> list[int | None] | None:
    """The dims a Shape node outputs (None where not static), honouring start/end."""
    dims = _static(node.inputs[0].shape)
    return None if dims is None else shape_slice(node, dims)


def _constant(t: gs.Tensor) -> np.ndarray | None:
    """The tensor's value when constant, read without caching (`constant_value`: gs's
    caching read replaces the value object, which the manager counts as a change)."""
    return constant_value(t)


def _slice_indices(node: gs.Node, length: int) -> np.ndarray | None:
    """The positions a Slice of a 1-D tensor of `length` keeps, or None when not constant."""
    if len(node.inputs) >= 3:
        params: list[np.ndarray | None] = []
        for t in node.inputs[1:5]:
            value = _constant(t) if t.name else None
            if t.name and value is None:
                return None
            params.append(value)
        starts, ends, axes, steps = params + [None] * (4 - len(params))
        axes = [0] if axes is None else axes
        steps = [1] if steps is None else steps
    else:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes, steps = node.attrs.get("axes", [0]), [1]
    if starts is None or ends is None:
        return None
    if [int(a) for a in np.ravel(axes)] not in ([0], [-1]) or np.size(starts) != 1:
        return None
    step = int(np.ravel(steps)[0])
    if step == 0:
        return None
    # numpy's slice clamps like ONNX Slice does, INT64 max/min sentinels included
    return np.arange(length)[int(np.ravel(starts)[0]):int(np.ravel(ends)[0]):step]


def _fold(tensor: gs.Tensor, value: np.ndarray) -> None:
    tensor.to_constant(value)
    tensor.inputs.clear()


def fold_static_shapes(graph: gs.Graph) -> int:
    """Fold Shape/Size, and Gather/Slice of a Shape, where the dims they read are static.
    Returns how many nodes were folded."""
    return sum(len(fold_shape(node)) for g in all_graphs(graph) for node in list(g.nodes))


def fold_shape(node: gs.Node) -> list[gs.Tensor]:
    """Fold `node` when it is a Shape or Size whose dims are static, else the Gather/
    Slice readers of a Shape that read only its static dims; returns the tensors that
    became constants."""
    if not is_onnx(node, "Shape", "Size") or not node.inputs or not node.outputs:
        return []
    if _constant(node.inputs[0]) is not None:
        return []  # evaluated with the other constants
    out = node.outputs[0]
    if node.op == "Size":
        dims = _static(node.inputs[0].shape)
        if dims is None or None in dims:
            return []
        _fold(out, np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64))
        return [out]
    dims = shape_dims(node)
    if dims is None:
        return []
    if None not in dims:
        _fold(out, np.array(dims, dtype=np.int64))
        return [out]
    parts = [_fold_part(reader, out, dims) for reader in list(out.outputs)]
    return [t for t in parts if t is not None]


def _fold_part(reader: gs.Node, shape: gs.Tensor, dims: list[int | None]
               ) -> gs.Tensor | None:
    """Fold `reader`, a Gather or Slice of a partly static shape, where it reads only
    static dims; returns its output, now a constant."""
    if not is_onnx(reader, "Gather", "Slice") or reader.inputs[0] is not shape or (
            not reader.outputs):  # folded already (`propagate_shapes`), not yet pruned
        return None
    if reader.op == "Gather":
        indices = _constant(reader.inputs[1])
        if indices is None or reader.attrs.get("axis", 0) not in (0, -1):
            return None
        positions = np.asarray(indices, dtype=np.int64) % max(len(dims), 1)
    else:
        positions = _slice_indices(reader, len(dims))
        if positions is None:
            return None
    picked = [dims[int(i)] for i in np.ravel(positions)]
    if None in picked:
        return None
    out = reader.outputs[0]
    _fold(out, np.array(picked, dtype=np.int64).reshape(np.shape(positions)))
    return out


def fold_node_by_node(graph: gs.Graph, size_threshold: int | None) -> int:
    """Evaluate, one node at a time in topological order, every node whose inputs are
    all constants (module docstring); returns how many were folded."""
    folded = 0
    for g in all_graphs(graph):
        g.toposort(recurse_subgraphs=False)
        for node in list(g.nodes):
            if not _evaluable(node):
                continue
            values = _evaluate(node, graph)
            if values is None or any(
                    not isinstance(v, np.ndarray) or v.dtype == object
                    or (size_threshold and v.nbytes > size_threshold)
                    for v in values if v is not None):
                continue
            for out, value in zip(node.outputs, values, strict=True):
                if out.name:
                    _fold(out, value)
            node.outputs.clear()
            node.inputs.clear()
            folded += 1
    return folded


def _evaluable(node: gs.Node) -> bool:
    if node.op == "Constant" or not node.outputs or excluded(node) or not is_onnx(node):
        return False
    if any(isinstance(v, (gs.Graph, list)) and (not isinstance(v, list) or any(
            isinstance(x, gs.Graph) for x in v)) for v in node.attrs.values()):
        return False
    return all(isinstance(t, gs.Constant) for t in node.inputs if t.name)


def _evaluate(node: gs.Node, top: gs.Graph) -> list | None:
    """The node's outputs computed by onnxruntime from its constant inputs (None for an
    output without a name), or None when onnxruntime cannot."""
    named = [t for t in node.outputs if t.name]
    try:
        values = iter(run_closure(closure_model([node], named, top), [t.name for t in named]))
    except Exception:  # noqa: BLE001 - onnxruntime lacks the op, the type, ...: not folded
        return None
    return [next(values) if t.name else None for t in node.outputs]


def inline_constant_ifs(graph: gs.Graph) -> int:
    """Replace each If whose condition is a constant by the nodes of the branch it takes
    (innermost graphs first); returns how many. The If's outputs keep their names: the
    branch node writing a branch output writes the If output instead (an Identity does
    where the branch output comes from outside the branch, or repeats). Branch tensors
    are renamed where their names are taken. gs's own flattening loses outputs: it
    rebinds them while iterating the list it empties."""
    names = names_in_use(graph)
    count = 0
    for g in reversed(list(all_graphs(graph))):
        for node in [n for n in g.nodes if is_onnx(n, "If") and n.inputs]:
            cond = _constant(node.inputs[0])
            if cond is None or cond.size != 1:
                continue
            branch = node.attrs["then_branch" if bool(cond.ravel()[0]) else "else_branch"]
            g.nodes[_position(g, node):_position(g, node) + 1] = _take(node, branch, names)
            count += 1
    return count


def _position(g: gs.Graph, node: gs.Node) -> int:
    return next(i for i, n in enumerate(g.nodes) if n is node)


def _take(node: gs.Node, branch: gs.Graph, names: set[str]) -> list[gs.Node]:
    """The branch's nodes, rewired to write the If's outputs (see `inline_constant_ifs`)."""
    local = {id(t) for n in branch.nodes for t in n.outputs}
    for t in {id(t): t for n in branch.nodes for t in n.outputs if t.name}.values():
        names.discard(t.name)
        t.name = fresh_name(t.name, names)
    pairs = list(zip(list(node.outputs), list(branch.outputs), strict=True))
    node.outputs.clear()
    node.inputs.clear()
    nodes, written = list(branch.nodes), {}
    for if_out, out in pairs:
        if id(out) in local and id(out) not in written:
            producer = out.inputs[0]
            slot = next(i for i, t in enumerate(producer.outputs) if t is out)
            producer.outputs[slot] = if_out
            for reader in list(out.outputs):  # branch nodes that read the output too
                replace_in(reader.inputs, out, if_out)
            written[id(out)] = if_out
        else:
            source = written.get(id(out), out)
            nodes.append(gs.Node("Identity", inputs=[source], outputs=[if_out]))
    return nodes


def scalar_range_inputs(graph: gs.Graph) -> list[str]:
    """Reshape each 1-element 1-D input of a Range to the scalar ONNX requires; returns
    the Ranges changed. onnxruntime runs Range on either, but onnx's shape inference
    refuses the 1-D form once the shape is known, which is what inlining an If exposes
    (an If's outputs have no shape; a branch's Split of a shape gives [1] tensors)."""
    names = names_in_use(graph)
    changed = []
    for g in all_graphs(graph):
        for node in [n for n in g.nodes if is_onnx(n, "Range")]:
            for i, tensor in enumerate(node.inputs):
                if tensor.shape is None or list(tensor.shape) != [1]:
                    continue
                name = fresh_name(f"{tensor.name}_scalar", names)
                if isinstance(tensor, gs.Constant):
                    node.inputs[i] = gs.Constant(name, constant_value(tensor).reshape(()))
                else:
                    scalar = gs.Variable(name, dtype=tensor.dtype, shape=[])
                    empty = gs.Constant(fresh_name(f"{name}_shape", names),
                                        np.zeros(0, np.int64))
                    g.nodes.append(gs.Node("Reshape", inputs=[tensor, empty],
                                           outputs=[scalar]))
                    node.inputs[i] = scalar
                changed.append(node.name or node.outputs[0].name)
    return list(dict.fromkeys(changed))
