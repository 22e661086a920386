"""Strict mode: what a tensor that fails its own scale-relative bound is still allowed,
from its operands' measured errors and what its op does with them (`widen_by_operands`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from graphfix import weights
from graphfix.check._inline import Producer
from graphfix.runtime.measure import Tally


class CandidateConvs:
    """The candidate's Conv nodes with constant weights, by the tensor they write: what
    such a Conv makes of its input's error (`allowance`, its weights' largest row sum),
    whatever the reference computes the same tensor with (a Conv, or a Conv -> Mul ->
    Add that fuse-conv-mul and fuse-conv-bias folded into this one)."""

    def __init__(self, candidate: onnx.ModelProto | None) -> None:
        graph = candidate.graph if candidate is not None else onnx.GraphProto()
        self._inits = {t.name: t for t in graph.initializer}
        self._convs = {n.output[0]: n for n in graph.node
                       if n.op_type == "Conv" and n.domain in ("", "ai.onnx") and n.output
                       and len(n.input) > 1 and n.input[1] in self._inits}
        self._norms: dict[str, float] = {}

    def allowance(self, name: str, tallies: Mapping[str, Tally], by_candidate: Mapping[
            str, str], sample: int) -> float | None:
        """max_o sum |W[o]| dx for the candidate Conv writing `name` (the most one output
        channel's weights sum to, in magnitude: what an input error of at most dx
        anywhere can move one output; dx: its input's error, compared and agreeing on the
        sample); None where no such Conv writes it."""
        node = self._convs.get(name)
        if node is None:
            return None
        source = by_candidate.get(node.input[0])
        if source is None or not _agrees(tallies, source, sample):
            return None
        if node.input[1] not in self._norms:
            w = weights.to_array(self._inits[node.input[1]]).astype(np.float64)
            rows = np.abs(w).reshape(w.shape[0], -1).sum(axis=1) if w.ndim > 1 else w
            self._norms[node.input[1]] = float(rows.max()) if rows.size else 0.0
        return self._norms[node.input[1]] * tallies[source].abs_errors[sample]


NO_CONVS = CandidateConvs(None)


def widen_by_operands(tallies: dict[str, Tally], producers: Mapping[str, Producer],
                      convs: CandidateConvs = NO_CONVS) -> None:
    """Strict mode: a tensor that fails its own scale-relative bound is measured against
    its operands' scale (`Tally.widen`), in topological order. Graph outputs get the same;
    the per-pass check instead widens outputs by the model's noise floor.

    An Exp whose operand is compared and agrees on the sample is then allowed what
    that operand's measured error d grows to through it:
    |exp(x + d) - exp(x)| <= exp(x) |d| e^|d|, so max|y| d e^d on top of its own
    rounding. A rewrite that only rounds differently upstream makes an Exp of inputs
    around 4 differ by 4.6e-5 of its scale (Mask R-CNN's box decoding), which no
    scale-relative bound admits; an Exp computed wrongly still fails.

    An op whose every output element is an input element, or moves no further from it
    than its inputs do (`_COPIES`: Reshape, Gather, Concat, Max, Relu, ...), is allowed
    the largest error of its data inputs where those agree on the sample (and its
    compared index inputs too): Keypoint R-CNN's Unsqueeze of a Min failed at the error
    its Min passed with, measured against the Max under it.

    Add and Sub are allowed the sum of their operands' errors, Mul |a| db + |b| da +
    da db (maxima over the sample), where both operands are compared and agree: a
    difference of two box corners (a width) cancels most of its scale, not its error.
    A tensor the candidate writes with a Conv of constant weights W is allowed
    max_o sum |W[o]| dx (dx: that Conv's input's error, compared and agreeing; the sum
    over the weights one output channel reads), whatever the reference computes it
    with: tf2onnx's MobileNetV2, whose Conv -> Mul -> Add BatchNorm fuse-conv-mul and
    fuse-conv-bias fold into one Conv, differs by 1.5e-5 of the scale there from
    rounding upstream (onnxruntime's own BASIC optimizations fail the same tensors
    without this). A wrong fold is (W' - W) x, far over that.
    A Cast from one float type to a wider one (float16 -> float32) is exact: it is allowed
    its input's error, so a model computing in float16 between float32 inputs and
    outputs (onnxconverter-common's keep_io_types) is held to float16's bound at its
    outputs, not float32's (one float16 ulp failed its output Cast before).
    MatMul sums K such products (K: the contracted length), so it is allowed K times
    that: DETR's attention, whose Softmax passes against its logits' scale, multiplies
    the probabilities' error 1.3e-4 into its values (2.4e-3 against its own scale's 1e-5
    bound, which the Where selecting the probabilities failed too before Where counted
    as a copy of its two data inputs)."""
    by_candidate = {t.candidate: name for name, t in tallies.items() if t.candidate}
    for name, tally in tallies.items():
        producer = producers.get(name)
        if producer is None or tally.ok:
            continue
        operands = [tallies[i] for i in producer.inputs if i in tallies and i != name]
        for sample in [s for s, ok in tally.oks.items() if not ok]:
            scale = max((o.scales.get(sample, 0.0) for o in operands), default=0.0)
            tally.widen(sample, scale)
            if producer.op == "Exp" and _agrees(tallies, producer.inputs[0], sample):
                d = tallies[producer.inputs[0]].abs_errors[sample]
                tally.allow(sample, tally.scales[sample] * d * math.exp(min(d, 50.0)))
            elif producer.op in _COPIES:
                carried = _carried_error(producer, tallies, sample, producers)
                if carried is not None:
                    tally.allow(sample, carried)
            elif producer.op == "Cast" and _widens(tallies, producer.inputs[0], tally):
                if _agrees(tallies, producer.inputs[0], sample):
                    tally.allow(sample, tallies[producer.inputs[0]].abs_errors[sample])
            elif producer.op in ("Add", "Sub", "Mul", "MatMul"):
                grown = _grown_error(producer, tallies, sample)
                if grown is not None:
                    tally.allow(sample, grown)
            if not tally.oks[sample]:
                grown = convs.allowance(tally.candidate, tallies, by_candidate, sample)
                if grown is not None:
                    tally.allow(sample, grown)


def _widens(tallies: Mapping[str, Tally], source: str, out: Tally) -> bool:
    """Whether a Cast from the compared tensor `source` to `out` converts one float type
    to another at least as wide: exact, so the error it carries is its input's."""
    tally = tallies.get(source)
    if tally is None:
        return False
    try:
        a, b = np.dtype(tally.dtype), np.dtype(out.dtype)
    except TypeError:
        return False
    return a.kind == b.kind == "f" and b.itemsize >= a.itemsize


def _agrees(tallies: Mapping[str, Tally], name: str, sample: int) -> bool:
    tally = tallies.get(name)
    return tally is not None and tally.oks.get(sample) is True


_COPIES: dict[str, tuple[int, ...] | None] = {op: (0,) for op in (
    "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Slice",
    "Gather", "GatherElements", "GatherND", "Split", "Expand", "Tile", "DepthToSpace",
    "SpaceToDepth", "Relu", "Neg", "Abs", "Clip", "MaxPool", "ReduceMax", "ReduceMin")}
_COPIES.update({"Concat": None, "Max": None, "Min": None, "Where": (1, 2)})
"""Ops whose output error is at most their data inputs' (copies, selections, and
1-Lipschitz maps): the positions of the data inputs (None: all); the others are
indices, shapes, bounds or conditions."""


def _carried_error(producer: Producer, tallies: Mapping[str, Tally], sample: int,
                   producers: Mapping[str, Producer], depth: int = 0) -> float | None:
    """The largest error of the producer's data inputs on the sample, when every one is
    compared and agrees there, and so does every compared index input; else None. A data
    input the rewrite removed carries nothing where the reference computes it from
    nothing (a folded constant), and what it carries itself where it is a copy too (a
    Reshape eliminate-noops dropped)."""
    data = _COPIES[producer.op]
    errors = []
    for k, name in enumerate(producer.inputs):
        if data is None or k in data:
            if name in tallies:
                if not _agrees(tallies, name, sample):
                    return None
                errors.append(tallies[name].abs_errors.get(sample, 0.0))
                continue
            source = producers.get(name)
            if source is None or source.op == "Constant":
                continue  # an initializer or Constant (graph inputs are always compared)
            if source.op not in _COPIES or depth >= _MAX_UNCOMPARED:
                return None
            carried = _carried_error(source, tallies, sample, producers, depth + 1)
            if carried is None:
                return None
            errors.append(carried)
        elif name in tallies and tallies[name].oks.get(sample) is False:
            return None
    return max(errors, default=None)


_MAX_UNCOMPARED = 8
"""How many removed copies in a row `_carried_error` looks through."""


def _grown_error(producer: Producer, tallies: Mapping[str, Tally], sample: int
                 ) -> float | None:
    """What Add, Sub or Mul make of their two operands' errors on the sample (bounds
    exact to first order, the product term included), when both are compared and agree
    there; else None."""
    if len(producer.inputs) != 2:
        return None
    if not all(_agrees(tallies, name, sample) for name in producer.inputs):
        return None
    pair = [tallies[name] for name in producer.inputs]
    (da, db), (sa, sb) = ([t.abs_errors[sample] for t in pair],
                          [t.scales[sample] for t in pair])
    if producer.op == "Mul":
        return sa * db + sb * da + da * db
    if producer.op == "MatMul":
        contracted = pair[0].shape[-1] if pair[0].shape else None
        return None if contracted is None else contracted * (sa * db + sb * da + da * db)
    return da + db
