"""What the plugin -> ONNX forms of `plugins.native` and `plugins.native_layout` share:
reading a plugin node's attributes and inputs, refusing with the reason, the emitter."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from graphfix.nms.onnxops import Emitter
from graphfix.runtime.references import NeedsOpset, Unavailable, attributes


def scalar_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """Attributes with one-element lists read as scalars (exporters write INTS [1])."""
    out = attributes(node)
    for key, value in out.items():
        if isinstance(value, (list, np.ndarray)) and np.size(value) == 1 and key not in (
                "scales", "bias", "stride", "padding", "dilation", "split", "output_lengths"):
            out[key] = np.asarray(value).ravel()[0].item()
    return out


def require(attrs: dict[str, Any], names: tuple[str, ...], plugin: str) -> None:
    if missing := [n for n in names if n not in attrs]:
        raise Unavailable(f"{plugin} requires the attributes {', '.join(missing)} "
                          "(its creator fails without them)")


def require_opset(opset: int, least: int, what: str) -> None:
    """NeedsOpset below `least`: call it after the node's other checks (see NeedsOpset)."""
    if opset < least:
        raise NeedsOpset(f"{what} needs ONNX opset >= {least}, the model imports {opset}: "
                          f"convert it first (graphfix run --passes opset{{version={least}}})")


def inputs_of(node: onnx.NodeProto, counts: tuple[int, ...]) -> list[str]:
    names = list(node.input)
    while names and not names[-1]:
        names.pop()
    if len(names) not in counts or not all(names) or len(node.output) != 1:
        raise Unavailable(f"{node.op_type} takes {' or '.join(map(str, counts))} inputs and "
                          f"one output; this node has {len(names)} and {len(node.output)}")
    return names


def emitter_for(node: onnx.NodeProto, opset: int) -> Emitter:
    return Emitter(node.output[0], opset, node.name or node.output[0])


def single_input_attribute(node: onnx.NodeProto, opset: int, least: int, what: str,
                           name: str) -> Any:
    """The required attribute `name` of a one-input, one-output plugin node whose form
    needs opset `least` (for `what`); Unavailable says which condition fails."""
    require_opset(opset, least, what)
    inputs_of(node, (1,))
    attrs = scalar_attrs(node)
    require(attrs, (name,), node.op_type)
    return attrs[name]
