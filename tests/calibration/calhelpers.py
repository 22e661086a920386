"""Helpers shared by the calibration tests: TensorStats from arrays or counts, and
a loop-for-loop port of NVIDIA's entropy search to check the vectorized one against."""

from __future__ import annotations

from collections import Counter

import numpy as np

from graphfix.calibration.stats import TensorStats


def stats_of_counts(counts, amax: float, name: str = "t") -> TensorStats:
    """TensorStats holding a given |x| histogram on [0, amax]."""
    hist = np.asarray(counts, dtype=np.int64)
    return TensorStats(name=name, dtype=np.dtype(np.float32), min=-amax, max=amax,
                       amax=float(amax), hist=hist, count=int(hist.sum()))


def stats_of_array(x: np.ndarray, bins: int = 2048, name: str = "t") -> TensorStats:
    """TensorStats of one array, binned the way stats.collect bins."""
    amax = float(np.abs(x).max())
    hist = np.histogram(np.abs(x), bins=bins, range=(0.0, amax))[0].astype(np.int64)
    return TensorStats(name=name, dtype=x.dtype, min=float(x.min()), max=float(x.max()),
                       amax=amax, hist=hist, count=int(x.size))


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.stats.entropy(p, q): both normalized, 0 where p == 0, inf where q == 0 < p."""
    p = p / p.sum()
    q = q / q.sum()
    out = 0.0
    for pi, qi in zip(p, q, strict=True):
        if pi > 0:
            if qi <= 0:
                return float("inf")
            out += pi * np.log(pi / qi)
    return out


def reference_entropy_index(counts, nbins: int = 128, start: int = 128) -> tuple[int, list]:
    """The clip index pytorch-quantization's `_compute_amax_entropy` picks (same loops,
    numpy only); returns (index into the edges, divergences)."""
    bins = np.array(counts, dtype=np.float64)
    bins[0] = bins[1]
    divergences = []
    for i in range(start, len(bins) + 1):
        space = np.linspace(0, i, num=nbins + 1)
        digitized = np.digitize(range(i), space) - 1
        digitized[bins[:i] == 0] = -1
        density = np.zeros(nbins)
        for idx, d in enumerate(digitized):
            if d != -1:
                density[d] += bins[idx]
        for key, val in Counter(digitized).items():
            if key != -1:
                density[key] /= val
        q = np.array([density[d] if d != -1 else 0.0 for d in digitized])
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        divergences.append(_kl(p, q))
    div = np.array(divergences)
    last = len(div) - 1 - int(np.argmin(div[::-1]))
    return start + last, divergences
