"""Comparing a candidate's outputs with the reference's, per output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from graphfix.runtime.tolerances import Tolerance, tolerance_for


@dataclass(frozen=True)
class OutputDiff:
    """How one output compares: errors, the tolerance applied, and whether it holds."""

    name: str
    ok: bool
    max_abs: float
    max_rel: float
    tolerance: Tolerance
    problem: str = ""

    def describe(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        return (
            f"{self.name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} "
            f"(rtol {self.tolerance.rtol:g}, atol {self.tolerance.atol:g})"
        )


def compare_outputs(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
    float_tolerance: Tolerance | None = None,
) -> list[OutputDiff]:
    """Compare every reference output with the candidate's output of the same name.
    `float_tolerance` replaces the per-dtype tolerance of float tensors (--atol/--rtol)."""
    return [_compare_one(name, ref, candidate.get(name), float_tolerance)
            for name, ref in reference.items()]


def _compare_one(name: str, ref: np.ndarray, cand: np.ndarray | None,
                 float_tolerance: Tolerance | None = None) -> OutputDiff:
    ref = np.asarray(ref)
    tol = tolerance_for(ref.dtype)
    if float_tolerance is not None and ref.dtype.kind == "f":
        tol = float_tolerance
    if cand is None:
        return OutputDiff(name, False, np.inf, np.inf, tol, "missing from the rewritten model")
    cand = np.asarray(cand)
    if cand.dtype != ref.dtype:
        return OutputDiff(
            name, False, np.inf, np.inf, tol, f"dtype changed {ref.dtype} -> {cand.dtype}"
        )
    if cand.shape != ref.shape:
        return OutputDiff(
            name, False, np.inf, np.inf, tol, f"shape changed {ref.shape} -> {cand.shape}"
        )
    if ref.size == 0:
        return OutputDiff(name, True, 0.0, 0.0, tol)
    if ref.dtype.kind not in "fc":
        diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
        max_abs = float(diff.max())
        return OutputDiff(name, max_abs == 0, max_abs, max_abs, tol)
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    if not np.array_equal(np.isnan(r), np.isnan(c)):
        return OutputDiff(name, False, np.inf, np.inf, tol, "NaN in different places")
    inf_r, inf_c = np.isinf(r), np.isinf(c)
    if not np.array_equal(inf_r, inf_c) or not np.array_equal(r[inf_r], c[inf_c]):
        return OutputDiff(name, False, np.inf, np.inf, tol, "infinities differ")
    finite = np.isfinite(r)
    diff = np.abs(r[finite] - c[finite])
    mag = np.abs(r[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(mag > 0, diff / mag, np.where(diff > 0, np.inf, 0.0))
    max_rel = float(rel.max()) if rel.size else 0.0
    ok = bool(np.all(diff <= tol.atol + tol.rtol * mag))
    return OutputDiff(name, ok, max_abs, max_rel, tol)
