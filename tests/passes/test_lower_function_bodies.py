"""lower-unsupported by ONNX function bodies (graphfix.plugins.function_bodies): the
opset-23 RMSNormalization, RotaryEmbedding and Attention that torch.onnx.export(dynamo=True,
opset_version=23) writes, for TensorRT versions that parse none of them. Exact ops after,
numerics against onnxruntime running the original op (its optimizations off), checker
(in `apply`), a second run that changes nothing, and the notes of nodes left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, feeds_for, ops, output_types
from onnx import TensorProto, helper, numpy_helper
from test_lower_unsupported import _Without

from graphfix.api import run as api_run
from graphfix.doctor import diagnose
from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.lower_unsupported import LowerUnsupported, LowerUnsupportedOptions
from graphfix.trt import parse_target

F, F16, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BOOL
NO_RULE = "; no plugin rule replaces it either"
RMS_OPS = ["Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul"]
RMS_KEY = "lowered RMSNormalization into Mul, ReduceMean, Add, Sqrt, Div"


def _vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), checked=True) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    if checked:
        onnx.checker.check_model(model, full_check=True)
    return model


def _ctx(target) -> PassContext:
    return PassContext(trt=parse_target(target) if isinstance(target, str) else target)


def _opset_note(trt: str, high: int) -> tuple[str, str]:
    return ("graph", f"the model's opset 23 is above the {high} that TensorRT {trt} parses; "
                     f"opset{{version={high}}} after this pass converts it (the default --trt "
                     "pipeline runs opset{to-target=true} near its end)")


def _lowers(model, trt, expected_ops, counts, notes, feeds=None, options=None,
            rtol=1e-5, atol=1e-6) -> onnx.ModelProto:
    pass_ = LowerUnsupported(options)
    out, result = apply(pass_, model, _ctx(trt))
    assert dict(result.counts) == counts
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert ops(out) == expected_ops
    assert output_types(out) == output_types(model)
    assert_same_outputs(model, out, feeds or feeds_for(model), rtol=rtol, atol=atol)
    assert_idempotent(pass_, out, _ctx(trt))
    return out


def _stays(model, target, notes) -> None:
    graph = to_graph(model)
    before = fingerprint(graph)
    result = LowerUnsupported().run(graph, _ctx(target))
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert fingerprint(graph) == before


# ----------------------------------------------------------------------------- RMSNormalization


def _rms(shape=(2, 3, 8), axis=-1, elem=F, **attrs) -> onnx.ModelProto:
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    norm = list(shape[axis:])
    scale = (np.random.default_rng(1).random(norm) + 0.5).astype(dtype)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], name="rms", axis=axis,
                            **attrs)
    return _model([node], [_vi("x", list(shape), elem)], [_vi("y", list(shape), elem)],
                  [numpy_helper.from_array(scale, "s")])


@pytest.mark.parametrize(("trt", "high"), [("8.6", 17), ("10.1", 20)])
def test_rms_norm_becomes_its_body_with_constant_axes(trt, high):
    out = _lowers(_rms(epsilon=1e-3), trt, RMS_OPS, {RMS_KEY: 1}, [_opset_note(trt, high)])
    reduce = next(n for n in out.graph.node if n.op_type == "ReduceMean")
    axes = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}[reduce.input[1]]
    assert axes.tolist() == [2]  # Range(axis + rank, rank) computed: the opset pass needs it
    assert out.graph.node[-1].output[0] == "y"


def test_float16_rms_norm_over_two_axes_computes_in_float32():
    model = _rms(shape=(2, 3, 8), axis=1, elem=F16, stash_type=1)
    out = _lowers(model, "8.6", ["Cast", *RMS_OPS[:5], "Cast", "Mul"],
                  {RMS_KEY.replace("into ", "into Cast, "): 1}, [_opset_note("8.6", 17)],
                  rtol=2e-3, atol=2e-3)
    casts = [n for n in out.graph.node if n.op_type == "Cast"]
    assert [a.i for n in casts for a in n.attribute] == [F, F16]


def test_forced_rms_norm_lowers_on_a_target_that_parses_it():
    model = _rms()
    _stays(model, "10.16", [("graph", "no node to lower for TensorRT 10.16")])
    _lowers(model, "10.16", RMS_OPS, {RMS_KEY: 1}, [],
            options=LowerUnsupportedOptions(ops="RMSNormalization"))


def test_rms_norm_whose_body_emits_an_op_the_target_lacks_stays():
    target = _Without("8.6", "Sqrt")
    _stays(_rms(), target, [
        ("RMSNormalization 'rms'", "TensorRT 8.6 without Sqrt does not list it, but its "
         "lowering emits Sqrt, which TensorRT 8.6 without Sqrt neither parses nor can lower"
         + NO_RULE),
        _opset_note("8.6 without Sqrt", 17)])


def test_rms_norm_of_an_untyped_input_stays():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("RMSNormalization", ["r", "s"], ["y"], name="rms")]
    model = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 4])],
                   [numpy_helper.from_array(np.ones(4, np.float32), "s")])
    graph = to_graph(model)
    graph.nodes[0].outputs[0].dtype = None
    result = LowerUnsupported().run(graph, _ctx("8.6"))
    assert not result.changed
    assert (result.notes[0].subject, result.notes[0].reason) == (
        "RMSNormalization 'rms'", "TensorRT 8.6 does not list it, but it has no exact "
        "lowering: the type of its input 'r' is unknown; run shape inference first" + NO_RULE)


def test_an_output_the_body_does_not_write_keeps_the_node():
    """ONNX's bodies write every output their schema declares; a node that declares one
    more (read by a Relu) is how this branch is reached."""
    nodes = [helper.make_node("RMSNormalization", ["x", "s"], ["y", "extra"], name="rms"),
             helper.make_node("Relu", ["extra"], ["z"], name="relu")]
    model = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 4]), _vi("z", [2, 4])],
                   [numpy_helper.from_array(np.ones(4, np.float32), "s")], checked=False)
    _stays(model, "8.6", [
        ("RMSNormalization 'rms'", "TensorRT 8.6 does not list it, but it has no exact "
         "lowering: its output 'extra' is read, and its function body does not compute it"
         + NO_RULE),
        _opset_note("8.6", 17)])


def test_run_for_8_6_ends_at_opset_17_without_rms_norm():
    """probe 4: RMSNormalization blocked the opset pass ("No Previous Version of
    RMSNormalization exists") and `run --trt 8.6` exited 1."""
    model = _rms(shape=(2, 16, 64), epsilon=1e-6)
    result = api_run(model, trt="8.6")
    assert result.model.opset_import[0].version == 17
    assert ops(result.model) == RMS_OPS
    assert [f for f in result.diagnosis.findings if f.severity == "error"] == []
    assert_same_outputs(model, result.model, feeds_for(model))


def test_doctor_names_lower_unsupported_for_the_opset_23_ops():
    finding, = [f for f in diagnose(_rms(), parse_target("8.6")).findings
                if f.rule == "op-unsupported"]
    assert finding.fix == ("TensorRT 10.16 supports it; otherwise lower-unsupported rewrites "
                           "it into ops this version parses: graphfix run model.onnx --trt "
                           "8.6 --passes lower-unsupported")


# ----------------------------------------------------------------------------- RotaryEmbedding


def _rotary(position_ids: bool, interleaved: int = 0, rotary_dim: int = 0):
    """X [2, 4 heads, 5 tokens, 8] with cos/sin caches [2, 5, 4] (or [16, 4] indexed by
    position_ids [2, 5])."""
    rng = np.random.default_rng(2)
    half = (rotary_dim or 8) // 2
    shape = [16, half] if position_ids else [2, 5, half]
    angles = rng.random(shape).astype(np.float32) * 3
    inits = [numpy_helper.from_array(np.cos(angles), "cos"),
             numpy_helper.from_array(np.sin(angles), "sin")]
    names = ["x", "cos", "sin"]
    if position_ids:
        inits.append(numpy_helper.from_array(rng.integers(0, 16, (2, 5)).astype(np.int64),
                                             "pos"))
        names.append("pos")
    attrs = {"rotary_embedding_dim": rotary_dim} if rotary_dim else {}
    node = helper.make_node("RotaryEmbedding", names, ["y"], name="rope",
                            interleaved=interleaved, **attrs)
    return _model([node], [_vi("x", [2, 4, 5, 8])], [_vi("y", [2, 4, 5, 8])], inits)


ROTATE = ["Slice", "Slice", "Split", "Unsqueeze", "Unsqueeze", "Split", "Mul", "Mul", "Mul",
          "Mul", "Sub", "Add", "Concat", "Concat", "Transpose", "Reshape"]  # after toposort
ROPE_KEY = "Split, Slice, Unsqueeze, Mul, Sub, Add, Concat, Reshape"


@pytest.mark.parametrize(("position_ids", "expected", "key"), [
    (False, ["Transpose", *ROTATE], f"Transpose, {ROPE_KEY}"),
    (True, ["Transpose", "Gather", "Gather", "Split", *ROTATE[:2], *ROTATE[3:]],
     f"Transpose, Split, Gather, {ROPE_KEY.replace('Split, ', '')}"),
])
def test_rotary_embedding_becomes_its_body(position_ids, expected, key):
    """The head size, its half and the output shape are static: no Shape is left."""
    key = f"lowered RotaryEmbedding into {key}"
    out = _lowers(_rotary(position_ids), "8.6", expected, {key: 1}, [_opset_note("8.6", 17)])
    slices = [n for n in out.graph.node if n.op_type == "Slice"]
    inits = {i.name for i in out.graph.initializer}
    assert all(s.input[3] in inits for s in slices)  # 8.6: "`axes` must be an initializer"


def test_interleaved_rotary_embedding_on_part_of_the_head():
    model = _rotary(False, interleaved=1, rotary_dim=4)
    out, result = apply(LowerUnsupported(), model, _ctx("10.1"))
    assert "RotaryEmbedding" not in ops(out)
    assert list(result.counts.values()) == [1]
    assert_same_outputs(model, out, feeds_for(model))
    assert_idempotent(LowerUnsupported(), out, _ctx("10.1"))


# ----------------------------------------------------------------------------- Attention


def _attention(mask: bool = True, kv_heads: int = 4, **attrs) -> onnx.ModelProto:
    """Q [2, 4 heads, 5, 8], K and V [2, kv_heads, 6, 8], a BOOL mask [2, 1, 5, 6]."""
    names = ["q", "k", "v"] + (["mask"] if mask else [])
    inputs = [_vi("q", [2, 4, 5, 8]), _vi("k", [2, kv_heads, 6, 8]), _vi("v", [2, kv_heads, 6, 8])]
    if mask:
        inputs.append(_vi("mask", [2, 1, 5, 6], BOOL))
    node = helper.make_node("Attention", names, ["y"], name="attn", **attrs)
    return _model([node], inputs, [_vi("y", [2, 4, 5, 8])])


def _attention_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = feeds_for(model)
    if "mask" in feeds:
        mask = np.random.default_rng(3).random((2, 1, 5, 6)) > 0.3
        mask[..., 0] = True  # every row attends somewhere
        feeds["mask"] = mask
    return feeds


# after toposort; the K/V head interleave (Unsqueeze, Expand, Reshape) stays with equal
# head counts (it is then a copy), as the body writes it
ATTENTION_OPS = ["Where", "Unsqueeze", "Unsqueeze", "Mul", "Expand", "Expand", "ReduceMax",
                 "Reshape", "Reshape", "Equal", "Transpose", "Mul", "MatMul", "Add", "Softmax",
                 "Where", "MatMul"]
ATTENTION_KEY = ("lowered Attention into Where, Unsqueeze, Expand, Reshape, Transpose, Mul, "
                 "MatMul, Add, Softmax, ReduceMax")


@pytest.mark.parametrize(("trt", "high"), [("8.6", 17), ("10.1", 20)])
def test_attention_with_a_bool_mask_becomes_its_body(trt, high):
    """8.6 lacks CastLike: the body's two are expanded in turn (Cast of a constant,
    computed); 10.1 parses them, so they stay."""
    model = _attention(scale=0.3)
    expected, key = ATTENTION_OPS, f"{ATTENTION_KEY}, Equal"
    if trt == "10.1":
        expected = [*ATTENTION_OPS[:7], "CastLike", *ATTENTION_OPS[7:15], "CastLike",
                    *ATTENTION_OPS[15:]]
        key = f"{ATTENTION_KEY}, CastLike, Equal"
    _lowers(model, trt, expected, {key: 1}, [_opset_note(trt, high)],
            feeds=_attention_feeds(model))


def test_causal_grouped_query_attention_becomes_its_body():
    """The causal bias of static sizes (5 x 6) is computed into a constant."""
    model = _attention(mask=False, kv_heads=2, is_causal=1)
    _lowers(model, "8.6", ["Unsqueeze", "Unsqueeze", "Mul", "Expand", "Expand", "Reshape",
                           "Reshape", "Transpose", "Mul", "MatMul", "Add", "Softmax", "Where",
                           "MatMul"],
            {"lowered Attention into Unsqueeze, Expand, Reshape, Transpose, Mul, MatMul, "
             "Add, Softmax, Where": 1}, [_opset_note("8.6", 17)])


def test_attention_whose_body_needs_an_op_the_target_lacks_stays():
    _stays(_attention(), _Without("8.6", "MatMul"), [
        ("Attention 'attn'", "TensorRT 8.6 without MatMul does not list it, but its "
         "lowering emits MatMul, which TensorRT 8.6 without MatMul neither parses nor can "
         "lower" + NO_RULE),
        _opset_note("8.6 without MatMul", 17)])


def test_a_body_op_the_target_lacks_is_expanded_by_its_own_body():
    """Softmax-13 has a function body too: without it, Attention still lowers."""
    model = _attention()
    out, result = apply(LowerUnsupported(), model, PassContext(trt=_Without("8.6", "Softmax")))
    assert "Softmax" not in ops(out) and "Attention" not in ops(out)
    assert {"Exp", "ReduceSum"} <= set(ops(out))
    assert list(result.counts.values()) == [1]
    assert_same_outputs(model, out, _attention_feeds(model))
