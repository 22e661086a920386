"""Tensors onnxruntime computes differently on every run: they follow a training-mode
Dropout, whose mask it draws anew each run (a model exported with
`TrainingMode.TRAINING` or `PRESERVE` while in train mode).

No check can compare them: the original run against itself differs. `graphfix run`'s
check does not judge the outputs that follow one (`runtime.outputs`), and `graphfix
check` does not judge the tensors (`check.layerwise`); both say which Dropout and how
to avoid it, where they would otherwise blame the rewrite or onnxruntime's
optimizations. Random* ops are not listed: onnxruntime seeds them the same way every
run, so they repeat.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from graphfix.graph.protos import all_nodes, subgraphs

FIX = "export the model in eval mode (model.eval() before torch.onnx.export)"


def random_sources(model: onnx.ModelProto) -> dict[str, str]:
    """Main-graph tensors drawn anew on every run: {tensor: why}."""
    constants = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = attr.t
    found: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            continue
        if not _training(node, constants) or _zero_ratio(node, constants):
            continue
        label = f"Dropout '{node.name or node.output[0]}'"
        for name in node.output:
            if name:
                found[name] = (f"it follows {label} in training mode, whose mask onnxruntime "
                               "draws anew on every run")
    return found


def _value(name: str, constants: dict[str, onnx.TensorProto]):
    tensor = constants.get(name)
    return None if tensor is None else numpy_helper.to_array(tensor)


def _training(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """training_mode (opset 12+) set and not a constant false; earlier Dropouts are
    inference in onnxruntime."""
    if len(node.input) < 3 or not node.input[2]:
        return False
    mode = _value(node.input[2], constants)
    if mode is None:  # computed: may be true
        return True
    return mode.size > 0 and bool(mode.reshape(-1)[0])


def _zero_ratio(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto]) -> bool:
    """A ratio of 0 keeps every element: the identity, the same on every run."""
    if len(node.input) < 2 or not node.input[1]:
        return False  # the default ratio, 0.5
    ratio = _value(node.input[1], constants)
    return ratio is not None and ratio.size == 1 and float(ratio.reshape(-1)[0]) == 0.0


def downstream(model: onnx.ModelProto, sources: dict[str, str]) -> dict[str, str]:
    """Every main-graph tensor computed from `sources` (node order), with the reason of
    the first source it follows; `sources` included."""
    out = dict(sources)
    if not sources:
        return out
    for node in model.graph.node:
        reads = list(node.input)
        for body in subgraphs(node):  # bodies read outer tensors by name
            reads += [i for n in all_nodes(body) for i in n.input]
        why = next((out[name] for name in reads if name in out), None)
        if why is not None:
            for name in node.output:
                if name:
                    out.setdefault(name, why)
    return out
