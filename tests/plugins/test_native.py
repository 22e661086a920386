"""Standard-ONNX forms of TensorRT plugins (graphfix.plugins.native), run as the plugins'
reference forms: each against numpy ports of the plugin kernels or the ONNX op it becomes,
on seeded inputs, and the nodes a form cannot express are "not checkable" with the reason."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphfix.plugins.native import MIGRATIONS, migration_for
from graphfix.runtime import references

F, F16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64
DOMAIN = "trt.plugins"


def rand(shape, seed, dtype=np.float32, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def model(nodes, inputs, outputs, opset=17, inits=()):
    """A model of plugin nodes (domain trt.plugins or ""), inputs/outputs as (name, type, shape)."""
    vi = [helper.make_tensor_value_info(*i) for i in inputs]
    vo = [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
    graph = helper.make_graph(nodes, "g", vi, vo, list(inits))
    out = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                  helper.make_opsetid(DOMAIN, 1)])
    out.ir_version = 9
    return out


def plugin(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=op.lower(), domain=DOMAIN,
                            plugin_version=attrs.pop("plugin_version", "1"),
                            plugin_namespace="", **attrs)


def reference(m, feeds):
    """Every output of `m` through its reference forms (all plugin nodes must be replaced)."""
    sub = references.substitute(m)
    assert sub.not_checkable == [] and sub.kernels == []
    assert not references.needs_reference(sub.model)
    return references.run(sub, feeds)


def ops_after(m):
    return [n.op_type for n in references.substitute(m).model.graph.node]


def not_checkable(m):
    sub = references.substitute(m)
    assert sub.model is m and sub.replaced == []
    return sub.not_checkable


def ort_run(m, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_every_form_is_a_registered_reference():
    keys = {(r.domain, r.op_type, r.versions) for r in references.registered()}
    for m in MIGRATIONS:
        assert (references.PLUGIN_DOMAIN, m.op_type, m.versions) in keys
    assert migration_for("Clip_TRT", "1").native == "Clip"
    assert migration_for("ROIAlign_TRT", "2").native == "RoiAlign"
    assert migration_for("ROIAlign_TRT", "3") is None
    assert migration_for("EfficientNMS_TRT", "1") is None  # plugin-to-nms has its forms


# ----------------------------------------------------------------------------- normalization


def test_instance_norm_trt_float16_is_normalized_in_float32():
    scales, bias = rand([3], 1) + 1.5, rand([3], 2)
    node = plugin("InstanceNormalization_TRT", ["x"], epsilon=1e-5, scales=scales.tolist(),
                  bias=bias.tolist(), relu=1, alpha=0.2, plugin_version="3")
    m = model([node], [("x", F16, [2, 3, 4, 5])], [("y", F16)])
    x = rand([2, 3, 4, 5], 0, np.float16, 2.0)
    y = reference(m, {"x": x})["y"]
    x64 = x.astype(np.float64)
    norm = (x64 - x64.mean((2, 3), keepdims=True)) / np.sqrt(x64.var((2, 3), keepdims=True)
                                                            + 1e-5)
    want = norm * scales.reshape(1, 3, 1, 1) + bias.reshape(1, 3, 1, 1)
    want = np.where(want < 0, want * 0.2, want)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-3, atol=2e-3)
    assert (y < 0).any()


def numpy_group_norm(x, scale, bias, groups, eps):
    """GroupNormalizationPlugin: mean and biased variance per (n, group), then per channel."""
    n, c = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    g = (g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return g.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("opset, shape, expected", [
    (21, [2, 6, 4, 5], ["GroupNormalization"]),
    (17, [2, 6, 4, 5], ["Reshape", "InstanceNormalization", "Shape", "Slice", "Concat",
                        "Reshape", "Reshape", "Mul", "Reshape", "Add", "Reshape"]),
    (17, [3, 6, 7], None),
    (13, [1, 6, 2, 3, 4], None),
])
def test_group_normalization_plugin(opset, shape, expected):
    scale, bias = rand([6], 1) + 1.0, rand([6], 2)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")]
    node = plugin("GroupNormalizationPlugin", ["x", "s", "b"], eps=1e-4, num_groups=3)
    m = model([node], [("x", F, shape)], [("y", F)], opset, inits)
    if expected:
        assert ops_after(m) == expected
    x = rand(shape, 0, scale=3.0) + 1.0
    y = reference(m, {"x": x})["y"]
    np.testing.assert_allclose(y, numpy_group_norm(x, scale, bias, 3, 1e-4), rtol=1e-5, atol=1e-5)
    standard = model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"],
                                       epsilon=1e-4, num_groups=3)],
                     [("x", F, shape)], [("y", F)], 21, inits)
    np.testing.assert_allclose(y, ort_run(standard, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_group_normalization_plugin_refusals():
    inits = [numpy_helper.from_array(np.ones(4, np.float32), n) for n in "sb"]
    zero = model([plugin("GroupNormalizationPlugin", ["x", "s", "b"], eps=0.0, num_groups=2)],
                 [("x", F, [1, 4, 3])], [("y", F)], 17, inits)
    assert not_checkable(zero) == ["GroupNormalizationPlugin (trt.plugins): the plugin "
                                   "rejects eps 0 / num_groups 2 (both must be > 0)"]


# ----------------------------------------------------------------------------- indexing


@pytest.mark.parametrize("dtype, elem", [(np.float32, F), (np.int32, I32)])
def test_scatter_nd_plugin_takes_int32_indices(dtype, elem):
    node = plugin("ScatterND", ["data", "idx", "upd"])
    m = model([node], [("data", elem, [4, 3, 2]), ("idx", I32, [2, 1]), ("upd", elem, [2, 3, 2])],
              [("y", elem)])
    assert ops_after(m) == ["Cast", "ScatterND"]
    data, upd = (rand([4, 3, 2], 0) * 10).astype(dtype), (rand([2, 3, 2], 1) * 10).astype(dtype)
    idx = np.array([[3], [1]], np.int32)
    want = data.copy()
    want[[3, 1]] = upd
    y = reference(m, {"data": data, "idx": idx, "upd": upd})["y"]
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, want)


def numpy_roi_align(x, rois, batch, oh, ow, ratio, scale, avg, aligned):
    """roiAlignKernel.cu, transcribed: float32 arithmetic in the kernel's order."""
    f = np.float32
    _, c, height, width = x.shape
    out = np.zeros((len(rois), c, oh, ow), np.float32)

    def sample(img, y, xx):
        if y < -1.0 or y > height or xx < -1.0 or xx > width:
            return np.zeros(c, np.float32)
        y, xx = max(y, f(0)), max(xx, f(0))
        y0, x0 = int(y), int(xx)
        y1, x1 = (y0 + 1, x0 + 1)
        if y0 >= height - 1:
            y0 = y1 = height - 1
            y = f(y0)
        if x0 >= width - 1:
            x0 = x1 = width - 1
            xx = f(x0)
        ly, lx = f(y - y0), f(xx - x0)
        hy, hx = f(1) - ly, f(1) - lx
        terms = [hy * hx * img[:, y0, x0], hy * lx * img[:, y0, x1], ly * hx * img[:, y1, x0],
                 ly * lx * img[:, y1, x1]]
        return sum(terms) if avg else np.maximum.reduce(terms)

    for r, (box, b) in enumerate(zip(rois, batch, strict=True)):
        shift = f(0.5) if aligned else f(0)
        x_start, y_start, x_end, y_end = (f(v) * f(scale) - shift for v in box)
        rw, rh = x_end - x_start, y_end - y_start
        if not aligned:
            rw, rh = max(rw, f(1)), max(rh, f(1))
        bh, bw = f(rh / f(oh)), f(rw / f(ow))
        gh = ratio if ratio > 0 else int(np.ceil(rh / f(oh)))
        gw = ratio if ratio > 0 else int(np.ceil(rw / f(ow)))
        for ph in range(oh):
            for pw in range(ow):
                vals = [sample(x[b], f(f(y_start + f(ph) * bh) + f(iy + 0.5) * f(bh / f(gh))),
                               f(f(x_start + f(pw) * bw) + f(ix + 0.5) * f(bw / f(gw))))
                        for iy in range(gh) for ix in range(gw)]
                if vals:
                    out[r, :, ph, pw] = sum(vals) / f(gh * gw) if avg else np.maximum.reduce(vals)
    return out


