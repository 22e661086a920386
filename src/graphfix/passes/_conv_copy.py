"""Fold into a copy of a Conv whose output has other readers, when the copy is cheaper.

fold-bn, fuse-conv-mul and fuse-conv-bias fold a per-channel op P (BatchNormalization,
a constant Mul/Div/Add/Sub) into the Conv before it. When the Conv output y is also
read by another node (or is a graph output), y must keep its values, so P can only
fold into a copy of the Conv, which the other readers do not see::

    z = P(Conv(x, W, b)), r = R(y = Conv(x, W, b))
        ->  z = Conv'(x, W', b'), r = R(Conv(x, W, b))

Cost model (per chain; a model from first principles, not measured on TensorRT).
Count time in element moves: reading or writing one element of a tensor in memory.
With E the elements of y:

- left alone, P is an elementwise layer TensorRT cannot fuse into the Conv, since y
  must also be written for its other readers: it reads y (E moves) and writes z (E);
- the copy reads x and its own weights again (in + w moves), does the Conv's
  multiply-adds again (MACs), and writes z (E).

z is written either way, so the copy saves E moves and adds in + w + MACs /
`MACS_PER_ELEMENT_MOVE`. It is made when that is less than E. Per output element
(weights aside), a Conv with K = Cin/group * prod(kernel) MACs per output element
and r input elements per output element is copied when K / M + r < 1, with
M = `MACS_PER_ELEMENT_MOVE` = 16:

- depthwise at stride 1 (r = 1): never; the copy reads an x as large as the y it
  saves reading, and adds its MACs;
- expanding 1x1 Convs with few input channels (8 -> 64: 0.5 + 0.125) and depthwise
  Convs with a channel multiplier (3x3, 4 outputs per input: 0.56 + 0.25): copied;
- 3x3 Convs over 16 or more input channels (K >= 144): never.

Sizes are the run's (`PassContext.input_shapes`, the shapes the output check uses):
a static shape on the tensor, else ONNX shape inference at those input shapes. When
a size is still unknown, nothing is copied and the note says so. A copy is not made
either when P's result meets y again in a few elementwise steps (y * Clip(y + 3, 0,
6) / 6, a decomposed HardSwish): P is then part of one elementwise expression of y,
not a scale or bias of its own, and the expression stays whatever is folded. Gemm
and MatMul are not copied (a copy repeats a whole matrix product).

The copy shares the Conv's input and attributes; the pass gives it new weight and
bias constants (never changing a constant another node reads), and it takes P's
output tensor, so names are kept. With its own weights it is not a duplicate of the
Conv for `merge-duplicates`, and its output has one reader, so no pass folds or
copies again: a second run changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import onnx
import onnx_graphsurgeon as gs

from graphfix.graph import (
    constant_value,
    fresh_name,
    is_graph_output,
    is_onnx,
    node_label,
    opset_of,
    replace_in,
)
from graphfix.graph.convert import export
from graphfix.graph.protos import graph_protos, infer_shapes
from graphfix.graph.skeleton import skeleton
from graphfix.passes._hard_activations import relu6_of_x_plus_3

MACS_PER_ELEMENT_MOVE = 16
"""Multiply-adds that cost as much time as one element move. A GPU's peak FP32
multiply-add rate over its peak memory bandwidth is of the order of 5 per byte on
current data-center parts (published figures, not measured here): about 20 per 4-byte
element; FP16 doubles the rate and halves the bytes, about the same per element. 16
is a little below that, so a copy's MACs weigh a little more than the balance says;
and summing MACs and moves (a kernel overlaps them) overstates a copy's time too: a
copy is made only when it wins under a pessimistic model."""

COPIED_OPS = ("Conv", "ConvTranspose")
_HOPS = 3  # how far P's result is followed to see whether it meets y again
# Elementwise ops: a path through them from P back to y makes P part of one elementwise
# expression of y.
_POINTWISE = ("Add", "Sub", "Mul", "Div", "Clip", "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid",
              "Tanh", "Max", "Min", "Neg", "Abs", "Exp", "Erf", "Pow", "Sqrt", "HardSwish")


class Into(Enum):
    """Where a per-channel op folds: the producer itself, or a new copy of it."""

    PRODUCER = "the producer"
    COPY = "a copy of the producer"


class ConvCopies:
    """One pass run's decisions and copies: `decide`, then `target` after the budget."""

    def __init__(self, graph: gs.Graph, input_shapes: dict[str, tuple[int, ...]],
                 names: set[str], known: dict[str, tuple[int, ...]] | None = None) -> None:
        self.shapes = ShapeBook(graph, input_shapes, known)
        self.names = names

    def decide(self, g: gs.Graph, producer: gs.Node, reader: gs.Node) -> Into | str:
        """Where `reader` (reading `producer`'s output) folds, or why nowhere."""
        return decide(g, producer, reader, self.shapes)

    def target(self, g: gs.Graph, producer: gs.Node, reader: gs.Node, into: Into,
               node_ids: set[int]) -> gs.Node:
        """The node to fold into: `producer`, or a new copy that `reader` now reads
        (added to `node_ids`, so later folds in this run see it as part of `g`)."""
        if into is Into.PRODUCER:
            return producer
        copy = copy_producer(g, producer, reader, self.names)
        node_ids.add(id(copy))
        return copy


