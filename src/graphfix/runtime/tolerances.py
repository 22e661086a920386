"""Tolerances per dtype: the one place graphfix decides "same numbers".

An element agrees when |candidate - reference| <= atol + rtol * |reference|
(numpy.isclose), NaNs must sit in the same places and infinities must match.
Integer and boolean outputs must be equal.

fp32: rtol 1e-4, atol 1e-5 — tight enough to catch a wrong rewrite, loose
enough for reassociation (a folded BatchNorm computes the same value in a
different order). fp16/bf16 hold ~3/2 significant digits, so they get much looser
bounds; these suit rewrites, not INT8 (use `graphfix check` for that).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


EXACT = Tolerance(0.0, 0.0)

_BY_DTYPE: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-9),
    "float32": Tolerance(1e-4, 1e-5),
    "float16": Tolerance(1e-2, 1e-3),
    "bfloat16": Tolerance(5e-2, 1e-2),
}


# A TensorRT FP32 engine (TF32 off) against onnxruntime on CPU: other kernels (Winograd,
# other reduction orders) round differently than a rewrite does. NOT MEASURED: there is
# no TensorRT where graphfix is developed. It is polygraphy's default atol/rtol (1e-5)
# loosened 100x in rtol and 10x in atol, a starting point; --atol/--rtol override it.
ENGINE_FP32 = Tolerance(1e-3, 1e-4)


def tolerance_for(dtype: np.dtype | str) -> Tolerance:
    """The tolerance for an output of this dtype (exact for integers and bools)."""
    return _BY_DTYPE.get(np.dtype(dtype).name if not isinstance(dtype, str) else dtype, EXACT)


def tolerance_table() -> dict[str, Tolerance]:
    """Every non-exact tolerance, for reports and docs."""
    return dict(_BY_DTYPE)
