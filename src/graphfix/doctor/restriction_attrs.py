"""Checkers of the operator table's restriction sentences that a node's attributes settle
(with the schema's defaults for attributes the node leaves out): Resize modes and axes,
recurrent activations, pooling dilations, Einsum equations, Attention's attributes and
optional inputs/outputs, DeformConv and Pad padding. Answers as in restriction_checks.
"""

from __future__ import annotations

import re

import numpy as np

from graphfix.doctor.restriction_checks import (
    UNKNOWN,
    attr_value,
    input_index,
    output_index,
    present_inputs,
    quoted,
    schema_default,
)

# How many activation functions each direction of a recurrent op takes (ONNX spec: LSTM
# f, g, h; GRU f, g; RNN f).
_PER_DIRECTION = {"LSTM": 3, "GRU": 2, "RNN": 1}
# The sentence's words for Resize attributes.
_RESIZE = {"resize transformation": "coordinate_transformation_mode", "resize": "mode",
           "nearest": "nearest_mode", "aspect ratio": "keep_aspect_ratio_policy"}


def dilations(ref, view, match) -> str | None:
    value = ref.attr("dilations")
    return None if not value or all(d == 1 for d in value) else f"dilations {list(value)}"


def attr_equals(ref, view, match) -> str | None:
    """"`sorted` must be 1", "`axis` must be -2"; zero points are inputs, left to
    rules_qdq (qdq-zero-point), which reports them once."""
    name, wanted = match.group(1), int(match.group(2))
    value = attr_value(ref, view, name)
    if input_index(ref, view, name) is not None or value is None:
        return None  # an input, or an attribute this opset does not have
    return None if value == wanted else f"`{name}` is {value}"


def reduction_none(ref, view, match) -> str | None:
    value = attr_value(ref, view, "reduction") or "none"
    return None if value == "none" else f"reduction is '{value}'"


def seed_ignored(ref, view, match) -> str | None:
    return "its `seed` is set but TensorRT ignores it" if ref.has_attr("seed") else None


def resize_mode(ref, view, match) -> str | None:
    """"Supported resize modes: `nearest`, `linear`" and the like; nearest_mode only
    matters in nearest mode, and an attribute the opset lacks cannot be set."""
    attr = _RESIZE[match.group(1).lower()]
    value = attr_value(ref, view, attr)
    if value is None or (attr == "nearest_mode" and attr_value(ref, view, "mode") != "nearest"):
        return None
    return None if value in re.findall(r"`(\w+)`", match.string) else f"{attr} is '{value}'"


def no_antialias(ref, view, match) -> str | None:
    return "antialias is 1" if attr_value(ref, view, "antialias") else None


def resize_axes_iota(ref, view, match) -> str | None:
    """"When `scales` is a tensor input, `axes` must be an iota vector of length
    rank(input)": a constant `scales` is exempt (the parser reorders it itself)."""
    axes, scales = ref.attr("axes"), ref.input(2)
    if not axes or not scales or view.is_constant(scales):
        return None
    shape = view.shape(ref.input(0))
    if shape is None:
        return UNKNOWN
    rank = len(shape)
    if [a % rank for a in axes] == list(range(rank)):
        return None
    return f"`scales` is computed at run time and `axes` is {list(axes)}, not 0..{rank - 1}"


def constant_attrs(ref, view, match) -> str | None:
    bad = [a for a in ("sparse_value", "value_string", "value_strings") if ref.has_attr(a)]
    return f"it uses {', '.join(bad)}" if bad else None


def same_activations(ref, view, match) -> str | None:
    """"For bidirectional LSTMs, activation functions must be the same for both the
    forward and reverse pass": `activations` lists the forward functions, then the
    reverse ones (one list for both when it names one direction's worth)."""
    if attr_value(ref, view, "direction") != "bidirectional":
        return None
    count = _PER_DIRECTION[ref.op]
    names = [a.decode() if isinstance(a, bytes) else a for a in ref.attr("activations", [])]
    forward, reverse = names[:count], names[count:]
    if not reverse or [n.lower() for n in forward] == [n.lower() for n in reverse]:
        return None
    return f"forward activations {forward}, reverse {reverse}"


def attrs_unsupported(ref, view, match) -> str | None:
    """"`qk_matmul_output_mode` and `softcap` attributes are unsupported": set to other
    than their default, which means what leaving them out means."""
    bad = [f"`{name}` is {ref.attr(name)}" for name in quoted(match)
           if ref.has_attr(name)
           and attr_value(ref, view, name) != schema_default(ref, view, name)]
    return ", ".join(bad) or None


