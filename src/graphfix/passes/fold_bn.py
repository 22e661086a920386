"""fold-bn: fold inference BatchNormalization into the linear op before it.

With s = gamma / sqrt(var + eps) and t = beta - mean * s, an inference
BatchNormalization is y = x * s + t along axis 1, so it folds into the
output channels of the op that produced x::

    BN(Conv(x, W, b))          -> Conv(x, W * s[:, None, ...], b * s + t)
    BN(ConvTranspose(x, W, b)) -> ConvTranspose(x, W * s (per group, per output channel), b * s + t)
    BN(Gemm(A, B, C))          -> Gemm(A, B * s (on the N axis), beta * C * s + t), beta = 1
    BN(MatMul(A, W))           -> Gemm(A, W * s[None, :], t)            (A of rank 2)

MatMul becomes a Gemm rather than MatMul + Add: BatchNormalization normalizes
axis 1, which is the MatMul's column axis only when the output has rank 2, and
then A has rank 2 too, so a Gemm is always valid and is one node (TensorRT maps
it to a single fully connected layer). When the rank is not known from shape
information, or is not 2, the BatchNormalization is left alone with a note.

New weights are computed in float64 and cast back to the weight's dtype. Every
folded node gets new `gs.Constant` objects; no existing array is written to, so
a weight shared with another node is never changed under it. The linear op takes
the BatchNormalization's output tensor, so output names and dtypes are kept; the
disconnected BatchNormalization is left for `cleanup`.

When the Conv output is also read by another node (or is a graph output), the
BatchNormalization folds into a copy of the Conv where the cost model of `_conv_copy` finds
that cheaper, else a note names the other readers and the numbers
(docs/conv-chains.md).

Nodes are visited in graph order, so a chain Conv -> BN -> BN folds completely
when the graph is topologically sorted (the pass manager keeps it so).

Each fold is one rewrite for a rewrite budget (`PassContext.allow_rewrite`): a fold
leaves a valid graph whether or not the others are done (a BN after a BN that was
not folded is then left with a note).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from graphfix import weights
from graphfix.graph import (
    all_graphs,
    constant_value,
    fresh_name,
    is_onnx,
    names_in_use,
    node_label,
    opset_of,
    take_output,
)
from graphfix.graph.convert import deferred_values, spilled
from graphfix.passes._conv_copy import ConvCopies, counted, label
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult

_LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_BN_INPUTS = ("scale", "B", "mean", "var")


@dataclass(frozen=True)
class _Affine:
    """The BatchNormalization as y = x * scale + shift, one value per channel (float64)."""

    scale: np.ndarray
    shift: np.ndarray


@dataclass
class _Plan:
    """What to write into the linear node: new weight, new bias, attribute changes. The
    weight is computed only when the fold is made (`_rewrite`): a fold refused after the
    plan (a Conv copy that costs more than it saves, `ConvCopies.decide`) never scales
    weights (as in fuse-conv-mul, where maxvit_t refuses 23 such folds per run)."""

    weight: Callable[[], np.ndarray]
    bias: np.ndarray
    bias_index: int
    attrs: dict[str, Any] = field(default_factory=dict)
    op: str | None = None
    # the new weight's shape and dtype when `weight` also reads the old one (a large Conv
    # weight, `_ASYNC_MIN_ELEMENTS`): `_rewrite` may then compute it in a worker thread
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    # with the run's spill: `stream(spill, name)` writes the new weight there a block at a
    # time and returns its lazy values, or None where it cannot (`_streamed`)
    stream: Callable[[Any, str], LazyValues | None] | None = None


_ASYNC_MIN_ELEMENTS = 1 << 16
"""Conv weights of at least this many elements are read and scaled in worker threads
while the pass goes on (`_Workers`): numpy reads the file and multiplies without the
interpreter lock, so two cores share ResNet-50's 90 MB. Smaller ones are computed in
place: a thread hand-over costs more than they do."""


class _Pending(LazyValues):
    """The values of a new weight a worker is computing: what gs needs of lazy values
    (shape, dtype) until `_Workers.settle` puts the array in its place."""

    def __init__(self, future: Future, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.tensor = None
        self.future = future
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * dtype.itemsize

    def load(self) -> np.ndarray:
        values = self.future.result()  # spilled by the worker: read back (a fold of a fold)
        return values.load() if isinstance(values, LazyValues) else values


class _Workers:
    """Threads computing the large new Conv weights of one run of the pass; `settle`
    waits for them and gives each constant its values (or raises what a worker raised),
    so no pending value outlives the pass.

    With the run's spill (`PassContext.spill`), a worker writes the weight of a
    main-graph Conv there itself (a block of channels at a time where it can,
    `_streamed`) and the constant gets the deferred reference, as the manager would have
    given it on the main thread after the pass (`settle_constants`, 30 ms for
    fcos_resnet50_fpn's 100 MB)."""

    def __init__(self, spill=None) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.pending: list[gs.Constant] = []
        self.spill = spill

    def constant(self, name: str, plan: _Plan, main: bool) -> gs.Constant:
        """The new weight of `plan` as a constant named `name`; `main`: it is read in the
        main graph (a body's constants are never spilled, `settle_constants`)."""
        if plan.shape is None or plan.dtype is None:
            return gs.Constant(name, plan.weight())
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                                           thread_name_prefix="graphfix-fold-bn")
        work = plan.weight
        if self.spill is not None and main:
            work = functools.partial(_spilled_weight, self.spill, name, plan)
        constant = gs.Constant(name, _Pending(self.pool.submit(work), plan.shape,
                                              plan.dtype))
        self.pending.append(constant)
        return constant

    def settle(self) -> None:
        try:
            for constant in self.pending:
                values = constant._values.future.result()  # noqa: SLF001 - gs's own slot
                if isinstance(values, LazyValues):
                    constant._values = values  # noqa: SLF001 - spilled: deferred
                else:
                    constant.values = values
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool, self.pending = None, []


