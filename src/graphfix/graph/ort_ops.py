"""Ops onnxruntime (and TensorFlow, through tf2onnx) write that ONNX does not define: the
ones unfuse-contrib rewrites (doctor names the pass for them) and the ones onnxruntime
registers in the ONNX domain (the check runs them as onnxruntime's). Plain names, no
onnx-graphsurgeon import."""

from __future__ import annotations

MS = "com.microsoft"

MS_REWRITES = frozenset({
    "FusedConv", "FusedGemm", "Gelu", "BiasGelu", "FastGelu", "GemmFastGelu", "QuickGelu",
    "BiasAdd", "BiasSplitGelu", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization", "Attention", "MultiHeadAttention",
})
"""`com.microsoft` ops unfuse-contrib rewrites as standard ONNX ops."""

ORT_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})
"""Ops onnxruntime registers in the ONNX domain that ONNX does not define (its fusions write
them with domain ""); unfuse-contrib rewrites them too. onnxruntime also registers
LayerNormalization there below opset 17, where ONNX has none: rewritten as well."""

TF_ONNX_DOMAIN = frozenset({"Erfc"})
"""TensorFlow ops tf2onnx leaves as they are, in the ONNX domain, when it has no handler
for them (Keras 3's `model.export(format="onnx")` writes GELU's Erfc so); onnxruntime
cannot run them. unfuse-contrib rewrites them, and the check runs them by their reference
forms (`graphfix.runtime.references`)."""

LAYER_NORM_OPSET = 17
"""The first ONNX opset that defines LayerNormalization."""


def ort_onnx_domain_op(op: str, opset: int) -> bool:
    """Whether a default-domain `op` at `opset` is one of onnxruntime's, not ONNX's."""
    return op in ORT_ONNX_DOMAIN or (op == "LayerNormalization" and opset < LAYER_NORM_OPSET)


def foreign_onnx_domain_op(op: str, opset: int) -> bool:
    """Whether unfuse-contrib rewrites a default-domain `op` ONNX does not define at
    `opset`: onnxruntime's, or TensorFlow's left by tf2onnx."""
    return ort_onnx_domain_op(op, opset) or op in TF_ONNX_DOMAIN
