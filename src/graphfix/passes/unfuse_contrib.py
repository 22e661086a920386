"""unfuse-contrib: rewrite onnxruntime's contrib ops back to standard ONNX.

A model saved by onnxruntime's offline optimizer (`optimized_model_filepath` with
ORT_ENABLE_EXTENDED or ALL) carries `com.microsoft` fused ops, and with ALL on a
CPU with NCHWc kernels `com.microsoft.nchwc` ops; one from onnxruntime's transformer
optimizer carries its transformer fusions, some of them written in the ONNX domain
(SimplifiedLayerNormalization, LayerNormalization below opset 17); TensorRT parses none::

    FusedConv(X, W, B, Z){act, params} -> act(Add(Conv(X, W, B), Z))   (Z is added first)
    FusedGemm(A, B, C){act, activation_*} -> act(Gemm(A, B, C))
    com.microsoft.nchwc region            -> Conv/pools/Resize/Slice/Transpose, see _unfuse_nchwc
    Gelu, BiasGelu, FastGelu, GemmFastGelu, QuickGelu, BiasAdd, BiasSplitGelu,
    SkipLayerNormalization, SkipSimplifiedLayerNormalization,
    SimplifiedLayerNormalization, LayerNormalization < opset 17  -> see _unfuse_transformer
    EmbedLayerNormalization, Attention (BERT's), MultiHeadAttention
    (unpacked), without past state                               -> see _unfuse_attention
    Erfc(x), TensorFlow's, left in the ONNX domain by tf2onnx    -> Sub(1, Erf(x))

GroupQueryAttention, RotaryEmbedding, attention with past/present state, and the
quantized contrib ops are not rewritten (each is listed in a note).

The last new node writes the fused node's output tensor, so output names and
dtypes are kept. Only standard-domain nodes are emitted; the model keeps its
default opset, and opset imports of domains no node uses any more are dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.graph import all_graphs, names_in_use, node_label, opset_of
from graphfix.graph.dtypes import float_dtype
from graphfix.graph.ort_ops import MS, MS_REWRITES, foreign_onnx_domain_op
from graphfix.graph.walk import drop_unused_imports
from graphfix.passes import _unfuse_attention as attention
from graphfix.passes import _unfuse_nchwc as nchwc
from graphfix.passes import _unfuse_transformer as transformer
from graphfix.passes._unfuse_emit import (
    Emitter,
    Step,
    conv_activation,
    gemm_activation,
    needs_dtype,
    replace_with_chain,
)
from graphfix.passes.base import Note, Pass, PassContext, PassResult

_STANDARD = ("", "ai.onnx")
_GEMM_ATTRS = ("transA", "transB", "alpha", "beta")


@dataclass(frozen=True)
class UnfuseContribOptions:
    """`nchwc-block`: the NCHWc channel block of the machine that saved the model
    (8 for AVX2, 16 for AVX-512 and ARM64); 0 infers it from the graph, and leaves
    the NCHWc ops alone when the graph does not tell."""

    nchwc_block: int = 0

    def __post_init__(self) -> None:
        if self.nchwc_block not in (0, *nchwc.BLOCKS):
            raise GraphfixError(
                f"Option 'nchwc-block' of pass 'unfuse-contrib' got {self.nchwc_block}",
                "onnxruntime's NCHWc block is 8 (AVX2) or 16 (AVX-512, ARM64); 0 infers it",
                "write unfuse-contrib{nchwc-block=8}, {nchwc-block=16}, or leave the option out",
            )


class UnfuseContrib(Pass):
    """Rewrite onnxruntime contrib ops (fused convs, NCHWc, transformer fusions) as standard ONNX.

    Handles: `com.microsoft::FusedConv` with or without bias and Z (the residual added
    before the activation), activations Relu, Tanh, Sigmoid, LeakyRelu, Clip (min/max as
    inputs at opset >= 11, attributes before), HardSigmoid and HardSwish (opset >= 14);
    `FusedGemm` with Relu, Sigmoid, Tanh, Softsign, Softplus, LeakyRelu, HardSigmoid, Elu,
    Selu, ThresholdedRelu; the transformer optimizer's fusions (`com.microsoft::Gelu`,
    BiasGelu, FastGelu, GemmFastGelu, QuickGelu, BiasAdd, BiasSplitGelu,
    SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization,
    Attention and MultiHeadAttention without past state, and the ONNX-domain
    SimplifiedLayerNormalization and pre-17 LayerNormalization, and TensorFlow's Erfc left
    by tf2onnx, their optional statistics and sum outputs kept); the whole
    `com.microsoft.nchwc` region of a graph (Conv with fused activation and Sum, MaxPool,
    AveragePool, GlobalMaxPool, GlobalAveragePool, Upsample, ReorderInput/ReorderOutput,
    channels-last, padded channels, block view Reshapes), NCHWc weights reordered back to
    OIHW. Recurses into If/Loop/Scan bodies. Drops the opset imports of non-standard domains
    that no node uses.

    Skips, with a note, a fused node whose activation has no standard op or whose
    parameters do not match it, a node whose float type cannot be found when it
    needs typed constants, and an NCHWc region that cannot be rewritten whole (an
    unknown NCHWc op, a reader that depends on the blocked layout, a block size
    the graph does not tell). Every node left outside the standard domain is
    listed in a note by domain and op.
    """

    name = "unfuse-contrib"
    summary = ("Rewrite onnxruntime contrib ops (FusedConv, FusedGemm, NCHWc, GELUs, "
               "skip/RMS layer norms) as standard ONNX")
    Options = UnfuseContribOptions

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = opset_of(graph)
        names = names_in_use(graph)
        for g in list(all_graphs(graph)):
            em = Emitter(g, opset, names)
            self._nchwc(g, em, result)
            for node in [n for n in g.nodes if _rewrite_of(n, opset) and n.outputs]:
                reason = _rewrite_of(node, opset)(node, em)
                if reason:
                    result.notes.append(Note(node_label(node), reason))
                else:
                    result.counts[f"rewrote {node.op} as standard ops"] += 1
        dropped = drop_unused_imports(graph)
        if dropped:
            result.counts["dropped unused opset imports"] += dropped
        result.changed = bool(result.counts)
        result.notes.extend(_leftovers(graph))
        if not result.notes and not result.changed:
            result.notes.append(Note("graph", "no com.microsoft or com.microsoft.nchwc node"))
        return result

    def _nchwc(self, g: gs.Graph, em: Emitter, result: PassResult) -> None:
        region = nchwc.analyse(g, em.opset, self.options.nchwc_block)
        if region is None:
            return
        if isinstance(region, tuple):
            result.notes.append(Note(*region))
            return
        result.counts.update(nchwc.rewrite(g, region, em))


# ----------------------------------------------------------------------------- rewrites


def _fused_conv(node: gs.Node, em: Emitter) -> str | None:
    """FusedConv(X, W, B?, Z?) -> Conv(X, W, B) [-> Add(., Z)] [-> activation]."""
    if len(node.inputs) < 2:
        return "it has no weights input"
    act = conv_activation(node, em.opset)
    if isinstance(act, str):
        return act
    dtype = float_dtype(node.inputs[1]) or float_dtype(node.inputs[0])
    if needs_dtype(act, em.opset) and dtype is None:
        return transformer.NO_DTYPE
    inputs = list(node.inputs[:3])
    if len(inputs) == 3 and inputs[2].is_empty():
        inputs.pop()
    rest: list[Step] = []
    if len(node.inputs) > 3 and not node.inputs[3].is_empty():
        rest.append(("Add", [node.inputs[3]], {}))
    if act is not None:
        rest.append(em.activation_step(act, node.name or node.outputs[0].name, dtype))
    attrs = {k: v for k, v in node.attrs.items() if k not in ("activation", "activation_params")}
    replace_with_chain(em, node, ("Conv", inputs, attrs), rest)
    return None


def _fused_gemm(node: gs.Node, em: Emitter) -> str | None:
    """FusedGemm(A, B, C?) -> Gemm(A, B, C) [-> activation with the activation_* attributes]."""
    if len(node.inputs) < 2:
        return "it has fewer than two inputs"
    act = gemm_activation(node)
    if isinstance(act, str):
        return act
    attrs = {k: node.attrs[k] for k in _GEMM_ATTRS if k in node.attrs}
    rest = [] if act is None else [em.activation_step(act, node.name, None)]
    replace_with_chain(em, node, ("Gemm", list(node.inputs), attrs), rest)
    return None


_REWRITES = {"FusedConv": _fused_conv, "FusedGemm": _fused_gemm, **transformer.MS_REWRITES,
             **attention.REWRITES}
assert set(_REWRITES) == MS_REWRITES, "ort_ops.MS_REWRITES lists what doctor names"


def _rewrite_of(node: gs.Node, opset: int):
    """The rewrite for `node`: a com.microsoft op's, or an onnxruntime op written in the
    ONNX domain; None for every other node."""
    if node.domain == MS:
        return _REWRITES.get(node.op)
    if (node.domain or "") in _STANDARD and foreign_onnx_domain_op(node.op, opset):
        return transformer.ONNX_DOMAIN_REWRITES[node.op]
    return None


# ----------------------------------------------------------------------------- domains


def _live_nodes(graph: gs.Graph):
    for g in all_graphs(graph):
        yield from (n for n in g.nodes if n.outputs)


def _leftovers(graph: gs.Graph) -> list[Note]:
    """One note per (domain, op) still outside the standard ONNX domain."""
    left = Counter(
        (n.domain, n.op) for n in _live_nodes(graph) if (n.domain or "") not in _STANDARD
    )
    return [
        Note(f"{domain}::{op}", f"{count} node{'s' if count > 1 else ''} left outside the "
                                "standard ONNX domain; TensorRT cannot parse them")
        for (domain, op), count in sorted(left.items())
    ]


