"""How much running a model could cost, estimated before running it: Loops that never end.

A Loop runs its body M times (M: its trip-count input) unless its condition turns
false first. graphfix runs models in onnxruntime (the output check, `graphfix check`,
constant folding), and a Loop whose M is a huge constant (2^62) and whose condition
never turns false runs until it is killed. The estimate counts node runs:

    work(graph) = sum over its nodes of 1, plus for a Loop: trips x work(body);
                  for an If: the larger branch's work; for a Scan: work(body) once

A Loop's `trips` is M when the loop provably never stops early:
- M is a constant (an initializer or a Constant node, through Identity/Cast), and
- its first condition is absent, or true, or not a constant (it may be true), and
- its body's condition output can never be false: a constant true, or the body's
  condition input passed through (directly or by Identity), or absent.
A Loop whose first condition is the constant false runs 0 times. Any other Loop counts
its body once: when M is not a constant, or the body computes its condition (PyTorch
exports `while` as M = 2^63-1 with a computed condition), how long it runs depends on
the data, and is not guessed here. A Scan's length is its input's, also counted once.

`WORK_LIMIT` is the bound: `runaway_loops` names the outermost Loops past it (the
work of a Loop inside another is multiplied by the outer trips), `check_work` raises
`TooMuchWork` (a GraphfixError: what, why, how to fix) for a model that has one.
The estimate reads only the scalars it needs (M and the conditions); it takes a
ModelProto, a GraphProto, or an onnx-graphsurgeon Graph (for constant folding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.errors import GraphfixError
from graphfix.graph.protos import all_nodes

WORK_LIMIT = 10**7
"""Node runs: onnxruntime spends about 1 us per node run on tiny tensors (more on real
ones), so this bound is ~10 s at the very least; a model past it is not run."""
_PASS = ("Identity", "Cast")


@dataclass(frozen=True)
class LoopWork:
    """A Loop the estimate stops at: its label, trips, node runs per trip and in all
    (multiplied by the trips of the Loops around it)."""

    node: str
    trips: int
    body: int
    work: int

    def describe(self) -> str:
        return (f"Loop '{self.node}' would run its body {self.trips} times "
                f"({self.body} node runs each, {self.work:.3g} in all)")


class TooMuchWork(GraphfixError):
    """A model whose Loops would run past the work bound; `loops` says which."""

    def __init__(self, loops: Sequence[LoopWork], limit: int, fix: str,
                 label: str = "The model") -> None:
        self.loops = tuple(loops)
        super().__init__(
            f"{label} cannot be run: {loops[0].describe()}",
            "its trip count is a constant and its condition can never turn false, so "
            f"onnxruntime would not finish (graphfix runs at most {limit:.3g} node runs "
            "in a model; docs/inputs.md, 'Models too long to run')",
            fix)


@dataclass
class _Op:
    """One node, as much as the estimate needs (from a proto or a gs node)."""

    name: str
    op: str
    trips: int | None = None  # Loop: the constant M, None when not constant
    starts: bool = True       # Loop: the first condition may be true
    endless: bool = False     # Loop: the body's condition can never turn false
    bodies: tuple[list[_Op], ...] = ()


def runaway_loops(model, limit: int = WORK_LIMIT) -> list[LoopWork]:
    """The outermost Loops whose work (module docstring) exceeds `limit`. `model`: a
    ModelProto, GraphProto or onnx_graphsurgeon Graph."""
    found: list[LoopWork] = []
    if _may_loop(model):
        _scan(_ops(model), 1, limit, found)
    return found


def model_work(model) -> int:
    """The estimated node runs of one run of `model` (module docstring)."""
    return _work(_ops(model))


def check_work(model, limit: int = WORK_LIMIT, fix: str = "", label: str = "The model"
               ) -> None:
    """Raise TooMuchWork when `runaway_loops(model, limit)` finds any; `label` names the
    model in the message ("REFERENCE")."""
    loops = runaway_loops(model, limit)
    if loops:
        raise TooMuchWork(loops, limit, fix or (
            "give the Loop a trip count it can finish, or a condition that turns false; "
            "graphfix run rewrites such a model without the numerical check"), label)


def _may_loop(model) -> bool:
    """Whether a Loop is anywhere in `model` (subgraphs included): a model without one,
    most, needs no estimate, and this look is ~6x cheaper than building it (Mask R-CNN's
    proto, 2,630 nodes: 1.6 ms against 9 ms; every session the check makes pays it, and
    fold-constants on every graph)."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    if isinstance(graph, onnx.GraphProto):
        return any(node.op_type == "Loop" for node in all_nodes(graph))
    from graphfix.graph.walk import all_graphs  # an onnx-graphsurgeon Graph

    return any(node.op == "Loop" for g in all_graphs(model) for node in g.nodes)


def _ops(model) -> list[_Op]:
    if isinstance(model, onnx.ModelProto):
        return _proto_ops(model.graph, {})
    if isinstance(model, onnx.GraphProto):
        return _proto_ops(model, {})
    return _gs_ops(model)


def _trips(op: _Op) -> int:
    if op.op != "Loop":
        return 1
    if not op.starts:
        return 0
    return op.trips if op.trips is not None and op.endless else 1