@pytest.mark.parametrize("mode", [1, 0])
@pytest.mark.parametrize("aligned, opset", [(1, 16), (0, 16), (0, 13)])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_plugin_matches_its_kernel(mode, aligned, opset, ratio):
    node = plugin("ROIAlign_TRT", ["x", "rois", "bi"], coordinate_transformation_mode=aligned,
                  mode=mode, output_height=3, output_width=4, sampling_ratio=ratio,
                  spatial_scale=0.8, plugin_version="2")
    m = model([node], [("x", F, [2, 3, 10, 12]), ("rois", F, [4, 4]), ("bi", I32, [4])],
              [("y", F)], opset)
    x = rand([2, 3, 10, 12], 0)
    rois = np.array([[0.5, 1.2, 7.3, 8.8], [2, 2, 2.5, 2.2], [-2, -1, 14, 13], [3, 1, 9, 4]],
                    np.float32)
    bi = np.array([0, 1, 1, 0], np.int32)
    y = reference(m, {"x": x, "rois": rois, "bi": bi})["y"]
    want = numpy_roi_align(x, rois, bi, 3, 4, ratio, 0.8, mode == 1, aligned == 1)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_roi_align_half_pixel_below_opset_16_is_not_checkable():
    node = plugin("ROIAlign_TRT", ["x", "rois", "bi"], coordinate_transformation_mode=1)
    m = model([node], [("x", F, [1, 3, 8, 8]), ("rois", F, [2, 4]), ("bi", I32, [2])],
              [("y", F)], 13)
    assert not_checkable(m) == [
        "ROIAlign_TRT (trt.plugins): RoiAlign with coordinate_transformation_mode=1 "
        "(half_pixel) needs ONNX opset >= 16, the model imports 13: convert it first "
        "(graphfix run --passes opset{version=16})"]


