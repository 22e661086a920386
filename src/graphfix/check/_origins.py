"""Origins: the nodes that create error, as opposed to the nodes that only inherit it.

For every compared tensor that is not ok, on its worst sample:

    error          the tensor's error measure (`_measure`: relative error in strict
                   mode, noise power ratio 10^(-SQNR/10) in sqnr mode)
    input_error    the largest error among the node's inputs on that sample; an input
                   that was not compared (merged by a pass, only in the reference) is
                   looked through to the nearest compared tensors upstream; weights,
                   constants and graph inputs count as exact (0)
    amplification  error / max(input_error, ERROR_FLOOR)

The node is an origin when amplification >= `min_amplification` (10 by default: its
error is at least ten times its inputs'). A node whose error is only a little larger
than its inputs' inherits the error, even where it is the first to cross the
tolerance: error that grows gradually layer after layer (INT8 noise accumulating) has
no origin, and the report says so. Origins are ranked by amplification, then error,
then topological order; a node with several diverging outputs is listed once, by its
most amplifying output.

ERROR_FLOOR (1e-12) is far below any float32 rounding error (~1e-7 relative), so an
exact input gives a large, finite amplification (error / 1e-12) and nodes whose
inputs are exact rank first, among themselves by their own error. inf / inf (an input
and an output both infinitely wrong) counts as 1: inherited.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graphfix.check._inline import Producer
from graphfix.runtime.measure import Tally

if TYPE_CHECKING:
    from graphfix.check.layerwise import TensorResult

ERROR_FLOOR = 1e-12
MIN_AMPLIFICATION = 10.0


@dataclass
class Origin:
    """A node whose output error is much larger than its inputs' (module docstring)."""

    name: str  # the diverging tensor (reference name)
    node: str  # label of the node producing it
    op: str
    error: float
    input_error: float
    amplification: float
    sample: int  # the sample these numbers are from (the tensor's worst)

    def describe_amplification(self) -> str:
        """"12.3x", or where the inputs are exact (the ratio is then over ERROR_FLOOR and
        its size means nothing) "new (inputs exact)"."""
        if self.input_error == 0:
            return "new (inputs exact)"
        return f"{self.amplification:.3g}x"


def amplification(error: float, input_error: float) -> float:
    den = max(input_error, ERROR_FLOOR)
    if math.isinf(error) and math.isinf(den):
        return 1.0
    return error / den


def find_origins(results: Sequence[TensorResult], tallies: Mapping[str, Tally],
                 producers: Mapping[str, Producer],
                 min_amplification: float = MIN_AMPLIFICATION) -> list[Origin]:
    """The ranked origins among `results` (module docstring)."""
    memo: dict[tuple[str, int], float] = {}
    found: list[tuple[Origin, int]] = []
    for result in results:
        producer = producers.get(result.name)
        if result.ok is not False or producer is None or result.worst_sample is None:
            continue
        sample = result.worst_sample
        error = tallies[result.name].errors[sample]
        input_error = max((_upstream(i, sample, tallies, producers, memo)
                           for i in producer.inputs), default=0.0)
        amp = amplification(error, input_error)
        if amp >= min_amplification:
            origin = Origin(result.name, result.node, result.op, error, input_error, amp,
                            sample)
            found.append((origin, result.order))
    found.sort(key=lambda item: (-item[0].amplification, -item[0].error, item[1]))
    ranked: list[Origin] = []
    seen: set[str] = set()
    for origin, _ in found:
        if origin.node not in seen:
            seen.add(origin.node)
            ranked.append(origin)
    return ranked


def _direct(name: str, sample: int, tallies: Mapping[str, Tally]) -> float | None:
    tally = tallies.get(name)
    if tally is None or not tally.compared or sample not in tally.errors:
        return None
    return tally.errors[sample]


def _upstream(name: str, sample: int, tallies: Mapping[str, Tally],
              producers: Mapping[str, Producer], memo: dict[tuple[str, int], float]) -> float:
    """The error of `name` on `sample`, looking through tensors that were not compared
    to the nearest compared ones upstream (iterative: uncompared chains can be long)."""
    stack: list[tuple[str, bool]] = [(name, False)]
    open_: set[str] = set()  # expanded, not yet finished: the ancestors (cycle guard)
    while stack:
        t, expanded = stack.pop()
        if (t, sample) in memo:
            continue
        direct = _direct(t, sample, tallies)
        if direct is not None or t not in producers:
            memo[(t, sample)] = direct if direct is not None else 0.0
            continue
        inputs = producers[t].inputs
        if not expanded:
            open_.add(t)
            stack.append((t, True))
            stack.extend((i, False) for i in inputs if (i, sample) not in memo and i not in open_)
            continue
        open_.discard(t)
        memo[(t, sample)] = max((memo.get((i, sample), 0.0) for i in inputs), default=0.0)
    return memo[(name, sample)]
