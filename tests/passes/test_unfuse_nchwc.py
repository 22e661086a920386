"""unfuse-contrib on onnxruntime's NCHWc ops (com.microsoft.nchwc).

Two kinds of models: ones onnxruntime's optimizer makes with ORT_ENABLE_ALL on this
machine (skipped where its CPU has no NCHWc kernels), compared with the model before
optimization; and NCHWc graphs built here from a standard model with weights blocked
for B = 8 or 16 (`_block` follows MLAS's OIHWBiBo/OIHWBo loops index by index, and
`test_blocked_weights_match_onnxruntime` checks it against onnxruntime), compared
with that standard model. The second kind covers the block size this CPU lacks.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import apply, assert_idempotent, assert_same_outputs, ops, ort_optimized
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import fingerprint
from graphfix.passes._unfuse_nchwc import AMBIGUOUS, unblock
from graphfix.passes.base import PassContext
from graphfix.passes.unfuse_contrib import UnfuseContrib, UnfuseContribOptions
from graphfix.runtime.session import run_model

NCHWC = "com.microsoft.nchwc"
n = helper.make_node


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits, opset=17, domains=(NCHWC,)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, inits)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _weights(seed: int, *shape: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def _feeds(model: onnx.ModelProto, **shapes) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {i.name: rng.standard_normal(shapes[i.name]).astype(np.float32)
            for i in model.graph.input}


def _block(w: np.ndarray, kind: str, block: int) -> np.ndarray:
    """MLAS's reorder, written out: OIHWBiBo or OIHWBo, output channels zero-padded."""
    out, inp, kh, kw = w.shape
    padded = -(-out // block) * block
    if kind == "BiBo":
        dst = np.zeros((padded // block, inp // block, kh, kw, block, block), np.float32)
        for o in range(out):
            for i in range(inp):
                dst[o // block, i // block, :, :, i % block, o % block] = w[o, i]
    else:
        dst = np.zeros((padded // block, inp, kh, kw, block), np.float32)
        for o in range(out):
            dst[o // block, :, :, :, o % block] = w[o]
    return dst.reshape(padded, inp, kh, kw)


def _pad(b: np.ndarray, block: int) -> np.ndarray:
    return np.concatenate([b, np.zeros(-len(b) % block, np.float32)])


def _run(model, options=None):
    return apply(UnfuseContrib(options), model)


def _assert_skips(model, subject, reason, options=None):
    graph = gs.import_onnx(model)
    snapshot = fingerprint(graph)
    result = UnfuseContrib(options).run(graph, PassContext())
    assert not result.changed and not result.counts
    assert fingerprint(graph) == snapshot
    assert (result.notes[0].subject, result.notes[0].reason) == (subject, reason)
    assert all("left outside the standard ONNX domain" in x.reason for x in result.notes[1:])


# ----------------------------------------------------------------------------- built here


def _chain(block: int, e_out: int = 6):
    """x -> Conv(3->16)+Relu -> Conv(16->16)+x residual+Relu -> depthwise+Clip -> MaxPool
    -> Conv(16->e_out)+Sigmoid -> y, as NCHWc (blocked for `block`) and as standard ONNX."""
    wa, ba, wb = _weights(1, 16, 3, 3, 3), _weights(2, 16), _weights(3, 16, 16, 3, 3)
    wd, we, be = _weights(4, 16, 1, 3, 3), _weights(5, e_out, 16, 1, 1), _weights(6, e_out)
    std_inits = [numpy_helper.from_array(v, k) for k, v in
                 dict(wa=wa, ba=ba, wb=wb, wd=wd, we=we, be=be).items()]
    std_inits += [numpy_helper.from_array(np.float32(v), k) for k, v in (("lo", 0), ("hi", 6))]
    pads = [1, 1, 1, 1]
    standard = _model([
        n("Conv", ["x", "wa", "ba"], ["a"], pads=pads), n("Relu", ["a"], ["ra"]),
        n("Conv", ["ra", "wb"], ["b"], pads=pads), n("Add", ["b", "ra"], ["s"]),
        n("Relu", ["s"], ["rb"]), n("Conv", ["rb", "wd"], ["d"], group=16, pads=pads),
        n("Clip", ["d", "lo", "hi"], ["rd"]),
        n("MaxPool", ["rd"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p", "we", "be"], ["e"]), n("Sigmoid", ["e"], ["y"]),
    ], [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, e_out, 4, 4])], std_inits, domains=())
    blocked = {"wa": _block(wa, "Bo", block), "ba": _pad(ba, block),
               "wb": _block(wb, "BiBo", block), "wd": _block(wd, "Bo", block),
               "we": _block(we, "BiBo", block), "be": _pad(be, block)}
    kw = {"domain": NCHWC}
    nodes = [
        n("Conv", ["x", "wa", "ba"], ["t1"], "a", pads=pads, activation="Relu", **kw),
        n("Conv", ["t1", "wb", "", "t1"], ["t2"], "b", pads=pads, activation="Relu", **kw),
        n("Conv", ["t2", "wd"], ["t3"], "d", group=16, pads=pads, activation="Clip",
          activation_params=[0.0, 6.0], **kw),
        n("MaxPool", ["t3"], ["t4"], "p", kernel_shape=[2, 2], strides=[2, 2], **kw),
        n("Conv", ["t4", "we", "be"], ["t5"], "e", activation="Sigmoid", **kw),
        n("ReorderOutput", ["t5"], ["y"], "ro", channels=e_out, **kw),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in blocked.items()]
    return _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, e_out, 4, 4])], inits), standard


CHAIN_OPS = ["Conv", "Relu", "Conv", "Add", "Relu", "Conv", "Clip", "MaxPool", "Conv", "Sigmoid"]


@pytest.mark.parametrize("block", [8, 16])
def test_infers_the_block_size_and_unblocks_the_weights(block):
    model, standard = _chain(block)
    out, result = _run(model)
    assert dict(result.counts) == {
        "rewrote NCHWc Conv as Conv": 4, "rewrote NCHWc MaxPool as MaxPool": 1,
        "rewrote ReorderOutput as Slice": 1, "dropped unused opset imports": 1,
    }
    assert result.notes == []
    assert ops(out) == CHAIN_OPS + ["Slice"]
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 17)]
    assert_same_outputs(standard, out, _feeds(model, x=[1, 3, 8, 8]))
    assert_idempotent(UnfuseContrib(), out)


def test_a_given_block_size_that_does_not_fit_is_refused():
    model, _ = _chain(16)
    _assert_skips(model, "Conv 'a'", "6 NCHWc nodes left in place: the graph does not fit "
                  "nchwc-block=8: ReorderOutput 'ro' crops 16 channels to 6",
                  UnfuseContribOptions(8))


def test_an_ambiguous_block_size_needs_the_option():
    model, standard = _chain(16, e_out=16)
    _assert_skips(model, "Conv 'a'", f"6 NCHWc nodes left in place: {AMBIGUOUS}")
    out, _ = _run(model, UnfuseContribOptions(16))
    assert ops(out) == CHAIN_OPS
    assert_same_outputs(standard, out, _feeds(model, x=[1, 3, 8, 8]))


def test_weights_that_read_alike_under_both_block_sizes_need_no_option():
    scale, bias = _weights(1, 16, 1, 1, 1), _weights(2, 16)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")]
    kw = {"domain": NCHWC}
    model = _model([
        n("ReorderInput", ["x"], ["t"], "ri", **kw),
        n("Conv", ["t", "s", "b"], ["c"], "bn", group=16, **kw),
        n("GlobalAveragePool", ["c"], ["g"], "gap", **kw),
        n("ReorderOutput", ["g"], ["y"], "ro", channels=16, **kw),
    ], [_vi("x", [1, 16, 4, 4])], [_vi("y", [1, 16, 1, 1])], inits)
    standard = _model([n("Conv", ["x", "s", "b"], ["c"], group=16),
                       n("GlobalAveragePool", ["c"], ["y"])],
                      [_vi("x", [1, 16, 4, 4])], [_vi("y", [1, 16, 1, 1])], inits, domains=())
    out, result = _run(model)
    assert dict(result.counts) == {
        "removed ReorderInput": 1, "rewrote NCHWc Conv as Conv": 1, "removed ReorderOutput": 1,
        "rewrote NCHWc GlobalAveragePool as GlobalAveragePool": 1,
        "dropped unused opset imports": 1,
    }
    assert ops(out) == ["Conv", "GlobalAveragePool"]
    assert out.graph.node[-1].output == ["y"]
    assert_same_outputs(standard, out, _feeds(model, x=[1, 16, 4, 4]))


def test_channels_last_output_of_a_padded_conv_is_cropped_then_transposed():
    w = _weights(1, 6, 16, 1, 1)
    kw = {"domain": NCHWC}
    model = _model([
        n("ReorderInput", ["x"], ["t"], "ri", **kw),
        n("Conv", ["t", "w"], ["c"], "conv", **kw),
        n("ReorderOutput", ["c"], ["y"], "ro", channels=6, channels_last=1, **kw),
    ], [_vi("x", [1, 16, 4, 4])], [_vi("y", [1, 4, 4, 6])],
        [numpy_helper.from_array(_block(w, "BiBo", 8), "w")])
    standard = _model([n("Conv", ["x", "w"], ["c"]),
                       n("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])],
                      [_vi("x", [1, 16, 4, 4])], [_vi("y", [1, 4, 4, 6])],
                      [numpy_helper.from_array(w, "w")], domains=())
    out, result = _run(model)
    assert result.counts["rewrote ReorderOutput as Slice + Transpose"] == 1
    assert ops(out) == ["Conv", "Slice", "Transpose"]
    assert out.graph.node[-1].output == ["y"]
    assert_same_outputs(standard, out, _feeds(model, x=[1, 16, 4, 4]))


def test_rewrites_a_region_inside_an_if_branch():
    model, standard = _chain(16)
    then = helper.make_graph(model.graph.node, "then", [], model.graph.output,
                             model.graph.initializer)
    other = helper.make_graph(standard.graph.node, "else", [], standard.graph.output,
                              standard.graph.initializer)
    outer = _model([n("If", ["cond"], ["y"], "if", then_branch=then, else_branch=other)],
                   [_vi("x", [1, 3, 8, 8]), _vi("cond", [], TensorProto.BOOL)],
                   [_vi("y", [1, 6, 4, 4])], [])
    out, result = _run(outer)
    assert result.counts["rewrote NCHWc Conv as Conv"] == 4
    branches = {a.name: [x.op_type for x in a.g.node] for a in out.graph.node[0].attribute}
    assert branches["then_branch"] == CHAIN_OPS + ["Slice"]
    x = _feeds(model, x=[1, 3, 8, 8])["x"]
    rewritten = run_model(out, {"x": x, "cond": np.array(True)})["y"]
    reference = run_model(outer, {"x": x, "cond": np.array(False)})["y"]  # the standard branch
    np.testing.assert_allclose(rewritten, reference, rtol=1e-5, atol=1e-6)
    assert_idempotent(UnfuseContrib(), out)


def _tiny_region(middle: onnx.NodeProto, opset: int = 17) -> onnx.ModelProto:
    kw = {"domain": NCHWC}
    return _model([n("ReorderInput", ["x"], ["t"], "ri", **kw), middle,
                   n("ReorderOutput", ["m"], ["y"], "ro", channels=16, **kw)],
                  [_vi("x", [1, 16, 4, 4])], [_vi("y", ["n", "c", "h", "w"])], [], opset)


def test_region_skips_with_reasons():
    left = "{} NCHWc nodes left in place: "
    _assert_skips(_tiny_region(n("Softmax", ["t"], ["m"], "sm", axis=1)), "Softmax 'sm'",
                  left.format(2)
                  + "it reads a tensor in NCHWc layout, and its result depends on that layout")
    _assert_skips(_tiny_region(n("Foo", ["t"], ["m"], "foo", domain=NCHWC)), "Foo 'foo'",
                  left.format(3) + "onnxruntime's NCHWc op Foo has no standard rewrite here")
    _assert_skips(_tiny_region(n("Upsample", ["t"], ["m"], "up", domain=NCHWC,
                                 scales=[1, 1, 2, 2]), opset=10), "Upsample 'up'",
                  left.format(3) + "opset 10 has no Resize with nearest_mode, which it needs")
    _assert_skips(_tiny_region(n("Conv", ["t", "t"], ["m"], "c", domain=NCHWC)), "Conv 'c'",
                  left.format(3) + "its reordered weights are not a 4-D initializer")


def test_no_block_size_fits():
    model, _ = _chain(8)
    we = next(i for i in model.graph.initializer if i.name == "we")
    we.CopyFrom(numpy_helper.from_array(_weights(7, 12, 16, 1, 1), "we"))
    _assert_skips(model, "Conv 'a'", "6 NCHWc nodes left in place: neither NCHWc block size "
                  "fits (8: Conv 'e' has 12 output channels; 16: Conv 'e' has 12 output channels)")


@pytest.mark.parametrize("kind", ["BiBo", "Bo"])
@pytest.mark.parametrize("block", [8, 16])
def test_unblock_inverts_the_mlas_reorder(kind, block):
    w = _weights(0, 2 * block, 1 if kind == "Bo" else 2 * block, 3, 2)
    np.testing.assert_array_equal(unblock(_block(w, kind, block), kind, block), w)


# ----------------------------------------------------------------------------- made by onnxruntime


def ort_all(model: onnx.ModelProto, path) -> onnx.ModelProto:
    optimized = ort_optimized(model, path, "all")
    if not any(x.domain == NCHWC for x in optimized.graph.node):
        pytest.skip("onnxruntime made no NCHWc op on this CPU")
    return optimized


def _std(nodes, inputs, outputs, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    return _model(nodes, inputs, outputs, inits, domains=())


def _simple_chain() -> onnx.ModelProto:
    w = {"wa": _weights(1, 16, 3, 3, 3), "wb": _weights(2, 16, 16, 3, 3),
         "wd": _weights(3, 16, 1, 3, 3), "we": _weights(4, 4, 16, 1, 1)}
    return _std([n("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]), n("Relu", ["a"], ["r"]),
                 n("Conv", ["r", "wb"], ["b"], pads=[1, 1, 1, 1]),
                 n("Conv", ["b", "wd"], ["d"], group=16, pads=[1, 1, 1, 1]),
                 n("Conv", ["d", "we"], ["y"])],
                [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])], w)


def test_blocked_weights_match_onnxruntime(tmp_path):
    model = _simple_chain()
    optimized = ort_all(model, tmp_path / "m.onnx")
    stored = {i.name: numpy_helper.to_array(i) for i in optimized.graph.initializer}
    convs = [x for x in optimized.graph.node if x.domain == NCHWC and x.op_type == "Conv"]
    block = stored[convs[-1].input[1]].shape[0]  # the 4 output channels padded to B
    originals = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for conv, name, kind in zip(convs, ["wa", "wb", "wd", "we"], ["Bo", "BiBo", "Bo", "BiBo"],
                                strict=True):
        np.testing.assert_array_equal(stored[conv.input[1]], _block(originals[name], kind, block))
    out, _ = _run(optimized)
    assert ops(out) == ["Conv", "Relu", "Conv", "Conv", "Conv", "Slice"]
    assert_same_outputs(model, out, _feeds(model, x=[1, 3, 8, 8]))


def _mixed() -> onnx.ModelProto:
    """Channels-last input and output, BatchNorm, Add, Mul, Sigmoid, Concat, AveragePool,
    nearest Resize, grouped Conv, GlobalAveragePool: what NchwcTransformer rewrites."""
    w = {"w1": _weights(1, 16, 16, 3, 3), "s": _weights(2, 16) + 1, "bb": _weights(3, 16),
         "m": _weights(4, 16), "v": np.abs(_weights(5, 16)) + 0.5,
         "w2": _weights(6, 16, 16, 1, 1), "w3": _weights(7, 16, 16, 1, 1),
         "sc": np.array([1, 1, 2, 2], np.float32), "wg": _weights(8, 32, 16, 3, 3),
         "w5": _weights(9, 4, 32, 1, 1)}
    return _std([
        n("Transpose", ["xh"], ["x"], perm=[0, 3, 1, 2]),
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["bn"]),
        n("Conv", ["bn", "w2"], ["c2"]), n("Conv", ["bn", "w3"], ["c3"]),
        n("Add", ["c2", "c3"], ["a"]), n("Mul", ["a", "c2"], ["mu"]), n("Sigmoid", ["mu"], ["sg"]),
        n("Concat", ["sg", "c3"], ["cc"], axis=1),
        n("AveragePool", ["cc"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Resize", ["ap", "", "sc"], ["rs"], mode="nearest",
          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        n("Conv", ["rs", "wg"], ["cg"], group=2, pads=[1, 1, 1, 1]),
        n("GlobalAveragePool", ["cg"], ["gp"]), n("Conv", ["gp", "w5"], ["c5"]),
        n("Transpose", ["cg"], ["y1"], perm=[0, 2, 3, 1]), n("Relu", ["c5"], ["y2"]),
    ], [_vi("xh", ["n", 8, 8, 16])], [_vi("y1", ["n", 8, 8, 32]), _vi("y2", ["n", 4, 1, 1])], w)


def test_mixed_region_made_by_onnxruntime(tmp_path):
    model = _mixed()
    out, result = _run(ort_all(model, tmp_path / "m.onnx"))
    assert result.notes == []
    assert ops(out) == ["Transpose", "Conv", "Conv", "Conv", "Add", "Mul", "Sigmoid", "Concat",
                        "AveragePool", "Resize", "Conv", "GlobalAveragePool", "Transpose", "Conv",
                        "Relu", "Slice"]
    assert result.counts["rewrote ReorderInput as Transpose"] == 1
    assert result.counts["rewrote ReorderOutput as Transpose"] == 1
    # onnxruntime folded the BatchNormalization into the first Conv's weights in float32,
    # so the rewrite computes Conv(x, W * s) where the original computes BN(Conv(x, W)):
    # measured max abs difference 6.5e-6 on outputs up to |8|, hence atol 1e-5.
    assert_same_outputs(model, out, _feeds(model, xh=[2, 8, 8, 16]), atol=1e-5)
    assert_idempotent(UnfuseContrib(), out)


def test_broadcasting_add_view_made_by_onnxruntime(tmp_path):
    w = {"w1": _weights(1, 16, 16, 3, 3), "w2": _weights(2, 16, 16, 3, 3)}
    model = _std([n("Conv", ["x1", "w1"], ["c1"], pads=[1, 1, 1, 1]),
                  n("Conv", ["x2", "w2"], ["c2"], pads=[1, 1, 1, 1]),
                  n("Add", ["c1", "c2"], ["a"]), n("Relu", ["a"], ["y"])],
                 [_vi("x1", ["n", 16, "h", "w"]), _vi("x2", ["m", 16, "p", "q"])],
                 [_vi("y", ["n", 16, "h", "w"])], w)
    optimized = ort_all(model, tmp_path / "m.onnx")
    assert "Reshape" in ops(optimized)
    out, result = _run(optimized)
    assert result.counts["removed NCHWc block-view Reshape"] == 3
    assert ops(out) == ["Conv", "Conv", "Add", "Relu"]
    for shapes in ({"x1": [1, 16, 6, 6], "x2": [1, 16, 6, 6]},
                   {"x1": [2, 16, 1, 5], "x2": [2, 16, 4, 5]}):
        assert_same_outputs(model, out, _feeds(model, **shapes))


@pytest.mark.parametrize("mode, transform", [("nearest", "asymmetric"), ("linear", "asymmetric"),
                                             ("linear", "half_pixel"), ("linear", "align_corners")])
def test_upsample_made_by_onnxruntime(tmp_path, mode, transform):
    w = {"w1": _weights(1, 16, 16, 3, 3), "sc": np.array([1, 1, 2, 3], np.float32),
         "w2": _weights(2, 4, 16, 1, 1)}
    model = _std([n("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
                  n("Resize", ["c", "", "sc"], ["r"], mode=mode, nearest_mode="floor",
                    coordinate_transformation_mode=transform),
                  n("Conv", ["r", "w2"], ["y"])],
                 [_vi("x", [1, 16, 5, 4])], [_vi("y", [1, 4, 10, 12])], w)
    optimized = ort_all(model, tmp_path / "m.onnx")
    assert any(x.op_type == "Upsample" for x in optimized.graph.node)
    out, result = _run(optimized)
    assert result.counts["rewrote NCHWc Upsample as Resize"] == 1
    assert ops(out) == ["Conv", "Resize", "Conv", "Slice"]
    assert_same_outputs(model, out, _feeds(model, x=[1, 16, 5, 4]))


def test_real_model_region_made_by_onnxruntime(tmp_path, shared_model):
    model = onnx.load(str(shared_model("mobilenet_v3_small_bn.onnx")))  # never saved back
    optimized = ort_all(model, tmp_path / "m.onnx")
    activations = {a.s for x in optimized.graph.node for a in x.attribute if a.name == "activation"}
    # onnxruntime >= 1.31 fuses HardSwish into NCHWc Conv; 1.22 leaves HardSigmoid + Mul
    fused_hardswish = b"HardSwish" in activations
    out, result = _run(optimized)
    assert result.notes == []
    assert result.counts["rewrote NCHWc Conv as Conv"] == ops(optimized).count("Conv")
    assert all(x.domain == "" for x in out.graph.node)
    assert ops(out).count("Conv") == ops(model).count("Conv")
    assert ("HardSwish" in ops(out)) == fused_hardswish
    feeds = _feeds(model, input=[1, 3, 224, 224])
    # The outputs peak at ~2.7e-2, so bound the error by that scale; measured 9e-9.
    assert_same_outputs(model, out, feeds, rtol=1e-4, atol=1e-7)


def _padded_input(block: int, residual: bool):
    """ReorderInput of 20 channels (zero-padded to Cpad = 24 for B=8, 32 for B=16) read by a
    Conv whose weights carry zero input channels up to Cpad, as MLAS stores them; with
    `residual`, the padded tensor is also the Conv's Sum input, so it must be padded."""
    c, cpad = 20, -(-20 // block) * block
    out = c if residual else 16
    w = _weights(1, out, c, 3, 3)
    w_pad = np.concatenate([w, np.zeros((out, cpad - c, 3, 3), np.float32)], axis=1)
    if residual:  # Sum needs Cpad output channels too: zero rows, as MLAS pads them
        w_pad = np.concatenate([w_pad, np.zeros((cpad - out, cpad, 3, 3), np.float32)])
    kw, pads = {"domain": NCHWC}, [1, 1, 1, 1]
    extra = ["", "t"] if residual else []
    model = _model([
        n("ReorderInput", ["x"], ["t"], "ri", **kw),
        n("Conv", ["t", "w", *extra], ["k"], "conv", pads=pads, activation="Relu", **kw),
        n("ReorderOutput", ["k"], ["y"], "ro", channels=out, **kw),
    ], [_vi("x", [1, c, 5, 5])], [_vi("y", [1, out, 5, 5])],
        [numpy_helper.from_array(_block(w_pad, "BiBo", block), "w")])
    tail = [n("Add", ["k", "x"], ["s"]), n("Relu", ["s"], ["y"])] if residual else [
        n("Relu", ["k"], ["y"])]
    standard = _model([n("Conv", ["x", "w"], ["k"], pads=pads), *tail],
                      [_vi("x", [1, c, 5, 5])], [_vi("y", [1, out, 5, 5])],
                      [numpy_helper.from_array(w, "w")], domains=())
    return model, standard


@pytest.mark.parametrize("block", [8, 16])
def test_reorder_input_padding_is_cut_from_the_weights(block):
    """AVX-512 (B=16) pads 120 channels to 128 in MobileNetV3; any B is forced here."""
    model, standard = _padded_input(block, residual=False)
    out, result = _run(model)
    assert result.notes == []
    assert result.counts["removed ReorderInput (readers' padded input channels cut)"] == 1
    assert ops(out) == ["Conv", "Relu"]
    conv = next(x for x in out.graph.node if x.op_type == "Conv")
    weights = next(i for i in out.graph.initializer if i.name == conv.input[1])
    assert list(weights.dims) == [16, 20, 3, 3]
    assert_same_outputs(standard, out, _feeds(model, x=[1, 20, 5, 5]))
    assert_idempotent(UnfuseContrib(), out)


@pytest.mark.parametrize("block", [8, 16])
def test_reorder_input_padding_read_as_a_sum_becomes_a_pad(block):
    model, standard = _padded_input(block, residual=True)
    out, result = _run(model)
    assert result.notes == []
    assert result.counts["rewrote ReorderInput as Pad"] == 1
    assert ops(out) == ["Pad", "Conv", "Add", "Relu", "Slice"]
    assert_same_outputs(standard, out, _feeds(model, x=[1, 20, 5, 5]))
    assert_idempotent(UnfuseContrib(), out)


def test_reorder_input_whose_channels_cannot_be_told_is_left_alone():
    model, _ = _padded_input(16, residual=False)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "c"
    _assert_skips(model, "ReorderInput 'ri'", "3 NCHWc nodes left in place: the number of "
                  "channels it reads cannot be told from the graph (it pads them to a multiple "
                  "of the block size); run shape inference on the model first")
