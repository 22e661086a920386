"""Bad clips: tensors whose chosen range loses far more than another method's would.

After calibration, every quantized tensor's chosen amax is compared, by simulated INT8
SQNR on its histogram (`algorithms.quantization_sqnr`), with the amax of every method
that has a formula (`methods.plain_ranges`; minmax is the observed range). A tensor is
listed when the best of those is more than `LOSS_DB` above the chosen one: 6.02 dB is
one bit of INT8 precision, so the chosen range throws away more than a bit that
another range from the same statistics keeps. That is what TensorRT-style entropy does
to a distribution with most of its mass near zero and a sparse tail (HardSwish
outputs): it clips the tail, and the tensor's error grows many times over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from graphfix.calibration import algorithms, methods
from graphfix.calibration.stats import TensorStats

LOSS_DB = 6.02  # one bit


@dataclass(frozen=True)
class Clip:
    tensor: str
    method: str  # the method that chose `amax` (per tensor for auto)
    amax: float
    observed: float  # max|x| over the calibration data
    sqnr_db: float
    best_method: str
    best_amax: float
    best_sqnr_db: float
    readers: tuple[str, ...]  # nodes that read the tensor: what --exclude-nodes takes

    @property
    def lost_db(self) -> float:
        return self.best_sqnr_db - self.sqnr_db

    def message(self) -> str:
        what = (f"clips at {self.amax:.4g} of the observed {self.observed:.4g}"
                if self.amax < self.observed else f"keeps the whole range {self.observed:.4g}")
        return (f"'{self.tensor}': {self.method} {what}; simulated SQNR {self.sqnr_db:.1f} dB, "
                f"{self.lost_db:.1f} dB below {self.best_method} (amax {self.best_amax:.4g}). "
                f"Avoid it with --method auto (or {self.best_method}), or keep its readers "
                f"in float: --exclude-nodes {','.join(self.readers)}")

    def to_json(self) -> dict:
        return {"tensor": self.tensor, "method": self.method, "amax": self.amax,
                "observed_amax": self.observed, "sqnr_db": round(self.sqnr_db, 2),
                "best_method": self.best_method, "best_amax": self.best_amax,
                "best_sqnr_db": round(self.best_sqnr_db, 2), "lost_db": round(self.lost_db, 2),
                "exclude_nodes": list(self.readers), "message": self.message()}


def find(stats: Mapping[str, TensorStats], chosen: methods.Ranges,
         plain: Mapping[str, methods.Ranges], readers: Mapping[str, Sequence[str]],
         threshold_db: float = LOSS_DB) -> list[Clip]:
    """The tensors of `chosen.amaxes` that lose more than `threshold_db` against the
    best of the `plain` methods (`methods.plain_ranges`), worst first. `readers` maps
    a tensor to the names of the nodes that read it."""
    clips = []
    for name, amax in chosen.amaxes.items():
        s = stats.get(name)
        if s is None or s.amax <= 0 or s.hist.sum() <= 0:
            continue
        names = [m for m in plain if name in plain[m].amaxes]
        others = [plain[m].amaxes[name] for m in names]
        sqnr = algorithms.quantization_sqnr(s, [amax, *others])
        best = int(np.argmax(sqnr[1:]))
        if sqnr[1 + best] - sqnr[0] > threshold_db:
            clips.append(Clip(name, chosen.chosen.get(name, chosen.method), amax, s.amax,
                              float(sqnr[0]), names[best], others[best],
                              float(sqnr[1 + best]), tuple(readers.get(name, ()))))
    return sorted(clips, key=lambda c: -c.lost_db)