def _work(ops: list[_Op]) -> int:
    total = 0
    for op in ops:
        inner = [_work(b) for b in op.bodies]
        if op.op == "Loop" and inner:
            total += 1 + _trips(op) * inner[0]
        else:
            total += 1 + (max(inner) if inner else 0)
    return total


def _scan(ops: list[_Op], outer: int, limit: int, found: list[LoopWork]) -> None:
    for op in ops:
        if op.op == "Loop" and op.bodies:
            body = _work(op.bodies[0])
            trips = _trips(op)
            if outer * trips * body > limit:
                found.append(LoopWork(op.name, trips, body, outer * trips * body))
                continue
            _scan(op.bodies[0], outer * max(trips, 1), limit, found)
        else:
            for sub in op.bodies:
                _scan(sub, outer, limit, found)


# --- ONNX protos -------------------------------------------------------------------

def _proto_ops(graph: onnx.GraphProto, outer: dict[str, Callable[[], np.ndarray]]
               ) -> list[_Op]:
    """`outer`: the constants of enclosing graphs, by name (values read on demand)."""
    consts = dict(outer)
    for init in graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            consts[init.name] = lambda t=init: numpy_helper.to_array(t)
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for out in node.output:
            producer[out] = node
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = lambda a=attr: numpy_helper.to_array(a.t)
                elif attr.name in ("value_int", "value_ints"):
                    consts[node.output[0]] = lambda a=attr: np.asarray(
                        onnx.helper.get_attribute_value(a))

    def scalar(name: str, depth: int = 0):
        if name in consts:
            value = consts[name]()
            return value.reshape(-1)[0].item() if value.size == 1 else None
        node = producer.get(name)
        if node is not None and node.op_type in _PASS and node.input and depth < 8:
            return scalar(node.input[0], depth + 1)
        return None

    ops = []
    for node in graph.node:
        label = node.name or (node.output[0] if node.output else node.op_type)
        bodies = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        bodies += [g for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS
                   for g in a.graphs]
        op = _Op(label, node.op_type, bodies=tuple(_proto_ops(b, consts) for b in bodies))
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and bodies:
            m = scalar(node.input[0]) if node.input and node.input[0] else None
            op.trips = int(m) if m is not None else None
            cond = scalar(node.input[1]) if len(node.input) > 1 and node.input[1] else True
            op.starts = cond is None or bool(cond)
            op.endless = _proto_endless(bodies[0])
        ops.append(op)
    return ops


def _proto_endless(body: onnx.GraphProto) -> bool:
    """Whether the body's condition output can never be false (module docstring)."""
    if not body.output or not body.output[0].name:
        return True
    cond_in = body.input[1].name if len(body.input) > 1 else None
    producer = {out: n for n in body.node for out in n.output}
    inits = {t.name: t for t in body.initializer}
    name = body.output[0].name
    for _ in range(8):
        if name == cond_in:
            return True
        if name in inits:
            return bool(numpy_helper.to_array(inits[name]).all())
        node = producer.get(name)
        if node is None:
            return False
        if node.op_type == "Constant":
            return any(a.name == "value" and bool(numpy_helper.to_array(a.t).all())
                       for a in node.attribute)
        if node.op_type != "Identity" or not node.input:
            return False
        name = node.input[0]
    return False


# --- onnx-graphsurgeon -----------------------------------------------------------------

def _gs_value(tensor, depth: int = 0):
    """A gs tensor's scalar value when it is a constant (through Identity/Cast)."""
    import onnx_graphsurgeon as gs

    if isinstance(tensor, gs.Constant):
        from graphfix.graph import constant_value  # reads without caching (its docstring)

        values = constant_value(tensor)
        return values.reshape(-1)[0].item() if values.size == 1 else None
    if len(tensor.inputs) != 1 or depth >= 8:
        return None
    node = tensor.inputs[0]
    if node.op == "Constant" and isinstance(node.attrs.get("value"), gs.Constant):
        return _gs_value(node.attrs["value"], depth + 1)
    if node.op in _PASS and node.inputs:
        return _gs_value(node.inputs[0], depth + 1)
    return None


def _gs_ops(graph) -> list[_Op]:
    import onnx_graphsurgeon as gs

    ops = []
    for node in graph.nodes:
        bodies = [v for v in node.attrs.values() if isinstance(v, gs.Graph)]
        op = _Op(node.name or (node.outputs[0].name if node.outputs else node.op), node.op,
                 bodies=tuple(_gs_ops(b) for b in bodies))
        if node.op == "Loop" and node.domain in (None, "", "ai.onnx") and bodies:
            inputs = node.inputs
            m = _gs_value(inputs[0]) if inputs and inputs[0].name else None
            op.trips = int(m) if m is not None else None
            cond = _gs_value(inputs[1]) if len(inputs) > 1 and inputs[1].name else True
            op.starts = cond is None or bool(cond)
            op.endless = _gs_endless(bodies[0])
        ops.append(op)
    return ops


def _gs_endless(body) -> bool:
    if not body.outputs:
        return True
    cond_in = body.inputs[1] if len(body.inputs) > 1 else None
    tensor = body.outputs[0]
    for _ in range(8):
        if cond_in is not None and tensor is cond_in:
            return True
        value = _gs_value(tensor)
        if value is not None:
            return bool(value)
        if len(tensor.inputs) != 1 or tensor.inputs[0].op != "Identity":
            return False
        tensor = tensor.inputs[0].inputs[0]
    return False