def label(reader: gs.Node, producer: gs.Node, into: Into) -> str:
    """How a rewrite budget names the fold."""
    where = "a copy of " if into is Into.COPY else ""
    return f"{node_label(reader)} into {where}{node_label(producer)}"


def counted(phrase: str, producer: gs.Node, into: Into) -> str:
    """The count phrase of a fold: copies are counted apart."""
    return f"{phrase}, on a copy of the {producer.op}" if into is Into.COPY else phrase


# ----------------------------------------------------------------------------- decide


def decide(g: gs.Graph, producer: gs.Node, reader: gs.Node, shapes: ShapeBook) -> Into | str:
    """Into.PRODUCER when `reader` is the only use of the producer's output, Into.COPY
    when the cost model says a copy is cheaper, else why neither (naming the other
    readers and the numbers)."""
    y = producer.outputs[0]
    if not is_graph_output(g, y) and all(r is reader for r in y.outputs):
        return Into.PRODUCER
    meet = _meets_again(reader, y)
    if meet is not None:
        what = _hardswish(g, reader, meet, producer.op) or (
            f"{node_label(meet)} reads both its result and the {producer.op} output")
        return (f"{what}: it is part of one elementwise expression of the {producer.op} "
                f"output, not a scale or bias of its own, so copying the {producer.op} "
                "would add work and remove nothing")
    also = _also_read(g, y, reader, producer.op)
    if not is_onnx(producer, *COPIED_OPS):
        return (f"{also}, which needs it without the {reader.op}; only a Conv or "
                f"ConvTranspose is copied for that (a {producer.op} copy repeats a whole "
                "matrix product)")
    cost = copy_cost(producer, shapes)
    if isinstance(cost, str):
        return (f"{also}; whether a copy of {node_label(producer)} for the {reader.op} is "
                f"cheaper is not known: {cost}, and a copy is made only when the cost model "
                "shows it cheaper")
    if not cost.cheaper:
        return (f"{also}; copying {node_label(producer)} to fold the {reader.op} would add "
                f"{cost.describe()}, so it is not copied")
    return Into.COPY


def _also_read(g: gs.Graph, y: gs.Tensor, reader: gs.Node, op: str) -> str:
    """'the Conv output is also read by Relu 'r'' (and/or 'a graph output')."""
    others = list(dict.fromkeys(node_label(r) for r in y.outputs if r is not reader))
    parts = [f"read by {', '.join(others)}"] if others else []
    if is_graph_output(g, y):
        parts.append("a graph output")
    return f"the {op} output is also {' and '.join(parts)}"


