"""Plugin -> standard ONNX: one `build(node, opset) -> Decomposition` per TensorRT plugin.

Each form computes what the plugin's kernel computes (NVIDIA/TensorRT `plugin/`, read at
v10.16 for the plugins removed in 11.0 and at v11.1 for the others), writes the plugin
node's own output names, and is used twice: by the pass `migrate-plugins`, which replaces
deprecated or removed plugins with it, and as the plugin's reference form for the numerical
check (`REFERENCES`, loaded by `graphfix.runtime.references`). A node whose attributes have
no standard equivalent raises `Unavailable` with the reason; the corners a form does not
reproduce are in its docstring. `plugin_version` and `plugin_namespace` are ignored.

    InstanceNormalization_TRT -> InstanceNormalization [-> LeakyRelu]
    GroupNormalizationPlugin  -> GroupNormalization (opset >= 21) | Reshape, InstanceNormalization,
                                 Reshape, Mul, Add, Reshape
    ScatterND (plugin)        -> Cast(indices, INT64), ScatterND
    ROIAlign_TRT              -> Cast(batch_indices, INT64), RoiAlign
    ModulatedDeformConv2d     -> DeformConv (opset >= 19)
    Clip_TRT / LReLU_TRT      -> Clip / LeakyRelu
    ResizeNearest_TRT         -> Resize(nearest, asymmetric, floor)
    Split (plugin)            -> Split
    FlattenConcat_TRT         -> Flatten per input, Concat, Reshape
    Reorg_TRT                 -> Reshape, Transpose, Reshape (darknet order, not SpaceToDepth)
    CustomGeluPluginDynamic   -> [Reshape, Add bias,] Gelu(tanh) (opset >= 20) | its formula

Legacy IPluginV2/IPluginV2Ext plugins (Clip, LReLU, ResizeNearest, FlattenConcat, Reorg v1)
see each tensor without its batch dimension and run once per batch item (TensorRT's
`getOutputDimensions` contract for non-dynamic plugins), so their forms treat dim 0 as batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphfix.plugins.deform import plugin_kernel, plugin_params
from graphfix.plugins.native_common import (
    emitter_for,
    inputs_of,
    require,
    require_opset,
    scalar_attrs,
)
from graphfix.plugins.native_layout import flatten_concat, reorg, resize_nearest, split
from graphfix.runtime.references import (
    PLUGIN_DOMAIN,
    Decompose,
    Decomposition,
    Kernel,
    Registration,
    Unavailable,
    attributes,
)

FLOAT, FLOAT16, INT64 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64


# ----------------------------------------------------------------------------- normalization


def instance_norm(node: onnx.NodeProto, opset: int) -> Decomposition:
    """InstanceNormalization_TRT(x) -> InstanceNormalization(x, scales, bias, epsilon)
    [-> LeakyRelu(alpha)], as the plugin's creator reads its fields: epsilon FLOAT (default 0),
    scales and bias FLOATS or a FLOAT/FLOAT16 TENSOR (per channel, required), relu INT (the
    activation runs when relu > 0), alpha FLOAT (slope below 0, default 0: a plain ReLU).
    The plugin computes in float32 for float16 data too; from opset 15 so does this form
    (Cast in, CastLike back)."""
    attrs = attributes(node)
    scales, bias = (np.asarray(attrs.get(k, ()), np.float32).ravel() for k in ("scales", "bias"))
    if scales.size == 0 or scales.size != bias.size or len(node.input) != 1:
        raise Unavailable(f"needs one input and scales and bias of one length "
                          f"(got {scales.size} and {bias.size})")
    y = node.output[0]
    inits = [numpy_helper.from_array(scales, f"{y}_gf_scales"),
             numpy_helper.from_array(bias, f"{y}_gf_bias")]
    steps: list[tuple[str, list[str], dict[str, Any]]] = []
    if opset >= 15:
        steps.append(("Cast", [], {"to": FLOAT}))
    steps.append(("InstanceNormalization", [inits[0].name, inits[1].name],
                  {"epsilon": float(attrs.get("epsilon", 0.0))}))
    if int(attrs.get("relu", 0)) > 0:
        steps.append(("LeakyRelu", [], {"alpha": float(attrs.get("alpha", 0.0))}))
    if opset >= 15:
        steps.append(("CastLike", [node.input[0]], {}))
    nodes, src = [], node.input[0]
    for i, (op, extra, kw) in enumerate(steps):
        dst = y if i == len(steps) - 1 else f"{y}_gf_{op.lower()}"
        nodes.append(helper.make_node(op, [src, *extra], [dst], name=f"{node.name}/{op}", **kw))
        src = dst
    return Decomposition(nodes, inits)


def group_norm(node: onnx.NodeProto, opset: int) -> Decomposition:
    """GroupNormalizationPlugin(x [N,C,...], scale [C], bias [C]) {eps FLOAT = 1e-5,
    num_groups INT = 1}: cuDNN batch norm over the view (1, N*G, C/G, spatial), i.e. mean
    and biased variance per (n, group), then `scale[c] * x + bias[c]`; float32 only.
    Opset >= 21: GroupNormalization (per-channel scale and bias). Below: x as [N, G, -1]
    through InstanceNormalization (unit scale, zero bias), back to [N, C, -1], Mul, Add, and
    back to x's shape. The creator rejects eps <= 0 and num_groups <= 0; C not divisible
    by num_groups is garbage in the plugin and a Reshape error here."""
    x, scale, bias = inputs_of(node, (3,))
    attrs = scalar_attrs(node)
    eps, groups = float(attrs.get("eps", 1e-5)), int(attrs.get("num_groups", 1))
    if eps <= 0 or groups <= 0:
        raise Unavailable(f"the plugin rejects eps {eps:g} / num_groups {groups} "
                          "(both must be > 0)")
    em = emitter_for(node, opset)
    if opset >= 21:
        em.op("GroupNormalization", [x, scale, bias], node.output[0], epsilon=eps,
              num_groups=groups)
        return em.decomposition()
    require_opset(opset, 10, "the InstanceNormalization form of GroupNormalizationPlugin")
    grouped = em.op("Reshape", [x, em.const([0, groups, -1])])
    normed = em.op("InstanceNormalization", [grouped, em.const(np.ones(groups), np.float32),
                                             em.const(np.zeros(groups), np.float32)],
                   epsilon=eps)
    shape = em.op("Shape", [x])
    channels = em.op("Concat", [em.op("Slice", [shape, em.const([0]), em.const([2])]),
                                em.const([-1])], axis=0)
    scaled = em.op("Mul", [em.op("Reshape", [normed, channels]),
                           em.op("Reshape", [scale, em.const([-1, 1])])])
    shifted = em.op("Add", [scaled, em.op("Reshape", [bias, em.const([-1, 1])])])
    em.op("Reshape", [shifted, shape], node.output[0])
    return em.decomposition()


# ----------------------------------------------------------------------------- indexing


def scatter_nd(node: onnx.NodeProto, opset: int) -> Decomposition:
    """ScatterND plugin (data float32|int32, indices int32, updates): a copy of data with
    rows written at the indices, reduction none: ONNX ScatterND with indices cast to INT64.
    Not reproduced: negative or out-of-range indices (the plugin writes outside the tensor,
    ONNX wraps negatives or fails) and the order of duplicate indices (racy in the plugin,
    undefined in ONNX)."""
    require_opset(opset, 11, "ScatterND")
    data, indices, updates = inputs_of(node, (3,))
    em = emitter_for(node, opset)
    em.op("ScatterND", [data, em.op("Cast", [indices], to=INT64), updates], node.output[0])
    return em.decomposition()


def roi_align(node: onnx.NodeProto, opset: int) -> Decomposition:
    """ROIAlign_TRT v1/v2(X, rois [R,4], batch_indices [R] int32) {coordinate_transformation_mode
    INT = 1 (1 half_pixel, 0 output_half_pixel), mode INT = 1 (1 avg, 0 max), output_height,
    output_width INT = 1, sampling_ratio INT = 0 (adaptive), spatial_scale FLOAT = 1}.
    roiAlignKernel.cu is onnxruntime's RoiAlign ported to CUDA (out-of-map samples are 0,
    malformed ROIs forced to 1x1 without half_pixel, max mode = max over the weighted
    corners), so the form is ONNX RoiAlign with the indices cast to INT64. half_pixel needs
    RoiAlign-16: below opset 16 such a node is Unavailable (a form cannot raise the model's
    opset; the `opset` pass can). Not reproduced: a zero-size ROI with half_pixel and avg,
    where the plugin divides 0 by 0 (NaN) and onnxruntime gives 0; float16 data, which the
    plugin computes in half precision."""
    require_opset(opset, 10, "RoiAlign")
    x, rois, batch = inputs_of(node, (3,))
    a = scalar_attrs(node)
    aligned, mode = int(a.get("coordinate_transformation_mode", 1)), int(a.get("mode", 1))
    height, width = int(a.get("output_height", 1)), int(a.get("output_width", 1))
    ratio, scale = int(a.get("sampling_ratio", 0)), float(a.get("spatial_scale", 1.0))
    if aligned not in (0, 1) or mode not in (0, 1) or min(height, width) <= 0 or ratio < 0 \
            or scale <= 0:
        raise Unavailable("the plugin rejects these attribute values")
    if aligned:
        require_opset(opset, 16, "RoiAlign with coordinate_transformation_mode=1 (half_pixel)")
    kw: dict[str, Any] = {"mode": "avg" if mode else "max", "output_height": height,
                          "output_width": width, "sampling_ratio": ratio,
                          "spatial_scale": scale}
    if opset >= 16:
        kw["coordinate_transformation_mode"] = "half_pixel" if aligned else "output_half_pixel"
    em = emitter_for(node, opset)
    em.op("RoiAlign", [x, rois, em.op("Cast", [batch], to=INT64)], node.output[0], **kw)
    return em.decomposition()


# ----------------------------------------------------------------------------- convolution


def deform_conv(node: onnx.NodeProto, opset: int) -> Decomposition:
    """ModulatedDeformConv2d v1/v2(x, offset, mask, weight [, bias]) {stride, padding,
    dilation INTS[2], group, deformable_group INT; all five required} -> DeformConv(x, weight,
    offset, bias, mask) (opset 19): DCNv2 as in mmcv, offsets (dy, dx) per kernel tap and
    deformable group, bilinear samples outside (-1, H) x (-1, W) are 0, times the mask.
    The kernel launcher reads stride/padding/dilation as [W, H] while TensorRT's ONNX
    DeformConv importer passes ONNX's [H, W] to this same plugin, so an asymmetric value
    cannot keep the plugin's numbers in both onnxruntime and TensorRT: Unavailable. Below
    opset 19 the check computes it with `plugins.deform`'s numpy kernel instead."""
    inputs = inputs_of(node, (4, 5))
    params = plugin_params(attributes(node), node.op_type)
    require_opset(opset, 19, "DeformConv")  # below 19 the check uses deform.plugin_kernel
    x, offset, mask, weight = inputs[:4]
    bias = inputs[4] if len(inputs) == 5 else ""
    em = emitter_for(node, opset)
    em.op("DeformConv", [x, weight, offset, bias, mask], node.output[0], **params)
    return em.decomposition()