def _spilled_weight(spill, name: str, plan: _Plan) -> LazyValues:
    """A worker's job with the spill: the new weight written there, a block at a time
    where the plan can (`_streamed`), else computed whole and written; the deferred
    values that refer to it (`_Workers`)."""
    if plan.stream is not None:
        values = plan.stream(spill, name)
        if values is not None:
            return values
    return spilled(spill, name, plan.weight())


class FoldBatchNorm(Pass):
    """Fold inference BatchNormalization into a preceding Conv, ConvTranspose, Gemm or MatMul.

    Handles: Conv of any rank (1-D, 2-D, 3-D), group count and dilation (depthwise
    included); ConvTranspose with groups (weights [Cin, Cout/g, k...]); Gemm with
    transB, alpha, beta and a C that is absent, scalar, [N], [1, N], [M, 1] or
    [M, N]; MatMul with a constant [K, N] weight and a rank-2 output (becomes
    Gemm). BatchNormalization opsets 6 to 15+: training mode (is_test=0,
    training_mode=1, or extra outputs) is skipped, spatial=0 folds only when its
    statistics are per channel. Recurses into If/Loop/Scan bodies.

    When the linear op's output has another reader or is a graph output, folds into
    a copy of a Conv or ConvTranspose when the cost model of `_conv_copy` finds the
    copy cheaper than the BatchNormalization layer (docs/conv-chains.md).

    Skips, with a note, when the linear op's output has another reader or is a graph
    output and no copy is made (the note names the readers and the cost numbers),
    when weights, bias or statistics are not constants (Identity of a constant counts
    as a constant), when channel counts disagree, and when BatchNormalization does
    not follow one of the ops above.
    """

    name = "fold-bn"
    summary = "Fold inference BatchNormalization into a preceding Conv, ConvTranspose, Gemm, MatMul"
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names = names_in_use(graph)
        copies = ConvCopies(graph, ctx.input_shapes, names, ctx.static_shapes)
        workers = _Workers(ctx.spill)
        try:
            found = self._fold_all(graph, ctx, opset, names, copies, workers, result)
        finally:
            workers.settle()
        if not found:
            result.notes.append(
                Note(subject="graph", reason="no BatchNormalization in the graph")
            )
        return result

    def _fold_all(self, graph: gs.Graph, ctx: PassContext, opset: int, names: set[str],
                  copies: ConvCopies, workers: _Workers, result: PassResult) -> int:
        """Fold every BatchNormalization that can be (class docstring); how many there
        were."""
        found = 0
        for g in all_graphs(graph):
            node_ids = {id(n) for n in g.nodes}
            for bn in [n for n in g.nodes if is_onnx(n, "BatchNormalization")]:
                if not bn.outputs:  # already folded and disconnected
                    continue
                found += 1
                checked = _check(bn, opset, node_ids)
                into = checked if isinstance(checked, str) else copies.decide(g, checked[0], bn)
                if isinstance(into, str):
                    result.notes.append(Note(subject=node_label(bn), reason=into))
                    continue
                producer, plan = checked
                if not ctx.allow_rewrite(self.name, label(bn, producer, into)):
                    result.notes.append(Note(node_label(bn), LIMIT_REACHED))
                    continue
                phrase = f"folded BatchNormalization into {producer.op}"
                result.counts[counted(phrase, producer, into)] += 1
                _rewrite(bn, copies.target(g, producer, bn, into, node_ids), plan, names,
                         workers, main=g is graph)
                result.changed = True
        return found