def _meets_again(reader: gs.Node, y: gs.Tensor) -> gs.Node | None:
    """A pointwise node within `_HOPS` pointwise steps after `reader` that reads `y` too."""
    frontier, seen = [reader], {id(reader)}
    for _ in range(_HOPS):
        following = []
        for node in frontier:
            for r in (r for t in node.outputs for r in t.outputs):
                if id(r) in seen or not is_onnx(r, *_POINTWISE):
                    continue
                seen.add(id(r))
                if any(t is y for t in r.inputs):
                    return r
                following.append(r)
        frontier = following
    return None


def _hardswish(g: gs.Graph, reader: gs.Node, meet: gs.Node, op: str) -> str:
    """Names the + 3 of a decomposed HardSwish x * Clip(x + 3, 0, 6) / 6 ("" when
    `reader` is not that Add and `meet` not its Mul): normalize-activations' pattern
    (`_hard_activations.relu6_of_x_plus_3`)."""
    clips = reader.outputs[0].outputs if is_onnx(reader, "Add") else []
    if not is_onnx(meet, "Mul") or len(clips) != 1 or not clips[0].outputs:
        return ""
    relu6 = clips[0].outputs[0]
    inner = relu6_of_x_plus_3(g, relu6, opset_of(g), {id(n) for n in g.nodes})
    if inner is None or inner.nodes[1] is not reader or not any(t is relu6
                                                                for t in meet.inputs):
        return ""
    return (f"it is the + 3 of a decomposed HardSwish, x * Clip(x + 3, 0, 6) / 6, whose "
            f"{node_label(meet)} reads the {op} output too")


# ----------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class CopyCost:
    """What a copy of a Conv adds (`macs`, `reread` elements of its input and weights)
    and saves (`saved`: one read of its output), for elements of `itemsize` bytes."""

    macs: int
    reread: int
    saved: int
    itemsize: int

    @property
    def added(self) -> float:
        """Element moves the copy adds, its MACs counted at `MACS_PER_ELEMENT_MOVE`."""
        return self.macs / MACS_PER_ELEMENT_MOVE + self.reread

    @property
    def cheaper(self) -> bool:
        return self.added < self.saved

    def describe(self) -> str:
        reread = _amount(self.reread * self.itemsize, "B")
        return (f"{_amount(self.macs, 'MAC')} and re-read {reread} (its input and weights) "
                f"to save one read of its {_amount(self.saved * self.itemsize, 'B')} output "
                f"(cost model: {self.added:,.0f} element moves added, {self.saved:,} saved)")


def copy_cost(producer: gs.Node, shapes: ShapeBook) -> CopyCost | str:
    """The cost of copying a Conv or ConvTranspose, or why it is not known."""
    w = constant_value(producer.inputs[1]) if len(producer.inputs) > 1 else None
    if w is None or w.ndim < 3:
        return f"the {producer.op} weights are not a constant of rank 3 or more"
    x, y = producer.inputs[0], producer.outputs[0]
    in_shape, out_shape = shapes.shape(x), shapes.shape(y)
    if in_shape is None or out_shape is None:
        which = "input" if in_shape is None else "output"
        return f"the size of its {which} is not static at the run's input shapes"
    inputs, outputs = math.prod(in_shape), math.prod(out_shape)
    # Conv: each output element takes Cin/g * prod(k) MACs; ConvTranspose: each input
    # element is spread over Cout/g * prod(k) outputs. Both are w.shape[1:].
    macs = (outputs if producer.op == "Conv" else inputs) * math.prod(w.shape[1:])
    bias = constant_value(producer.inputs[2]) if len(producer.inputs) > 2 else None
    weights = w.size + (bias.size if bias is not None else 0)
    return CopyCost(macs, inputs + weights, outputs, w.dtype.itemsize)


def _amount(value: float, unit: str) -> str:
    """3890 MAC -> '3.89 kMAC'."""
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.0f} {unit}"


