"""Where Q/DQ goes: which input edges read a quantized tensor, which weights are quantized
per channel, which activation scales must be equal. `qdq.plan` wraps this.

Sources: ../shared/trt/calibration_notes.md, section (d). Its "Q/DQ placement" items are
the TensorRT developer guide's "Q/DQ Layer-Placement Recommendations" as *recalled* there
(not re-read); its "ModelOpt ONNX INT8 placement" was verified in NVIDIA ModelOpt's code.

1. Weighted ops (Conv, ConvTranspose, Gemm, MatMul) with a constant float32 weight: a Q/DQ
   pair on the activation input (input 0) and a per-channel DequantizeLinear on the weight
   (input 1). (d) Q/DQ placement 1 (recalled): "Quantize all inputs of weighted ops ...
   weights usually per-channel, axis 0 for Conv, axis 1 for ConvTranspose". Gemm: axis 0
   with transB=1 (weight [N, K]), else 1; MatMul: the weight's last axis ([..., K, N]); both
   are the output channels, as doctor's qdq-axis rule expects. The bias stays float
   (ModelOpt `QuantizeBias=False`, verified). A MatMul of two activations (attention) or a
   weighted op in an If/Loop/Scan body is skipped, with the reason.
2. Outputs are not quantized: Q/DQ sits on the *input edges* of the ops that read a tensor
   in INT8. (d) placement 2 (recalled): "By default do not quantize the outputs of weighted
   ops"; ModelOpt `OpTypesToExcludeOutputQuantization` = all op types (verified). One pair
   per tensor is shared by all its INT8 readers (ModelOpt `DedicatedQDQPair=False`); other
   readers, and graph outputs, keep the float tensor.
3. Residual Add: when one input of an Add is the output of a quantized Conv/ConvTranspose
   read by nothing else (the side TensorRT fuses into the convolution), the *other* input
   gets a Q/DQ pair and the Conv side stays float. (d) placement 4 (recalled): "Quantize
   the residual input of element-wise Add ... An extra Q/DQ pair between Conv and Add
   breaks the fusion"; ModelOpt `build_non_residual_input_map` (verified) does the same.
   When both sides qualify, the one on the longer path from their nearest common ancestor
   is the fused (non-residual) side, as ModelOpt decides; a tie keeps input 0 fused.
4. AveragePool/GlobalAveragePool: the input is quantized when the pool has a quantized
   neighbour: its input comes from a quantized weighted op (through copy ops or the
   activation TensorRT fuses into the op: Relu, LeakyRelu, Clip), or its output reaches a
   quantized weighted op through copy ops. (d) placement 5 (recalled): TensorRT "fuses Q/DQ
   with 'quantizable' ops (e.g. AveragePool, element-wise Add)"; ModelOpt (verified):
   "pooling/window ops are quantized only if they have a quantizable neighbour". Looking
   through the fused activation is graphfix's reading of (d) placement 3 (TensorRT fuses
   Conv+BN+ReLU itself).
5. MaxPool/GlobalMaxPool get no pair of their own: TensorRT "propagates DQ forward and Q
   backward through 'commuting' ops (e.g. MaxPool, ...)" ((d) placement 5, recalled), so
   the pair at the consumer's input already makes the pooling INT8; a second pair at its
   input would be extra rounding that doctor's qdq-unfusable rule flags.
6. Concat: a Concat whose output (or the copy-op chain after it) is quantized shares one
   scale with those of its inputs that are quantized: TensorRT moves Q through "Concat
   where scales are equal" ((d) placement 5, recalled); ModelOpt's `concat_elimination`
   pass groups Concat input/output tensors to share one scale (verified). Groups that
   overlap merge.
7. A BatchNormalization that is the only reader of a quantized op's output is refused:
   fold it first (`fold-bn`). (d) placement 3 (recalled): do not simulate BatchNorm
   folding; graphfix calibrates the folded model, whose numbers TensorRT will run. When
   that output has other readers (or is a graph output) the BatchNormalization is
   accepted and stays a float op of its own: TensorRT fuses a Conv with what follows only
   when nothing else reads the Conv's output (../shared/DESIGN.md, "a second consumer"),
   and fold-bn folds it only into a copy of the op, which its cost model may decline
   (maxvit_t's stem Conv, read by the first block's BatchNormalization and its
   shortcut's AveragePool). A BatchNormalization *before* a weighted op (BN -> Conv,
   which fold-bn does not fold) is accepted: the Conv's input pair sits after it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import constant_value, is_graph_output, is_onnx, node_label

WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
AVERAGE_POOLS = ("AveragePool", "GlobalAveragePool")
# Ops that only move or reshape data ("Reshape/Transpose-like copy ops", (d) placement 5).
COPY_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
# Activations TensorRT fuses into the weighted op before them (rule 4 looks through them).
FUSED_ACTIVATIONS = frozenset({"Relu", "LeakyRelu", "Clip"})
_FUSING_PRODUCERS = ("Conv", "ConvTranspose")
# The skip reason for a weight computed from constants (a tied embedding's Transpose):
# `runner.planned` folds those and plans again.
WEIGHT_FROM_CONSTANTS = ("its weight (input 1) is computed from constants: run the "
                         "fold-constants pass first")
_MAX_WALK = 8  # chains (copy ops, fused activations, constant math) followed this far


def node_key(node: gs.Node) -> str:
    """How plans name a node: its name, or its first output's name when it has none."""
    return node.name or (node.outputs[0].name if node.outputs else "")


