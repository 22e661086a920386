"""Dataflow over one ONNX graph proto: producers, readers, constants, data dependence.

A node that holds subgraphs (If/Loop/Scan) reads, besides its inputs, every tensor of
an enclosing graph that its bodies use (`graph.protos.outer_reads`), so a graph's dataflow sees
the whole dependence. "Data-dependent" nodes are those whose output shape or control
flow depends on tensor values: NonZero, NonMaxSuppression, Unique, Compress, If, Loop,
Scan, and TopK with a non-constant K. A node is *dirty* when it is data-dependent or
reads a dirty tensor; clean tensors have the same shape for every input of a shape.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix import weights
from graphfix.graph.protos import node_reads, subgraphs

DATA_DEPENDENT = ("NonZero", "NonMaxSuppression", "Unique", "Compress", "If", "Loop", "Scan")
CONTROL_FLOW = ("If", "Loop", "Scan")
_NONDETERMINISTIC = ("RandomNormal", "RandomUniform", "RandomNormalLike",
                     "RandomUniformLike", "Multinomial", "Bernoulli")


class Flow:
    """Producers, readers and constants of one graph; `outer` is the enclosing graph's
    flow (for a body), whose constants count as constants here."""

    def __init__(self, graph: onnx.GraphProto, outer: Flow | None = None) -> None:
        self.graph = graph
        self.outer = outer
        self.nodes = list(graph.node)
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        self.reads: list[list[str]] = []
        for i, node in enumerate(self.nodes):
            self.producer.update((o, i) for o in node.output if o)
            reads = node_reads(node)
            self.reads.append(reads)
            for name in reads:
                self.readers.setdefault(name, []).append(i)
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in graph.output]
        self.constants = self._constants()
        self.dirty = self._dirty()

    def defines(self, name: str) -> bool:
        return name in self.producer or name in self.initializers or name in self.inputs

    def is_constant(self, name: str) -> bool:
        if name in self.constants:
            return True
        if not self.defines(name) and self.outer is not None:
            return self.outer.is_constant(name)
        return False

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node output (here or outside)."""
        if name in self.initializers:
            return weights.to_array(self.initializers[name])
        i = self.producer.get(name)
        if i is not None:
            node = self.nodes[i]
            if node.op_type == "Constant" and node.attribute:
                return _constant_attr(node.attribute[0])
            if node.op_type in ("Identity", "Cast") and node.input:
                value = self.constant_value(node.input[0])
                if value is not None and node.op_type == "Cast":
                    to = onnx.helper.get_attribute_value(node.attribute[0])
                    value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
                return value
            return None
        if not self.defines(name) and self.outer is not None:
            return self.outer.constant_value(name)
        return None

    def is_dirty_tensor(self, name: str) -> bool:
        i = self.producer.get(name)
        return i is not None and i in self.dirty

    def is_data_dependent(self, i: int) -> bool:
        node = self.nodes[i]
        if node.op_type in DATA_DEPENDENT:
            return True
        return node.op_type == "TopK" and len(node.input) > 1 and \
            not self.is_constant(node.input[1])

    def descendants(self, starts: Iterable[int]) -> set[int]:
        """The nodes `starts` and every node reading, directly or not, what they write."""
        seen: set[int] = set()
        todo = list(starts)
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            for out in self.nodes[i].output:
                todo.extend(self.readers.get(out, ()))
        return seen

    def ancestors(self, names: Iterable[str]) -> set[int]:
        """Every node that `names` depend on, directly or not."""
        seen: set[int] = set()
        todo = [self.producer[n] for n in names if n in self.producer]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            todo.extend(self.producer[n] for n in self.reads[i] if n in self.producer)
        return seen

    def _constants(self) -> set[str]:
        consts = set(self.initializers)
        for node in self.nodes:  # graph protos are topologically sorted
            if node.op_type in _NONDETERMINISTIC or any(True for _ in subgraphs(node)):
                continue
            reads = [n for n in node.input if n]
            if node.op_type == "Constant" or all(
                    n in consts or (not self.defines(n) and self.outer is not None
                                    and self.outer.is_constant(n)) for n in reads):
                consts.update(o for o in node.output if o)
        return consts

    def _dirty(self) -> set[int]:
        roots = [i for i in range(len(self.nodes)) if self.is_data_dependent(i)]
        return self.descendants(roots)


def _constant_attr(attr: onnx.AttributeProto) -> np.ndarray | None:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (int, float)):
        return np.asarray(value)
    if isinstance(value, list) and value and isinstance(value[0], (int, float)):
        return np.asarray(value)
    return None


def scalar(value: np.ndarray | None) -> float | int | None:
    """A one-element constant as a Python number (None for anything else)."""
    if value is None or np.size(value) != 1:
        return None
    item = np.asarray(value).reshape(-1)[0].item()
    return item if isinstance(item, (int, float)) else None
