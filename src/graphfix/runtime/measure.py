"""How far one candidate tensor is from the reference's, per sample, and over samples.

Per sample (one onnxruntime run):

- ok (strict mode): `runtime.compare.compare_outputs`, i.e. the tolerance of the dtype in
  `runtime.tolerances` (numpy.isclose per element, NaNs in the same places, equal
  infinities; integers and booleans exact).
- ok (sqnr mode): SQNR >= the threshold for float tensors; integers and booleans exact.
- max abs: max |c - r| over the finite elements.
- max rel: max |c - r| / max(|r|, guard) per element, where the guard is the dtype's
  atol (1 for integers and booleans): an element near zero is measured against the
  smallest difference the tolerance ever allows, not against ~0 (which would make
  every ReLU zero that the candidate computes as 1e-9 an "infinite" relative error).
- SQNR: 10 log10(sum r^2 / sum (r - c)^2) in dB; +inf when the tensors are equal,
  -inf when the reference is all zeros and the candidate is not.
- error (the measure origins are ranked by): strict mode, max |c - r| / max |r| (the
  largest difference relative to the tensor's magnitude; robust to near-zero
  elements); sqnr mode, the noise power ratio sum (r - c)^2 / sum r^2 = 10^(-SQNR/10).
  Both are 0 for equal tensors and inf when the reference is all zeros and the
  candidate is not (or NaN/inf placements differ).

Two dtypes compare when both are float (at the less precise one, with its tolerance:
an fp16 candidate is not held to fp32's) or both integer/boolean (as int64, exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphfix.runtime.compare import compare_outputs
from graphfix.runtime.tolerances import Tolerance, tolerance_for


@dataclass(frozen=True)
class Measure:
    ok: bool
    max_abs: float
    max_rel: float
    sqnr_db: float
    error: float


def common_dtype(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The dtype two tensors are compared at, or None when they do not compare."""
    if a == b:
        return a
    if a.kind == "f" and b.kind == "f":
        return a if a.itemsize <= b.itemsize else b
    if a.kind in "iub" and b.kind in "iub":
        return np.dtype(np.int64)
    return None


def measure(ref, cand, mode: str, threshold: float,
            tolerance: Tolerance | None = None) -> Measure | str:
    """The per-sample numbers (module docstring), or why the two do not compare."""
    if not isinstance(ref, np.ndarray) or not isinstance(cand, np.ndarray):
        return "not a tensor"
    dtype = common_dtype(ref.dtype, cand.dtype)
    if dtype is None:
        return f"dtype {ref.dtype} vs {cand.dtype}"
    if ref.shape != cand.shape:
        return f"shape {_shape(ref.shape)} vs {_shape(cand.shape)}"
    r, c = ref.astype(dtype, copy=False), cand.astype(dtype, copy=False)
    tol = tolerance if tolerance is not None and dtype.kind == "f" else tolerance_for(dtype)
    if dtype.kind != "f":
        (diff,) = compare_outputs({"t": r}, {"t": c})  # integers and booleans: exact
        within = diff.ok
    r64, c64 = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    finite = np.isfinite(r64)
    if not finite.all():  # NaNs and infinities must sit in the same places (runtime.compare)
        if not np.array_equal(r64[~finite], c64[~finite], equal_nan=True):
            return Measure(False, math.inf, math.inf, -math.inf, math.inf)
        r64, c64 = r64[finite], c64[finite]
    d = np.abs(c64 - r64)
    mag = np.abs(r64)
    if not np.isfinite(c64).all():
        return Measure(False, math.inf, math.inf, -math.inf, math.inf)
    max_abs = float(d.max()) if d.size else 0.0
    if dtype.kind == "f":  # the same rule as runtime.compare: |c - r| <= atol + rtol |r|
        within = bool(np.all(d <= tol.atol + tol.rtol * mag))
    guard = tol.atol if tol.atol > 0 else 1.0
    max_rel = float((d / np.maximum(mag, guard)).max()) if d.size else 0.0
    signal, noise = float(np.dot(mag, mag)), float(np.dot(d, d))
    sqnr = ratio_db(signal, noise)
    if mode == "sqnr":
        error = _safe_div(noise, signal)
        ok = within if dtype.kind != "f" else sqnr >= threshold
    else:
        error = _safe_div(max_abs, float(mag.max()) if mag.size else 0.0)
        ok = within
    return Measure(bool(ok), max_abs, max_rel, sqnr, error)


def _safe_div(num: float, den: float) -> float:
    if num == 0:
        return 0.0
    return math.inf if den == 0 else num / den


def ratio_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise): +inf when noise is 0, -inf when only the signal is 0."""
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


@dataclass
class Tally:
    """One reference tensor's numbers over the samples it was compared on."""

    candidate: str
    dtype: str = ""
    errors: dict[int, float] = field(default_factory=dict)
    oks: dict[int, bool] = field(default_factory=dict)
    max_abs: float = 0.0
    max_rel: float = 0.0
    sqnr_db: float = math.inf
    why: str = ""  # set when the pair does not compare (dtype, shape, not a tensor)

    def add(self, sample: int, ref, cand, mode: str, threshold: float,
            tolerance: Tolerance | None = None) -> None:
        if isinstance(ref, np.ndarray) and not self.dtype:
            self.dtype = str(ref.dtype)
        m = measure(ref, cand, mode, threshold, tolerance)
        if isinstance(m, str):
            self.why = self.why or m
            return
        self.errors[sample] = m.error
        self.oks[sample] = m.ok
        self.max_abs = max(self.max_abs, m.max_abs)
        self.max_rel = max(self.max_rel, m.max_rel)
        self.sqnr_db = min(self.sqnr_db, m.sqnr_db)

    @property
    def compared(self) -> bool:
        return not self.why and bool(self.errors)

    @property
    def ok(self) -> bool:
        return all(self.oks.values())

    @property
    def worst(self) -> int | None:
        """The sample with the largest error (the first of equals); a failing sample
        is preferred over a passing one."""
        if not self.errors:
            return None
        return max(self.errors, key=lambda s: (not self.oks[s], self.errors[s], -s))
