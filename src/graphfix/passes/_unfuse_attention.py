"""unfuse-contrib's attention part: the fusions of onnxruntime's transformer optimizer
`com.microsoft::EmbedLayerNormalization`, `Attention` (BERT) and `MultiHeadAttention` (its
unpacked form: cross attention, diffusion and CLIP models), as standard ONNX ops (opset 13
and later)::

    EmbedLayerNormalization(ids, segment_ids?, word, position, segment?, gamma, beta,
                            mask?, position_ids?)
        output         = LayerNorm(word[ids] + position[position_ids or 0..S-1]
                                   + segment[segment_ids])
        mask_index     = the number of ones in each row of mask (int32, [batch])
        embedding_sum  = the sum before the norm

    Attention(input, weights, bias?, mask_index?){num_heads, qkv_hidden_sizes?, scale?,
                                                  unidirectional?, mask_filter_value?}
        q, k, v  = split(input @ weights + bias) into heads
        scores   = scale * q @ k^T (scale 1/sqrt(head size) by default)
                   + mask_filter_value (-10000) where a key is masked: past its row's
                     length (1-D mask_index), where the raw mask (2-D) is 0, and after
                     the query (unidirectional)
        output   = softmax(scores) @ v, heads joined

    MultiHeadAttention(query, key, value, bias?, key_padding_mask?, attention_bias?)
        the same with q, k, v given (each plus its part of bias), attention_bias added to
        the scores, key_padding_mask as a mask of keys (lengths, or [batch, keys])

As onnxruntime's operator docs and CPU kernels define them (the mask_index an
EmbedLayerNormalization writes is checked against onnxruntime: the count of ones, not the
position of the first zero; MultiHeadAttention's form equals its CPU kernel within 2e-7
of the scale, measured). Not rewritten, each with a note: past/present state,
Attention's attention_bias, past_sequence_length, rotary embedding, left-padding
(2 * batch) and 3-D masks, packed or 4-D query/key/value, causal cross attention, and
opsets below 13.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from graphfix.graph import constant_value
from graphfix.graph.dtypes import float_dtype
from graphfix.passes._unfuse_emit import Emitter
from graphfix.passes._unfuse_transformer import (
    NO_DTYPE,
    detach,
    emit_norm,
    present_input,
    present_output,
)

MASK_FILTER_VALUE = -10000.0  # onnxruntime's default mask_filter_value
EMBED_EPSILON = 1e-12  # onnxruntime's kDefaultEmbedLayerNormEpsilon
MIN_OPSET = 13  # axes and split sizes as inputs


def _i64(em: Emitter, base: str, values) -> gs.Constant:
    return em.const(base, np.array(values, np.int64))


def _dim(em: Emitter, base: str, x: gs.Tensor, axis: int) -> gs.Tensor:
    """Dim `axis` of `x` as an int64 scalar (Shape, then Gather with a scalar index)."""
    shape = em.node("Shape", f"{base}_shape", [x], dtype=np.int64)
    return em.node("Gather", f"{base}_dim", [shape, _i64(em, f"{base}_axis", axis)],
                   dtype=np.int64)


def _range(em: Emitter, base: str, length: gs.Tensor) -> gs.Tensor:
    """0, 1, ..., length - 1 (int64)."""
    return em.node("Range", f"{base}_range", [_i64(em, f"{base}_zero", 0), length,
                                               _i64(em, f"{base}_one", 1)], dtype=np.int64)


def _options(node: gs.Node, head_size: int) -> tuple[float, float, bool]:
    """An attention node's scale (1/sqrt(head size) when absent or 0), mask_filter_value
    and unidirectional."""
    scale = float(node.attrs.get("scale", 0.0)) or 1.0 / math.sqrt(head_size)
    fill = float(node.attrs.get("mask_filter_value", MASK_FILTER_VALUE))
    return scale, fill, bool(int(node.attrs.get("unidirectional", 0)))


# ----------------------------------------------------------------------------- embedding


def embed_layer_norm(node: gs.Node, em: Emitter) -> str | None:
    if em.opset < MIN_OPSET:
        return f"its rewrite needs opset {MIN_OPSET} or later, not {em.opset}"
    ids, segments, word, position, segment, gamma, beta, mask, position_ids = (
        present_input(node, i) for i in range(9))
    if ids is None or word is None or position is None or gamma is None or beta is None:
        return "it lacks one of input_ids, the word and position embeddings, gamma and beta"
    if (segments is None) != (segment is None):
        return "it has segment ids without a segment embedding, or the other way round"
    out, mask_out, sum_out = (present_output(node, i) for i in range(3))
    if out is None:
        return "its output is not used"
    if mask_out is not None and mask is None and (mask_out.outputs
                                                   or mask_out in em.graph.outputs):
        return "its mask_index is read but it has no mask to count"
    dtype = float_dtype(word)
    if dtype is None:
        return NO_DTYPE
    epsilon = float(node.attrs.get("epsilon", EMBED_EPSILON))
    out = node.outputs[0]
    base = detach(node)
    total = em.node("Gather", f"{base}_word", [word, ids], dtype=dtype)
    if position_ids is None:
        position_ids = _range(em, f"{base}_positions", _dim(em, f"{base}_seq", ids, 1))
    positions = em.node("Gather", f"{base}_position", [position, position_ids], dtype=dtype)
    last = segment is None
    total = em.node("Add", f"{base}_add_position", [total, positions], dtype=dtype,
                    output=sum_out if last else None)
    if segment is not None:
        segs = em.node("Gather", f"{base}_segment", [segment, segments], dtype=dtype)
        total = em.node("Add", f"{base}_add_segment", [total, segs], dtype=dtype,
                        output=sum_out)
    emit_norm(em, base, total, gamma, beta, epsilon=epsilon, axes=[-1], rms=False, out=out,
              out_dtype=dtype)
    if mask_out is not None and mask is not None:
        ones = em.node("Equal", f"{base}_mask_one", [mask, em.const(
            f"{base}_one_value", np.array(1, _int_dtype(mask)))], dtype=np.bool_)
        counted = em.node("Cast", f"{base}_mask_int", [ones], {"to": TensorProto.INT32},
                          dtype=np.int32)
        em.node("ReduceSum", f"{base}_mask_index", [counted, _i64(em, f"{base}_mask_axes",
                                                                  [1])],
                {"keepdims": 0}, output=mask_out, dtype=np.int32)
    return None


def _int_dtype(t: gs.Tensor) -> np.dtype:
    """The integer dtype of a mask: its own, else int32 (what onnxruntime's fusion casts
    masks to)."""
    producer = t.inputs[0] if len(t.inputs) == 1 else None
    if t.dtype is not None:
        return np.dtype(t.dtype)
    if producer is not None and producer.op == "Cast" and "to" in producer.attrs:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(producer.attrs["to"])))
    return np.dtype(np.int32)


# ----------------------------------------------------------------------------- attention


def _attention_refusal(node: gs.Node, em: Emitter) -> str | None:
    if em.opset < MIN_OPSET:
        return f"its rewrite needs opset {MIN_OPSET} or later, not {em.opset}"
    names = {4: "past", 5: "attention_bias", 6: "past_sequence_length"}
    for i, name in names.items():
        if present_input(node, i) is not None:
            return f"it has a {name} input, which this rewrite does not handle"
    if present_output(node, 1) is not None:
        return "it writes a present state, which this rewrite does not handle"
    if int(node.attrs.get("do_rotary", 0)):
        return "it applies a rotary embedding, which this rewrite does not handle"
    if present_input(node, 0) is None or present_input(node, 1) is None:
        return "it lacks its input or weights"
    mask = present_input(node, 3)
    if mask is not None:
        rank = _mask_rank(mask)
        if rank not in (1, 2):
            return "its mask_index has an unknown rank or a 3-D/4-D form"
        if rank == 1 and not _lengths_mask(mask, node.inputs[0]):
            return ("its 1-D mask_index may be left-padding's (2 * batch end and start "
                    "positions), which this rewrite does not handle")
    if "num_heads" not in node.attrs:
        return "it has no num_heads"
    return None


def _counted(mask: gs.Tensor) -> bool:
    """Whether an EmbedLayerNormalization wrote `mask` (its rewrite: the ReduceSum that
    counts a mask's ones), which makes it one length per batch row."""
    producer = mask.inputs[0] if len(mask.inputs) == 1 else None
    return producer is not None and (
        producer.op == "EmbedLayerNormalization"
        or (producer.op == "ReduceSum" and producer.name.endswith("_mask_index")))


def _mask_rank(mask: gs.Tensor) -> int | None:
    if mask.shape is not None:
        return len(mask.shape)
    return 1 if _counted(mask) else None


def _lengths_mask(mask: gs.Tensor, x: gs.Tensor) -> bool:
    """Whether a 1-D mask_index holds one length per batch row: an EmbedLayerNormalization's,
    or as long as the input's batch."""
    if _counted(mask):
        return True
    return (mask.shape is not None and x.shape is not None and len(x.shape) == 3
            and mask.shape[0] == x.shape[0] and mask.shape[0] is not None)


def _head_sizes(node: gs.Node) -> tuple[int, int, int] | str:
    weights = node.inputs[1]
    sizes = node.attrs.get("qkv_hidden_sizes")
    if sizes:
        q, k, v = (int(s) for s in sizes)
    else:
        width = weights.shape[-1] if weights.shape is not None else None
        if not isinstance(width, int) or width % 3:
            return "its weights' width is unknown or not three equal parts"
        q = k = v = width // 3
    heads = int(node.attrs["num_heads"])
    if q != k or q % heads or v % heads:
        return "its Q, K and V sizes do not split evenly into num_heads"
    return q, k, v


def attention(node: gs.Node, em: Emitter) -> str | None:
    reason = _attention_refusal(node, em)
    if reason:
        return reason
    sizes = _head_sizes(node)
    if isinstance(sizes, str):
        return sizes
    x, weights = node.inputs[0], node.inputs[1]
    dtype = float_dtype(x) or float_dtype(weights)
    if dtype is None:
        return NO_DTYPE
    bias, mask = present_input(node, 2), present_input(node, 3)
    heads = int(node.attrs["num_heads"])
    hq, hk, hv = sizes
    scale, fill, causal = _options(node, hq // heads)
    out = node.outputs[0]
    base = detach(node)
    qkv = em.node("MatMul", f"{base}_qkv", [x, weights], dtype=dtype)
    if bias is not None:
        qkv = em.node("Add", f"{base}_qkv_bias", [qkv, bias], dtype=dtype)
    parts = [gs.Variable(em.fresh(f"{base}_{k}"), dtype=dtype) for k in "qkv"]
    split = gs.Node("Split", em.fresh(f"{base}_split"), {"axis": -1},
                    [qkv, _i64(em, f"{base}_sizes", [hq, hk, hv])], parts)
    em.graph.nodes.append(split)
    keep = _keep(em, base, x, x, mask, causal)
    _attend(em, base, parts, heads, (hq, hk, hv), scale, fill, keep, None, out, dtype)
    return None


def _attend(em: Emitter, base: str, qkv: list[gs.Tensor], heads: int,
            sizes: tuple[int, int, int], scale: float, fill: float, keep: gs.Tensor | None,
            bias: gs.Tensor | None, out: gs.Tensor, dtype) -> None:
    """softmax(scale * q k^T + bias, masked) v over `heads` heads of the [batch, sequence,
    hidden] tensors `qkv`, the heads joined into `out`."""
    def heads_of(t: gs.Tensor, size: int, perm: list[int], what: str) -> gs.Tensor:
        shaped = em.node("Reshape", f"{base}_{what}_heads", [t, _i64(
            em, f"{base}_{what}_shape", [0, 0, heads, size // heads])], dtype=dtype)
        return em.node("Transpose", f"{base}_{what}_t", [shaped], {"perm": perm}, dtype=dtype)

    hq, hk, hv = sizes
    q = heads_of(qkv[0], hq, [0, 2, 1, 3], "q")
    k = heads_of(qkv[1], hk, [0, 2, 3, 1], "k")
    v = heads_of(qkv[2], hv, [0, 2, 1, 3], "v")
    scores = em.node("MatMul", f"{base}_scores", [q, k], dtype=dtype)
    scores = em.node("Mul", f"{base}_scale", [scores, em.const(
        f"{base}_scale_value", np.array(scale, dtype))], dtype=dtype)
    if bias is not None:
        scores = em.node("Add", f"{base}_attention_bias", [scores, bias], dtype=dtype)
    if keep is not None:
        additive = em.node("Where", f"{base}_mask", [keep, em.const(
            f"{base}_zero_value", np.array(0.0, dtype)), em.const(
            f"{base}_fill", np.array(fill, dtype))], dtype=dtype)
        scores = em.node("Add", f"{base}_masked", [scores, additive], dtype=dtype)
    probs = em.node("Softmax", f"{base}_softmax", [scores], {"axis": -1}, dtype=dtype)
    context = em.node("MatMul", f"{base}_context", [probs, v], dtype=dtype)
    context = em.node("Transpose", f"{base}_context_t", [context], {"perm": [0, 2, 1, 3]},
                      dtype=dtype)
    em.node("Reshape", f"{base}_join", [context, _i64(em, f"{base}_join_shape", [0, 0, hv])],
            output=out, dtype=dtype)


# ----------------------------------------------------------------------------- MultiHeadAttention


def _mha_refusal(node: gs.Node, em: Emitter) -> str | None:
    if em.opset < MIN_OPSET:
        return f"its rewrite needs opset {MIN_OPSET} or later, not {em.opset}"
    names = {6: "past_key", 7: "past_value", 8: "past_sequence_length",
             9: "cache_indirection"}
    for i, name in names.items():
        if present_input(node, i) is not None:
            return f"it has a {name} input, which this rewrite does not handle"
    if any(present_output(node, i) is not None for i in (1, 2, 3)):
        return "it writes present state or its qk, which this rewrite does not handle"
    query, key, value = (present_input(node, i) for i in range(3))
    if query is None or key is None or value is None:
        return "its query, key or value is packed or absent"
    if any(t.shape is None or len(t.shape) != 3 for t in (query, key, value)):
        return "its query, key and value are not all [batch, sequence, hidden]"
    if "num_heads" not in node.attrs:
        return "it has no num_heads"
    if int(node.attrs.get("unidirectional", 0)) and key is not query:
        return "it is causal over a key that is not the query"
    mask = present_input(node, 4)
    if mask is not None:
        rank = _mask_rank(mask)
        if rank not in (1, 2) or (rank == 1 and not _lengths_mask(mask, query)):
            return "its key_padding_mask is not one length per batch row or a [batch, keys] mask"
    bias = present_input(node, 5)
    if bias is not None and (bias.shape is None or len(bias.shape) != 4):
        return "its attention_bias is not 4-D"
    return None


def multi_head_attention(node: gs.Node, em: Emitter) -> str | None:
    """MultiHeadAttention(query, key, value, bias?, key_padding_mask?, attention_bias?):
    the projections' bias (query's, key's, value's, concatenated) added to each, then the
    attention of `_attend`; the mask as Attention's, for keys."""
    reason = _mha_refusal(node, em)
    if reason:
        return reason
    query, key, value = node.inputs[:3]
    widths = [t.shape[-1] for t in (query, key, value)]
    heads = int(node.attrs["num_heads"])
    if not all(isinstance(w, int) for w in widths) or widths[0] != widths[1] or any(
            w % heads for w in widths):
        return "its hidden sizes are not static, or do not split evenly into num_heads"
    dtype = float_dtype(query)
    if dtype is None:
        return NO_DTYPE
    proj = present_input(node, 3)
    projections = constant_value(proj) if proj is not None else None
    if proj is not None and (projections is None or projections.size != sum(widths)):
        return "its bias is not a constant of the three hidden sizes"
    mask, attention_bias = present_input(node, 4), present_input(node, 5)
    scale, fill, causal = _options(node, widths[0] // heads)
    out = node.outputs[0]
    base = detach(node)
    qkv = [query, key, value]
    if projections is not None:
        starts = np.cumsum([0, *widths])
        qkv = [em.node("Add", f"{base}_{what}_bias", [t, em.const(
            f"{base}_{what}_bias_value", projections.reshape(-1)[starts[i]:starts[i + 1]])],
            dtype=dtype) for i, (t, what) in enumerate(zip(qkv, "qkv", strict=True))]
    keep = _keep(em, base, query, key, mask, causal)
    _attend(em, base, qkv, heads, tuple(widths), scale, fill, keep, attention_bias, out,
            dtype)
    return None


def _keep(em: Emitter, base: str, queries: gs.Tensor, keys_of: gs.Tensor,
          mask: gs.Tensor | None, causal: bool) -> gs.Tensor | None:
    """Where a query may read a key, broadcastable to [batch, heads, query, key] (BOOL);
    None when it may read every key. `queries` and `keys_of` give the two counts (dim 1)."""
    keep = None
    if mask is not None and _mask_rank(mask) == 1:
        keys = _range(em, f"{base}_keys", _dim(em, f"{base}_key_count", keys_of, 1))
        lengths = em.node("Cast", f"{base}_lengths", [mask], {"to": TensorProto.INT64},
                          dtype=np.int64)
        lengths = em.node("Unsqueeze", f"{base}_lengths_col", [lengths, _i64(
            em, f"{base}_col_axes", [1, 2, 3])], dtype=np.int64)
        keep = em.node("Less", f"{base}_in_length", [keys, lengths], dtype=np.bool_)
    elif mask is not None:
        raw = em.node("Greater", f"{base}_raw", [mask, em.const(
            f"{base}_raw_zero", np.array(0, _int_dtype(mask)))], dtype=np.bool_)
        keep = em.node("Unsqueeze", f"{base}_raw_4d", [raw, _i64(em, f"{base}_raw_axes",
                                                                    [1, 2])], dtype=np.bool_)
    if causal:
        count = _dim(em, f"{base}_query_count", queries, 1)
        positions = _range(em, f"{base}_causal", count)
        rows = em.node("Unsqueeze", f"{base}_rows", [positions, _i64(
            em, f"{base}_rows_axes", [1])], dtype=np.int64)
        lower = em.node("LessOrEqual", f"{base}_causal_keep", [positions, rows],
                        dtype=np.bool_)
        keep = lower if keep is None else em.node("And", f"{base}_keep", [keep, lower],
                                                  dtype=np.bool_)
    return keep


REWRITES = {"EmbedLayerNormalization": embed_layer_norm, "Attention": attention,
            "MultiHeadAttention": multi_head_attention}
