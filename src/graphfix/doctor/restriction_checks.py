"""Checkers of the operator table's restriction sentences that a node's inputs settle:
constant inputs, ranks and static dims, element types, index values.

A checker reads one node against one sentence (its regex match) and answers None (met),
a violation text (not met: why, precisely) or UNKNOWN (the model alone does not settle
it). Attribute checkers are in restriction_attrs, If/Loop ones in restriction_graphs;
rules_restrictions maps sentences to them. The helpers here (the op's schema, its named
inputs, attribute defaults) serve all three.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import onnx
from onnx import TensorProto

from graphfix.doctor.view import ModelView, NodeRef
from graphfix.graph.protos import text

UNKNOWN = "unknown"  # a checker's answer when the model does not settle it
Checker = Callable[[NodeRef, ModelView, re.Match], str | None]  # violation text, None, UNKNOWN
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


# ----------------------------------------------------------------------------- helpers


def schema(ref: NodeRef, view: ModelView) -> onnx.defs.OpSchema | None:
    """The ONNX schema of the node's op at the model's opset (None when onnx lacks it)."""
    try:
        return onnx.defs.get_schema(ref.op, max(view.opset, 1), "")
    except onnx.defs.SchemaError:
        return None


def input_index(ref: NodeRef, view: ModelView, name: str) -> int | None:
    """The position of the input the schema calls `name`; None for an attribute or an
    input this opset lacks."""
    found = schema(ref, view)
    names = [i.name for i in found.inputs] if found is not None else []
    return names.index(name) if name in names else None


def output_index(ref: NodeRef, view: ModelView, name: str) -> int | None:
    found = schema(ref, view)
    names = [o.name for o in found.outputs] if found is not None else []
    return names.index(name) if name in names else None


def attr_value(ref: NodeRef, view: ModelView, name: str):
    """The node's attribute, else the schema's default (None when it has neither);
    strings as str."""
    value = ref.attr(name)
    return schema_default(ref, view, name) if value is None else text(value)


def schema_default(ref: NodeRef, view: ModelView, name: str):
    """The default the op's schema gives attribute `name` (None when it gives none)."""
    found = schema(ref, view)
    attribute = found.attributes.get(name) if found is not None else None
    if attribute is None or not attribute.default_value.name:
        return None
    return text(onnx.helper.get_attribute_value(attribute.default_value))


def quoted(match: re.Match) -> list[str]:
    """The names a sentence writes in backticks (`attn_mask ` read as attn_mask)."""
    return re.findall(r"`(\w+)\s*`", match.string)


def present_inputs(ref: NodeRef, view: ModelView, match: re.Match) -> list[tuple[str, str]]:
    """(schema name, tensor) of each input the sentence names that the node has."""
    named = [(name, input_index(ref, view, name)) for name in quoted(match)]
    return [(name, ref.input(i)) for name, i in named if i is not None and ref.input(i)]


def spatial_rank(ref: NodeRef, view: ModelView) -> int | None:
    kernel = ref.attr("kernel_shape")
    if kernel:
        return len(kernel)
    weighted = ref.op in ("Conv", "ConvTranspose", "DeformConv")
    for name in (ref.input(1) if weighted else "", ref.input(0)):
        shape = view.shape(name) if name else None
        if shape is not None:
            return len(shape) - 2
    return None


# ----------------------------------------------------------------------------- checkers


def spatial_dims(ref, view, match) -> str | None:
    """"2D or 3D pooling only", "`input` must have 1D or 2D spatial dimensions"."""
    rank = spatial_rank(ref, view)
    if rank is None:
        return UNKNOWN
    allowed = {int(match.group(1)), int(match.group(2))}
    return None if rank in allowed else (
        f"{rank}-D {ref.op} (only {match.group(1)}-D or {match.group(2)}-D are supported)")


