"""TensorRT plugins and the ops a target cannot parse: one package for the three ways
graphfix moves between standard ONNX and TensorRT plugins.

- `nodes`: building and validating plugin nodes from the specs in `graphfix.trt.plugins`
  (attribute typing as TensorRT's ONNX parser maps it); doctor validates with it too.
- `rules`: the rule object (pattern / check / rewrite) and the rule sets.
- `substitute`: onnx -> plugin rules (RoiAlign -> ROIAlign_TRT, ...), pass `substitute-plugins`.
- `lowering`: onnx -> ops the target parses (LayerNormalization, Gelu, ...), pass
  `lower-unsupported`.
- `native`: plugin -> standard ONNX (InstanceNormalization_TRT -> InstanceNormalization, ...),
  pass `migrate-plugins`; the same forms are the plugins' references for the numerical check
  (`graphfix.runtime.references`).
"""
