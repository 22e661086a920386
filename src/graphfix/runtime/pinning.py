"""The run's output check across a TopK that chose among near-ties: the original's choice.

A detector's proposals are a TopK of scores; with random weights (and often with real
ones) some scores near the cut tie to within rounding. A correct rewrite (fold-bn on
Faster R-CNN) changes their last bits, the TopK keeps another of the tied anchors, and
every box after it differs by whole boxes: the output check failed and rolled a correct
pass back (issue 18's report: Faster R-CNN).

The check sees each TopK's outputs in both runs (`extra` outputs, no copy of the model).
When a rewrite's outputs fail and a TopK's values agree with the original's (within the
float bound) while its indices differ, the TopK chose among tied values: the rewritten
model is run again with that TopK cut out and the original's values and indices fed in
its place (`pinned`), so everything after it is computed from the same choice and judged
strictly, and everything before it was judged by the TopK's values. A TopK whose values
differ is not a tie: the check fails as before. Cascades (a second TopK after the first)
are pinned in turn, `MAX_PINS` runs at most.

Only TopK has this witness; NonMaxSuppression, ArgMax and NonZero output indices alone,
and a choice they make among ties still fails the check (a note says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from graphfix.runtime.compare import compare_outputs

MAX_PINS = 3
"""Reruns of one rewritten model with more TopKs pinned (each pins every TopK found tied)."""


@dataclass(frozen=True)
class Selection:
    """One TopK of the original's main graph: its label and output tensors."""

    label: str
    values: str
    indices: str


def selections(model: onnx.ModelProto) -> list[Selection]:
    """The main graph's TopK nodes whose both outputs are named."""
    out = []
    for node in model.graph.node:
        if node.op_type == "TopK" and node.domain in ("", "ai.onnx") and (
                len(node.output) >= 2 and node.output[0] and node.output[1]):
            label = f"TopK '{node.name or node.output[0]}'"
            out.append(Selection(label, node.output[0], node.output[1]))
    return out


def witnesses(model: onnx.ModelProto, found: Sequence[Selection]) -> list[str]:
    """The outputs of `found` that `model`'s main graph computes (a pass may have merged
    or renamed one)."""
    produced = {name for node in model.graph.node for name in node.output}
    return [name for s in found for name in (s.values, s.indices) if name in produced]


def tied(found: Sequence[Selection], reference: Mapping[str, np.ndarray],
         candidate: Mapping[str, np.ndarray]) -> list[Selection]:
    """The TopKs whose values agree (the float bound of `runtime.compare`) and whose
    indices differ: choices among values tied to within rounding."""
    out = []
    for s in found:
        names = (s.values, s.indices)
        if not all(n in reference and n in candidate for n in names):
            continue
        (values,) = compare_outputs({s.values: reference[s.values]}, candidate)
        if values.ok and not np.array_equal(reference[s.indices], candidate[s.indices]):
            out.append(s)
    return out


def pinned(model: onnx.ModelProto, chosen: Sequence[Selection],
           reference: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """`model` without the nodes computing `chosen` TopKs' outputs, which are graph inputs
    instead (to be fed the original's `reference` values). A copy: `model` is unchanged
    (deferred weights stay references)."""
    names = {n for s in chosen for n in (s.values, s.indices)}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    kept = [node for node in graph.node if not names.intersection(node.output)]
    del graph.node[:]
    graph.node.extend(kept)
    infos = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    graph.input.extend(
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(reference[n].dtype),
                                      reference[n].shape) for s in chosen
        for n in (s.values, s.indices))
    return out