# ----------------------------------------------------------------------------- elementwise


def clip(node: onnx.NodeProto, opset: int) -> Decomposition:
    """Clip_TRT {clipMin, clipMax FLOAT, required}: `t = x > min ? x : min; t < max ? t :
    max`, compared in float32 for float/half data and in int32 (bounds truncated) for int32.
    -> Clip(x, CastLike(min, x), CastLike(max, x)) (opset 15; float32 bounds for opsets
    11-14, the min/max attributes below). Not reproduced: NaN inputs (the plugin writes
    clipMin) and, for float16, an x strictly between a bound and its float16 rounding (the
    plugin compares with the float32 bound)."""
    inputs_of(node, (1,))
    a = scalar_attrs(node)
    require(a, ("clipMin", "clipMax"), node.op_type)
    low, high = float(a["clipMin"]), float(a["clipMax"])
    em, x = emitter_for(node, opset), node.input[0]
    if opset < 11:
        em.op("Clip", [x], node.output[0], min=low, max=high)
        return em.decomposition()
    bounds = [em.const(v, np.float32, "bound") for v in (low, high)]
    if opset >= 15:
        bounds = [em.op("CastLike", [b, x]) for b in bounds]
    em.op("Clip", [x, *bounds], node.output[0])
    return em.decomposition()