# ----------------------------------------------------------------------------- check


def _check(bn: gs.Node, opset: int, node_ids: set[int]) -> tuple[gs.Node, _Plan] | str:
    """The linear producer and the plan to fold `bn` into it, or why it cannot be folded."""
    reason = _check_mode(bn, opset)
    if reason:
        return reason
    producer = _producer(bn, node_ids)
    if isinstance(producer, str):
        return producer
    affine = _affine(bn, opset)
    if isinstance(affine, str):
        return affine
    plan = _FOLDERS[producer.op](producer, bn, affine)
    if isinstance(plan, str):
        return plan
    return producer, plan


def _check_mode(bn: gs.Node, opset: int) -> str | None:
    if opset >= 14 and int(bn.attrs.get("training_mode", 0)) == 1:
        return "it is in training mode (training_mode=1), so it normalizes with batch statistics"
    if opset < 7 and int(bn.attrs.get("is_test", 0)) == 0:
        return "it is in training mode (is_test=0), so it normalizes with batch statistics"
    if any(not o.is_empty() for o in bn.outputs[1:]):
        return "it has running mean/variance outputs, which only training mode computes"
    if len(bn.inputs) != 5:
        return f"it has {len(bn.inputs)} inputs instead of X, scale, B, mean and var"
    return None


def _producer(bn: gs.Node, node_ids: set[int]) -> gs.Node | str:
    x = bn.inputs[0]
    if isinstance(x, gs.Constant) or not x.inputs:
        where = "is a constant" if isinstance(x, gs.Constant) else "is a graph input"
        return f"it does not follow a Conv, ConvTranspose, Gemm or MatMul (its input {where})"
    producer = x.inputs[0]
    if id(producer) not in node_ids:
        return (
            "it does not follow a Conv, ConvTranspose, Gemm or MatMul "
            "(its input comes from an enclosing graph)"
        )
    if not is_onnx(producer, *_LINEAR_OPS):
        return (
            "it does not follow a Conv, ConvTranspose, Gemm or MatMul "
            f"(its input comes from {node_label(producer)})"
        )
    return producer


def _affine(bn: gs.Node, opset: int) -> _Affine | str:
    values = {}
    for name, tensor in zip(_BN_INPUTS, bn.inputs[1:], strict=True):
        value = constant_value(tensor)
        if value is None:
            return f"its {name} input is not a constant"
        values[name] = np.asarray(value, dtype=np.float64)
    channels = values["scale"].shape[:1]
    spatial = int(bn.attrs.get("spatial", 1)) if opset < 9 else 1
    for name, value in values.items():
        if value.ndim < 1 or value.shape[:1] != channels:
            return "its scale, B, mean and var do not have the same number of channels"
        if value.size != value.shape[0]:
            if spatial == 0:
                return "it has spatial=0 with statistics that vary over positions, not per channel"
            return f"its {name} input is not one value per channel"
    flat = {name: value.reshape(-1) for name, value in values.items()}
    eps = float(bn.attrs.get("epsilon", 1e-5))
    if np.any(flat["var"] + eps <= 0):
        return "its var + epsilon is not positive everywhere"
    scale = flat["scale"] / np.sqrt(flat["var"] + eps)
    return _Affine(scale=scale, shift=flat["B"] - flat["mean"] * scale)


