"""onnx -> TensorRT plugin: the built-in rules of `substitute-plugins`.

Each rule is a `plugins.rules.Rule`; which target versions it is useful for comes from the
operator table (`native`), not from version numbers written here:

- `roialign-to-plugin`: ONNX RoiAlign -> ROIAlign_TRT (useful where the target's table does
  not list RoiAlign as supported: before 8.5). Attributes as the parser's own RoiAlign
  importer maps them (trt_plugins.json, ROIAlign_TRT): coordinate_transformation_mode
  "half_pixel" -> 1, anything else or RoiAlign-10 (no attribute) -> 0; mode avg -> 1,
  max -> 0. batch_indices stay INT64: TensorRT 10.1's parser casts INT64 inputs of
  ROIAlign_TRT to INT32 ("int32_only_plugins"); older parsers cast INT64 tensors down
  in general (parser notes); not verified on TensorRT here.
- `groupnorm-to-plugin`: ONNX GroupNormalization (opset 18: scale/bias per group, expanded
  to per channel; opset 21: per channel) -> GroupNormalizationPlugin(x, scale[C], bias[C];
  eps, num_groups). Useful where GroupNormalization is not supported (before 8.6).
- `decomposed-groupnorm-to-plugin`: the form PyTorch exports before opset 18,
  Reshape(x, [N, G, -1]) -> InstanceNormalization(ones, zeros) -> Reshape(back to x's
  shape) [-> Mul(gamma) -> Add(beta)], -> GroupNormalizationPlugin. Every op of it parses
  natively, so it is a speed choice, not needed to parse (`Rule.needed`).
- `scatternd-to-plugin`: ONNX ScatterND (reduction none) -> the legacy ScatterND plugin,
  indices cast to INT32 (the plugin's input type). Useful only where the table does not
  list ScatterND (8.0): from 8.2 the parser's builtin importer takes precedence over the
  plugin (trt_plugins.json).
- `deformconv-to-plugin`: ONNX DeformConv (opset 19) -> ModulatedDeformConv2d (useful
  before 10.1, where the parser has no DeformConv importer). Symmetric 2-D pads only; a
  missing mask becomes a constant of ones when the output shape is static.
- `mmcv-deformconv-to-plugin`: mmcv's `MMCVModulatedDeformConv2d` (domain "mmcv"; inputs
  x, offset, mask, weight[, bias]; stride, padding, dilation, groups, deform_groups)
  -> ModulatedDeformConv2d, on every version (no TensorRT parses that domain).
  Written from mmcv's export signature as documented in trt_plugins.json's note; not
  checked against an mmcv export here (mmcv is not installed).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph.rewire import constant_value
from graphfix.plugins.rules import Match, Replacement, Rule


def _only_reader(tensor: gs.Tensor, op: str) -> gs.Node | None:
    """The single node reading `tensor`, when it is an `op` and the tensor is no output."""
    readers = list(tensor.outputs)
    if len(readers) == 1 and readers[0].op == op and not getattr(tensor, "is_output", False):
        return readers[0]
    return None


def _const(graph_node: gs.Node, name: str, value: np.ndarray) -> gs.Constant:
    return gs.Constant(f"{graph_node.name or graph_node.outputs[0].name}_gf_{name}",
                       np.ascontiguousarray(value))


# ----------------------------------------------------------------------------- RoiAlign


def _roialign_rewrite(match: Match) -> Replacement:
    node = match.anchor
    attrs = node.attrs
    half = attrs.get("coordinate_transformation_mode", "output_half_pixel" if
                     match.captures["opset"] < 16 else "half_pixel")
    half = half.decode() if isinstance(half, bytes) else half
    mode = attrs.get("mode", "avg")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return Replacement(
        inputs=list(node.inputs[:3]), outputs=list(node.outputs),
        attributes={"coordinate_transformation_mode": 1 if half == "half_pixel" else 0,
                    "mode": 1 if mode == "avg" else 0,
                    "output_height": attrs.get("output_height", 1),
                    "output_width": attrs.get("output_width", 1),
                    "sampling_ratio": attrs.get("sampling_ratio", 0),
                    "spatial_scale": attrs.get("spatial_scale", 1.0)})


# ----------------------------------------------------------------------- GroupNormalization


def _groupnorm_check(match: Match) -> str | None:
    node = match.anchor
    if len(node.inputs) < 3:
        return "needs scale and bias inputs"
    x = node.inputs[0]
    if x.shape is not None and len(x.shape) != 4:
        return f"the plugin takes 4-D input [N, C, H, W]; this one is {len(x.shape)}-D"
    channels = x.shape[1] if x.shape is not None else None
    if match.captures["opset"] < 21:
        if not isinstance(channels, int):
            return "opset-18 scale/bias are per group; expanding them needs a static C"
        for t in node.inputs[1:3]:
            if constant_value(t) is None:
                return f"opset-18 {t.name} is per group and not a constant: cannot expand it"
    if int(node.attrs.get("stash_type", 1)) != 1:
        return "stash_type is not 1 (float32): the plugin computes in float32"
    return None


def _groupnorm_rewrite(match: Match) -> Replacement:
    node = match.anchor
    groups = int(node.attrs["num_groups"])
    scale, bias = node.inputs[1], node.inputs[2]
    if match.captures["opset"] < 21:  # per group -> per channel
        channels = int(node.inputs[0].shape[1])
        scale = _const(node, "scale", np.repeat(constant_value(scale).astype(np.float32),
                                                channels // groups))
        bias = _const(node, "bias", np.repeat(constant_value(bias).astype(np.float32),
                                              channels // groups))
    return Replacement(inputs=[node.inputs[0], scale, bias], outputs=list(node.outputs),
                       attributes={"eps": float(node.attrs.get("epsilon", 1e-5)),
                                   "num_groups": groups})


def _decomposed_groupnorm(anchor: gs.Node) -> Match | None:
    """InstanceNormalization between Reshape(x, [N, G, -1]) and Reshape(back) [-> Mul ->
    Add]; captures x, G, epsilon, gamma/beta per channel (None when absent)."""
    if len(anchor.inputs) != 3 or not anchor.inputs[0].inputs:
        return None
    first = anchor.inputs[0].inputs[0]
    if first.op != "Reshape" or len(anchor.inputs[0].outputs) != 1:
        return None
    target = constant_value(first.inputs[1])
    if target is None or target.size != 3 or target[2] != -1 or target[1] <= 0:
        return None
    second = _only_reader(anchor.outputs[0], "Reshape")
    if second is None:
        return None
    groups = int(target[1])
    match = Match([anchor, first, second], {"x": first.inputs[0], "groups": groups,
                                            "unit": anchor.inputs[1:3], "out": second})
    tail = second.outputs[0]
    for op, key in (("Mul", "gamma"), ("Add", "beta")):
        reader = _only_reader(tail, op)
        if reader is None:
            break
        other = [t for t in reader.inputs if t is not tail]
        value = constant_value(other[0]) if len(other) == 1 else None
        if value is None:
            break
        match.nodes.append(reader)
        match.captures[key] = value
        tail = reader.outputs[0]
    match.captures["out"] = tail
    return match


def _decomposed_check(match: Match) -> str | None:
    x, groups = match.captures["x"], match.captures["groups"]
    scale, bias = (constant_value(t) for t in match.captures["unit"])
    if scale is None or bias is None or not (np.all(scale == 1) and np.all(bias == 0)):
        return "the InstanceNormalization has its own scale/bias (not ones/zeros)"
    if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[1], int):
        return "x must be 4-D with a static channel count to size the plugin's scale/bias"
    channels = x.shape[1]
    if channels % groups:
        return f"C={channels} is not divisible by G={groups}"
    out = match.captures["out"]
    if out.shape is not None and x.shape is not None and len(out.shape) != len(x.shape):
        return "the second Reshape does not restore x's rank"
    for key in ("gamma", "beta"):
        value = match.captures.get(key)
        if value is not None and _per_channel(value, channels) is None:
            return f"the {key} constant (shape {value.shape}) is not per channel [C, 1, 1]"
    return None


def _per_channel(value: np.ndarray, channels: int) -> np.ndarray | None:
    shape = value.shape
    if value.size == 1:
        return np.full(channels, value.ravel()[0], np.float32)
    squeezed = [d for d in shape if d != 1]
    if squeezed != [channels] or len(shape) not in (3, 4) or shape[-1] != 1 or shape[-2] != 1:
        return None
    return value.reshape(channels).astype(np.float32)


def _decomposed_rewrite(match: Match) -> Replacement:
    anchor, x = match.anchor, match.captures["x"]
    channels = int(x.shape[1])
    gamma = match.captures.get("gamma")
    beta = match.captures.get("beta")
    scale = np.ones(channels, np.float32) if gamma is None else _per_channel(gamma, channels)
    bias = np.zeros(channels, np.float32) if beta is None else _per_channel(beta, channels)
    return Replacement(
        inputs=[x, _const(anchor, "scale", scale), _const(anchor, "bias", bias)],
        outputs=[match.captures["out"]],
        attributes={"eps": float(anchor.attrs.get("epsilon", 1e-5)),
                    "num_groups": match.captures["groups"]})


# ----------------------------------------------------------------------------- ScatterND


def _scatternd_check(match: Match) -> str | None:
    reduction = match.anchor.attrs.get("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction != "none":
        return f"reduction '{reduction}': the plugin only overwrites"
    return None


def _scatternd_rewrite(match: Match) -> Replacement:
    node = match.anchor
    data, indices, updates = node.inputs[:3]
    return Replacement(inputs=[data, indices, updates], outputs=list(node.outputs),
                       attributes={}, casts={} if indices.dtype == np.int32 else {1: np.int32})


# ----------------------------------------------------------------------------- DeformConv


def _deformconv_check(match: Match) -> str | None:
    node = match.anchor
    pads = list(node.attrs.get("pads", [0, 0, 0, 0]))
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        return f"pads {pads}: the plugin takes symmetric 2-D padding only"
    if len(node.inputs) < 5 or node.inputs[4].name == "":
        out = node.outputs[0].shape
        if out is None or not all(isinstance(d, int) for d in out):
            return "no mask input, and the output shape is not static to build one"
    return None


def _deformconv_rewrite(match: Match) -> Replacement:
    node = match.anchor
    x, weight, offset = node.inputs[:3]
    bias = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    mask = node.inputs[4] if len(node.inputs) > 4 and node.inputs[4].name else None
    kh, kw = (int(d) for d in (node.attrs.get("kernel_shape") or weight.shape[2:]))
    groups = int(node.attrs.get("offset_group", 1))
    if mask is None:
        n, _, h, w = node.outputs[0].shape
        mask = _const(node, "mask", np.ones((n, groups * kh * kw, h, w), np.float32))
    pads = list(node.attrs.get("pads", [0, 0, 0, 0]))
    inputs = [x, offset, mask, weight] + ([bias] if bias is not None else [])
    return Replacement(inputs=inputs, outputs=list(node.outputs), attributes={
        "stride": list(node.attrs.get("strides", [1, 1])), "padding": pads[:2],
        "dilation": list(node.attrs.get("dilations", [1, 1])),
        "group": int(node.attrs.get("group", 1)), "deformable_group": groups})


def _mmcv_rewrite(match: Match) -> Replacement:
    node = match.anchor
    attrs = node.attrs

    def pair(value, default):
        value = attrs.get(value, default)
        return [int(value)] * 2 if isinstance(value, int) else [int(v) for v in value]

    return Replacement(inputs=list(node.inputs), outputs=list(node.outputs), attributes={
        "stride": pair("stride", 1), "padding": pair("padding", 0),
        "dilation": pair("dilation", 1), "group": int(attrs.get("groups", 1)),
        "deformable_group": int(attrs.get("deform_groups", 1))})


def _mmcv_check(match: Match) -> str | None:
    if len(match.anchor.inputs) not in (4, 5):
        return (f"{len(match.anchor.inputs)} inputs; expected x, offset, mask, weight "
                "[, bias]")
    return None


def _single(node: gs.Node) -> Match:
    return Match([node])


def _with_opset(opset: int):
    def pattern(node: gs.Node) -> Match:
        return Match([node], {"opset": opset})
    return pattern


def builtin_rules(opset: int = 17) -> list[Rule]:
    """The built-in rules for a model of default-domain `opset` (attribute defaults and
    GroupNormalization's scale layout differ by opset)."""
    return [
        Rule("roialign-to-plugin", "ONNX RoiAlign -> ROIAlign_TRT", "ROIAlign_TRT", "RoiAlign",
             _with_opset(opset), _roialign_rewrite, native=("RoiAlign",)),
        Rule("groupnorm-to-plugin", "ONNX GroupNormalization -> GroupNormalizationPlugin",
             "GroupNormalizationPlugin", "GroupNormalization", _with_opset(opset),
             _groupnorm_rewrite, _groupnorm_check, native=("GroupNormalization",)),
        Rule("decomposed-groupnorm-to-plugin",
             "Reshape -> InstanceNormalization -> Reshape [-> Mul -> Add] (GroupNorm as "
             "exported before opset 18) -> GroupNormalizationPlugin",
             "GroupNormalizationPlugin", "InstanceNormalization", _decomposed_groupnorm,
             _decomposed_rewrite, _decomposed_check, native=("GroupNormalization",)),
        Rule("scatternd-to-plugin", "ONNX ScatterND (no reduction) -> ScatterND plugin",
             "ScatterND", "ScatterND", _single, _scatternd_rewrite, _scatternd_check,
             native=("ScatterND",)),
        Rule("deformconv-to-plugin", "ONNX DeformConv -> ModulatedDeformConv2d",
             "ModulatedDeformConv2d", "DeformConv", _single, _deformconv_rewrite,
             _deformconv_check, native=("DeformConv",)),
        Rule("mmcv-deformconv-to-plugin",
             "mmcv MMCVModulatedDeformConv2d -> ModulatedDeformConv2d",
             "ModulatedDeformConv2d", "MMCVModulatedDeformConv2d", _single, _mmcv_rewrite,
             _mmcv_check, domain="mmcv"),
    ]