def inputs_unsupported(ref, view, match) -> str | None:
    """"`past_key`, `past_value` and `nonpad_kv_seqlen` inputs are unsupported"."""
    given = [f"`{name}`" for name, _ in present_inputs(ref, view, match)]
    return f"it has {', '.join(given)}" if given else None


def outputs_beyond_first(ref, view, match) -> str | None:
    """"`Indices` output tensor unsupported", "Only the first output `Y` is supported"."""
    used = [o for o in ref.node.output[1:] if o]
    return f"output(s) {used} are used" if used else None


def outputs_unsupported(ref, view, match) -> str | None:
    """"`present_key`, `present_value` and `qk_matmul_output` outputs are unsupported"."""
    indices = [(name, output_index(ref, view, name)) for name in quoted(match)]
    used = [f"`{name}`" for name, i in indices
            if i is not None and i < len(ref.node.output) and ref.node.output[i]]
    return f"it has {', '.join(used)}" if used else None


def heads_from_shapes(ref, view, match) -> str | None:
    """Attention's `q_num_heads` / `kv_num_heads`, read by TensorRT from dim 1 of 4-D
    `Q` / `K`, `V`: a set attribute must agree with it (3-D inputs: the 4D sentence)."""
    bad, unknown = [], False
    for attr, indices in (("q_num_heads", (0,)), ("kv_num_heads", (1, 2))):
        heads = ref.attr(attr)
        for index in indices if heads is not None else ():
            shape = view.shape(ref.input(index))
            if shape is None or len(shape) != 4:
                unknown |= shape is None
            elif not isinstance(shape[1], int):
                unknown = True
            elif shape[1] != heads:
                bad.append(f"`{attr}` is {heads} but dimension 1 of input {index} is "
                           f"{shape[1]}")
    return "; ".join(bad) if bad else (UNKNOWN if unknown else None)


def symmetric_pads(ref, view, match) -> str | None:
    """"`pads` for the beginning and end along each spatial axis must be the same"."""
    pads = list(ref.attr("pads", []))
    half = len(pads) // 2
    return None if pads[:half] == pads[half:] else f"pads {pads}"


def einsum_plain(ref, view, match) -> str | None:
    """"Ellipsis and diagonal operations are not supported"."""
    equation = attr_value(ref, view, "equation") or ""
    if "..." in equation:
        return f"its equation '{equation}' uses an ellipsis"
    terms = equation.replace(" ", "").split("->")[0].split(",")
    repeated = [t for t in terms if len(set(t)) != len(t)]
    return f"its equation '{equation}' takes a diagonal ('{repeated[0]}')" if repeated else None


def einsum_no_broadcast(ref, view, match) -> str | None:
    """"Broadcasting between inputs is not supported": a letter whose size differs
    between inputs (1 against n) broadcasts; an ellipsis may, which doctor cannot see."""
    equation = (attr_value(ref, view, "equation") or "").replace(" ", "")
    if "..." in equation:
        return UNKNOWN
    sizes: dict[str, list] = {}
    for term, tensor in zip(equation.split("->")[0].split(","), ref.node.input, strict=False):
        shape = view.shape(tensor)
        for axis, letter in enumerate(term):
            dim = shape[axis] if shape is not None and axis < len(shape) else None
            sizes.setdefault(letter, []).append(dim if isinstance(dim, int) else None)
    for letter, dims in sorted(sizes.items()):
        known = sorted({d for d in dims if d is not None})
        if len(known) > 1:
            return f"index '{letter}' has sizes {known} in different inputs"
    return UNKNOWN if any(None in d and len(d) > 1 for d in sizes.values()) else None


def zero_padding_two_dims(ref, view, match) -> str | None:
    """TensorRT 8.0's Pad: mode `constant`, value 0, at most two padded dimensions."""
    mode = attr_value(ref, view, "mode")
    if mode != "constant":
        return f"mode is '{mode}'"
    if view.opset < 11:
        pads, value = ref.attr("pads", []), ref.attr("value", 0.0)
    else:
        pads = view.value(ref.input(1))
        value = view.value(ref.input(2)) if ref.input(2) else 0.0
    if pads is None or value is None:
        return UNKNOWN
    if np.any(np.asarray(value) != 0):
        return f"its constant value is {float(np.asarray(value).reshape(-1)[0]):g}"
    pads = np.asarray(pads).reshape(2, -1)
    padded = int(np.count_nonzero(pads.any(axis=0)))
    return None if padded <= 2 else f"it pads {padded} dimensions"
