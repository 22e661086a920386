"""A small emitter of standard ONNX nodes for the NMS decompositions.

It names every tensor after a prefix (`f"{prefix}_gf_{op}{k}"`), keeps the initializers it
makes, and writes the few ops whose form changed between opsets (Unsqueeze's and
ReduceSum's axes became inputs in opset 13) in the form of the model's opset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from graphfix.runtime.references import Decomposition

MIN_OPSET = 11  # NonMaxSuppression with score_threshold, TopK with a K input, Range


class Emitter:
    """Collects nodes and initializers; every method returns the name of its output."""

    def __init__(self, prefix: str, opset: int, node_name: str = "") -> None:
        self.prefix, self.opset = prefix, opset
        self.node_name = node_name or prefix
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}_gf_{hint}{self._count}"

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        return self.ops(op_type, inputs, 1, [out] if out else None, **attrs)[0]

    def ops(self, op_type: str, inputs: list[str], n: int, outs: list[str] | None = None,
            **attrs: Any) -> list[str]:
        names = outs or [self.fresh(op_type.lower()) for _ in range(n)]
        self.nodes.append(helper.make_node(op_type, inputs, names,
                                           name=f"{self.node_name}/{op_type}_{len(self.nodes)}",
                                           **attrs))
        return names

    def const(self, value: Any, dtype: Any = np.int64, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(axes)])
        return self.op("Unsqueeze", [x], axes=axes)

    def reduce_sum(self, x: str, axes: list[int], keepdims: int, out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("ReduceSum", [x, self.const(axes)], out, keepdims=keepdims)
        return self.op("ReduceSum", [x], out, axes=axes, keepdims=keepdims)

    def dim(self, shape: str, axis: int) -> str:
        """Dim `axis` of a shape tensor as a 1-D [1] int64 tensor."""
        return self.op("Slice", [shape, self.const([axis]), self.const([axis + 1])])

    def cast_like(self, x: str, like: str, out: str) -> str:
        """x in the dtype of `like` (opset 15+); below that x as it is (float32 models)."""
        if self.opset >= 15:
            return self.op("CastLike", [x, like], out)
        return self.op("Identity", [x], out)

    def decomposition(self) -> Decomposition:
        return Decomposition(list(self.nodes), list(self.inits))


def insert(graph: gs.Graph, dec: Decomposition) -> list[gs.Node]:
    """Add the decomposition's nodes and initializers to `graph`, wiring them by tensor name
    to the graph's tensors (a name not there yet becomes a new Variable)."""
    tensors = graph.tensors()
    for init in dec.initializers:
        tensors[init.name] = gs.Constant(init.name, numpy_helper.to_array(init))

    def tensor(name: str) -> gs.Tensor:
        if not name:
            return gs.Variable.empty()
        if name not in tensors:
            tensors[name] = gs.Variable(name)
        return tensors[name]

    added = []
    for node in dec.nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        added.append(gs.Node(node.op_type, node.name, attrs, [tensor(i) for i in node.input],
                             [tensor(o) for o in node.output], domain=node.domain or None))
    graph.nodes.extend(added)
    return added


def made_names(dec: Decomposition) -> set[str]:
    """The tensor names a decomposition writes: its nodes' outputs and its initializers."""
    return {o for n in dec.nodes for o in n.output if o} | {t.name for t in dec.initializers}


def clashes(graph: gs.Graph, dec: Decomposition, own: set[str]) -> list[str]:
    """Names the decomposition makes that the graph already uses (other than `own`)."""
    return sorted((made_names(dec) - own) & set(graph.tensors()))


def replace_node(graph: gs.Graph, node: gs.Node, dec: Decomposition) -> list[gs.Node]:
    """Replace `node` by `dec`, which writes the node's output names. The node's inputs
    stay wired until the decomposition is in, so `insert` finds them by name: an
    initializer the node alone read would otherwise be gone from the graph's tensors, and
    `insert` would make an unproduced Variable of its name."""
    node.outputs.clear()
    added = insert(graph, dec)
    node.inputs.clear()
    graph.nodes.remove(node)
    return added
