"""Rewiring idioms: bypass a pass-through node, let a node take another's output."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from graphfix import weights


def is_graph_output(graph: gs.Graph, tensor: gs.Tensor) -> bool:
    return any(t is tensor for t in graph.outputs)


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The tensor's value when it is a constant, else None.

    A constant is an initializer, the output of a `Constant` node, or either of
    those behind a chain of `Identity` nodes (exporters put Identity in front of
    shared weights and BatchNorm statistics). Lazily loaded initializers are read
    without caching: `Constant.values` would replace gs's value object, which the
    manager's fingerprint counts as a change, so passes read constants only here.
    """
    while (
        tensor is not None
        and not isinstance(tensor, gs.Constant)
        and len(tensor.inputs) == 1
        and tensor.inputs[0].op == "Identity"
        and tensor.inputs[0].inputs
    ):
        tensor = tensor.inputs[0].inputs[0]
    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return _read(tensor)
    if len(tensor.inputs) == 1 and tensor.inputs[0].op == "Constant":
        value = tensor.inputs[0].attrs.get("value")
        if isinstance(value, gs.Constant):
            return _read(value)
    return None


def _read(constant: gs.Constant) -> np.ndarray:
    raw = constant._values  # gs has no public non-caching read
    if type(raw) is LazyValues:  # gs's own (not sparse, not deferred): read it directly
        values = weights.inline_array(raw.tensor)
        if values is not None:
            return values
    return raw.load() if hasattr(raw, "load") else np.asarray(raw)


def bypass(graph: gs.Graph, node: gs.Node) -> str | None:
    """Remove a node whose first output equals its first input, keeping output names.

    Consumers of the node's output read its input instead. When the output is a
    graph output, the producer of the input takes the output's tensor (and so its
    name) instead. Returns None on success, or why the node cannot be removed.
    The node is left disconnected; `cleanup` drops it.
    """
    why = bypass_refusal(graph, node)
    if why:
        return why
    inp, out = node.inputs[0], node.outputs[0]
    if not is_graph_output(graph, out):
        for consumer in list(out.outputs):
            replace_in(consumer.inputs, out, inp)
        node.inputs.clear()
        node.outputs.clear()
        return None
    # The output is a graph output: its name must survive.
    producer = inp.inputs[0]
    if out.dtype is None and inp.dtype is not None:
        out.dtype = inp.dtype
    take_output(producer, inp, out)
    node.inputs.clear()
    node.outputs.clear()
    return None


def bypass_refusal(graph: gs.Graph, node: gs.Node) -> str | None:
    """Why `bypass` would refuse to remove `node`, or None; changes nothing."""
    inp, out = node.inputs[0], node.outputs[0]
    if any(o.outputs for o in node.outputs[1:]) or any(
        is_graph_output(graph, o) for o in node.outputs[1:]
    ):
        return "a secondary output is used"
    if not is_graph_output(graph, out):
        return None
    # The output is a graph output: its name must survive.
    if is_graph_output(graph, inp) or any(t is inp for t in graph.inputs):
        return "it connects a graph input or output directly to a graph output"
    if isinstance(inp, gs.Constant) or len(inp.inputs) != 1:
        return "its input is a constant or is not produced by a node of this graph"
    if inp.inputs[0] not in graph.nodes:
        return "its input comes from an enclosing graph"
    return None


def take_output(producer: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    """Make `producer` write `new` where it wrote `old`; other readers of `old` read `new`."""
    for consumer in list(old.outputs):
        replace_in(consumer.inputs, old, new)
    new.inputs.clear()
    replace_in(producer.outputs, old, new)


def replace_in(tensors: list, old: gs.Tensor, new: gs.Tensor) -> None:
    """Replace `old` by `new` in a node's input or output list, keeping gs's links in sync."""
    for i, t in enumerate(tensors):
        if t is old:
            tensors[i] = new


def fresh_name(base: str, names: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... whichever is not in `names` (which it then joins)."""
    name, i = base, 1
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return name