def _weight(node: gs.Node, index: int, what: str) -> np.ndarray | str:
    value = constant_value(node.inputs[index]) if len(node.inputs) > index else None
    if value is None:
        return f"the {node.op} {what} {_be(what)} not a constant"
    if not np.issubdtype(value.dtype, np.floating):
        return f"the {node.op} {what} {_be(what)} {value.dtype}, not floating point"
    return value


def _large_weight(node: gs.Node) -> gs.Constant | None:
    """The Conv's weight when it is a constant of a floating type, rank 3 or more and at
    least `_ASYNC_MIN_ELEMENTS` elements, known without reading it; else None (`_weight`
    reads it and says what is wrong)."""
    t = node.inputs[1] if len(node.inputs) > 1 else None
    # gs gives an ONNX type number for a type numpy lacks (bfloat16 without ml_dtypes)
    if not isinstance(t, gs.Constant) or not isinstance(t.dtype, (np.dtype, type)):
        return None
    shape = t.shape
    if (shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape)
            or math.prod(shape) < _ASYNC_MIN_ELEMENTS):
        return None
    dtype = np.dtype(t.dtype)
    return t if np.issubdtype(dtype, np.floating) and dtype.num < 256 else None


def _be(what: str) -> str:
    return "are" if what.endswith("s") else "is"


def _bias(node: gs.Node, index: int, what: str) -> tuple[np.ndarray | None, str | None]:
    """The optional bias input: (value, None), (None, None) when absent, or (None, reason)."""
    if len(node.inputs) <= index or node.inputs[index].is_empty():
        return None, None
    value = constant_value(node.inputs[index])
    if value is None:
        return None, f"the {node.op} {what} is not a constant"
    return value, None


def _channel_mismatch(node: gs.Node, affine: _Affine, channels: int) -> str | None:
    if affine.scale.size == channels:
        return None
    return (
        f"it normalizes {affine.scale.size} channels but the {node.op} "
        f"has {channels} output channels"
    )


# ----------------------------------------------------------------------------- folders


def _fold_conv(node: gs.Node, bn: gs.Node, affine: _Affine) -> _Plan | str:
    """Conv weights are [Cout, Cin/g, k...]: output channels are axis 0 for every group count.
    A large weight is not read here: its plan reads it, in a worker (`_Workers`)."""
    large = _large_weight(node)
    if large is None:
        w = _weight(node, 1, "weights")
        if isinstance(w, str):
            return w
        shape, dtype, read = w.shape, w.dtype, lambda: (w, False)
    else:
        shape, dtype = tuple(large.shape), np.dtype(large.dtype)
        read = functools.partial(_private_value, large)
    b, reason = _bias(node, 2, "bias")
    if reason or len(shape) < 3:
        return reason or f"the Conv weights have rank {len(shape)}, not 3 or more"
    reason = _channel_mismatch(node, affine, shape[0])
    if reason:
        return reason
    s = affine.scale.reshape((-1,) + (1,) * (len(shape) - 1))

    def weight() -> np.ndarray:
        w, own = read()
        return _scaled(w, s, own)

    return _Plan(weight=weight, bias=_new_bias(b, affine, dtype),
                 bias_index=2, shape=None if large is None else shape,
                 dtype=None if large is None else dtype,
                 stream=None if large is None else functools.partial(_streamed, large, s))


