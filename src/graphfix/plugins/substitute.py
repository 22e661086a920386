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
  before 10.1, where the parser has no DeformConv importer).
- `mmcv-deformconv-to-plugin` / `mmcv-dcnv1-to-plugin`: mmcv's `MMCVModulatedDeformConv2d`
  / `MMCVDeformConv2d` (domain "mmcv") -> ModulatedDeformConv2d, on every version (no
  TensorRT parses that domain). Tested on exports made by mmcv 2.2.0's own symbolics.
- `torchvision-deformconv-to-plugin`: `torchvision::deform_conv2d` as torch's TorchScript
  exporter writes it with ONNX_FALLTHROUGH (nine constant scalar inputs), on every version.
  torch's dynamo exporter writes ONNX DeformConv, which `deformconv-to-plugin` takes.

For all four (`plugins.deform` has the forms' semantics): the same value for height and
width of stride, padding and dilation, and symmetric pads (the plugin reads them as [W, H]
while TensorRT's DeformConv importer passes [H, W]: only a square value means the same in
both); a form without a mask gets a constant of ones, so the offset's shape must be static.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph.rewire import constant_value
from graphfix.plugins.deform import mmcv_params, torchvision_params
from graphfix.plugins.rules import Match, Replacement, Rule
from graphfix.runtime.references import Unavailable


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
# Every form becomes ModulatedDeformConv2d(x, offset, mask, weight [, bias]); a form without
# a mask gets a constant of ones. `plugins.deform` documents the forms and their semantics.


def _symmetry_refusal(params: dict) -> str | None:
    """Why the plugin cannot take these DeformConv attributes, or None (see native.deform_conv:
    the plugin reads [W, H] where TensorRT's importer passes [H, W])."""
    strides, pads, dilations = params["strides"], params["pads"], params["dilations"]
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        return f"pads {pads}: the plugin takes symmetric 2-D padding only"
    if strides[0] != strides[1] or dilations[0] != dilations[1] or pads[0] != pads[1]:
        return (f"strides {strides}, pads {pads}, dilations {dilations} differ between height "
                "and width: the plugin reads them as [W, H], TensorRT's DeformConv importer "
                "passes [H, W]")
    return None


def _ones_mask_refusal(offset: gs.Tensor) -> str | None:
    shape = offset.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return "no mask input, and the offset's shape is not static to build one"
    return None


def _ones_mask(node: gs.Node, offset: gs.Tensor) -> gs.Constant:
    n, channels, h, w = offset.shape
    return _const(node, "mask", np.ones((n, channels // 2, h, w), np.float32))


def _plugin_attributes(params: dict) -> dict:
    return {"stride": list(params["strides"]), "padding": list(params["pads"][:2]),
            "dilation": list(params["dilations"]), "group": params["group"],
            "deformable_group": params["offset_group"]}


def _onnx_params(node: gs.Node) -> dict:
    return {"strides": list(node.attrs.get("strides", [1, 1])),
            "pads": list(node.attrs.get("pads", [0, 0, 0, 0])),
            "dilations": list(node.attrs.get("dilations", [1, 1])),
            "group": int(node.attrs.get("group", 1)),
            "offset_group": int(node.attrs.get("offset_group", 1))}


def _present(node: gs.Node, index: int) -> gs.Tensor | None:
    return node.inputs[index] if len(node.inputs) > index and node.inputs[index].name else None


def _deformconv_check(match: Match) -> str | None:
    node = match.anchor
    if _present(node, 4) is None and (why := _ones_mask_refusal(node.inputs[2])):
        return why
    return _symmetry_refusal(_onnx_params(node))


def _deformconv_rewrite(match: Match) -> Replacement:
    node = match.anchor
    x, weight, offset = node.inputs[:3]
    bias, mask = _present(node, 3), _present(node, 4)
    mask = _ones_mask(node, offset) if mask is None else mask
    inputs = [x, offset, mask, weight] + ([bias] if bias is not None else [])
    return Replacement(inputs=inputs, outputs=list(node.outputs),
                       attributes=_plugin_attributes(_onnx_params(node)))


def _mmcv_check(match: Match) -> str | None:
    node = match.anchor
    plain = node.op == "MMCVDeformConv2d"
    counts = (3,) if plain else (4, 5)
    if len(node.inputs) not in counts:
        wanted = "x, offset, weight" if plain else "x, offset, mask, weight [, bias]"
        return f"{len(node.inputs)} inputs; expected {wanted}"
    if plain and int(np.ravel(node.attrs.get("bias", 0))[0]):
        return "bias=1: mmcv's DeformConv2d has no bias input"
    if plain and (why := _ones_mask_refusal(node.inputs[1])):
        return why
    try:
        return _symmetry_refusal(mmcv_params(node.attrs))
    except Unavailable as exc:
        return str(exc)


def _mmcv_rewrite(match: Match) -> Replacement:
    node = match.anchor
    inputs = list(node.inputs)
    if node.op == "MMCVDeformConv2d":
        x, offset, weight = inputs
        inputs = [x, offset, _ones_mask(node, offset), weight]
    return Replacement(inputs=inputs, outputs=list(node.outputs),
                       attributes=_plugin_attributes(mmcv_params(node.attrs)))


def _torchvision_pattern(node: gs.Node) -> Match | None:
    """torchvision::deform_conv2d with its nine scalar inputs constant (as exported)."""
    if len(node.inputs) != 14:
        return None
    scalars = [constant_value(t) for t in node.inputs[5:]]
    if any(v is None or v.size != 1 for v in scalars):
        return None
    params, use_mask = torchvision_params(scalars)
    return Match([node], {"params": params, "use_mask": use_mask})


def _torchvision_check(match: Match) -> str | None:
    if not match.captures["use_mask"] and (why := _ones_mask_refusal(match.anchor.inputs[2])):
        return why
    return _symmetry_refusal(match.captures["params"])


def _torchvision_rewrite(match: Match) -> Replacement:
    node = match.anchor
    x, weight, offset, mask, bias = node.inputs[:5]
    if not match.captures["use_mask"]:
        mask = _ones_mask(node, offset)
    return Replacement(inputs=[x, offset, mask, weight, bias], outputs=list(node.outputs),
                       attributes=_plugin_attributes(match.captures["params"]))


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
        Rule("mmcv-dcnv1-to-plugin",
             "mmcv MMCVDeformConv2d -> ModulatedDeformConv2d (mask of ones)",
             "ModulatedDeformConv2d", "MMCVDeformConv2d", _single, _mmcv_rewrite,
             _mmcv_check, domain="mmcv"),
        Rule("torchvision-deformconv-to-plugin",
             "torchvision::deform_conv2d (TorchScript export, ONNX_FALLTHROUGH) -> "
             "ModulatedDeformConv2d", "ModulatedDeformConv2d", "deform_conv2d",
             _torchvision_pattern, _torchvision_rewrite, _torchvision_check,
             domain="torchvision"),
    ]


def substitution_advice(domain: str, op: str, target) -> str | None:
    """The doctor's fix text for an `op` (in `domain`) that the target cannot parse, when a
    built-in rule replaces it with a plugin the target has; None when none does. The rule's
    own check is not run here: the pass's notes say why it leaves a node."""
    for rule in builtin_rules():
        if (rule.anchor, rule.domain) == (op, domain or "") and rule.plugin_status(target) is None:
            return (f"substitute-plugins replaces it with the {rule.plugin} plugin (rule "
                    f"{rule.name}) where the rule's conditions hold: graphfix run model.onnx "
                    f"--trt {target.effective} (or --passes substitute-plugins)")
    return None
