"""Decomposed HardSigmoid and HardSwish, as exporters without those ops write them.

Paddle (paddle2onnx) and PyTorch below opset 14 write MobileNetV3's activations as::

    HardSigmoid:  Clip(x + 3, 0, 6) / 6           (or * 1/6)
    HardSwish:    x * Clip(x + 3, 0, 6) / 6       (the Mul first, then / 6 or * 1/6)
                  x * (Clip(x + 3, 0, 6) / 6)     (a HardSigmoid, then the Mul)

which is ONNX's HardSigmoid(x; alpha=1/6, beta=1/2) = max(0, min(1, x / 6 + 1/2)) and
HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2) exactly in real numbers (in float32 the
two forms may round differently in the last bit). `normalize-activations` matches
them here; the last form becomes a HardSigmoid first, and then x * HardSigmoid(x)
becomes a HardSwish in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import constant_value, is_graph_output, is_onnx

_REL_TOL = 1e-6  # 1/6 in float32 is 0.16666667


@dataclass(frozen=True)
class Decomposed:
    """`x`, and the nodes after it that compute the activation (the last one first)."""

    x: gs.Tensor
    nodes: tuple[gs.Node, ...]


def hard_sigmoid(g: gs.Graph, node: gs.Node, opset: int, node_ids: set[int]) -> Decomposed | None:
    """Clip(x + 3, 0, 6) / 6 or * 1/6 ending at `node` (a Div or Mul), else None."""
    scaled = _divided_by_six(node)
    if scaled is None:
        return None
    inner = relu6_of_x_plus_3(g, scaled, opset, node_ids)
    return None if inner is None else Decomposed(inner.x, (node, *inner.nodes))


def hard_swish(g: gs.Graph, node: gs.Node, opset: int, node_ids: set[int]) -> Decomposed | None:
    """x * Clip(x + 3, 0, 6), then / 6 or * 1/6, ending at `node`, else None."""
    product = _divided_by_six(node)
    mul = _only_producer(g, product, node_ids) if product is not None else None
    if mul is None or not is_onnx(mul, "Mul") or len(mul.inputs) != 2:
        return None
    for i in (0, 1):
        inner = relu6_of_x_plus_3(g, mul.inputs[i], opset, node_ids)
        if inner is not None and mul.inputs[1 - i] is inner.x:
            return Decomposed(inner.x, (node, mul, *inner.nodes))
    return None


def relu6_of_x_plus_3(
    g: gs.Graph, t: gs.Tensor, opset: int, node_ids: set[int]
) -> Decomposed | None:
    """Clip(x + 3, 0, 6) writing `t` (read by one node only), else None."""
    clip = _only_producer(g, t, node_ids)
    if clip is None or not is_onnx(clip, "Clip") or _clip_bounds(clip, opset) != (0.0, 6.0):
        return None
    add = _only_producer(g, clip.inputs[0], node_ids)
    if add is None or not is_onnx(add, "Add") or len(add.inputs) != 2:
        return None
    for i in (0, 1):
        if _is_scalar(add.inputs[i], 3.0):
            return Decomposed(add.inputs[1 - i], (clip, add))
    return None


def _divided_by_six(node: gs.Node) -> gs.Tensor | None:
    """t when `node` is t / 6 or t * 1/6 (either order), else None."""
    if len(node.inputs) != 2:
        return None
    if is_onnx(node, "Div"):
        return node.inputs[0] if _is_scalar(node.inputs[1], 6.0) else None
    if is_onnx(node, "Mul"):
        for i in (0, 1):
            if _is_scalar(node.inputs[i], 1.0 / 6.0):
                return node.inputs[1 - i]
    return None


def _only_producer(g: gs.Graph, t: gs.Tensor, node_ids: set[int]) -> gs.Node | None:
    """The node of `g` writing `t` when `t` has one reader and is no graph output (so the
    node can go with the rewrite)."""
    if isinstance(t, gs.Constant) or len(t.inputs) != 1 or len(t.outputs) != 1:
        return None
    producer = t.inputs[0]
    if id(producer) not in node_ids or len(producer.outputs) != 1 or is_graph_output(g, t):
        return None
    return producer


def _clip_bounds(clip: gs.Node, opset: int) -> tuple[float, float] | None:
    if opset < 11:
        lo, hi = clip.attrs.get("min"), clip.attrs.get("max")
        return None if lo is None or hi is None else (float(lo), float(hi))
    if len(clip.inputs) < 3:
        return None
    values = [constant_value(t) for t in clip.inputs[1:3]]
    if any(v is None or v.size != 1 for v in values):
        return None
    return float(values[0].reshape(-1)[0]), float(values[1].reshape(-1)[0])


def _is_scalar(t: gs.Tensor, expected: float) -> bool:
    value = constant_value(t)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return False
    return bool(np.isclose(float(value.reshape(-1)[0]), expected, rtol=_REL_TOL, atol=0))
