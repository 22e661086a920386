"""fuse-conv-mul: fold a per-channel constant Mul or Div after a Conv into its weights.

With s one value per output channel (see `_channels` for which constant shapes
are per channel)::

    Mul(Conv(x, W, b), s)          -> Conv(x, W * s[:, None, ...], b * s)
    Mul(s, Conv(x, W, b))          -> the same
    Div(Conv(x, W, b), c)          -> Conv(x, W / c[:, None, ...], b / c)     (no c == 0)
    Mul(ConvTranspose(x, W, b), s) -> ConvTranspose(x, W * s (per group, per output channel), b * s)

Exporters that decompose BatchNormalization (TensorFlow, Paddle) write
Conv -> Mul(s) -> Add(t); this pass folds the Mul, and `fuse-conv-bias` then
folds the Add, leaving one Conv that TensorRT fuses with its activation.

When the Conv output is also read by another node (or is a graph output), the
Mul folds into a copy of the Conv where the cost model of `_conv_copy` finds
that cheaper, else a note names the other readers and the numbers
(docs/conv-chains.md).

New weights are computed in float64 and cast back to the weight dtype, into new
`gs.Constant` objects (a weight shared with another node is never changed under
it). The Conv takes the Mul's output tensor, so output names and dtypes are kept;
the disconnected Mul is left for `cleanup`. Nodes are visited in graph order, so a
chain Conv -> Mul -> Mul folds completely in one run on a sorted graph.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import fresh_name
from graphfix.passes._channels import (
    CONV_OPS,
    Match,
    absorb,
    conv_operands,
    fold_elementwise,
    scale_out_channels,
    set_input,
)
from graphfix.passes.base import NoOptions, Pass, PassContext, PassResult


class FuseConvMul(Pass):
    """Fold a per-output-channel constant Mul or Div after Conv/ConvTranspose into the weights.

    Handles: `Mul(conv, s)` and `Mul(s, conv)`; `Div(conv, c)` (as a scale by 1/c);
    Conv of any rank, group count and dilation; ConvTranspose with groups (weights
    [Cin, Cout/g, k...]); with or without a bias (which is scaled too); constants of
    shape [1, C, 1, 1], [C, 1, 1], [1] or scalar (for a rank-4 output; generally any
    shape that varies along the channel axis only). Recurses into If/Loop/Scan bodies.

    When the conv output has another reader or is a graph output, folds into a copy
    of the conv when the cost model of `_conv_copy` finds that cheaper.

    Skips, with a note, when the conv output has another reader or is a graph output and
    no copy is made (the note names the readers and the cost numbers, or the
    elementwise expression the op belongs to), when the other operand, the weights
    or the bias are not constants, when the constant varies along a non-channel axis
    (e.g. [C] against a rank-4 output, which lines up with the width axis) or has a
    higher rank than the output, when its dtype differs from the conv's, when a
    divisor is zero, and for `Div(c, conv)`.
    """

    name = "fuse-conv-mul"
    summary = "Fold a per-channel constant Mul or Div after Conv/ConvTranspose into its weights"
    Options = NoOptions
    counts_rewrites = True  # each fold is one rewrite (`_channels.fold_elementwise`)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        return fold_elementwise(
            graph, ctx, self.name, ("Mul", "Div"), CONV_OPS, _plan, _rewrite, _what,
            "no Mul or Div of a Conv or ConvTranspose output",
        )


def _what(m: Match) -> str:
    return f"fused {m.node.op} into {m.producer.op} weights"


def _plan(m: Match) -> tuple[Callable[[], np.ndarray], np.ndarray | None] | str:
    """New (weights, bias or None) for the producer, or why the constant does not fold.
    The weights are scaled only when the fold is made (`_rewrite`), not for a fold the
    Conv-copy cost model refuses after the plan (maxvit_t: 23 per run; the pass 20 ms -> 7 ms)."""
    operands = conv_operands(m)
    if isinstance(operands, str):
        return operands
    w, b, scale = operands
    if m.node.op == "Div":
        if np.any(scale == 0):
            return "its divisor is zero for some channel, so the quotient is not a finite scale"
        scale = 1.0 / scale
    new_b = None if b is None else (b.astype(np.float64).reshape(-1) * scale).astype(b.dtype)
    return (lambda: scale_out_channels(m.producer, w, scale)), new_b


def _rewrite(m: Match, plan: tuple[Callable[[], np.ndarray], np.ndarray | None],
             names: set[str]) -> None:
    weight, bias = plan
    base = m.node.outputs[0].name
    m.producer.inputs[1] = gs.Constant(fresh_name(f"{base}_fused_weight", names), weight())
    if bias is not None:
        set_input(m.producer, 2, gs.Constant(fresh_name(f"{base}_fused_bias", names), bias))
    absorb(m)
