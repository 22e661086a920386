"""Checkers of the operator table's restriction sentences about If and Loop subgraphs,
from the branch and body outputs' names and shapes (declared or inferred, as the view
has them). Answers as in restriction_checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphfix.doctor.restriction_checks import UNKNOWN

_INT32_MAX = int(np.iinfo(np.int32).max)
Shape = Sequence[int | str | None]


def if_branches(ref, view, match) -> str | None:
    """"Output tensors of the two conditional branches must have the same rank (8.x:
    broadcastable shapes), and must have different names"."""
    then, other = ref.attr("then_branch"), ref.attr("else_branch")
    same_rank = "same rank" in match.group(0)
    bad, unknown = [], False
    for index, (a, b) in enumerate(zip(then.output, other.output, strict=False)):
        if a.name == b.name:
            bad.append(f"output {index} is '{a.name}' in both branches")
            continue
        shapes = view.shape(a.name), view.shape(b.name)
        if shapes[0] is None or shapes[1] is None:
            unknown = True
            continue
        verdict = _ranks(*shapes) if same_rank else _broadcastable(*shapes)
        unknown |= verdict == UNKNOWN
        if verdict not in (None, UNKNOWN):
            bad.append(f"output {index}: {verdict}")
    return "; ".join(bad) if bad else (UNKNOWN if unknown else None)


def _ranks(a: Shape, b: Shape) -> str | None:
    return None if len(a) == len(b) else f"rank {len(a)} in then_branch, {len(b)} in else_branch"


def _broadcastable(a: Shape, b: Shape) -> str | None:
    verdict = None
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x == y or 1 in (x, y):
            continue
        if isinstance(x, int) and isinstance(y, int):
            return f"shapes {list(a)} and {list(b)} do not broadcast"
        verdict = UNKNOWN
    return verdict


def loop_scan_length(ref, view, match) -> str | None:
    """"Scan output length cannot be dynamic": with scan outputs, the trip count `M`
    must be given (a constant one below INT32_MAX settles it) and the loop must not stop
    on a condition it computes."""
    body = ref.attr("body")
    scans = len(body.output) - 1 - (len(ref.node.input) - 2)
    if scans <= 0:
        return None
    trip = ref.input(0)
    value = view.value(trip) if trip else None
    if not trip or (value is not None and int(value.reshape(-1)[0]) >= _INT32_MAX):
        return (f"it has {scans} scan output(s) and no trip count `M`, so their length is "
                "decided at run time by its condition")
    if ref.input(1) and not _passes_condition_through(body):
        return UNKNOWN  # the body computes when to stop
    return None if value is not None else UNKNOWN


def _passes_condition_through(body) -> bool:
    """Whether the body's condition output is its condition input (directly or through
    an Identity): the loop then runs exactly `M` times."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_out == cond_in:
        return True
    return any(n.op_type == "Identity" and list(n.output) == [cond_out]
               and list(n.input) == [cond_in] for n in body.node)


def loop_carried_shapes(ref, view, match) -> str | None:
    """"The shape of Loop carried dependencies must be the same across all loop
    iterations": each carried value's shape entering the body against leaving it."""
    body = ref.attr("body")
    bad, unknown = [], False
    for before, after in zip(body.input[2:], body.output[1:], strict=False):
        old, new = view.shape(before.name), view.shape(after.name)
        verdict = UNKNOWN if old is None or new is None else _same_shape(old, new)
        unknown |= verdict == UNKNOWN
        if verdict not in (None, UNKNOWN):
            bad.append(f"'{before.name}' is {verdict}")
    return "; ".join(bad) if bad else (UNKNOWN if unknown else None)


def _same_shape(old: Shape, new: Shape) -> str | None:
    if len(old) != len(new):
        return f"rank {len(old)} entering the body and {len(new)} leaving it"
    verdict = None
    for x, y in zip(old, new, strict=True):
        if isinstance(x, int) and isinstance(y, int) and x != y:
            return f"{list(old)} entering the body and {list(new)} leaving it"
        if x != y or x is None:
            verdict = UNKNOWN
    return verdict
