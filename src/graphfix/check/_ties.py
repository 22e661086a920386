"""Selections among near-ties: tensors a layer-wise check does not judge on a sample.

A TopK whose values agree on a sample while its indices differ chose among values tied
to within rounding: both models computed a valid answer, and what is computed from the
indices (Mask R-CNN's proposals, and everything after them) differs by whole boxes. On
such a sample those tensors are not judged, and the report says which selection they
follow and asks for real inputs (`--data`), as `graphfix run`'s per-pass check does for
outputs its noise floor shows to be ill-conditioned (`runtime.outputs`). A TopK whose
values differ is not a tie: it fails like any tensor, and so does everything after it.

Only TopK has this witness (its values output); other selections (NonMaxSuppression,
ArgMax, NonZero) output indices alone and are judged as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import onnx

from graphfix.check._inline import Producer, topo_order
from graphfix.check.status import TensorStatus
from graphfix.runtime.measure import Tally

if TYPE_CHECKING:
    from graphfix.check.layerwise import TensorResult


def tie_flips(reference: onnx.ModelProto, tallies: Mapping[str, Tally],
              producers: Mapping[str, Producer]) -> dict[str, dict[int, str]]:
    """TopK index outputs that differ on a sample where the values output agrees:
    {indices tensor: {sample: why}} (main graph)."""
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
                         tallies: Mapping[str, Tally], producers: Mapping[str, Producer]
                         ) -> int:
    """Mark the failing tensors that fail only on samples where they follow a TopK's
    choice among near-ties (module docstring) ill-conditioned, not judged; returns how
    many."""
    flips = tie_flips(reference, tallies, producers)
    if not flips:
        return 0
    follows = tainted(flips, topo_order(reference), producers)
    count = 0
    for result in results:
        tally = tallies.get(result.name)
        if result.ok is not False or tally is None:
            continue
        failing = [s for s, ok in tally.oks.items() if not ok]
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
