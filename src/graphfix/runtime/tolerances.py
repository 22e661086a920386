"""The numbers behind graphfix's one "same numbers" verdict, per dtype.

The verdict (`runtime.measure.measure`) accepts a float tensor when every element
satisfies

    |c - r| <= max(atol, scale * S, FLOOR_FACTOR * floor) + rtol * |r|

where S = max |r| over the tensor's finite elements (its scale on this sample) and
`floor` is the model's own noise floor for that tensor when it was measured (the
per-pass check measures it for graph outputs, `runtime.outputs`). NaNs must sit in
the same places and infinities must match; integer and boolean tensors must be equal.

Why scale-relative and not elementwise rtol alone: a correct rewrite of a deep network
(a folded BatchNorm, a bias moved into a Conv) reorders fp32 sums. The rounding error it
adds is a fraction of the magnitudes summed, i.e. of the tensor's scale, not of each
element: an output element near zero in a tensor whose scale is 400 moves by ~1e-5 in
absolute terms, which misses isclose(rtol=1e-4, atol=1e-5) although the rewrite is
exact in real arithmetic. Measured on correct rewrites (fold-bn, trt-prep) and on
onnxruntime's own fusions of the same models: max|c - r| / S was 0.6e-7 to 4.2e-7 (1 to
7 units of fp32 rounding, u = 2^-24 = 6e-8) on `samples.deep_resnet` (50 Conv-BN-ReLU
blocks, logits up to ~400), the shared MobileNetV3, PaddleOCR cls and digits models
(docs/verdict.md has the table); issue 11 reports 4.7e-7 on its deep ResNet, not run here.
The standard error bound of a length-n dot product is
n*u, and sqrt(n*L)*u is the typical accumulation over L layers: for L = 50 layers of
3x3x16 sums that is ~5e-6. `scale` = 1e-5 for fp32 sits above both (24x the largest
measured correct error), and below what a wrong rewrite does on most models (a 1% error
in one channel's weights: 1e-5 to 3e-3 of the output scale; the mutation table in
docs/verdict.md says where it is not).

The noise floor covers what a fixed bound cannot know: how much *this* model's
outputs move under a correct reordering (cancellation, long reductions, TF32 on a GPU
provider). It is max|r' - r| where r' is the original model run by onnxruntime with
its BASIC graph optimizations on (it folds BatchNorm and fuses Conv with Add/Mul
itself, the same rewrites graphfix makes). A rewrite within FLOOR_FACTOR times that
is no worse than onnxruntime's own. fp32 measurements: trt-prep's error was at most
2.0x the floor where the floor was non-zero.

`atol` only guards tensors whose scale is ~0 (all zeros: S = 0). `rtol` is 0 in the
default verdict: since |r| <= S, rtol * |r| only loosens the bound, and a systematic
relative error of 1e-4 (BatchNorm folded without its epsilon, on every layer of a deep
network) hid under rtol 1e-4 (docs/verdict.md); it stays for a user's plain
elementwise bound (`graphfix check --rtol`) and for `ENGINE_FP32`. fp16/bf16 hold ~3/2
significant digits and get bounds ~10 units of their rounding; they suit rewrites,
not INT8 (Q/DQ models are compared by SQNR, `graphfix check`).
A float32 output that is a Cast up from float16 holds float16 numbers and takes
float16's bound (`runtime.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """Elementwise `rtol`, absolute `atol` and scale-relative `scale` (module docstring)."""

    rtol: float
    atol: float
    scale: float = 0.0

    def allowed(self, tensor_scale: float, floor: float = 0.0) -> float:
        """The absolute error allowed on top of rtol * |r| for a tensor of this scale."""
        return max(self.atol, self.scale * tensor_scale, FLOOR_FACTOR * floor)

    def to_json(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol, "scale": self.scale}


EXACT = Tolerance(0.0, 0.0, 0.0)
FLOOR_FACTOR = 10.0

ILL_CONDITIONED = 1e-3
"""A float output whose noise floor exceeds this fraction of its scale is not judged on
that sample (`runtime.outputs`): 100x the fp32 bound above, which a reordering of sums
alone does not reach; a selection flipped by a near-tie (NMS, TopK) among its inputs
does. Measured floors of correct models are 1e-7 of scale and below (docs/verdict.md)."""

_BY_DTYPE: dict[str, Tolerance] = {
    "float64": Tolerance(0.0, 1e-300, 1e-12),
    "float32": Tolerance(0.0, 1e-7, 1e-5),
    "float16": Tolerance(0.0, 1e-4, 1e-2),
    "bfloat16": Tolerance(0.0, 1e-3, 5e-2),
}


# A TensorRT FP32 engine (TF32 off) against onnxruntime on CPU: other kernels (Winograd,
# other reduction orders) round differently than a rewrite does. NOT MEASURED: there is
# no TensorRT where graphfix is developed. It is polygraphy's default atol/rtol (1e-5)
# loosened 100x in rtol and 10x in atol, plus 10x the rewrite scale bound, a starting
# point; --atol/--rtol override it.
ENGINE_FP32 = Tolerance(1e-3, 1e-4, 1e-4)


def tolerance_for(dtype: np.dtype | str) -> Tolerance:
    """The tolerance for a tensor of this dtype (exact for integers and bools)."""
    return _BY_DTYPE.get(np.dtype(dtype).name if not isinstance(dtype, str) else dtype, EXACT)


def tolerance_table() -> dict[str, Tolerance]:
    """Every non-exact tolerance, for reports and docs."""
    return dict(_BY_DTYPE)
