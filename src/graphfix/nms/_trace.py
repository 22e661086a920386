"""Tracing an NMS node's boxes and scores back to the pre-NMS tensors, and its
selected indices forward to the graph outputs, across If/Loop/Scan bodies.

Backward, from an NMS input: through the steps post-processing puts before NMS —
layout ops (Unsqueeze/Squeeze/Transpose/Reshape/Flatten/Cast/Identity/Expand),
selections (Gather/GatherND/GatherElements/Slice, a score filter when their indices
come from NonZero), TopK, Concat (each input), and the class-offset trick
(`boxes + class * (max + 1)`: an Add whose other operand comes from a Mul). The walk
goes on while the tensor is dirty (`_flow`: computed after a data-dependent node, or
defined in a body) and, on clean tensors, only through layout ops and a Gather or
Reshape with constant indices/shape; it stops at the first clean tensor produced
otherwise: that is the cut.
Any other op on a dirty tensor (decoding, clipping, normalising) is walked through on all
its inputs and recorded as a step under its op type, so split-nms cuts where the
data-dependence starts and nms-to-plugin, which accepts no step but the class offset,
refuses it with the op named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from graphfix.graph.protos import proto_label
from graphfix.nms._flow import CONTROL_FLOW, Flow

_LAYOUT = ("Unsqueeze", "Squeeze", "Transpose", "Flatten", "Cast", "Identity", "Expand",
           "Reshape")
_SELECT = ("Gather", "GatherND", "GatherElements", "Slice")
_FOLLOW_FIRST = (*_LAYOUT, *_SELECT, "TopK", "Tile")
_INDEX_CHAIN = ("Transpose", "Squeeze", "Unsqueeze", "Reshape", "Cast", "Flatten", "Slice",
                "Gather", "Identity")
_OFFSET_CHAIN = ("Unsqueeze", "Slice", "Cast", "Expand", "Reshape", "Gather", "Identity")


CLASS_OFFSET = "class offset"  # a step of `Trace.steps` that passes test for


@dataclass(frozen=True)
class Scope:
    """Where a node sits: the flows from the main graph inwards, and for each body the
    holding node's index in the enclosing flow and the attribute name."""

    flows: tuple[Flow, ...]
    containers: tuple[tuple[int, str], ...] = ()
    path: tuple[str, ...] = ()

    def lookup(self, name: str) -> tuple[int, int | None]:
        """(level of the innermost graph defining `name`, its producer index or None)."""
        for level in range(len(self.flows) - 1, -1, -1):
            flow = self.flows[level]
            if flow.defines(name):
                return level, flow.producer.get(name)
        return 0, None

    def label(self, level: int, i: int) -> str:
        return proto_label(self.flows[level].nodes[i], self.path[:level])


@dataclass
class Trace:
    """What the backward walk found: the cut tensors, the steps recognised, problems."""

    cut: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    transposed: bool = False
    reshaped: bool = False

    def step(self, text: str) -> None:
        if text not in self.steps:
            self.steps.append(text)


def trace_back(scope: Scope, start: str, role: str) -> Trace:
    """Walk from `start` (an NMS input) back to the pre-NMS tensor(s)."""
    trace = Trace()
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_visit(scope, name, role, trace))
    trace.cut.sort()
    return trace


def _visit(scope: Scope, name: str, role: str, trace: Trace) -> list[str]:
    """The tensors to walk to from `name`; records a cut, steps and problems."""
    level, i = scope.lookup(name)
    flow = scope.flows[level]
    if i is None:
        if level > 0 and name in flow.inputs:
            trace.problems.append(f"the {role} come from '{name}', an input of the body "
                                  "that holds the NMS (a loop-carried value)")
        trace.cut.append(name)
        return []
    node = flow.nodes[i]
    dirty = level > 0 or flow.is_dirty_tensor(name)
    if node.op_type in CONTROL_FLOW:
        trace.problems.append(f"the {role} come from {scope.label(level, i)}, which does "
                              "not hold this NMS: the cut would have to go before it")
        trace.cut.append(name)
        return []
    if not dirty and not _clean_step(flow, node):
        if node.op_type in ("Add", "Sub") and _offset_operand(scope, node) is not None:
            trace.step(CLASS_OFFSET)  # the cut stays here; nms-to-plugin must undo it
        trace.cut.append(name)
        return []
    op = node.op_type
    if op == "Transpose":
        perm = _attr(node, "perm")
        trace.transposed |= list(perm or []) == [0, 2, 1]
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten"):
        trace.reshaped = True
    if op == "TopK":
        trace.step("TopK")
    if op in _SELECT and len(node.input) > 1 and _from_nonzero(scope, node.input[1]):
        trace.step("score filter")
    if op in _FOLLOW_FIRST:
        return [node.input[0]]
    if op == "Concat":
        trace.step("Concat")
        return [n for n in node.input if n]
    if op in ("Add", "Sub") and (k := _offset_operand(scope, node)) is not None:
        trace.step(CLASS_OFFSET)
        return [node.input[1 - k]]
    # Any other op on a dirty tensor is post-processing too (box decoding and clipping
    # after TopK in torchvision, Ultralytics' normalised offsets): the walk goes on through
    # all its inputs, so the cut is where the data-dependence starts; the op is a step.
    trace.step(op)
    return [n for n in node.input if n]