# ----------------------------------------------------------------------------- convolution


def dcn_case(seed, n, c, hw, cout, k, stride, pad, dil, group, dg, bias):
    rng = np.random.default_rng(seed)
    ho = (hw[0] + 2 * pad - dil * (k - 1) - 1) // stride + 1
    wo = (hw[1] + 2 * pad - dil * (k - 1) - 1) // stride + 1
    feeds = {"x": rng.standard_normal((n, c, *hw)).astype(np.float32),
             "off": (rng.standard_normal((n, 2 * dg * k * k, ho, wo)) * 2).astype(np.float32),
             "mask": rng.random((n, dg * k * k, ho, wo)).astype(np.float32),
             "w": rng.standard_normal((cout, c // group, k, k)).astype(np.float32)}
    if bias:
        feeds["b"] = rng.standard_normal(cout).astype(np.float32)
    return feeds


def numpy_modulated_deform_conv(x, off, mask, w, b, stride, pad, dil, group, dg):
    """modulatedDeformConvPluginKernel.cu, transcribed: im2col of masked bilinear samples
    (0 outside (-1, H) x (-1, W)), then one matrix product per group, then bias."""
    n, c, height, width = x.shape
    cout, _, kh, kw = w.shape
    ho, wo = off.shape[2:]
    cols = np.zeros((n, c, kh, kw, ho, wo), np.float64)
    for b_, ci, i, j, oy, ox in np.ndindex(n, c, kh, kw, ho, wo):
        g, tap = ci // (c // dg), i * kw + j
        h = oy * stride - pad + i * dil + off[b_, g * 2 * kh * kw + 2 * tap, oy, ox]
        v = ox * stride - pad + j * dil + off[b_, g * 2 * kh * kw + 2 * tap + 1, oy, ox]
        if h <= -1 or h >= height or v <= -1 or v >= width:
            continue
        h0, v0 = int(np.floor(h)), int(np.floor(v))
        lh, lv = h - h0, v - v0
        val = 0.0
        for dy, dx, wt in ((0, 0, (1 - lh) * (1 - lv)), (0, 1, (1 - lh) * lv),
                           (1, 0, lh * (1 - lv)), (1, 1, lh * lv)):
            yy, xx = h0 + dy, v0 + dx
            if 0 <= yy < height and 0 <= xx < width:
                val += wt * x[b_, ci, yy, xx]
        cols[b_, ci, i, j, oy, ox] = val * mask[b_, g * kh * kw + tap, oy, ox]
    out = np.zeros((n, cout, ho, wo))
    cin, cog = c // group, cout // group
    for g in range(group):
        wg = w[g * cog:(g + 1) * cog].reshape(cog, -1)
        cg = cols[:, g * cin:(g + 1) * cin].reshape(n, cin * kh * kw, ho * wo)
        out[:, g * cog:(g + 1) * cog] = np.einsum("ok,nkp->nop", wg, cg).reshape(n, cog, ho, wo)
    return out + (b.reshape(1, -1, 1, 1) if b is not None else 0)


@pytest.mark.parametrize("stride, pad, dil, group, dg, bias", [
    (1, 1, 1, 1, 1, True),
    (2, 1, 1, 2, 2, False),
    (1, 2, 2, 2, 2, True),
])
def test_modulated_deform_conv(stride, pad, dil, group, dg, bias):
    feeds = dcn_case(0, 2, 4, (6, 7), 6, 3, stride, pad, dil, group, dg, bias)
    inputs = ["x", "off", "mask", "w"] + (["b"] if bias else [])
    node = plugin("ModulatedDeformConv2d", inputs, stride=[stride] * 2, padding=[pad] * 2,
                  dilation=[dil] * 2, group=group, deformable_group=dg, plugin_version="2")
    m = model([node], [(k, F, v.shape) for k, v in feeds.items()], [("y", F)], 19)
    assert ops_after(m) == ["DeformConv"]
    y = reference(m, feeds)["y"]
    want = numpy_modulated_deform_conv(feeds["x"], feeds["off"], feeds["mask"], feeds["w"],
                                       feeds.get("b"), stride, pad, dil, group, dg)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    standard = references.substitute(m).model  # the onnx package's own DeformConv agrees
    np.testing.assert_allclose(y, ReferenceEvaluator(standard).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_modulated_deform_conv_below_opset_19_runs_the_numpy_kernel():
    """No DeformConv before opset 19: the check computes the plugin with plugins.deform's
    kernel, which agrees with the plugin kernel's transcription."""
    feeds = dcn_case(1, 1, 4, (5, 6), 4, 3, 1, 1, 1, 2, 2, True)
    node = plugin("ModulatedDeformConv2d", ["x", "off", "mask", "w", "b"], stride=[1, 1],
                  padding=[1, 1], dilation=[1, 1], group=2, deformable_group=2,
                  plugin_version="2")
    m = model([node], [(k, F, v.shape) for k, v in feeds.items()], [("y", F)], 17)
    sub = references.substitute(m)
    assert sub.replaced == ["ModulatedDeformConv2d 'modulateddeformconv2d' -> numpy kernel"]
    assert sub.not_checkable == []
    y = references.run(sub, feeds)["y"]
    want = numpy_modulated_deform_conv(feeds["x"], feeds["off"], feeds["mask"], feeds["w"],
                                       feeds["b"], 1, 1, 1, 2, 2)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset, attrs, why", [
    (19, {"stride": [2, 1]}, "asymmetric {'stride': [2, 1], 'padding': [0, 0], 'dilation': "
                             "[1, 1]}: the plugin reads these as [W, H], TensorRT's DeformConv "
                             "importer passes [H, W]"),
    (19, {"deformable_group": None}, "ModulatedDeformConv2d requires the attributes "
                                     "deformable_group (its creator fails without them)"),
])
def test_modulated_deform_conv_refusals(opset, attrs, why):
    full = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "group": 1,
            "deformable_group": 1, **attrs}
    node = plugin("ModulatedDeformConv2d", ["x", "off", "mask", "w"],
                  **{k: v for k, v in full.items() if v is not None})
    m = model([node], [("x", F, [1, 2, 5, 5])], [("y", F)], opset)
    assert not_checkable(m) == [f"ModulatedDeformConv2d (trt.plugins): {why}"]


# ----------------------------------------------------------------------------- elementwise


@pytest.mark.parametrize("opset, elem, dtype, expected", [
    (17, F, np.float32, ["CastLike", "CastLike", "Clip"]),
    (13, F, np.float32, ["Clip"]),
    (9, F, np.float32, ["Clip"]),
    (17, I32, np.int32, ["CastLike", "CastLike", "Clip"]),
])
def test_clip_trt(opset, elem, dtype, expected):
    m = model([plugin("Clip_TRT", ["x"], clipMin=-2.7, clipMax=3.9)], [("x", elem, [3, 40])],
              [("y", elem)], opset)
    assert ops_after(m) == expected
    x = (rand([3, 40], 0) * 5).astype(dtype)
    low, high = (np.float32(-2.7), np.float32(3.9)) if dtype == np.float32 else (-2, 3)
    t = np.where(x > low, x, low)  # the plugin's kernel, bounds truncated for int32
    want = np.where(t < high, t, high).astype(dtype)
    np.testing.assert_array_equal(reference(m, {"x": x})["y"], want)


def test_leaky_relu_trt_and_its_refusal():
    m = model([plugin("LReLU_TRT", ["x"], negSlope=0.15)], [("x", F, [4, 9])], [("y", F)])
    x = rand([4, 9], 3)
    np.testing.assert_array_equal(reference(m, {"x": x})["y"],
                                  np.where(x > 0, x, x * np.float32(0.15)))
    bad = model([plugin("LReLU_TRT", ["x"], negSlope=-0.1)], [("x", F, [4, 9])], [("y", F)])
    assert not_checkable(bad) == ["LReLU_TRT (trt.plugins): the plugin rejects negSlope -0.1 "
                                  "(must be >= 0)"]


def numpy_gelu(u):
    u = u.astype(np.float64)
    return u * (0.5 + 0.5 * np.tanh(u * (0.035677408136300125 * u * u + 0.7978845608028654)))


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("with_bias", [True, False])
def test_custom_gelu_plugin(opset, with_bias):
    bias = rand([6], 7)
    attrs = {"type_id": 0, **({"bias": bias.tolist()} if with_bias else {})}
    # [2, 6, 1, 1]: the plugin adds the bias over [-1, 6], not on the last axis
    m = model([plugin("CustomGeluPluginDynamic", ["x"], **attrs)], [("x", F, [2, 6, 1, 1])],
              [("y", F)], opset)
    assert ("Gelu" in ops_after(m)) == (opset >= 20)
    x = rand([2, 6, 1, 1], 4, scale=2.0)
    u = (x.reshape(-1, 6) + bias).reshape(x.shape) if with_bias else x
    y = reference(m, {"x": x})["y"]
    assert y.shape == x.shape
    np.testing.assert_allclose(y, numpy_gelu(u), rtol=1e-5, atol=1e-6)


def test_custom_gelu_plugin_float16_and_its_refusals():
    half_bias = numpy_helper.from_array(rand([4], 1, np.float16), "bias")
    m = model([plugin("CustomGeluPluginDynamic", ["x"], type_id=1, bias=half_bias)],
              [("x", F16, [3, 4])], [("y", F16)], 17)
    x = rand([3, 4], 2, np.float16)
    y = reference(m, {"x": x})["y"]
    want = numpy_gelu(x.astype(np.float32) + numpy_helper.to_array(half_bias).astype(np.float32))
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, want, rtol=5e-3, atol=5e-3)
    wrong = model([plugin("CustomGeluPluginDynamic", ["x"], type_id=0, bias=half_bias)],
                  [("x", F, [3, 4])], [("y", F)], 17)
    assert not_checkable(wrong) == ["CustomGeluPluginDynamic (trt.plugins): a float16 bias of 4 "
                                    "values with type_id 0 is not what the plugin reads"]
    int8 = model([plugin("CustomGeluPluginDynamic", ["x"], type_id=2)], [("x", F, [3, 4])],
                 [("y", F)], 17)
    assert "type_id 2" in not_checkable(int8)[0]


