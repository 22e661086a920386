"""Shared by unfuse-contrib and its NCHWc part: fused activations and node emission.

onnxruntime fuses an activation into `com.microsoft::FusedConv`, `FusedGemm` and
`com.microsoft.nchwc::Conv` as attributes. This module reads those attributes
back into a standard ONNX activation and emits chains of standard nodes in which
the last node writes the fused node's output tensor, so names and dtypes survive.

FusedConv and NCHWc Conv (MLAS activations): `activation` plus a float list
`activation_params`: Relu, Tanh, Sigmoid, LeakyRelu [alpha], Clip [min, max],
HardSigmoid [alpha, beta], HardSwish (opset >= 14). FusedGemm copies the
activation node's attributes with an `activation_` prefix (`activation_alpha`, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import fresh_name

# MLAS activation -> number of activation_params.
CONV_ACTIVATIONS = {
    "Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2,
    "HardSwish": 0,
}
MIN_OPSET = {"HardSwish": 14}  # activations newer than opset 6
# FusedGemm activation -> the attributes its standard ONNX op takes.
GEMM_ACTIVATIONS: dict[str, tuple[str, ...]] = {
    "Relu": (), "Sigmoid": (), "Tanh": (), "Softsign": (), "Softplus": (),
    "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Elu": ("alpha",),
    "Selu": ("alpha", "gamma"), "ThresholdedRelu": ("alpha",),
}
FLOAT_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Activation:
    """A standard activation op with its attributes; `clip` holds Clip's (min, max)."""

    op: str
    attrs: dict[str, Any] = field(default_factory=dict)
    clip: tuple[float, float] | None = None


def conv_activation(node: gs.Node, opset: int) -> Activation | None | str:
    """The activation fused into a FusedConv or NCHWc Conv: None if none, a reason if unknown."""
    name = str(node.attrs.get("activation", "") or "")
    params = [float(p) for p in node.attrs.get("activation_params", []) or []]
    if not name:
        return None
    if name not in CONV_ACTIVATIONS:
        return f"its fused activation '{name}' has no standard ONNX rewrite here"
    if opset < MIN_OPSET.get(name, 1):
        return f"its {name} activation is a standard op from opset {MIN_OPSET[name]}, not {opset}"
    wanted = CONV_ACTIVATIONS[name]
    if wanted and len(params) != wanted:
        return f"its {name} activation has {len(params)} activation_params instead of {wanted}"
    if name == "LeakyRelu":
        return Activation(name, {"alpha": params[0]})
    if name == "HardSigmoid":
        return Activation(name, {"alpha": params[0], "beta": params[1]})
    if name == "Clip":
        return Activation(name, clip=(params[0], params[1]))
    return Activation(name)


def gemm_activation(node: gs.Node) -> Activation | None | str:
    """The activation fused into a FusedGemm: None if none, a reason if it cannot be rebuilt."""
    name = str(node.attrs.get("activation", "") or "")
    if not name:
        return None
    if name not in GEMM_ACTIVATIONS:
        return f"its fused activation '{name}' has no standard ONNX rewrite here"
    attrs = {
        key[len("activation_"):]: value
        for key, value in node.attrs.items()
        if key.startswith("activation_")
    }
    extra = sorted(set(attrs) - set(GEMM_ACTIVATIONS[name]))
    if extra:
        return f"its activation attribute 'activation_{extra[0]}' is not an attribute of {name}"
    return Activation(name, {k: float(v) for k, v in attrs.items()})


class Emitter:
    """Creates standard-domain nodes and uniquely named tensors in one graph."""

    def __init__(self, graph: gs.Graph, opset: int, names: set[str]) -> None:
        self.graph = graph
        self.opset = opset
        self.names = names

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.names)

    def const(self, base: str, value: np.ndarray) -> gs.Constant:
        return gs.Constant(self.fresh(base), np.asarray(value))

    def node(
        self,
        op: str,
        name: str,
        inputs: Sequence[gs.Tensor],
        attrs: dict[str, Any] | None = None,
        output: gs.Tensor | None = None,
        dtype: Any = None,
    ) -> gs.Tensor:
        """Append a node; it writes `output`, or a new tensor named after `name`."""
        out = output if output is not None else gs.Variable(self.fresh(f"{name}_out"), dtype=dtype)
        node = gs.Node(op=op, name=self.fresh(name), attrs=dict(attrs or {}),
                       inputs=list(inputs), outputs=[out])
        self.graph.nodes.append(node)
        return out

    def activation_step(
        self, act: Activation, base: str, dtype: np.dtype | None
    ) -> tuple[str, list[gs.Tensor], dict[str, Any]]:
        """(op, extra inputs after x, attrs); Clip's bounds need `dtype` at opset >= 11."""
        if act.clip is None:
            return act.op, [], dict(act.attrs)
        low, high = act.clip
        if self.opset < 11:
            return "Clip", [], {"min": low, "max": high}
        assert dtype is not None, "checked by the caller"
        bounds = [
            gs.Variable.empty() if abs(v) >= FLOAT_MAX
            else self.const(f"{base}_{k}", np.array(v, dtype))
            for k, v in (("min", low), ("max", high))
        ]
        while bounds and bounds[-1].is_empty():
            bounds.pop()
        return "Clip", bounds, {}


Step = tuple[str, list[gs.Tensor], dict[str, Any]]


def needs_dtype(act: Activation | None, opset: int) -> bool:
    """Whether emitting `act` needs the tensor's dtype (Clip bounds are typed inputs)."""
    return act is not None and act.clip is not None and opset >= 11


def replace_with_chain(em: Emitter, old: gs.Node, first: Step, rest: list[Step]) -> None:
    """Replace `old` by first(inputs) -> rest[0](x, extra...) -> ...; the last writes old's output.

    `old` is left disconnected for cleanup.
    """
    out = old.outputs[0]
    base = old.name or out.name
    old.inputs.clear()
    old.outputs.clear()
    steps = [first, *rest]
    current: gs.Tensor | None = None
    for i, (op, inputs, attrs) in enumerate(steps):
        last = i == len(steps) - 1
        ins = inputs if current is None else [current, *inputs]
        current = em.node(op, f"{base}_{op.lower()}", ins, attrs,
                          output=out if last else None, dtype=out.dtype)
