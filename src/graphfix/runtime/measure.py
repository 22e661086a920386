"""The one "same numbers" measure: how far a candidate tensor is from the reference's.

Used by the per-pass check (`runtime.outputs`, via `runtime.compare`), by `graphfix
check` for every tensor (`Tally`, per sample and over samples) and by calibration's
comparisons (`ratio_db`). The bound itself is explained in `runtime.tolerances`.

Per sample (one onnxruntime run), over the finite elements:

- scale S: max |r|.
- max abs: max |c - r|.
- error: max |c - r| / S (strict mode; 0 for equal tensors, inf when S is 0 and the
  candidate differs), or the noise power ratio sum (c - r)^2 / sum r^2 = 10^(-SQNR/10)
  (sqnr mode). Origins are ranked by it.
- max rel: max |c - r| / max(|r|, allowed) per element, where `allowed` is the
  absolute part of the bound (`Tolerance.allowed`): an element near zero is measured
  against the smallest difference the bound ever allows, not against ~0.
- SQNR: 10 log10(sum r^2 / sum (r - c)^2) in dB; +inf when equal, -inf when the
  reference is all zeros and the candidate is not.
- ok (strict mode): |c - r| <= allowed + rtol |r| for every element, NaNs in the same
  places, equal infinities; integers and booleans equal. ok (sqnr mode): SQNR >= the
  threshold for float tensors; integers and booleans equal.

Two dtypes compare when both are float (at the less precise one, with its tolerance:
an fp16 candidate is not held to fp32's) or both integer/boolean (as int64, exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphfix.runtime.tolerances import Tolerance, tolerance_for

STRICT, SQNR = "strict", "sqnr"


@dataclass(frozen=True)
class Measure:
    ok: bool
    max_abs: float
    max_rel: float
    sqnr_db: float
    error: float
    scale: float = 0.0  # max |r|
    allowed: float = 0.0  # the absolute part of the bound (plus rtol |r|)
    tolerance: Tolerance | None = None
    problem: str = ""  # NaN/inf placement


def common_dtype(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The dtype two tensors are compared at, or None when they do not compare."""
    if a == b:
        return a
    if a.kind == "f" and b.kind == "f":
        return a if a.itemsize <= b.itemsize else b
    if a.kind in "iub" and b.kind in "iub":
        return np.dtype(np.int64)
    return None