class ShapeBook:
    """Static tensor shapes: the tensor's own; else its own with the named dims of the
    graph inputs set as `input_shapes` sets them (a Conv output [batch, 64, 112, 112]
    with the input [batch, 3, 224, 224] given as 1x3x224x224: ONNX inference names a dim
    after the input's when it is that dim); else what an earlier inference of the run
    found for its name (`known`, `PassContext.static_shapes`, which this book adds to);
    else ONNX shape inference of the graph at `input_shapes` (run once, on first need; a
    failed inference knows nothing). Only a cost model reads these (maxvit_t: fold-bn's
    inference for its copy decisions, 35 ms, is not needed)."""

    def __init__(self, graph: gs.Graph, input_shapes: dict[str, tuple[int, ...]],
                 known: dict[str, tuple[int, ...]] | None = None) -> None:
        self.graph, self.input_shapes = graph, input_shapes
        self.known = {} if known is None else known
        self._inferred: dict[str, tuple[int, ...]] | None = None
        sizes: dict[str, set[int]] = {}  # the sizes `input_shapes` gives each named dim
        for t in graph.inputs:
            given = input_shapes.get(t.name)
            if given is not None and t.shape is not None and len(t.shape) == len(given):
                for d, size in zip(t.shape, given, strict=True):
                    if isinstance(d, str) and d:
                        sizes.setdefault(d, set()).add(int(size))
        self._named = {d: next(iter(v)) for d, v in sizes.items() if len(v) == 1}

    def shape(self, tensor: gs.Tensor) -> tuple[int, ...] | None:
        own = _static(tensor.shape)
        if own is not None:
            return own
        named = _static(self._with_input_dims(tensor.shape))
        if named is not None:
            return named
        if tensor.name in self.known:
            return self.known[tensor.name]
        if self._inferred is None:
            self._inferred = _infer(self.graph, self.input_shapes)
            self.known.update(self._inferred)
        return self._inferred.get(tensor.name)

    def _with_input_dims(self, shape) -> list | None:
        """`shape` with each dim named like a graph input's dim given a size in
        `input_shapes` set to that size (a name given two sizes is left as it is)."""
        if shape is None:
            return None
        return [self._named.get(d, d) if isinstance(d, str) else d for d in shape]


def _static(shape) -> tuple[int, ...] | None:
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(int(d) for d in shape)


def _infer(graph: gs.Graph, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Every static shape ONNX shape inference finds with the inputs set to `input_shapes`.

    Nodes a pass has disconnected (no outputs) are left out of the export: inference
    rejects a node without its inputs."""
    model = export(graph)
    for g in graph_protos(model.graph):
        live = [n for n in g.node if n.output]
        del g.node[:]
        g.node.extend(live)
    for vi in model.graph.input:
        if vi.name in input_shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in input_shapes[vi.name]:
                dims.add().dim_value = int(d)
    try:
        inferred = infer_shapes(skeleton(model))
    except (onnx.shape_inference.InferenceError, ValueError):
        return {}
    shapes = {}
    for g in graph_protos(inferred.graph):
        for vi in [*g.input, *g.value_info, *g.output]:
            if not vi.type.tensor_type.HasField("shape"):
                continue
            dims = vi.type.tensor_type.shape.dim
            found = _static([d.dim_value if d.HasField("dim_value") else None for d in dims])
            if found is not None:
                shapes[vi.name] = found
    return shapes


# ----------------------------------------------------------------------------- copy


def copy_producer(g: gs.Graph, producer: gs.Node, reader: gs.Node, names: set[str]) -> gs.Node:
    """A copy of `producer` (same inputs and attributes, a new output) placed after it in
    `g`; `reader` reads the copy's output instead of the producer's."""
    y = producer.outputs[0]
    out = gs.Variable(fresh_name(f"{y.name}_copy", names), dtype=y.dtype, shape=y.shape)
    node_names = names | {n.name for n in g.nodes if n.name}
    name = fresh_name(f"{producer.name or y.name}_copy", node_names)
    names.add(name)
    copy = gs.Node(producer.op, name=name, attrs=dict(producer.attrs),
                   inputs=list(producer.inputs), outputs=[out], domain=producer.domain)
    replace_in(reader.inputs, y, out)
    index = next(i for i, n in enumerate(g.nodes) if n is producer)
    g.nodes.insert(index + 1, copy)
    return copy