# ----------------------------------------------------------------------------- layout


@pytest.mark.parametrize("scale, opset", [(2.0, 17), (2.0, 11), (1.5, 13), (0.5, 17)])
def test_resize_nearest_trt(scale, opset):
    m = model([plugin("ResizeNearest_TRT", ["x"], scale=scale)], [("x", F, [2, 3, 5, 7])],
              [("y", F)], opset)
    x = rand([2, 3, 5, 7], 5)
    s = np.float32(scale)
    rows = [int(np.float32(o) / s) for o in range(int(np.float32(5) * s))]
    cols = [int(np.float32(o) / s) for o in range(int(np.float32(7) * s))]
    np.testing.assert_array_equal(reference(m, {"x": x})["y"], x[:, :, rows][:, :, :, cols])


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_plugin(opset):
    node = plugin("Split", ["x"], ["a", "b", "c"], axis=1, split=[1, 3, 2])
    m = model([node], [("x", F, [2, 6, 3])], [("a", F), ("b", F), ("c", F)], opset)
    x = rand([2, 6, 3], 6)
    out = reference(m, {"x": x})
    for name, part in zip("abc", np.split(x, [1, 4], axis=1), strict=True):
        np.testing.assert_array_equal(out[name], part)
    missing = model([plugin("Split", ["x"], ["a", "b"], axis=1)], [("x", F, [2, 6, 3])],
                    [("a", F), ("b", F)], opset)
    assert "split (or output_lengths)" in not_checkable(missing)[0]


