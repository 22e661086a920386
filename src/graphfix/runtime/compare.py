"""Comparing a candidate's graph outputs with the reference's, one verdict per output.

Each output is measured by `runtime.measure.measure` (the one measure `graphfix check`
uses too), with the model's noise floor for that output when it was measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from graphfix.runtime.measure import Measure, describe, measure
from graphfix.runtime.tolerances import Tolerance, tolerance_for


@dataclass(frozen=True)
class OutputDiff:
    """How one output compares: the measure, and whether it holds."""

    name: str
    ok: bool
    max_abs: float
    max_rel: float
    tolerance: Tolerance
    problem: str = ""
    measure: Measure | None = None
    not_compared: str = ""  # why this output is not judged on this sample (ok is True)

    @property
    def scaled(self) -> float:
        """max |c - r| / max |r| (inf when they do not compare)."""
        return self.measure.error if self.measure is not None else math.inf

    @property
    def sqnr_db(self) -> float:
        return self.measure.sqnr_db if self.measure is not None else -math.inf

    def describe(self) -> str:
        if self.not_compared:
            return f"{self.name}: not compared ({self.not_compared})"
        if self.problem:
            return f"{self.name}: {self.problem}"
        assert self.measure is not None
        return f"{self.name}: {describe(self.measure)}"


def compare_outputs(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
    float_tolerance: Tolerance | None = None, floors: Mapping[str, float] | None = None,
    computed_in: Mapping[str, str] | None = None,
) -> list[OutputDiff]:
    """Compare every reference output with the candidate's output of the same name.
    `float_tolerance` replaces the per-dtype tolerance of float tensors (--atol/--rtol);
    `floors` are the model's noise floors per output (absolute, `runtime.outputs`);
    `computed_in` names the narrower float type an output was cast up from, whose
    tolerance then applies (`runtime.precision`)."""
    floors, computed_in = floors or {}, computed_in or {}
    return [_compare_one(name, ref, candidate.get(name, _MISSING), float_tolerance,
                         floors.get(name, 0.0), computed_in.get(name))
            for name, ref in reference.items()]


_MISSING = object()
"""An output the candidate's run did not return at all (None is an empty optional)."""


def unstable(name: str, reason: str) -> OutputDiff:
    """The verdict on an output that no rewrite can be judged by on this sample (its
    reference changes under onnxruntime's own correct optimizations, `runtime.outputs`)."""
    return OutputDiff(name, True, math.nan, math.nan, tolerance_for(np.dtype(np.int64)),
                      not_compared=reason)


def _compare_one(name: str, ref: np.ndarray | None, cand: np.ndarray | None,
                 float_tolerance: Tolerance | None, floor: float,
                 computed_in: str | None = None) -> OutputDiff:
    if cand is _MISSING or ref is None or cand is None:
        # ref or cand None: an empty optional (onnxruntime returns None for one)
        same = ref is None and cand is None
        what = ("missing from the rewritten model" if cand is _MISSING
                else "" if same else "an empty optional in one model only")
        return OutputDiff(name, same, 0.0 if same else math.inf, 0.0 if same else math.inf,
                          tolerance_for(np.dtype(np.int64)), what)
    ref = np.asarray(ref)
    if float_tolerance is not None and ref.dtype.kind == "f":
        tol = float_tolerance
    elif computed_in is not None and ref.dtype.kind == "f":
        tol = tolerance_for(computed_in)
    else:
        tol = tolerance_for(ref.dtype)
    cand = np.asarray(cand)
    if cand.dtype != ref.dtype:
        return OutputDiff(name, False, math.inf, math.inf, tol,
                          f"dtype changed {ref.dtype} -> {cand.dtype}")
    if cand.shape != ref.shape:
        return OutputDiff(name, False, math.inf, math.inf, tol,
                          f"shape changed {ref.shape} -> {cand.shape}")
    m = measure(ref, cand, tolerance=tol, floor=floor)
    assert not isinstance(m, str), "dtype and shape were checked"
    return OutputDiff(name, m.ok, m.max_abs, m.max_rel, tol, m.problem, m)