@dataclass
class Placement:
    """The result of `place`: edges (tensor, node key, input index), weights (name, node
    key, axis), groups of tensors sharing a scale, and (label, reason) skips."""

    edges: list[tuple[str, str, int]] = field(default_factory=list)
    weights: list[tuple[str, str, int]] = field(default_factory=list)
    shared: list[tuple[str, ...]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    unfolded_bn: list[tuple[str, str]] = field(default_factory=list)  # (BN label, op label)


def weight_axis(node: gs.Node) -> tuple[int | None, str]:
    """The output-channel axis of the node's constant weight (input 1), or why there is none."""
    if len(node.inputs) < 2 or not node.inputs[0].name:
        return None, "it has no activation and weight inputs"
    activation, weight = constant_value(node.inputs[0]), constant_value(node.inputs[1])
    if activation is not None:
        return None, "its input 0 is a constant, not an activation to calibrate"
    if weight is None:
        if _static(node.inputs[1]):
            return None, WEIGHT_FROM_CONSTANTS
        if node.op == "MatMul":
            return None, "both inputs are activations (attention-style MatMul): kept in float"
        return None, "its weight (input 1) is computed at run time, not a constant"
    if weight.dtype != np.float32:
        return None, f"its weight is {weight.dtype}; graphfix quantizes float32 weights"
    if node.op == "Conv":
        axis = 0
    elif node.op == "ConvTranspose":
        axis = 1
    elif node.op == "Gemm":
        axis = 0 if node.attrs.get("transB", 0) else 1
    else:
        axis = weight.ndim - 1
    if weight.ndim < 2 or (node.op in _FUSING_PRODUCERS and weight.ndim < 3):
        return None, f"its weight has rank {weight.ndim}"
    return axis, ""


def place(graph: gs.Graph, excluded_names: set[str], excluded_ops: set[str]) -> Placement:
    """Apply the module's rules to the main graph of `graph` (see the module docstring)."""
    result = Placement()

    def excluded(node: gs.Node) -> str:
        if node_key(node) in excluded_names:
            return "excluded by name (--exclude-nodes)"
        if node.op in excluded_ops:
            return f"excluded by op type (--exclude-op-types {node.op})"
        return ""

    quantized: set[int] = set()  # id() of quantized weighted nodes
    for node in graph.nodes:
        if not is_onnx(node, *WEIGHTED_OPS):
            continue
        reason = excluded(node)
        axis = None
        if not reason:
            axis, reason = weight_axis(node)
        if axis is None:
            result.skipped.append((node_label(node), reason))
            continue
        quantized.add(id(node))
        result.edges.append((node.inputs[0].name, node_key(node), 0))
        result.weights.append((node.inputs[1].name, node_key(node), axis))
    for node in graph.nodes:
        if is_onnx(node, "Add"):
            _residual_add(graph, node, quantized, excluded(node), result)
        elif is_onnx(node, *AVERAGE_POOLS) and node.inputs and (
                _quantized_producer(node.inputs[0], quantized)
                or _quantized_consumer(node.outputs[0], quantized)):
            reason = excluded(node)
            if reason:
                result.skipped.append((node_label(node), f"{reason}: its input stays float"))
            else:
                result.edges.append((node.inputs[0].name, node_key(node), 0))
        elif is_onnx(node, "BatchNormalization") and node.inputs:
            producer = _producer(node.inputs[0])
            if (producer is not None and id(producer) in quantized
                    and len(node.inputs[0].outputs) == 1
                    and not is_graph_output(graph, node.inputs[0])):
                result.unfolded_bn.append((node_label(node), node_label(producer)))
    result.edges = _in_graph_order(graph, result.edges)
    result.shared = _concat_groups(graph, {t for t, _, _ in result.edges})
    return result


def _producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if len(tensor.inputs) == 1 else None


def _residual_add(graph: gs.Graph, add: gs.Node, quantized: set[int], reason: str,
                  result: Placement) -> None:
    """Rule 3: quantize the input that is not fused into a quantized Conv/ConvTranspose."""
    if len(add.inputs) != 2 or any(_static(t) for t in add.inputs):
        return  # a bias or constant Add, not a residual one
    fusable = []
    for i, tensor in enumerate(add.inputs):
        producer = _producer(tensor)
        if (producer is not None and id(producer) in quantized
                and producer.op in _FUSING_PRODUCERS and len(tensor.outputs) == 1
                and not is_graph_output(graph, tensor)):
            fusable.append(i)
    if not fusable:
        return
    if reason:
        result.skipped.append((node_label(add), f"{reason}: its residual input stays float"))
        return
    fused = fusable[0]
    if len(fusable) == 2:
        fused = _longer_branch(_producer(add.inputs[0]), _producer(add.inputs[1]))
    other = 1 - fused
    result.edges.append((add.inputs[other].name, node_key(add), other))


def _static(tensor: gs.Tensor, depth: int = 0) -> bool:
    """Whether `tensor` is a constant, or computed from constants only within a few nodes
    (Paddle exports a Conv bias as Add(conv, Reshape(constant)))."""
    if isinstance(tensor, gs.Constant) or constant_value(tensor) is not None:
        return True
    producer = _producer(tensor)
    if producer is None or depth >= _MAX_WALK or not producer.inputs:
        return False
    return all(_static(t, depth + 1) for t in producer.inputs if t.name)


def _ancestors(node: gs.Node) -> dict[int, int]:
    """id(tensor) -> fewest nodes from `node` back to each non-constant tensor it depends on
    (its own inputs at 1), graph inputs included."""
    dist: dict[int, int] = {}
    queue = deque([(node, 1)])
    while queue:
        current, depth = queue.popleft()
        for tensor in current.inputs:
            if isinstance(tensor, gs.Constant) or id(tensor) in dist:
                continue
            dist[id(tensor)] = depth
            parent = _producer(tensor)
            if parent is not None:
                queue.append((parent, depth + 1))
    return dist


def _longer_branch(a: gs.Node, b: gs.Node) -> int:
    """0 when `a` is at least as far as `b` from their nearest common ancestor tensor,
    else 1 (0 when they share none)."""
    da, db = _ancestors(a), _ancestors(b)
    common = [(da[k] + db[k], da[k], db[k]) for k in da.keys() & db.keys()]
    if not common:
        return 0
    _, to_a, to_b = min(common)
    return 0 if to_a >= to_b else 1


def _quantized_producer(tensor: gs.Tensor, quantized: set[int], depth: int = 0) -> bool:
    """Whether `tensor` comes from a quantized weighted op, through copy ops and fused
    activations with one non-constant input each."""
    producer = _producer(tensor)
    if producer is None or depth > _MAX_WALK:
        return False
    if id(producer) in quantized:
        return True
    if not is_onnx(producer) or producer.op not in COPY_OPS | FUSED_ACTIVATIONS:
        return False
    variables = [t for t in producer.inputs if t.name and constant_value(t) is None]
    return len(variables) == 1 and _quantized_producer(variables[0], quantized, depth + 1)


def _quantized_consumer(tensor: gs.Tensor, quantized: set[int], depth: int = 0) -> bool:
    """Whether a quantized weighted op reads `tensor` as its activation, through copy ops."""
    if depth > _MAX_WALK:
        return False
    for reader in tensor.outputs:
        if id(reader) in quantized and reader.inputs[0] is tensor:
            return True
        if is_onnx(reader) and reader.op in COPY_OPS and reader.outputs and \
                _quantized_consumer(reader.outputs[0], quantized, depth + 1):
            return True
    return False


def _in_graph_order(graph: gs.Graph, edges: list[tuple[str, str, int]]
                    ) -> list[tuple[str, str, int]]:
    """Edges sorted by their reader's place in the graph, then input index."""
    order = {node_key(n): i for i, n in enumerate(graph.nodes)}
    return sorted(dict.fromkeys(edges), key=lambda e: (order.get(e[1], len(order)), e[2]))


def _concat_groups(graph: gs.Graph, activations: set[str]) -> list[tuple[str, ...]]:
    """Rule 6, with overlapping groups merged (union-find); members in graph order."""
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for node in graph.nodes:
        if not is_onnx(node, "Concat") or not node.outputs:
            continue
        out = _quantized_alias(node.outputs[0], activations)
        if out is None:
            continue
        members = [out] + [t.name for t in node.inputs if t.name in activations]
        for name in members[1:]:
            parent[find(name)] = find(out)
    groups: dict[str, list[str]] = {}
    for name in parent:
        groups.setdefault(find(name), []).append(name)
    position = {t: i for i, t in enumerate(_tensor_order(graph))}
    return [tuple(sorted(g, key=lambda t: position.get(t, len(position))))
            for g in groups.values() if len(g) > 1]


def _quantized_alias(tensor: gs.Tensor, activations: set[str]) -> str | None:
    """`tensor`'s name when quantized, else that of the end of a single-reader copy-op
    chain after it that is quantized, else None."""
    for _ in range(_MAX_WALK):
        if tensor.name in activations:
            return tensor.name
        if len(tensor.outputs) != 1 or not is_onnx(tensor.outputs[0]) or \
                tensor.outputs[0].op not in COPY_OPS or not tensor.outputs[0].outputs:
            return None
        tensor = tensor.outputs[0].outputs[0]
    return None


def _tensor_order(graph: gs.Graph) -> list[str]:
    """Tensor names in the order the graph makes them: inputs, then node outputs."""
    names = [t.name for t in graph.inputs]
    for node in graph.nodes:
        names.extend(t.name for t in node.outputs)
    return names
