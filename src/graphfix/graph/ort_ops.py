"""Ops onnxruntime defines and ONNX does not: the ones unfuse-contrib rewrites (doctor names
the pass for them) and the ones onnxruntime registers in the ONNX domain (the check runs
them as onnxruntime's). Plain names, no onnx-graphsurgeon import."""

from __future__ import annotations

MS = "com.microsoft"

MS_REWRITES = frozenset({
    "FusedConv", "FusedGemm", "Gelu", "BiasGelu", "FastGelu", "GemmFastGelu", "QuickGelu",
    "BiasAdd", "BiasSplitGelu", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization", "Attention",
})
"""`com.microsoft` ops unfuse-contrib rewrites as standard ONNX ops."""

ORT_ONNX_DOMAIN = frozenset({"SimplifiedLayerNormalization"})
"""Ops onnxruntime registers in the ONNX domain that ONNX does not define (its fusions write
them with domain ""); unfuse-contrib rewrites them too. onnxruntime also registers
LayerNormalization there below opset 17, where ONNX has none: rewritten as well."""

LAYER_NORM_OPSET = 17
"""The first ONNX opset that defines LayerNormalization."""


def ort_onnx_domain_op(op: str, opset: int) -> bool:
    """Whether a default-domain `op` at `opset` is one of onnxruntime's, not ONNX's."""
    return op in ORT_ONNX_DOMAIN or (op == "LayerNormalization" and opset < LAYER_NORM_OPSET)
