"""unfuse-contrib on onnxruntime's BERT fusions: EmbedLayerNormalization and Attention.

The reference is onnxruntime's CPU kernel for the node (graph optimizations off), and for
data/ort_bert_tiny.onnx (a real transformers export through onnxruntime's transformer
optimizer, export_ort_bert.py) the fused model as onnxruntime runs it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import apply, assert_idempotent, ops
from onnx import TensorProto, helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.graph import fingerprint
from graphfix.passes.base import PassContext
from graphfix.passes.unfuse_contrib import UnfuseContrib
from graphfix.runtime.session import run_model
from graphfix.trt import parse_target

MS = "com.microsoft"
DATA = Path(__file__).parent / "data"
B, S, H, HEADS = 2, 6, 16, 4


def _model(nodes, inputs, outputs, inits, opset=14) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _w(*shape, seed=0, scale=0.3):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _same(model: onnx.ModelProto, feeds: dict, expected_ops=None, tol=2e-6) -> onnx.ModelProto:
    """Apply; the same outputs as onnxruntime's kernels within `tol` of each output's scale,
    standard domain only, checker (in `apply`), idempotent."""
    want = run_model(model, feeds)
    out, result = apply(UnfuseContrib(), model)
    assert result.changed
    assert not [n for n in result.notes if "left outside" in n.reason], result.notes
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    if expected_ops is not None:
        assert ops(out) == expected_ops
    got = run_model(out, feeds)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        if value.dtype.kind == "f":
            scale = max(float(np.abs(value).max()), 1.0)
            assert float(np.abs(got[name] - value).max()) <= tol * scale, name
        else:
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert_idempotent(UnfuseContrib(), out)
    return out


# ----------------------------------------------------------------------------- embedding


def _embed(mask=True, segments=True, position_ids=False, outputs=3):
    ins = ["ids", "seg" if segments else "", "word", "pos", "segemb" if segments else "",
           "gamma", "beta", "mask" if mask else "", "posids" if position_ids else ""]
    while ins[-1] == "":
        ins.pop()
    outs = ["out", "mask_index", "sum"][:outputs]
    node = helper.make_node("EmbedLayerNormalization", ins, outs, name="embed", domain=MS,
                            epsilon=1e-12)
    inputs = [_vi("ids", TensorProto.INT32, [B, S])]
    inputs += [_vi("seg", TensorProto.INT32, [B, S])] if segments else []
    inputs += [_vi("mask", TensorProto.INT32, [B, S])] if mask else []
    inputs += [_vi("posids", TensorProto.INT32, [1, S])] if position_ids else []
    out_vis = [_vi("out", TensorProto.FLOAT, [B, S, H]), _vi("mask_index", TensorProto.INT32,
                                                            [B]),
               _vi("sum", TensorProto.FLOAT, [B, S, H])][:outputs]
    inits = {"word": _w(50, H), "pos": _w(20, H, seed=1), "segemb": _w(2, H, seed=2),
             "gamma": _w(H, seed=3) + 1, "beta": _w(H, seed=4)}
    inits = {k: v for k, v in inits.items() if k in ins}
    return _model([node], inputs, out_vis, inits)


def _embed_feeds(mask=True, segments=True, position_ids=False):
    rng = np.random.default_rng(7)
    feeds = {"ids": rng.integers(0, 50, (B, S)).astype(np.int32)}
    if segments:
        feeds["seg"] = rng.integers(0, 2, (B, S)).astype(np.int32)
    if mask:  # right padding in row 0, a hole in row 1: onnxruntime counts the ones
        feeds["mask"] = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0]], np.int32)
    if position_ids:
        feeds["posids"] = np.array([[3, 1, 4, 1, 5, 9]], np.int32)
    return feeds


def test_embed_layer_norm_with_its_mask_index_and_sum():
    out = _same(_embed(), _embed_feeds())
    got = run_model(out, _embed_feeds())
    np.testing.assert_array_equal(got["mask_index"], [4, 4])
    assert "LayerNormalization" not in ops(out)  # opset 14: written out


@pytest.mark.parametrize("case", ["no segments", "position ids", "no sum"])
def test_embed_layer_norm_variants(case):
    # onnxruntime's own type inference wants the mask_index output: every case has it
    segments, position_ids = case != "no segments", case == "position ids"
    outputs = 2 if case == "no sum" else 3
    model = _embed(segments=segments, position_ids=position_ids, outputs=outputs)
    _same(model, _embed_feeds(segments=segments, position_ids=position_ids))


# ----------------------------------------------------------------------------- attention


def _attention(mask_rank=None, opset=14, **attrs):
    attrs.setdefault("num_heads", HEADS)
    sizes = attrs.get("qkv_hidden_sizes", [H, H, H])
    ins = ["x", "w", "b"] + (["mask"] if mask_rank else [])
    node = helper.make_node("Attention", ins, ["y"], name="attn", domain=MS, **attrs)
    inputs = [_vi("x", TensorProto.FLOAT, [B, S, H])]
    if mask_rank:
        inputs.append(_vi("mask", TensorProto.INT32, [B] if mask_rank == 1 else [B, S]))
    inits = {"w": _w(H, sum(sizes), seed=5), "b": _w(sum(sizes), seed=6)}
    return _model([node], inputs, [_vi("y", TensorProto.FLOAT, [B, S, sizes[2]])], inits,
                  opset)


def _attention_feeds(mask_rank=None):
    feeds = {"x": _w(B, S, H, seed=8, scale=1.0)}
    if mask_rank == 1:
        feeds["mask"] = np.array([4, 6], np.int32)
    elif mask_rank == 2:
        feeds["mask"] = np.array([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    return feeds


def test_attention_without_a_mask():
    _same(_attention(), _attention_feeds(),
          ["MatMul", "Add", "Split", "Reshape", "Reshape", "Reshape", "Transpose", "Transpose",
           "Transpose", "MatMul", "Mul", "Softmax", "MatMul", "Transpose", "Reshape"])


@pytest.mark.parametrize("mask_rank", [1, 2])
def test_attention_with_lengths_or_a_raw_mask(mask_rank):
    _same(_attention(mask_rank), _attention_feeds(mask_rank))


@pytest.mark.parametrize("attrs", [
    {"unidirectional": 1},
    {"qkv_hidden_sizes": [H, H, 2 * H]},
    {"scale": 0.5, "mask_filter_value": -1e4},
])
def test_attention_options(attrs):
    _same(_attention(2, **attrs), _attention_feeds(2))


@pytest.mark.parametrize("case, reason", [
    ("opset 12", "its rewrite needs opset 13 or later, not 12"),
    ("past", "it has a past input, which this rewrite does not handle"),
    ("present", "it writes a present state, which this rewrite does not handle"),
    ("left padding", "its 1-D mask_index may be left-padding's (2 * batch end and start "
                     "positions), which this rewrite does not handle"),
])
def test_attention_it_does_not_rewrite_stays_with_the_reason(case, reason):
    model = _attention(1 if case == "left padding" else None,
                       opset=12 if case == "opset 12" else 14)
    node = model.graph.node[0]
    if case == "past":
        node.input.extend(["", "past"])
        model.graph.input.append(_vi("past", TensorProto.FLOAT, [2, B, HEADS, 3, H // HEADS]))
    elif case == "present":
        node.output.append("present")
    elif case == "left padding":
        model.graph.input[1].CopyFrom(_vi("mask", TensorProto.INT32, [2 * B]))
    graph = gs.import_onnx(model)
    before = fingerprint(graph)
    result = UnfuseContrib().run(graph, PassContext())
    assert fingerprint(graph) == before
    assert (result.notes[0].subject, result.notes[0].reason) == ("Attention 'attn'", reason)


# ----------------------------------------------------------------------------- a real export


def test_onnxruntime_optimized_bert_parses_and_computes_the_same():
    fused = onnx.load(DATA / "ort_bert_tiny.onnx")
    target = parse_target("10")
    assert not diagnose(fused, target).parses()
    rng = np.random.default_rng(0)
    mask = np.array([[1] * 9 + [0] * 3, [1] * 12, [1] * 5 + [0] * 7])
    feeds = {"input_ids": rng.integers(0, 128, (3, 12)), "attention_mask": mask,
             "token_type_ids": rng.integers(0, 2, (3, 12))}
    out = _same(fused, feeds)
    assert diagnose(out, target).parses()
    assert {"Softmax", "ReduceMean", "Erf"} <= set(ops(out))  # opset 14: norms written out
    assert len(out.graph.node) == 131  # 18 nodes, the fused ones written out


# ----------------------------------------------------------------------------- MultiHeadAttention

L = 5  # keys, against S queries


def _mha(self_attention=False, bias=False, mask=None, attention_bias=False, **attrs):
    attrs.setdefault("num_heads", HEADS)
    ins = ["q", "q" if self_attention else "k", "q" if self_attention else "v"]
    ins += ["b" if bias else "", "m" if mask else "", "ab" if attention_bias else ""]
    while ins[-1] == "":
        ins.pop()
    keys = S if self_attention else L
    node = helper.make_node("MultiHeadAttention", ins, ["y"], name="mha", domain=MS, **attrs)
    inputs = [_vi("q", TensorProto.FLOAT, [B, S, H])]
    if not self_attention:
        inputs += [_vi("k", TensorProto.FLOAT, [B, L, H]),
                   _vi("v", TensorProto.FLOAT, [B, L, 2 * H])]
    if mask:
        inputs.append(_vi("m", TensorProto.INT32, [B] if mask == 1 else [B, keys]))
    if attention_bias:
        inputs.append(_vi("ab", TensorProto.FLOAT, [1, HEADS, S, keys]))
    width = H if self_attention else 2 * H
    inits = {"b": _w(2 * H + width, seed=3)} if bias else {}
    return _model([node], inputs, [_vi("y", TensorProto.FLOAT, [B, S, width])], inits)


def _mha_feeds(model):
    rng = np.random.default_rng(4)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "m":
            feeds["m"] = (np.array([3, 5], np.int32) if len(shape) == 1 else
                          (rng.random(shape) > 0.3).astype(np.int32))
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("kwargs", [
    {"self_attention": True},
    {"bias": True},
    {"mask": 2},
    {"mask": 1},
    {"attention_bias": True, "bias": True},
    {"self_attention": True, "unidirectional": 1},
    {"scale": 0.3, "mask": 2, "mask_filter_value": -1e4},
])
def test_multi_head_attention_computes_as_onnxruntimes_kernel(kwargs):
    model = _mha(**kwargs)
    _same(model, _mha_feeds(model))


@pytest.mark.parametrize("case, reason", [
    ("past", "it has a past_key input, which this rewrite does not handle"),
    ("packed", "its query, key or value is packed or absent"),
    ("causal cross", "it is causal over a key that is not the query"),
])
def test_multi_head_attention_it_does_not_rewrite_stays_with_the_reason(case, reason):
    model = _mha(unidirectional=int(case == "causal cross"))
    node = model.graph.node[0]
    if case == "past":
        node.input.extend(["", "", "", "pk"])
        model.graph.input.append(_vi("pk", TensorProto.FLOAT, [B, HEADS, 2, H // HEADS]))
    elif case == "packed":
        node.input[1:] = ["", ""]
    graph = gs.import_onnx(model)
    before = fingerprint(graph)
    result = UnfuseContrib().run(graph, PassContext())
    assert fingerprint(graph) == before
    assert (result.notes[0].subject, result.notes[0].reason) == ("MultiHeadAttention 'mha'",
                                                                 reason)