def must_be_constant(ref, view, match) -> str | None:
    """Each named input the node has must be an initializer or a Constant's output; a
    name that is no input (an attribute, or an input this opset lacks) is constant."""
    bad = [f"`{name}`" for name, tensor in present_inputs(ref, view, match)
           if not view.is_constant(tensor)]
    if bad:
        return f"{', '.join(bad)} is computed at run time, the parser needs a constant"
    return None if quoted(match) else UNKNOWN


def k_below(ref, view, match) -> str | None:
    value = view.value(ref.input(1)) if ref.input(1) else None
    if value is None:
        return UNKNOWN if ref.input(1) else None
    k = int(value.reshape(-1)[0])
    return None if k < int(match.group(1)) else f"K is {k}"


def training_false(ref, view, match) -> str | None:
    name = ref.input(2)
    if not name:
        return None
    value = view.value(name)
    if value is None:
        return "`training_mode` is not a constant"
    return "`training_mode` is true" if bool(value.reshape(-1)[0]) else None


def rank_between(low: int, high: int) -> Checker:
    def check(ref, view, match) -> str | None:
        shape = view.shape(ref.input(0))
        if shape is None:
            return UNKNOWN
        return None if low <= len(shape) <= high else f"its input has rank {len(shape)}"
    return check


def named_ranks(ref, view, match) -> str | None:
    """"`Q`, `K`, `V` and `attn_mask ` must be 4D": the rank of each named input given."""
    wanted, bad, unknown = int(match.group(1)), [], False
    for name, tensor in present_inputs(ref, view, match):
        shape = view.shape(tensor)
        unknown |= shape is None
        if shape is not None and len(shape) != wanted:
            bad.append(f"`{name}` has rank {len(shape)}")
    return ", ".join(bad) if bad else (UNKNOWN if unknown else None)


def static_input(ref, view, match) -> str | None:
    shape = view.shape(ref.input(0))
    if shape is None:
        return UNKNOWN
    dynamic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
    return f"input dimensions {dynamic} are dynamic" if dynamic else None


def static_axis(ref, view, match) -> str | None:
    """"`axis` dimension of input must be a build-time constant" (Hardmax)."""
    shape = view.shape(ref.input(0))
    if shape is None:
        return UNKNOWN
    axis = int(attr_value(ref, view, "axis"))
    dim = shape[axis] if -len(shape) <= axis < len(shape) else None
    if isinstance(dim, int):
        return None
    return f"dimension {axis} of its input is dynamic ('{dim}')" if dim else UNKNOWN


def non_negative_indices(ref, view, match) -> str | None:
    value = view.value(ref.input(1))
    if value is None:
        return UNKNOWN
    return "it has negative indices" if value.size and int(value.min()) < 0 else None


def element_type(ref, view, match) -> str | None:
    """"`position_ids` must be INT64"."""
    wanted = TensorProto.DataType.Value(match.group(2))
    for name, tensor in present_inputs(ref, view, match):
        found = view.elem_type(tensor)
        if not found:
            return UNKNOWN
        if found != wanted:
            return f"`{name}` is {TensorProto.DataType.Name(found)}"
    return None


def real_valued(ref, view, match) -> str | None:
    """STFT's signal is [batch, length, 1] when real, [batch, length, 2] when complex."""
    shape = view.shape(ref.input(0))
    last = shape[-1] if shape else None
    if not isinstance(last, int):
        return UNKNOWN
    return None if last == 1 else f"its signal is complex (last dimension {last})"


def float_range_constant(ref, view, match) -> str | None:
    """Range on floats needs constant `start`, `limit` and `delta`."""
    kind = view.elem_type(ref.input(0))
    if not kind:
        return UNKNOWN
    if kind not in _FLOATS:
        return None
    computed = [f"`{name}`" for name, tensor in present_inputs(ref, view, match)
                if not view.is_constant(tensor)]
    return (f"its inputs are {TensorProto.DataType.Name(kind)} and {', '.join(computed)} "
            "computed at run time") if computed else None


def reported_elsewhere(ref, view, match) -> str | None:
    """A sentence another rule or sentence reports on (see the table in
    rules_restrictions): nothing to add here."""
    return None
