"""Selections among near-ties: tensors a layer-wise check does not judge on a sample.

A TopK whose values agree on a sample while its indices differ chose among values tied
to within rounding: both models computed a valid answer, and what is computed from the
indices (Mask R-CNN's proposals, and everything after them) differs by whole boxes. On
such a sample those tensors are not judged, and the report says which selection they
follow and asks for real inputs (`--data`), as `graphfix run`'s per-pass check does for
outputs its noise floor shows to be ill-conditioned (`runtime.outputs`). A TopK whose
values differ is not a tie: it fails like any tensor, and so does everything after it.

Other selections (`runtime.pinning.selections`: NonMaxSuppression, ArgMax, a
comparison, Floor, a Cast to an integer type; not those of shapes and constants alone)
are witnessed by their inputs: where every computed input agrees on a sample, the
candidate computes the node with the same op, attributes and constants, and an output
differs (or does not compare: NonMaxSuppression keeping another number of boxes), the
node chose among near-ties, and the same holds for what follows it. Keypoint R-CNN's
RPN NonMaxSuppression (random weights) was such a case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import onnx

from graphfix.check._inline import Producer, topo_order
from graphfix.check.status import TensorStatus
from graphfix.graph.dtypes import np_dtype
from graphfix.runtime.measure import Tally

if TYPE_CHECKING:
    from graphfix.check.layerwise import TensorResult


Pair = tuple[onnx.ModelProto, onnx.ModelProto, Sequence[int]]
"""A reference and a candidate model as compared (Ifs inlined, `check._inline`) and the
samples they were compared on."""


def tie_flips(reference: onnx.ModelProto, tallies: Mapping[str, Tally],
              producers: Mapping[str, Producer], pairs: Sequence[Pair] = ()
              ) -> dict[str, dict[int, str]]:
    """Selection outputs that differ on a sample where the selection chose among
    near-ties (module docstring): {tensor: {sample: why}} (main graph). Without
    `pairs`, TopK alone."""
    flips = _topk_flips(reference, tallies, producers)
    for ref_model, cand_model, samples in pairs:
        found = _witnessed_flips(ref_model, cand_model, set(samples), tallies, producers)
        for name, by_sample in found.items():
            for sample, why in by_sample.items():
                flips.setdefault(name, {}).setdefault(sample, why)
    return flips


def _witnessed_flips(reference: onnx.ModelProto, candidate: onnx.ModelProto,
                     samples: set[int], tallies: Mapping[str, Tally],
                     producers: Mapping[str, Producer]) -> dict[str, dict[int, str]]:
    """The other selections' flips, witnessed by their inputs (module docstring)."""
    from graphfix.runtime import pinning

    nodes = {o: node for node in candidate.graph.node for o in node.output if o}
    casts = {node.output[0]: next((a.i for a in node.attribute if a.name == "to"), 0)
             for node in reference.graph.node if node.op_type == "Cast" and node.output}
    constants = None
    flips: dict[str, dict[int, str]] = {}
    for s in pinning.selections(reference):
        if s.op == "TopK":
            continue  # its values output is the witness (`_topk_flips`)
        outputs = [tallies.get(name) for name in s.outputs]
        first = outputs[0]
        node = nodes.get(first.candidate) if first is not None else None
        if node is None:
            continue
        constants = pinning.constants_of(candidate) if constants is None else constants
        if not pinning.alike(s, node, constants):
            continue
        fixed = {i for i, _ in s.constants}
        inputs = [name for i, name in enumerate(s.inputs)
                  if name and i not in fixed and name in producers]
        producer = producers.get(s.outputs[0])
        label = producer.label if producer else s.label
        for sample in sorted({x for t in outputs if t is not None
                              for x in (*t.oks, *t.mismatched)} & samples):
            if not all(_agrees(name, sample, tallies, producers, casts) for name in inputs):
                continue
            for name, t in zip(s.outputs, outputs, strict=True):
                if t is not None and (t.oks.get(sample) is False or sample in t.mismatched):
                    flips.setdefault(name, {})[sample] = (
                        f"{label} chose among values tied to within rounding on sample "
                        f"{sample}")
    return flips


_RESHAPES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"})
"""Ops that keep their data input's elements in order: a tensor a pass merged away (no
tally) agrees when it is one of these of a tensor that agrees."""