def _fold_conv_transpose(node: gs.Node, bn: gs.Node, affine: _Affine) -> _Plan | str:
    """ConvTranspose weights are [Cin, Cout/g, k...]; output channel c = group * Cout/g + j."""
    w = _weight(node, 1, "weights")
    if isinstance(w, str):
        return w
    b, reason = _bias(node, 2, "bias")
    if reason or w.ndim < 3:
        return reason or f"the ConvTranspose weights have rank {w.ndim}, not 3 or more"
    groups = int(node.attrs.get("group", 1))
    if groups < 1 or w.shape[0] % groups:
        return f"the ConvTranspose has {w.shape[0]} input channels, not divisible by group={groups}"
    per_group = w.shape[1]
    reason = _channel_mismatch(node, affine, groups * per_group)
    if reason:
        return reason
    kernel = w.shape[2:]
    s = affine.scale.reshape((groups, 1, per_group) + (1,) * len(kernel))

    def weight() -> np.ndarray:
        grouped = w.astype(np.float64).reshape((groups, w.shape[0] // groups, per_group)
                                               + kernel)
        return (grouped * s).reshape(w.shape).astype(w.dtype)

    return _Plan(
        weight=weight,
        bias=_new_bias(b, affine, w.dtype),
        bias_index=2,
    )


def _fold_gemm(node: gs.Node, bn: gs.Node, affine: _Affine) -> _Plan | str:
    """Y = alpha * A' B' + beta * C; scale B' columns, fold beta * C into a new C, beta = 1."""
    w = _weight(node, 1, "B input")
    if isinstance(w, str):
        return w
    c, reason = _bias(node, 2, "C input")
    if reason or w.ndim != 2:
        return reason or f"the Gemm B input has rank {w.ndim}, not 2"
    trans_b = int(node.attrs.get("transB", 0))
    reason = _channel_mismatch(node, affine, w.shape[0] if trans_b else w.shape[1])
    if reason:
        return reason
    s = affine.scale[:, None] if trans_b else affine.scale[None, :]
    beta = float(node.attrs.get("beta", 1.0))
    bias = affine.shift if c is None else beta * c.astype(np.float64) * affine.scale + affine.shift
    return _Plan(
        weight=lambda: (w.astype(np.float64) * s).astype(w.dtype),
        bias=bias.astype(w.dtype),
        bias_index=2,
        attrs={"beta": 1.0},
    )


def _fold_matmul(node: gs.Node, bn: gs.Node, affine: _Affine) -> _Plan | str:
    """MatMul(A, W) with rank-2 output becomes Gemm(A, W * s, shift)."""
    w = _weight(node, 1, "weights")
    if isinstance(w, str):
        return w
    if w.ndim != 2:
        return f"the MatMul weights have rank {w.ndim}, not 2"
    rank = next(
        (len(t.shape) for t in (node.inputs[0], node.outputs[0], bn.outputs[0]) if t.shape),
        None,
    )
    if rank is None:
        return "the MatMul output rank is unknown, so its columns may not be the channel axis"
    if rank != 2:
        return f"the MatMul output has rank {rank}, so its columns are not the channel axis"
    reason = _channel_mismatch(node, affine, w.shape[1])
    if reason:
        return reason
    return _Plan(
        weight=lambda: (w.astype(np.float64) * affine.scale[None, :]).astype(w.dtype),
        bias=affine.shift.astype(w.dtype),
        bias_index=2,
        op="Gemm",
    )


_BLOCK = 1 << 16
"""Elements per block of `_scaled` (0.5 MiB of float64: stays in the CPU's cache)."""


def _source(weight: gs.Constant) -> LazyValues | None:
    """The weight's lazy values when each load reads them anew from their source (a
    deferred weight's file, `weights.to_array`; gs's proto): not gs's cached array, not a
    worker's result (`_Pending`)."""
    raw = weight._values  # noqa: SLF001 - gs has no public non-caching read
    return raw if isinstance(raw, LazyValues) and not isinstance(raw, _Pending) else None


def _private_value(weight: gs.Constant) -> tuple[np.ndarray, bool]:
    """A large Conv weight's values, and whether the array is this caller's own to write
    into: read anew from its source (`_source`) into a writable array."""
    value = constant_value(weight)
    own = _source(weight) is not None and value is not None and value.flags.writeable
    return value, own


def _streamed(weight: gs.Constant, s: np.ndarray, spill, name: str) -> LazyValues | None:
    """`_scaled(weight's values, s)` written to `spill` a block of output channels at a
    time, each read from the weight's file into one reused buffer (`weights.
    PieceReader`), so no array of the whole weight is made; its lazy values, or None
    where the weight is not read from a file that way. Each block is `_scaled` in place,
    so the bits are `_scaled`'s. fcos_resnet50_fpn's 100 MB of new weights need no new memory but
    the spill's: its fold-bn 105 -> 71 ms (medians of five, `--no-check`)."""
    tensor = getattr(_source(weight), "tensor", None)
    if tensor is None:
        return None
    reader = weights.PieceReader.open(tensor)
    if reader is None:
        return None
    with reader:
        dtype, shape = reader.dtype, tuple(int(d) for d in tensor.dims)
        row = math.prod(shape[1:])
        rows = max(1, _BLOCK // max(1, row))
        region = spill.reserve(math.prod(shape) * dtype.itemsize)
        buffer = np.empty(min(rows, shape[0]) * row, dtype)
        for start in range(0, shape[0], rows):
            count = min(rows, shape[0] - start)
            piece = buffer[:count * row]
            reader.read_into(piece, start * row)
            _scaled(piece.reshape((count,) + shape[1:]), s[start:start + count], True)
            region.write(piece, start * row * dtype.itemsize)
    out = region.tensor(name, dtype, shape)
    return deferred_values(out, weights.read_sample(out))


def _scaled(w: np.ndarray, s: np.ndarray, in_place: bool = False) -> np.ndarray:
    """`(w.astype(float64) * s).astype(w.dtype)`, `s` broadcast along axis 0, computed a
    block of output channels at a time: the float64 products of a block stay in the
    cache instead of two whole float64 copies going through memory (wide_resnet50_2's
    263 MB of Conv weights: 0.67 s -> 0.2 s). The same roundings, so the same bits.
    `in_place`: `w` is the caller's own (`_private_value`) and becomes the result, so
    no new array is made: memory the process has not touched yet is what costs (a
    first-touch page fault per page; 100 MB copied into new memory 0.22 s, into touched
    memory 0.013 s, on this project's 2-core machine). fcos_resnet50_fpn's fold-bn with
    its spill writes: 170 ms -> 85 ms."""
    out = w if in_place else np.empty_like(w)
    rows = max(1, _BLOCK // max(1, w[0].size))
    for start in range(0, w.shape[0], rows):
        block = slice(start, start + rows)
        out[block] = np.multiply(w[block], s[block], dtype=np.float64)
    return out


def _new_bias(bias: np.ndarray | None, affine: _Affine, dtype: np.dtype) -> np.ndarray:
    if bias is None:
        return affine.shift.astype(dtype)
    return (bias.astype(np.float64).reshape(-1) * affine.scale + affine.shift).astype(dtype)


_FOLDERS: dict[str, Callable[[gs.Node, gs.Node, _Affine], _Plan | str]] = {
    "Conv": _fold_conv,
    "ConvTranspose": _fold_conv_transpose,
    "Gemm": _fold_gemm,
    "MatMul": _fold_matmul,
}


# ----------------------------------------------------------------------------- rewrite


def _rewrite(bn: gs.Node, producer: gs.Node, plan: _Plan, names: set[str],
             workers: _Workers, main: bool) -> None:
    """New constants into `producer`; it takes the BN's output tensor; the BN is
    disconnected. `main`: the nodes are in the main graph."""
    base = bn.outputs[0].name
    producer.inputs[1] = workers.constant(fresh_name(f"{base}_folded_weight", names), plan,
                                          main)
    bias = gs.Constant(fresh_name(f"{base}_folded_bias", names), plan.bias)
    if len(producer.inputs) > plan.bias_index:
        producer.inputs[plan.bias_index] = bias
    else:
        producer.inputs.append(bias)
    if plan.op:
        producer.op = plan.op
    producer.attrs.update(plan.attrs)
    x, y = bn.inputs[0], bn.outputs[0]
    bn.inputs.clear()
    bn.outputs.clear()
    take_output(producer, x, y)

