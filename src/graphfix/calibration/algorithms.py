"""Ranges (amax) per tensor from a |x| histogram: minmax, entropy, percentile, mse.

Every method takes a `TensorStats` (a histogram of |x| over `bins` equal bins on
[0, amax], see `stats`) and returns the symmetric INT8 range amax (scale =
amax/127) as a float with 0 <= result <= stats.amax. A tensor that was all zeros
(stats.amax == 0) gets 0 from every method; turning that into a usable Q/DQ scale
is the writer's job.

- `minmax`: the observed max|x| (TensorRT's IInt8MinMaxCalibrator).
- `entropy`: the KL-divergence search of TensorRT's EntropyCalibrator2 as NVIDIA
  published it (GTC 2017 s7310) and implemented it in pytorch-quantization /
  ModelOpt-torch `_compute_amax_entropy`; see `entropy` for how it differs from
  onnxruntime's and ModelOpt-ONNX's.
- `percentile`: the smallest bin edge below which p% of the |x| counts lie.
- `mse`: the bin edge minimizing the simulated INT8 quantization MSE.

`quantization_mse` / `quantization_sqnr` simulate INT8 on a histogram for any amax:
what `methods` uses to choose per tensor and `clipping` to find bad clips. The
registry of methods (names, options, help) is `methods`, not this module.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from graphfix.calibration.stats import TensorStats

LEVELS = 127  # positive INT8 levels of symmetric quantization: scale = amax / 127


def minmax(stats: TensorStats) -> float:
    """The full observed range, max|x|."""
    return float(stats.amax)


def entropy(stats: TensorStats, num_quant_bins: int = 128, start_bin: int = 128) -> float:
    """The amax that minimizes KL(P || Q), TensorRT EntropyCalibrator2 style.

    For every candidate clip point i = start_bin .. bins (inclusive), P is
    hist[:i] with the counts beyond i folded into its last bin, and Q is hist[:i]
    merged into `num_quant_bins` levels (source bin j goes to level
    floor(j * num_quant_bins / i)) and expanded back over the non-empty source
    bins only (empty bins stay 0). Like NVIDIA's code, hist[0] is replaced by
    hist[1] first (the spike of exact zeros after ReLU would dominate P), KL is
    computed on normalized P and Q without smoothing (a non-empty P bin over an
    empty Q bin gives +inf, i.e. that clip point is rejected), the *last*
    minimum wins (the larger threshold on ties), and amax is the right edge of
    the chosen range, edges[i].

    This equals pytorch-quantization's / ModelOpt-torch's `_compute_amax_entropy`
    (2048 bins, start 128, 128 levels) up to float rounding: it is computed in
    closed form from cumulative sums (about 6 ms for 2048 bins) instead of a
    Python loop per candidate (about 2 s). It differs on purpose from:

    - the GTC slides: they say amax = (m + 0.5) * bin width and stop the search
      at bin 2047; here (as in NVIDIA's code) amax = edges[i], i up to 2048;
    - onnxruntime's `HistogramCollector.get_entropy_threshold` and ModelOpt-ONNX
      (which calls it): they histogram signed x on [-amax, amax], search windows
      centred on zero with `num_quantized_bins` over both sides (~64 levels per
      side), smooth P and Q with eps=1e-4, take the first minimum, keep hist[0],
      and use 128 bins by default, which leaves a single candidate (the full
      range, i.e. minmax). Even with 2048 bins it lands elsewhere: 4.81 against
      4.15 here on N(0, 1) plus one outlier at 25 (test_algorithms).
    """
    hist = np.asarray(stats.hist, dtype=np.float64).copy()
    n = hist.size
    if stats.amax <= 0 or n == 0:
        return 0.0
    if num_quant_bins < 1 or start_bin < 1:
        raise ValueError("num_quant_bins and start_bin must be positive")
    if n > 1:
        hist[0] = hist[1]
    start = min(start_bin, n)
    div = kl_divergences(hist, num_quant_bins, start)
    if not np.isfinite(div).any():  # cannot happen with data; keep the full range
        return float(stats.amax)
    best = div.size - 1 - int(np.argmin(div[::-1]))
    return float(stats.edges[start + best])


def kl_divergences(hist: np.ndarray, num_quant_bins: int, start: int) -> np.ndarray:
    """KL(P_i || Q_i) for the clip points i = start .. len(hist), as in `entropy`.

    With T the total count, C/D/Z cumulative sums of b, b*log(b) and (b > 0),
    S_k and N_k the count and the non-empty bins of level k, Q is S_k/N_k on
    every non-empty bin of level k and sums to C[i], so
    KL_i = sum_{j<i-1} b_j/T * log((b_j/T) / (Q_j/C[i])) + (last bin term),
    which is D, C and per-level sums only: O(candidates * levels) work.
    """
    b = hist
    n = b.size
    total = b.sum()
    if total <= 0:
        return np.full(n - start + 1, np.inf)
    zero = np.zeros(1)
    c = np.concatenate([zero, np.cumsum(b)])
    z = np.concatenate([zero, np.cumsum(b > 0)])
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.concatenate([zero, np.cumsum(np.where(b > 0, b * np.log(b), 0.0))])
        i, bounds = _level_bounds(n, num_quant_bins, start)
        s = np.diff(c[bounds], axis=1)  # count per level, (candidates, levels)
        log_avg = np.diff(z[bounds], axis=1)  # non-empty source bins per level
        np.divide(s, log_avg, out=log_avg, where=s > 0)
        np.log(log_avg, out=log_avg, where=s > 0)
        log_avg[s <= 0] = 0.0
        level_sum = np.einsum("ij,ij->i", s, log_avg)  # sum_k S_k log(S_k / N_k)
        last = b[i - 1]
        log_avg_last = log_avg[np.arange(i.size), (num_quant_bins * (i - 1)) // i]
        ci = c[i]
        log_t = np.log(total)
        log_ci = np.log(ci)
        body = (d[i - 1] - (level_sum - last * log_avg_last)) / total
        body += c[i - 1] / total * (log_ci - log_t)
        p_last = last + (total - ci)
        tail = np.where(
            p_last > 0,
            p_last / total * (np.log(p_last) - log_t - log_avg_last + log_ci),
            0.0,
        )
        div = body + tail
    div[(p_last > 0) & (last == 0)] = np.inf  # P > 0 over an empty Q bin
    div[ci <= 0] = np.inf
    return div


@functools.lru_cache(maxsize=8)
def _level_bounds(n: int, levels: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Clip points i = start..n and, per i, the first source bin of each level
    (ceil(k * i / levels), k = 0..levels): level k holds bins [b[k], b[k+1])."""
    i = np.arange(start, n + 1)
    k = np.arange(levels + 1)
    bounds = (k[None, :] * i[:, None] + levels - 1) // levels
    i.flags.writeable = False
    bounds.flags.writeable = False
    return i, bounds


def percentile(stats: TensorStats, p: float = 99.99) -> float:
    """The smallest bin edge with at least p% of the |x| counts at or below it.

    That is the right edge of the bin where the cumulative count reaches p%, so
    percentile(stats, 100) == minmax(stats). pytorch-quantization, ModelOpt-torch
    and onnxruntime (symmetric) return that bin's *left* edge, one bin width
    (amax/bins) lower, which clips some of the p% and makes p=100 less than max|x|.
    """
    if not 0 < p <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {p}")
    total = float(stats.hist.sum())
    if stats.amax <= 0 or total <= 0:
        return 0.0
    cum = np.cumsum(stats.hist, dtype=np.float64)
    need = p / 100.0 * total * (1.0 - 1e-12)  # absorb rounding of p/100*total
    idx = int(np.searchsorted(cum, need, side="left"))
    return float(stats.edges[min(idx + 1, stats.hist.size)])


def _unit_errors(units: np.ndarray, n: int) -> np.ndarray:
    """Squared INT8 error of every bin centre (j + 0.5) for each amax, all in bin
    widths: shape (len(units), n). amax u maps c to min(round(c*127/u), 127) * u/127."""
    centers = np.arange(n) + 0.5
    u = units[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.minimum(np.round(centers * LEVELS / u), LEVELS)
    q *= u / LEVELS
    q[np.broadcast_to(u <= 0, q.shape)] = 0.0
    q -= centers
    np.square(q, out=q)
    return q


@functools.lru_cache(maxsize=2)
def _edge_errors(n: int, start: int) -> np.ndarray:
    """`_unit_errors` for the amaxes at edges start..n. It does not depend on the
    data, so it is computed once per (bins, start) and kept (read-only; 31 MB for
    2048 bins)."""
    errors = _unit_errors(np.arange(start, n + 1, dtype=np.float64), n)
    errors.flags.writeable = False
    return errors


def _weights(stats: TensorStats) -> np.ndarray:
    counts = np.asarray(stats.hist, dtype=np.float64)
    return counts / counts.sum()


def quantization_mse(stats: TensorStats, amaxes: np.ndarray | Sequence[float]) -> np.ndarray:
    """Mean squared INT8 quantization error of the histogram for each amax.

    Every count sits at its bin centre c; symmetric INT8 with scale s = amax/127
    maps c to min(round_half_even(c/s), 127) * s (so values above amax clip to
    it). The result is sum(count * (q - c)^2) / sum(count) per amax. It is
    computed in bin widths, with an amax within 1e-6 bin of an edge taken as that
    edge, so it agrees exactly with the search in `mse`.
    """
    thresholds = np.atleast_1d(np.asarray(amaxes, dtype=np.float64))
    n = stats.hist.size
    if stats.amax <= 0 or n == 0 or stats.hist.sum() <= 0:
        return np.zeros(thresholds.size)
    width = stats.amax / n
    units = thresholds / width
    snapped = np.round(units)
    units = np.where(np.abs(units - snapped) < 1e-6, snapped, units)
    return (_unit_errors(units, n) @ _weights(stats)) * width**2


def mse(stats: TensorStats, start_bin: int = 128) -> float:
    """The bin edge amax (edges[start_bin..bins]) with the lowest `quantization_mse`.

    The search starts at bin 128 as in pytorch-quantization's `_compute_amax_mse`:
    below it the quantization step (amax/127) is smaller than a bin, and the
    rounding error of bin centres says nothing about the data's. That code tries
    bin *centres* from 128 to the last bin; edges are used here, so the full
    range (minmax) is one of the candidates. The first minimum wins.
    """
    n = stats.hist.size
    if stats.amax <= 0 or n == 0 or stats.hist.sum() <= 0:
        return 0.0
    start = min(max(start_bin, 1), n)
    errors = _edge_errors(n, start) @ _weights(stats)
    return float(stats.edges[start + int(np.argmin(errors))])


def quantization_sqnr(stats: TensorStats, amaxes: np.ndarray | Sequence[float]) -> np.ndarray:
    """Simulated INT8 SQNR in dB of the histogram for each amax: 10 log10(mean of c^2
    over the counts / `quantization_mse`), c the bin centres; +inf where the error is 0
    (an all-zero tensor)."""
    error = quantization_mse(stats, amaxes)
    n = stats.hist.size
    if stats.amax <= 0 or n == 0 or stats.hist.sum() <= 0:
        return np.full(error.size, np.inf)
    centres = (np.arange(n) + 0.5) * (stats.amax / n)
    power = float(_weights(stats) @ (centres * centres))
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(power / error)
