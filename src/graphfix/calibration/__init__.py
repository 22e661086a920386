"""INT8 calibration: data loaders, streaming statistics, range algorithms, Q/DQ and cache writers.

Modules and their contracts (each module owns its tests in tests/calibration/):

- `data`: `CalibrationData`, a re-iterable, validated source of feed dicts (one batch
  per item, lazily read: memory never holds all samples) built by `open_data(...)`.
- `stats`: `collect(model, tensors, data, ...) -> dict[str, TensorStats]`: one
  streaming pass over the data in onnxruntime with the chosen tensors exposed as
  outputs (two, with the exact histogram entropy needs); per tensor amin/amax and a
  fixed-bin histogram of |x|, independent of batch size and sample order; tensors
  chunked under a memory budget.
- `algorithms`: amax per tensor from `TensorStats` by formula: minmax, entropy
  (TensorRT's KL search), percentile, mse; simulated INT8 error and SQNR.
- `methods`: the registry of methods (auto, the default, and the formulas), their
  options, cache headers and help; `clipping`: the bad-clip warnings.
- `qdq`: which tensors to calibrate, and the Q/DQ model TensorRT accepts from amaxes.
- `cache`: the legacy TensorRT calibration cache, written and read.
- `trt`: a lazy TensorRT IInt8 calibrator adapter (TensorRT 8.x-10.x).
- `evaluate`: compare Q/DQ models against FP32 (SQNR, top-1 agreement, accuracy).
"""