def measure(ref, cand, mode: str = STRICT, threshold: float = 0.0,
            tolerance: Tolerance | None = None, floor: float = 0.0) -> Measure | str:
    """The per-sample numbers (module docstring), or why the two do not compare.
    `tolerance` replaces the dtype's for float tensors; `floor` is the model's own
    noise floor for this tensor (absolute), when measured."""
    if not isinstance(ref, np.ndarray) or not isinstance(cand, np.ndarray):
        return "not a tensor"
    dtype = common_dtype(ref.dtype, cand.dtype)
    if dtype is None:
        return f"dtype {ref.dtype} vs {cand.dtype}"
    if ref.shape != cand.shape:
        return f"shape {_shape(ref.shape)} vs {_shape(cand.shape)}"
    tol = tolerance if tolerance is not None and dtype.kind == "f" else tolerance_for(dtype)
    if dtype.kind in "OUS":  # strings (onnx STRING is an object array): equal or not
        differ = int(np.count_nonzero(ref != cand))
        return (Measure(True, 0.0, 0.0, math.inf, 0.0, 0.0, 0.0, tol) if not differ else
                _broken(tol, f"{differ} of {ref.size} strings differ"))
    with np.errstate(over="ignore"):  # a float32 value past float16's range: inf there
        ref, cand = ref.astype(dtype, copy=False), cand.astype(dtype, copy=False)
    if dtype in _BLOCKED and ref.size > _BLOCK and _all_finite(ref, cand):
        return _blocked(ref.ravel(), cand.ravel(), mode, threshold, tol, floor)
    # float64 copies, then worked on in place: `graphfix check` measures every tensor
    # of two runs (ViT-B/16: 1.7 of its 3.3 s were these lines with a new array each)
    r64 = ref.astype(np.float64).ravel()
    c64 = cand.astype(np.float64).ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        sums = float(r64.sum()), float(c64.sum())
    if not math.isfinite(sums[0]):  # a sum is finite only when every value is, or
        finite = np.isfinite(r64)   # when huge ones overflow it: then the mask decides
        if not finite.all():  # NaNs and infinities must sit in the same places
            if not np.array_equal(r64[~finite], c64[~finite], equal_nan=True):
                return _broken(tol, "NaN or infinity in different places")
            r64, c64 = r64[finite], c64[finite]
    if not math.isfinite(sums[1]) and not np.isfinite(c64).all():
        return _broken(tol, "NaN or infinity where the reference is finite")
    d = np.subtract(c64, r64, out=c64)
    np.abs(d, out=d)
    mag = np.abs(r64, out=r64)
    max_abs = float(d.max()) if d.size else 0.0
    scale = float(mag.max()) if mag.size else 0.0
    allowed = tol.allowed(scale, floor) if dtype.kind == "f" else 0.0
    if dtype.kind != "f":
        within = max_abs == 0
    elif tol.rtol == 0:  # d <= allowed everywhere: its largest is
        within = max_abs <= allowed
    else:
        within = bool(np.all(d <= allowed + tol.rtol * mag))
    guard = allowed if allowed > 0 else 1.0
    with np.errstate(over="ignore"):  # squares past float64's range: inf, as they are
        signal, noise = float(np.dot(mag, mag)), float(np.dot(d, d))
    if d.size:  # the relative errors, in the buffers no longer needed
        max_rel = float(np.divide(d, np.maximum(mag, guard, out=mag), out=d).max())
    else:
        max_rel = 0.0
    sqnr = ratio_db(signal, noise)
    if mode == SQNR:
        error = _safe_div(noise, signal)
        ok = within if dtype.kind != "f" else sqnr >= threshold
    else:
        error = _safe_div(max_abs, scale)
        ok = within
    return Measure(bool(ok), max_abs, max_rel, sqnr, error, scale, allowed, tol)