def _clean_step(flow: Flow, node: onnx.NodeProto) -> bool:
    """Whether the walk goes on through `node` although its output is clean: layout ops
    and selections whose indices/shape are constants."""
    op = node.op_type
    if op in ("Unsqueeze", "Squeeze", "Transpose", "Flatten", "Cast", "Identity"):
        return True
    if op in ("Reshape", "Gather"):  # a constant Gather picks one class's scores
        return all(flow.is_constant(n) for n in node.input[1:] if n)
    return False


def _attr(node: onnx.NodeProto, name: str):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return None


def _from_nonzero(scope: Scope, name: str) -> bool:
    """Whether an index tensor comes from NonZero (or a one-input Where) through
    layout ops: the score-threshold filter."""
    for _ in range(8):
        level, i = scope.lookup(name)
        if i is None:
            return False
        node = scope.flows[level].nodes[i]
        if node.op_type == "NonZero" or (node.op_type == "Where" and len(node.input) == 1):
            return True
        if node.op_type not in _INDEX_CHAIN or not node.input:
            return False
        name = node.input[0]
    return False


def _offset_operand(scope: Scope, node: onnx.NodeProto) -> int | None:
    """Which operand of an Add/Sub is a class offset, when exactly one is."""
    offset = [k for k, n in enumerate(node.input[:2]) if _is_offset(scope, n)]
    return offset[0] if len(offset) == 1 else None


def _is_offset(scope: Scope, name: str) -> bool:
    """Whether `name` is a class offset: a Mul (class index times a span), reached
    through Unsqueeze/Slice/Cast/Expand/Reshape/Gather."""
    for _ in range(8):
        level, i = scope.lookup(name)
        if i is None:
            return False
        node = scope.flows[level].nodes[i]
        if node.op_type == "Mul":
            return True
        if node.op_type not in _OFFSET_CHAIN or not node.input:
            return False
        name = node.input[0]
    return False


def trace_tail(scope: Scope, outputs: list[str]) -> tuple[list[str], bool, bool]:
    """(labels of every node from the NMS outputs to the graph outputs, whether a main
    graph output is reached, whether an NMS output is itself a main graph output)."""
    tail: list[str] = []
    reached = direct = False
    todo = [(len(scope.flows) - 1, n) for n in outputs if n]
    seen: set[tuple[int, str]] = set()
    while todo:
        level, name = todo.pop()
        if (level, name) in seen:
            continue
        seen.add((level, name))
        flow = scope.flows[level]
        for r in flow.readers.get(name, ()):
            tail.append(scope.label(level, r))
            todo.extend((level, o) for o in flow.nodes[r].output if o)
        if name in flow.outputs:
            if level == 0:
                reached = True
                direct |= name in outputs
            else:
                todo.extend((level - 1, o) for o in _container_outputs(scope, level, name))
    return sorted(set(tail)), reached, direct


def _container_outputs(scope: Scope, level: int, name: str) -> list[str]:
    """The outputs of the If/Loop/Scan node that a body output `name` becomes."""
    index, attr = scope.containers[level - 1]
    holder = scope.flows[level - 1].nodes[index]
    position = scope.flows[level].outputs.index(name)
    if holder.op_type == "If":
        return [holder.output[position]] if position < len(holder.output) else []
    if holder.op_type == "Loop":  # body outputs: cond, carried..., scan outputs...
        k = position - 1
        return [holder.output[k]] if 0 <= k < len(holder.output) else []
    return [holder.output[position]] if position < len(holder.output) else []
