"""Deformable convolution in the forms exporters write, and one numpy kernel for all of them.

Three custom-domain forms reach graphfix besides ONNX DeformConv (opset 19) and TensorRT's
ModulatedDeformConv2d plugin. Their signatures were read from the exporters' sources and
seen in exports made with them (tests/plugins/data/export_deform.py):

- mmcv 2.x `mmcv::MMCVModulatedDeformConv2d(x, offset, mask, weight [, bias])` {stride,
  padding, dilation INTS [h, w]; groups, deform_groups INT} (DCNv2,
  mmcv/ops/modulated_deform_conv.py `symbolic`).
- mmcv 2.x `mmcv::MMCVDeformConv2d(x, offset, weight)` {the same, plus bias INT (always 0:
  mmcv refuses a bias) and im2col_step INT (a CUDA batching knob)} (DCNv1,
  mmcv/ops/deform_conv.py).
- torchvision `torchvision::deform_conv2d(input, weight, offset, mask, bias, stride_h,
  stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask)`: the op
  as torch's TorchScript exporter writes it with ONNX_FALLTHROUGH; the nine scalars are
  int64/bool Constant inputs, `mask` is ignored when use_mask is false and `bias` is always
  given (zeros when the layer has none). torch's dynamo exporter writes ONNX DeformConv
  instead (onnxscript's torchlib).

All of them compute what DeformConv computes: per output position and kernel tap, sample the
input bilinearly at the tap's place moved by its (dy, dx) offset (offsets interleaved per tap,
per offset group), with 0 for every neighbour outside the input (so 0 for a point outside
(-1, H) x (-1, W)), multiply by the mask (DCNv2), then convolve. Strides, pads and dilations
are [h, w] in every form above. The reference forms here let the numerical check run models
holding them: DeformConv from opset 19, this module's numpy kernel below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from graphfix.plugins.native_common import emitter_for, inputs_of, require, require_opset
from graphfix.runtime.references import (
    Decompose,
    Decomposition,
    Kernel,
    Registration,
    Unavailable,
    attributes,
)


def deform_conv2d(x: np.ndarray, weight: np.ndarray, offset: np.ndarray,
                  mask: np.ndarray | None = None, bias: np.ndarray | None = None, *,
                  strides: Sequence[int] = (1, 1), pads: Sequence[int] = (0, 0, 0, 0),
                  dilations: Sequence[int] = (1, 1), group: int = 1,
                  offset_group: int = 1) -> np.ndarray:
    """DeformConv's numbers in numpy: x [N, C, H, W], weight [M, C/group, kh, kw], offset
    [N, offset_group*kh*kw*2, oh, ow], mask [N, offset_group*kh*kw, oh, ow] or None (all
    ones), bias [M] or None; pads [top, left, bottom, right]. The output size comes from the
    offset, as in ONNX. Memory: one batch item's sampled columns at a time
    (C*kh*kw*oh*ow values)."""
    dtype = np.result_type(x.dtype, np.float32)
    n, c, height, width = x.shape
    m, _, kh, kw = weight.shape
    oh, ow = offset.shape[2:]
    taps = kh * kw
    if c % offset_group or c % group or m % group:
        raise ValueError(f"channels {c} / outputs {m} do not split into {group} groups and "
                         f"{offset_group} offset groups")
    tap_y, tap_x = np.divmod(np.arange(taps), kw)
    base_y = (np.arange(oh) * strides[0] - pads[0])[None, :, None] + (tap_y * dilations[0])[
        :, None, None]
    base_x = (np.arange(ow) * strides[1] - pads[1])[None, None, :] + (tap_x * dilations[1])[
        :, None, None]
    offsets = offset.reshape(n, offset_group, taps, 2, oh, ow).astype(dtype, copy=False)
    masks = None if mask is None else mask.reshape(n, offset_group, 1, taps, oh, ow)
    planes = x.reshape(n, offset_group, c // offset_group, height * width)
    kernel = weight.reshape(group, m // group, (c // group) * taps).astype(dtype, copy=False)
    out = np.empty((n, m, oh, ow), dtype)
    for b in range(n):
        y = base_y + offsets[b, :, :, 0]  # [offset_group, taps, oh, ow]
        xx = base_x + offsets[b, :, :, 1]
        y0, x0 = np.floor(y), np.floor(xx)
        fy, fx = y - y0, xx - x0
        y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
        cols = np.zeros((offset_group, c // offset_group, taps, oh, ow), dtype)
        for dy, dx, share in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx),
                              (1, 0, fy * (1 - fx)), (1, 1, fy * fx)):
            row, col = y0 + dy, x0 + dx
            inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
            flat = np.where(inside, row * width + col, 0).reshape(offset_group, 1, -1)
            picked = np.take_along_axis(planes[b], flat, axis=2)
            cols += picked.reshape(cols.shape) * np.where(inside, share, 0)[:, None]
        if masks is not None:
            cols *= masks[b]
        cols = cols.reshape(group, (c // group) * taps, oh * ow)
        out[b] = np.matmul(kernel, cols).reshape(m, oh, ow)
    if bias is not None:
        out += np.asarray(bias, dtype).reshape(1, m, 1, 1)
    return out.astype(x.dtype, copy=False)


def plugin_params(attrs: dict[str, Any], op_type: str) -> dict[str, Any]:
    """DeformConv's attributes from TensorRT's ModulatedDeformConv2d fields {stride,
    padding, dilation INTS[2], group, deformable_group INT; all five required}, or
    Unavailable: a field missing, not two values, not the same for height and width (see
    `native.deform_conv`), or a value the plugin rejects."""
    require(attrs, ("stride", "padding", "dilation", "group", "deformable_group"), op_type)
    pairs = {k: [int(v) for v in np.ravel(attrs[k])] for k in ("stride", "padding", "dilation")}
    if any(len(v) != 2 for v in pairs.values()):
        raise Unavailable("stride, padding and dilation must have 2 values each")
    if any(v[0] != v[1] for v in pairs.values()):
        raise Unavailable(f"asymmetric {pairs}: the plugin reads these as [W, H], TensorRT's "
                          "DeformConv importer passes [H, W]")
    (stride, _), (pad, _), (dilation, _) = (pairs[k] for k in ("stride", "padding", "dilation"))
    group = int(np.ravel(attrs["group"])[0])
    offset_group = int(np.ravel(attrs["deformable_group"])[0])
    if stride <= 0 or dilation <= 0 or pad < 0 or group <= 0 or offset_group <= 0:
        raise Unavailable("the plugin rejects these attribute values")
    return {"strides": [stride] * 2, "pads": [pad] * 4, "dilations": [dilation] * 2,
            "group": group, "offset_group": offset_group}


def plugin_kernel(inputs: list[Any], attrs: dict[str, Any]) -> list[np.ndarray]:
    """TensorRT's ModulatedDeformConv2d(x, offset, mask, weight [, bias]) where the model's
    opset has no DeformConv (`native.deform_conv` has refused what `plugin_params` does
    not take before this runs)."""
    x, offset, mask, weight = inputs[:4]
    bias = inputs[4] if len(inputs) > 4 else None
    return [deform_conv2d(x, weight, offset, mask, bias,
                          **plugin_params(attrs, "ModulatedDeformConv2d"))]


# ----------------------------------------------------------------------------- mmcv


def _pair(attrs: dict[str, Any], key: str, default: int) -> list[int]:
    value = attrs.get(key, default)
    values = [int(v) for v in np.ravel(value)]
    if len(values) == 1:
        values *= 2
    if len(values) != 2:
        raise Unavailable(f"{key} {values}: expected one value or two")
    return values


def mmcv_params(attrs: dict[str, Any]) -> dict[str, Any]:
    """DeformConv's attributes from an mmcv node's (either op): pads symmetric per axis."""
    pad = _pair(attrs, "padding", 0)
    params = {"strides": _pair(attrs, "stride", 1), "pads": pad + pad,
              "dilations": _pair(attrs, "dilation", 1),
              "group": int(np.ravel(attrs.get("groups", 1))[0]),
              "offset_group": int(np.ravel(attrs.get("deform_groups", 1))[0])}
    counts = params["strides"] + params["dilations"] + [params["group"], params["offset_group"]]
    if min(counts) <= 0 or min(pad) < 0:
        raise Unavailable(f"attribute values {params} are out of range")
    return params


def _mmcv_inputs(node: onnx.NodeProto) -> tuple[list[str], dict[str, Any]]:
    """(x, offset, mask or "", weight, bias or "") and the DeformConv attributes."""
    attrs = attributes(node)
    if node.op_type == "MMCVDeformConv2d":
        x, offset, weight = inputs_of(node, (3,))
        if int(np.ravel(attrs.get("bias", 0))[0]):
            raise Unavailable("bias=1: mmcv's DeformConv2d has no bias input")
        return [x, offset, "", weight, ""], mmcv_params(attrs)
    names = inputs_of(node, (4, 5))
    return names[:4] + [names[4] if len(names) == 5 else ""], mmcv_params(attrs)


def _mmcv_build(node: onnx.NodeProto, opset: int) -> Decomposition:
    (x, offset, mask, weight, bias), params = _mmcv_inputs(node)
    require_opset(opset, 19, "DeformConv")
    em = emitter_for(node, opset)
    em.op("DeformConv", [x, weight, offset, bias, mask] if mask else [x, weight, offset, bias],
          node.output[0], strides=params["strides"], pads=params["pads"],
          dilations=params["dilations"], group=params["group"],
          offset_group=params["offset_group"])
    return em.decomposition()


def _mmcv_modulated_kernel(inputs: list[Any], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, offset, mask, weight = inputs[:4]
    bias = inputs[4] if len(inputs) > 4 else None
    return [deform_conv2d(x, weight, offset, mask, bias, **mmcv_params(attrs))]


def _mmcv_plain_kernel(inputs: list[Any], attrs: dict[str, Any]) -> list[np.ndarray]:
    x, offset, weight = inputs[:3]
    return [deform_conv2d(x, weight, offset, **mmcv_params(attrs))]


# ----------------------------------------------------------------------------- torchvision

TORCHVISION_SCALARS = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
                       "groups", "offset_groups", "use_mask")


def torchvision_params(scalars: Sequence[Any]) -> tuple[dict[str, Any], bool]:
    """DeformConv's attributes and use_mask from the nine scalar inputs of
    torchvision::deform_conv2d, in schema order."""
    sh, sw, ph, pw, dh, dw, groups, offset_groups, use_mask = (
        np.asarray(v).ravel()[0].item() for v in scalars)
    return ({"strides": [int(sh), int(sw)], "pads": [int(ph), int(pw), int(ph), int(pw)],
             "dilations": [int(dh), int(dw)], "group": int(groups),
             "offset_group": int(offset_groups)}, bool(use_mask))


def _torchvision_kernel(inputs: list[Any], attrs: dict[str, Any]) -> list[np.ndarray]:
    if len(inputs) != 14:
        raise ValueError(f"torchvision::deform_conv2d takes 14 inputs, got {len(inputs)}")
    x, weight, offset, mask, bias = inputs[:5]
    params, use_mask = torchvision_params(inputs[5:])
    return [deform_conv2d(x, weight, offset, mask if use_mask else None, bias, **params)]


REFERENCES: tuple[Registration, ...] = (
    Registration("mmcv", "MMCVModulatedDeformConv2d",
                 Decompose(_mmcv_build, fallback=Kernel(_mmcv_modulated_kernel))),
    Registration("mmcv", "MMCVDeformConv2d",
                 Decompose(_mmcv_build, fallback=Kernel(_mmcv_plain_kernel))),
    Registration("torchvision", "deform_conv2d", Kernel(_torchvision_kernel)),
)