def _agrees(name: str, sample: int, tallies: Mapping[str, Tally],
            producers: Mapping[str, Producer], casts: Mapping[str, int], depth: int = 0
            ) -> bool:
    """Whether computed tensor `name` agrees on `sample`: compared and within its bound,
    or merged away by a pass (a box tensor's Cast to its own type that eliminate-noops
    removed) as an element-order-keeping reshape, or a Cast to the type it already has
    (`casts`: a Cast's output -> its `to`), of a tensor that agrees."""
    tally = tallies.get(name)
    if tally is not None:
        return tally.oks.get(sample) is True
    producer = producers.get(name)
    if producer is None or depth > 4 or not producer.inputs:
        return False
    data = producer.inputs[0]
    if producer.op == "Cast":
        source = tallies.get(data)
        to = casts.get(name, 0)
        dtype = np_dtype(to)
        same = source is not None and dtype is not None and str(dtype) == source.dtype
        if not same:
            return False
    elif producer.op not in _RESHAPES:
        return False
    return data in producers and _agrees(data, sample, tallies, producers, casts, depth + 1)


def _topk_flips(reference: onnx.ModelProto, tallies: Mapping[str, Tally],
                producers: Mapping[str, Producer]) -> dict[str, dict[int, str]]:
    """TopK index outputs that differ on a sample where the values output agrees."""
    flips: dict[str, dict[int, str]] = {}
    for node in reference.graph.node:
        if node.op_type != "TopK" or node.domain not in ("", "ai.onnx") or len(node.output) < 2:
            continue
        values, indices = (tallies.get(name) for name in node.output[:2])
        if values is None or indices is None or values.why or indices.why:
            continue
        producer = producers.get(node.output[1])
        label = producer.label if producer else node.name
        for sample, ok in indices.oks.items():
            if not ok and values.oks.get(sample) is True:
                flips.setdefault(node.output[1], {})[sample] = (
                    f"{label} chose among values tied to within rounding on sample {sample}")
    return flips


def tainted(flips: Mapping[str, Mapping[int, str]], order: Mapping[str, int],
            producers: Mapping[str, Producer]) -> dict[str, dict[int, str]]:
    """Every tensor computed from a flipped selection, per sample: {tensor: {sample: the
    flip it follows}}, the flipped tensors included."""
    out: dict[str, dict[int, str]] = {name: dict(samples) for name, samples in flips.items()}
    for name in sorted(order, key=order.__getitem__):
        producer = producers.get(name)
        if producer is None:
            continue
        for source in producer.inputs:
            for sample, why in out.get(source, {}).items():
                out.setdefault(name, {}).setdefault(sample, why)
    return out


def mark_ill_conditioned(reference: onnx.ModelProto, results: list[TensorResult],
                         tallies: Mapping[str, Tally], producers: Mapping[str, Producer],
                         pairs: Sequence[Pair] = ()) -> int:
    """Mark the tensors that fail (or do not compare) only on samples where they follow
    a selection's choice among near-ties (module docstring) ill-conditioned, not judged;
    returns how many."""
    flips = tie_flips(reference, tallies, producers, pairs)
    if not flips:
        return 0
    follows = tainted(flips, topo_order(reference), producers)
    count = 0
    for result in results:
        tally = tallies.get(result.name)
        # a different number of boxes compares by shape only; a dtype change is no tie
        reshaped = result.status is TensorStatus.NOT_COMPARABLE and (
            tally is not None and tally.why.startswith("shape "))
        if tally is None or not (result.ok is False or reshaped):
            continue
        failing = [s for s, ok in tally.oks.items() if not ok] + sorted(tally.mismatched)
        why = follows.get(result.name, {})
        if failing and all(s in why for s in failing):
            result.ok = None
            result.status, result.detail = TensorStatus.ILL_CONDITIONED, why[failing[0]]
            count += 1
    return count


def mark_random(reference: onnx.ModelProto, results: list[TensorResult]) -> int:
    """Mark the failing tensors that follow a training-mode Dropout (random on every run,
    `runtime.randomness`) not judged; returns how many."""
    from graphfix.runtime.randomness import downstream, random_sources

    follows = downstream(reference, random_sources(reference))
    count = 0
    for result in results:
        if result.ok is False and result.name in follows:
            result.ok = None
            result.status, result.detail = TensorStatus.RANDOM, follows[result.name]
            count += 1
    return count
