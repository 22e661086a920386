"""Numerical comparison: onnxruntime runs, seeded inputs, tolerances per dtype."""