@pytest.mark.parametrize("axis, shapes, out", [
    (1, [[2, 3, 4, 5], [2, 8, 2, 2], [2, 1, 1, 1]], [2, 93, 1, 1]),
    (2, [[2, 1, 3, 4], [2, 1, 5, 4]], [2, 1, 32, 1]),
    (3, [[3, 1, 1, 4], [3, 1, 1, 7]], [3, 1, 1, 11]),
])
def test_flatten_concat_trt(axis, shapes, out):
    names = [f"x{i}" for i in range(len(shapes))]
    m = model([plugin("FlattenConcat_TRT", names, axis=axis, ignoreBatch=0)],
              [(n, F, s) for n, s in zip(names, shapes, strict=True)], [("y", F)])
    feeds = {n: rand(s, i) for i, (n, s) in enumerate(zip(names, shapes, strict=True))}
    y = reference(m, feeds)["y"]
    want = np.concatenate([v.reshape(len(v), -1) for v in feeds.values()], axis=1)
    assert list(y.shape) == out
    np.testing.assert_array_equal(y.reshape(len(y), -1), want)


def numpy_reorg(x, s):
    """reorgForward.cu, transcribed index by index (darknet's reorg, forward=0)."""
    n, c, h, w = x.shape
    c_out, flat, out = c // (s * s), x.ravel(), np.empty(x.size, x.dtype)
    for index in range(x.size):
        i, ow = divmod(index, w)
        i, oh = divmod(i, h)
        on, oc = divmod(i, c)
        offset, ic = divmod(oc, c_out)
        ph, pw = divmod(offset, s)
        out[index] = flat[(ow * s + pw) + w * s * ((oh * s + ph) + h * s * (ic + c_out * on))]
    return out.reshape(n, c * s * s, h // s, w // s)


def test_reorg_trt_stride_2_is_the_readme_example_not_space_to_depth():
    m = model([plugin("Reorg_TRT", ["x"], stride=2, plugin_version="2")],
              [("x", F, [2, 4, 6, 6])], [("y", F)])
    assert ops_after(m) == ["Shape", "Slice", "Slice", "Concat", "Reshape", "Transpose",
                            "Div", "Div", "Concat", "Reshape"]
    x = np.arange(2 * 4 * 6 * 6, dtype=np.float32).reshape(2, 4, 6, 6)
    y = reference(m, {"x": x})["y"]
    assert y.shape == (2, 16, 3, 3)
    np.testing.assert_array_equal(y[0, 0], [[0, 2, 4], [6, 8, 10], [24, 26, 28]])  # README
    np.testing.assert_array_equal(y[0, 4], [[1, 3, 5], [7, 9, 11], [25, 27, 29]])
    np.testing.assert_array_equal(y, numpy_reorg(x, 2))
    space_to_depth = model([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)],
                           [("x", F, [2, 4, 6, 6])], [("y", F)])
    assert not np.array_equal(ort_run(space_to_depth, {"x": x})[0], y)


def test_reorg_trt_stride_3():
    m = model([plugin("Reorg_TRT", ["x"], stride=3, plugin_version="1")],
              [("x", F, [1, 18, 6, 9])], [("y", F)])
    x = rand([1, 18, 6, 9], 8)
    np.testing.assert_array_equal(reference(m, {"x": x})["y"], numpy_reorg(x, 3))