def _all_finite(*arrays: np.ndarray) -> bool:
    """Whether every value of these float arrays is finite: their sums in float64 are
    (also false when finite values are so large that a sum overflows; callers then take
    the element-wise way)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return all(math.isfinite(float(np.sum(a, dtype=np.float64))) for a in arrays)


_BLOCKED = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_BLOCK = 1 << 15
"""Float tensors of more elements than this, all finite, are measured a block at a time
(`_blocked`)."""


def _blocked(ref: np.ndarray, cand: np.ndarray, mode: str, threshold: float,
             tol: Tolerance, floor: float) -> Measure:
    """`measure` of two flat float tensors whose values are all finite, a block at a time
    in two float64 buffers that stay in the cache, instead of whole float64 copies in new
    memory. Mask R-CNN's check judges 84x1x320x320 masks: 0.28 -> 0.05 s in the run
    (new memory is what cost, a page fault per page). `graphfix check` of ViT-B/16,
    141M elements in 527 tensors: 1.04 -> 0.97 s (reading the tensors is most of it).
    The scale comes first, from the tensor's own dtype (max and min are exact), so that
    every element's bound is known as its block is measured. Each number is the one
    `measure` computes, but for the sums of squares behind SQNR, added up block by
    block."""
    scale = float(max(abs(ref.max()), abs(ref.min())))
    allowed = tol.allowed(scale, floor)
    guard = allowed if allowed > 0 else 1.0
    r64, c64 = np.empty(_BLOCK), np.empty(_BLOCK)
    max_abs = max_rel = signal = noise = 0.0
    within = True
    for start in range(0, ref.size, _BLOCK):
        n = min(_BLOCK, ref.size - start)
        r, c = r64[:n], c64[:n]
        r[...] = ref[start:start + n]
        c[...] = cand[start:start + n]
        d = np.subtract(c, r, out=c)
        np.abs(d, out=d)
        mag = np.abs(r, out=r)
        max_abs = max(max_abs, float(d.max()))
        if tol.rtol != 0 and within:
            within = bool(np.all(d <= allowed + tol.rtol * mag))
        with np.errstate(over="ignore"):
            signal += float(np.dot(mag, mag))
            noise += float(np.dot(d, d))
        max_rel = max(max_rel, float(np.divide(d, np.maximum(mag, guard, out=mag),
                                               out=d).max()))
    if tol.rtol == 0:
        within = max_abs <= allowed
    sqnr = ratio_db(signal, noise)
    if mode == SQNR:
        error, ok = _safe_div(noise, signal), sqnr >= threshold
    else:
        error, ok = _safe_div(max_abs, scale), within
    return Measure(bool(ok), max_abs, max_rel, sqnr, error, scale, allowed, tol)


def _broken(tol: Tolerance, problem: str) -> Measure:
    return Measure(False, math.inf, math.inf, -math.inf, math.inf, 0.0, 0.0, tol, problem)


def describe(m: Measure) -> str:
    """One line: the numbers `graphfix run` and `graphfix check` both report."""
    if m.problem:
        return m.problem
    if m.max_abs == 0:
        return "exact"
    text = f"max abs {m.max_abs:.3g} = {m.error:.2g} of max|ref| {m.scale:.3g}"
    if math.isfinite(m.sqnr_db):
        text += f", SQNR {m.sqnr_db:.0f} dB"
    if m.tolerance is not None and m.tolerance.rtol > 0:
        text += f" (allowed {m.allowed:.2g} + {m.tolerance.rtol:g}|ref|)"
    elif m.tolerance is not None:
        text += f" (allowed {m.allowed:.2g})"
    return text


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
    scales: dict[int, float] = field(default_factory=dict)  # max |r| per sample
    abs_errors: dict[int, float] = field(default_factory=dict)  # max |c - r| per sample
    tolerance: Tolerance | None = None  # what strict mode held it to (floats)
    shape: tuple[int, ...] = ()  # the reference's, on the first sample compared
    mismatched: set[int] = field(default_factory=set)  # samples that did not compare (`why`)

    def add(self, sample: int, ref, cand, mode: str, threshold: float,
            tolerance: Tolerance | None = None) -> None:
        if isinstance(ref, np.ndarray) and not self.dtype:
            self.dtype = str(ref.dtype)
            self.shape = ref.shape
        m = measure(ref, cand, mode, threshold, tolerance)
        if isinstance(m, str):
            self.why = self.why or m
            self.mismatched.add(sample)
            return
        self.errors[sample] = m.error
        self.oks[sample] = m.ok
        self.scales[sample], self.abs_errors[sample] = m.scale, m.max_abs
        self.tolerance = m.tolerance
        self.max_abs = max(self.max_abs, m.max_abs)
        self.max_rel = max(self.max_rel, m.max_rel)
        self.sqnr_db = min(self.sqnr_db, m.sqnr_db)

    def widen(self, sample: int, operand_scale: float) -> None:
        """Measure the sample against the larger of its own scale and `operand_scale`
        (the largest scale among the tensors its node computes it from): rounding in a
        node is relative to its operands, so Sigmoid(x) with |x| up to 40 carries error
        relative to 40, not to its own 1. Only a scale-relative bound widens."""
        self._accept(sample, operand_scale, 0.0)

    def allow(self, sample: int, extra: float) -> None:
        """Accept the sample when its error is within the bound plus `extra`: what its
        node's operands' measured error grows to through the node, by a bound of that
        op's own (`check._widen`). Only a scale-relative bound widens."""
        self._accept(sample, 0.0, extra)

    def _accept(self, sample: int, operand_scale: float, extra: float) -> None:
        """A failing sample passes when its error is within the bound at the larger of
        its scale and `operand_scale`, plus `extra`."""
        tol = self.tolerance
        if tol is None or tol.scale <= 0 or self.oks.get(sample, True) or self.why:
            return
        scale = max(self.scales[sample], operand_scale)
        if self.abs_errors[sample] <= tol.allowed(scale) + extra:
            self.oks[sample] = True
            self.errors[sample] = _safe_div(self.abs_errors[sample], scale)

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