def leaky_relu(node: onnx.NodeProto, opset: int) -> Decomposition:
    """LReLU_TRT {negSlope FLOAT, required, >= 0}: `x > 0 ? x : x * negSlope` (float32)
    -> LeakyRelu(alpha=negSlope), the same at 0 and for NaN."""
    inputs_of(node, (1,))
    a = scalar_attrs(node)
    require(a, ("negSlope",), node.op_type)
    slope = float(a["negSlope"])
    if slope < 0:
        raise Unavailable(f"the plugin rejects negSlope {slope:g} (must be >= 0)")
    em = emitter_for(node, opset)
    em.op("LeakyRelu", [node.input[0]], node.output[0], alpha=slope)
    return em.decomposition()


def gelu(node: onnx.NodeProto, opset: int) -> Decomposition:
    """CustomGeluPluginDynamic(x) {type_id INT: 0 float32, 1 float16; bias FLOATS or TENSOR,
    optional}: `u = x (+ bias); u * (0.5 + 0.5 * tanh(u * (0.0356774 * u * u +
    0.7978846)))`, the tanh approximation. The bias is added over the flat tensor seen as
    [-1, len(bias)] (not broadcast on the last axis), so the form reshapes to that, adds,
    and reshapes back. Opset >= 20: Gelu(approximate="tanh"), else the formula in the
    plugin's order with constants of type_id's type. Unavailable: other type_ids (the
    plugin has no kernel) and a bias whose element size differs from type_id's (the plugin
    copies the bytes as type_id's type). float16 rounds per op here, per half2 op there."""
    inputs_of(node, (1,))
    a = scalar_attrs(node)
    require(a, ("type_id",), node.op_type)
    dtype = {0: np.float32, 1: np.float16}.get(int(a["type_id"]))
    if dtype is None:
        raise Unavailable(f"type_id {a['type_id']}: the plugin runs float32 (0) and float16 (1)")
    em, x, y = emitter_for(node, opset), node.input[0], node.output[0]
    src = x
    if "bias" in a:
        bias = np.asarray(a["bias"]) if isinstance(a["bias"], np.ndarray) \
            else np.asarray(a["bias"], np.float32)
        bias = bias.ravel()
        if bias.size == 0 or bias.dtype.itemsize != np.dtype(dtype).itemsize:
            raise Unavailable(f"a {bias.dtype} bias of {bias.size} values with type_id "
                              f"{a['type_id']} is not what the plugin reads")
        rows = em.op("Reshape", [x, em.const([-1, bias.size])])
        src = em.op("Add", [rows, em.const(bias.astype(dtype), dtype, "bias")])
    out = em.fresh("gelu") if src != x else y
    if opset >= 20:
        em.op("Gelu", [src], out, approximate="tanh")
    else:
        def k(value: float) -> str:
            return em.const(value, dtype, "k")
        inner = em.op("Add", [em.op("Mul", [em.op("Mul", [src, src]), k(0.035677408136300125)]),
                              k(0.7978845608028654)])
        cdf = em.op("Add", [em.op("Mul", [em.op("Tanh", [em.op("Mul", [src, inner])]), k(0.5)]),
                            k(0.5)])
        em.op("Mul", [src, cdf], out)
    if src != x:
        em.op("Reshape", [out, em.op("Shape", [x])], y)
    return em.decomposition()


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Migration:
    """A plugin's standard-ONNX form: the plugin `versions` it covers, what it becomes
    (`native`, for reports), and `build`."""

    op_type: str
    versions: tuple[str, ...]
    native: str
    build: Callable[[onnx.NodeProto, int], Decomposition]
    fallback: Kernel | None = None  # the check's numpy form where build needs a newer opset


