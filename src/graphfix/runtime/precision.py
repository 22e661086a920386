"""Outputs that carry a narrower float's precision than their own type says.

A float16 converter with `keep_io_types` (onnxconverter-common, onnxruntime's transformer
optimizer) computes the whole model in float16 and Casts each output to float32 at the
end. Such an output holds float16 values: every one of them is a float16 number, its
last bits are float16's rounding, and a correct rewrite that rounds one float16 step
differently upstream moves it by float16 units, which float32's bound (1e-5 of the
scale) calls a failure (a BERT through onnxruntime's optimizer and its float16
conversion: 3.9e-4 of the scale, from onnxruntime's own BiasGelu run inside and outside
the model). Such an output is judged with the narrow type's bound.

Only a Cast up from float16/bfloat16 counts, reached from the output through ops that
move values without computing (Reshape, Transpose, Slice...): an output computed in
float32 from float16 inputs, or joined with float32 values (Concat), keeps float32's
bound.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import TensorProto

from graphfix.graph.protos import TYPE_NAMES, type_source

NARROW = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
WIDE = {TensorProto.FLOAT, TensorProto.DOUBLE}
MOVING = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice",
          "Gather", "Expand", "Tile", "Split"}
"""Ops whose output holds values of their input 0 unchanged (not Concat: its other inputs
may be float32 computations)."""
MAX_STEPS = 256


def narrow_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """Float32/64 graph outputs cast up from a narrower float (module docstring): output
    name -> that type's name ("float16", "bfloat16")."""
    graph = model.graph
    if not any(node.op_type == "Cast" for node in graph.node):  # most models: no map to build
        return {}
    producers = {out: node for node in graph.node for out in node.output if out}
    declared = _declared_types(graph)
    found: dict[str, str] = {}
    for output in graph.output:
        if output.type.tensor_type.elem_type not in WIDE:
            continue
        cast = _cast_behind(output.name, producers)
        if cast is None or not cast.input:
            continue
        source = _source_type(cast.input[0], producers, declared)
        if source in NARROW:
            found[output.name] = NARROW[source]
    return found


def _cast_behind(name: str, producers: Mapping[str, onnx.NodeProto]) -> onnx.NodeProto | None:
    """The Cast that writes `name`, through value-moving ops; None if none does."""
    for _ in range(MAX_STEPS):
        node = producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Cast":
            return node
        if node.op_type not in MOVING or not node.input:
            return None
        name = node.input[0]
    return None


def _source_type(name: str, producers: Mapping[str, onnx.NodeProto],
                 declared: Mapping[str, int]) -> int:
    """The element type of tensor `name` as the nodes computing it fix it: a Cast's `to`,
    an initializer's, Constant's or graph input's type, one the op's schema fixes; through
    an op whose output has one of its inputs' type (`type_source`; a non-ONNX op is taken
    to keep input 0's, as onnxruntime's fused ops do). 0 when it cannot be told."""
    for _ in range(MAX_STEPS):
        if name in declared:
            return declared[name]
        node = producers.get(name)
        if node is None or not node.input:
            if node is not None and node.op_type == "Constant":
                return _constant_type(node)
            return 0
        if node.op_type == "Cast":
            return next((a.i for a in node.attribute if a.name == "to"), 0)
        if node.domain not in ("", "ai.onnx"):  # onnxruntime's fused ops keep input 0's
            source: int | str | None = 0
        else:
            source = type_source(node.op_type, list(node.output).index(name))
        if isinstance(source, str):  # a type the schema fixes
            return TYPE_NAMES.get(source, 0)
        if source is None or source >= len(node.input) or not node.input[source]:
            return 0
        name = node.input[source]
    return 0


def _constant_type(node: onnx.NodeProto) -> int:
    for a in node.attribute:
        if a.name == "value":
            return a.t.data_type
    return 0


def _declared_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Types no node computes: initializers and graph inputs."""
    types = {t.name: t.data_type for t in graph.initializer}
    for vi in graph.input:
        types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return types
