"""Reference forms of the FP8 quantize/dequantize custom ops torch exports write for
TensorRT (`trt::TRT_FP8QuantizeLinear`, `trt::TRT_FP8DequantizeLinear`: NVIDIA ModelOpt's
and Transformer Engine's FP8 export), so that the check can run such a model.

    TRT_FP8QuantizeLinear(x, scale)   = float8_e4m3fn(clip(x / scale, -448, 448)), its bits
                                        as the UINT8 tensor the export declares
    TRT_FP8DequantizeLinear(q, scale) = float32(q's bits as float8_e4m3fn) * scale

The standard QuantizeLinear / DequantizeLinear with a float8 zero point (saturating,
rounding to nearest even), the scale per tensor or per `axis` when it has one element per
entry of that axis. Numpy kernels (float8_e4m3fn from ml_dtypes, which onnx itself
requires, so no new dependency): the declared UINT8 tensor
between them stays UINT8, which a standard QuantizeLinear could not write. Checked against
ModelOpt 0.47's PyTorch fake quantization of the exported models (RESULTS, seventeenth
round); what TensorRT does with these ops is not in graphfix's facts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphfix.runtime.references import Kernel, Registration

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
DOMAIN = "trt"


def _scale(scale: Any, x: np.ndarray, attributes: dict[str, Any]) -> np.ndarray:
    """`scale` broadcast against `x`: one value, or one per entry of `axis` (default 0)."""
    s = np.asarray(scale, dtype=np.float32)
    if s.size == 1:
        return s.reshape(())
    axis = int(attributes.get("axis", 0)) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = s.size
    return s.reshape(shape)


def _fp8() -> Any:
    """float8_e4m3fn, imported when a kernel runs: the registry imports this module for
    every lookup, which must not depend on ml_dtypes being there."""
    import ml_dtypes

    return ml_dtypes.float8_e4m3fn


def _quantize(inputs: list[Any], attributes: dict[str, Any]) -> list[np.ndarray]:
    x = np.asarray(inputs[0], dtype=np.float32)
    scaled = np.clip(x / _scale(inputs[1], x, attributes), -FP8_MAX, FP8_MAX)
    return [scaled.astype(_fp8()).view(np.uint8)]


def _dequantize(inputs: list[Any], attributes: dict[str, Any]) -> list[np.ndarray]:
    q = np.asarray(inputs[0], dtype=np.uint8).view(_fp8())
    values = q.astype(np.float32)
    kind = np.asarray(inputs[1]).dtype  # the output takes the scale's float type
    out = values * _scale(inputs[1], values, attributes)
    return [out.astype(kind if kind.kind == "f" else np.float32)]


REFERENCES: tuple[Registration, ...] = (
    Registration(DOMAIN, "TRT_FP8QuantizeLinear", Kernel(_quantize)),
    Registration(DOMAIN, "TRT_FP8DequantizeLinear", Kernel(_dequantize)),
)