MIGRATIONS: tuple[Migration, ...] = (
    Migration("InstanceNormalization_TRT", ("1", "2", "3"), "InstanceNormalization",
              instance_norm),
    Migration("GroupNormalizationPlugin", ("1",),
              "GroupNormalization (its InstanceNormalization form below opset 21)", group_norm),
    Migration("ScatterND", ("1",), "ScatterND", scatter_nd),
    Migration("ROIAlign_TRT", ("1", "2"), "RoiAlign", roi_align),
    Migration("ModulatedDeformConv2d", ("1", "2"), "DeformConv", deform_conv,
              Kernel(plugin_kernel)),
    Migration("Clip_TRT", ("1",), "Clip", clip),
    Migration("LReLU_TRT", ("1",), "LeakyRelu", leaky_relu),
    Migration("ResizeNearest_TRT", ("1",), "Resize", resize_nearest),
    Migration("Split", ("1",), "Split", split),
    Migration("FlattenConcat_TRT", ("1",), "Flatten + Concat", flatten_concat),
    Migration("Reorg_TRT", ("1", "2"), "Reshape + Transpose", reorg),
    Migration("CustomGeluPluginDynamic", ("1",), "Gelu tanh (its formula below opset 20)", gelu),
)


def migration_for(op_type: str, plugin_version: str = "1") -> Migration | None:
    """The standard-ONNX form of plugin `op_type` at `plugin_version`, or None."""
    return next((m for m in MIGRATIONS
                 if m.op_type == op_type and plugin_version in m.versions), None)


REFERENCES: tuple[Registration, ...] = tuple(
    Registration(PLUGIN_DOMAIN, m.op_type, Decompose(m.build, m.fallback), m.versions)
    for m in MIGRATIONS)
