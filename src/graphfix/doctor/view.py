"""A read-only view of a model for doctor rules: every node with its place, types, constants.

Built once per diagnosis from the ModelProto (no onnx-graphsurgeon import: doctor
must stay fast on large detection models). Types and shapes come from ONNX shape
inference (with data propagation) run on a weightless skeleton, plus what the
model declares; constants are read lazily and only when a rule asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import onnx

from graphfix import weights
from graphfix.graph.protos import graph_protos, infer_shapes, proto_label, walk_protos
from graphfix.graph.skeleton import skeleton

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class NodeRef:
    """One node and where it is: `path` names the enclosing nodes' subgraphs, outermost
    first, as ("If 'If_4349'.else_branch", ...); empty for the main graph."""

    node: onnx.NodeProto
    path: tuple[str, ...]
    index: int  # position in its own graph

    @property
    def op(self) -> str:
        return self.node.op_type

    @property
    def domain(self) -> str:
        return self.node.domain

    @property
    def standard(self) -> bool:
        return self.node.domain in STANDARD_DOMAINS

    @property
    def label(self) -> str:
        """`Op 'name'` (name, else first output), prefixed by its subgraph path."""
        return proto_label(self.node, self.path)

    def attr(self, name: str, default=None):
        for a in self.node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def has_attr(self, name: str) -> bool:
        return any(a.name == name for a in self.node.attribute)

    def input(self, i: int) -> str:
        """The name of input `i`, or "" when absent or omitted."""
        return self.node.input[i] if i < len(self.node.input) else ""


@dataclass
class TensorInfo:
    elem_type: int = 0  # onnx.TensorProto.UNDEFINED when unknown
    shape: tuple[int | str | None, ...] | None = None  # None: rank unknown


@dataclass
class ModelView:
    """What rules read. Build with `ModelView.of(model)`."""

    model: onnx.ModelProto
    nodes: list[NodeRef]
    tensors: dict[str, TensorInfo]
    initializers: dict[str, onnx.TensorProto]
    constant_nodes: dict[str, onnx.NodeProto]
    producers: dict[str, NodeRef]
    consumers: dict[str, list[NodeRef]]
    inference_error: str = ""
    _values: dict[str, np.ndarray | None] = field(default_factory=dict)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelView:
        nodes = [NodeRef(n, path, i) for n, path, i in walk_protos(model.graph)]
        inits: dict[str, onnx.TensorProto] = {}
        constants: dict[str, onnx.NodeProto] = {}
        producers: dict[str, NodeRef] = {}
        consumers: dict[str, list[NodeRef]] = {}
        for g in graph_protos(model.graph):
            for t in g.initializer:
                inits.setdefault(t.name, t)
        for ref in nodes:
            for out in ref.node.output:
                if out:
                    producers.setdefault(out, ref)
            if ref.op == "Constant" and ref.standard and ref.node.output:
                constants.setdefault(ref.node.output[0], ref.node)
            for name in ref.node.input:
                if name:
                    consumers.setdefault(name, []).append(ref)
        tensors, error = _infer(model, inits)
        return cls(model, nodes, tensors, inits, constants, producers, consumers, error)

    @cached_property
    def opset(self) -> int:
        for o in self.model.opset_import:
            if o.domain in STANDARD_DOMAINS:
                return o.version
        return 0

    @property
    def graph_inputs(self) -> list[onnx.ValueInfoProto]:
        inits = {t.name for t in self.model.graph.initializer}
        return [i for i in self.model.graph.input if i.name not in inits]

    @property
    def graph_outputs(self) -> list[onnx.ValueInfoProto]:
        return list(self.model.graph.output)

    def elem_type(self, name: str) -> int:
        info = self.tensors.get(name)
        return info.elem_type if info else 0

    def shape(self, name: str) -> tuple | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self.constant_nodes

    def value(self, name: str, max_elements: int = 1 << 20) -> np.ndarray | None:
        """The value of an initializer or Constant output (cached), None when not constant
        or larger than `max_elements`."""
        if name in self._values:
            return self._values[name]
        value = None
        tensor = self.initializers.get(name)
        if tensor is None and name in self.constant_nodes:
            attrs = {a.name: a for a in self.constant_nodes[name].attribute}
            if "value" in attrs:
                tensor = attrs["value"].t
            elif attrs:
                value = np.asarray(onnx.helper.get_attribute_value(next(iter(attrs.values()))))
        if tensor is not None and int(np.prod(tensor.dims, dtype=np.int64)) <= max_elements:
            value = weights.to_array(tensor)
        self._values[name] = value
        return value


def _infer(model: onnx.ModelProto, inits) -> tuple[dict[str, TensorInfo], str]:
    """Types and shapes of every named tensor: declared, then inferred (not strict)."""
    tensors: dict[str, TensorInfo] = {}
    for name, t in inits.items():
        tensors[name] = TensorInfo(t.data_type, tuple(int(d) for d in t.dims))
    error = ""
    try:
        inferred = infer_shapes(skeleton(model))
    except Exception as exc:  # noqa: BLE001 - inference failing is a finding, not a crash
        inferred, error = model, f"{type(exc).__name__}: {exc}".splitlines()[0]
    for g in graph_protos(inferred.graph):
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None:
                continue
            shape = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tt.shape.dim)
            old = tensors.get(vi.name)
            if old is None or (not old.elem_type and tt.elem_type) or (
                    old.shape is None and shape is not None):
                tensors[vi.name] = TensorInfo(tt.elem_type or (old.elem_type if old else 0),
                                              shape if shape is not None else
                                              (old.shape if old else None))
    for g in graph_protos(inferred.graph):
        for node in g.node:
            if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS and node.output:
                for a in node.attribute:
                    if a.name == "value" and node.output[0] not in tensors:
                        tensors[node.output[0]] = TensorInfo(a.t.data_type, tuple(a.t.dims))
    return tensors, error
