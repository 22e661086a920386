"""fuse-conv-bias: fold a constant Add or Sub after a linear op into its bias.

With t one value per output channel (see `_channels` for which constant shapes
are per channel) and c any constant that is a valid Gemm C::

    Add(Conv(x, W, b), t)             -> Conv(x, W, b + t)        (b = 0 when absent)
    Add(t, Conv(x, W, b))             -> the same
    Sub(Conv(x, W, b), t)             -> Conv(x, W, b - t)
    Add(ConvTranspose(x, W, b), t)    -> ConvTranspose(x, W, b + t)
    Add(Gemm(A, B, C; alpha, beta), c) -> Gemm(A, B, beta * C + c; alpha, beta = 1)
    Add(MatMul(A, W), c)              -> Gemm(A, W, c)            (A of rank 2, W constant)

Gemm C is unidirectionally broadcastable to the output [M, N], so besides the
column constants [N], [1, N], [1] and scalars, a constant of shape [M, 1] or
[M, N] folds too, but only when M is known statically: with M unknown (or 1) an
[M, ...] constant could broadcast the Add's output to more rows than the Gemm
has, and then it is left alone with a note. MatMul becomes a Gemm only when its
input is known to be 2-D (Gemm has no batch axes); otherwise the Add stays.

When the Conv output is also read by another node (or is a graph output), the
Add folds into a copy of the Conv where the cost model of `_conv_copy` finds
that cheaper, else a note names the other readers and the numbers
(docs/conv-chains.md).

New values are computed in float64 and cast back to the weight dtype, into new
`gs.Constant` objects (no existing array is written to). The linear op takes the
Add's output tensor, so output names and dtypes are kept; the disconnected Add is
left for `cleanup`. Nodes are visited in graph order, so a chain Conv -> Add -> Sub
folds completely in one run on a sorted graph. Run `fuse-conv-mul` first to fold a
decomposed BatchNormalization (Conv -> Mul -> Add) into one Conv.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import constant_value, fresh_name
from graphfix.passes._channels import (
    Match,
    absorb,
    conv_operands,
    dtype_reason,
    fold_elementwise,
    set_input,
    tensor_dtype,
)
from graphfix.passes.base import NoOptions, Pass, PassContext, PassResult

_LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class _Plan:
    """The new bias (input 2 of the producer) and attribute/op changes."""

    bias: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)
    op: str | None = None


class FuseConvBias(Pass):
    """Fold a constant Add or Sub after Conv, ConvTranspose, Gemm or MatMul into its bias.

    Handles: `Add(conv, t)`, `Add(t, conv)` and `Sub(conv, t)` for Conv of any rank,
    group count and dilation and for grouped ConvTranspose, with or without an
    existing bias (one is created), for constants of shape [1, C, 1, 1], [C, 1, 1],
    [1] or scalar (for a rank-4 output; generally any shape that varies along the
    channel axis only); Gemm with any transA/transB, alpha, beta and an absent or
    constant C, for constants that are valid Gemm C values ([N], [1, N], scalar, and
    [M, 1] or [M, N] when M is static); MatMul with a constant 2-D weight and a 2-D
    input, which becomes a Gemm. Recurses into If/Loop/Scan bodies.

    When a Conv or ConvTranspose output has another reader or is a graph output,
    folds into a copy of it when the cost model of `_conv_copy` finds that cheaper.

    Skips, with a note, when the linear op's output has another reader or is a graph
    output and no copy is made (the note names the readers and the cost numbers, or
    the elementwise expression the op belongs to), when the other operand, the
    weights, the bias or the Gemm C are not constants, when the constant varies
    along a non-channel axis (e.g. [C] against a rank-4 output, which lines up with
    the width axis) or has a higher rank than the output, when its dtype differs
    from the linear op's, for `Sub(t, conv)`, and for MatMul whose input rank is
    unknown or not 2.
    """

    name = "fuse-conv-bias"
    summary = "Fold a constant Add/Sub after Conv, ConvTranspose, Gemm or MatMul into its bias"
    Options = NoOptions
    counts_rewrites = True  # each fold is one rewrite (`_channels.fold_elementwise`)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        return fold_elementwise(
            graph, ctx, self.name, ("Add", "Sub"), _LINEAR_OPS, _plan, _rewrite, _what,
            "no Add or Sub of a Conv, ConvTranspose, Gemm or MatMul output",
        )


def _what(m: Match) -> str:
    if m.producer.op == "MatMul":
        return "fused Add into MatMul as a Gemm"
    target = "C" if m.producer.op == "Gemm" else "bias"
    return f"fused {m.node.op} into {m.producer.op} {target}"


def _sign(m: Match) -> float:
    return -1.0 if m.node.op == "Sub" else 1.0


# ----------------------------------------------------------------------------- planners


def _plan_conv(m: Match) -> _Plan | str:
    """Conv and ConvTranspose: the per-channel constant joins the (possibly new) bias."""
    operands = conv_operands(m)
    if isinstance(operands, str):
        return operands
    w, b, shift = operands
    old = np.zeros(shift.size) if b is None else b.astype(np.float64).reshape(-1)
    return _Plan(bias=(old + _sign(m) * shift).astype(w.dtype))


def _plan_gemm(m: Match) -> _Plan | str:
    """Y = alpha * A'B' + beta * C, so Y + c = alpha * A'B' + 1 * (beta * C + c)."""
    node = m.producer
    c = None
    if len(node.inputs) > 2 and not node.inputs[2].is_empty():
        c = constant_value(node.inputs[2])
        if c is None:
            return "the Gemm C input is not a constant"
    dtype = tensor_dtype(node.inputs[1])
    if dtype is None:
        dtype = tensor_dtype(node.inputs[0])
    reason = dtype_reason(m, dtype)
    if reason:
        return reason
    trans_a, trans_b = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    out = node.outputs[0]
    rows = _dim(node.inputs[0], 1 if trans_a else 0) or _dim(out, 0)
    cols = _dim(node.inputs[1], 0 if trans_b else 1) or _dim(out, 1)
    reason = _matrix_reason(m.value.shape, rows, cols, "Gemm output")
    if reason:
        return reason
    value = _sign(m) * m.value.astype(np.float64)
    if c is not None:
        value = float(node.attrs.get("beta", 1.0)) * c.astype(np.float64) + value
    return _Plan(bias=np.asarray(value, dtype=m.value.dtype), attrs={"beta": 1.0})


def _plan_matmul(m: Match) -> _Plan | str:
    """MatMul(A, W) + c with A of rank 2 is Gemm(A, W, c)."""
    node = m.producer
    w = constant_value(node.inputs[1])
    if w is None:
        return "the MatMul weights are not a constant"
    if not np.issubdtype(w.dtype, np.floating):
        return f"the MatMul weights are {w.dtype}, not floating point"
    if w.ndim != 2:
        return f"the MatMul weights have rank {w.ndim}, not 2"
    a, out = node.inputs[0], node.outputs[0]
    rank = next((len(t.shape) for t in (a, out) if t.shape is not None), None)
    if rank is None:
        return "the MatMul input rank is unknown, so it may not be 2-D (a Gemm takes 2-D inputs)"
    if rank != 2:
        return f"the MatMul input has rank {rank}, so it cannot become a Gemm (2-D inputs only)"
    reason = dtype_reason(m, w.dtype)
    if reason:
        return reason
    reason = _matrix_reason(m.value.shape, _dim(a, 0) or _dim(out, 0), w.shape[1], "MatMul output")
    if reason:
        return reason
    bias = np.asarray(_sign(m) * m.value.astype(np.float64), dtype=w.dtype)  # 0-d stays an array
    return _Plan(bias=bias, op="Gemm")


def _plan(m: Match) -> _Plan | str:
    if m.producer.op == "Gemm":
        return _plan_gemm(m)
    if m.producer.op == "MatMul":
        return _plan_matmul(m)
    return _plan_conv(m)


def _dim(tensor: gs.Tensor, axis: int) -> int | None:
    """A static dim of a rank-2 tensor (None when unknown, symbolic, or <= 0)."""
    shape = tensor.shape
    if shape is None or len(shape) != 2:
        return None
    size = shape[axis]
    return int(size) if isinstance(size, (int, np.integer)) and size > 0 else None


def _matrix_reason(
    shape: tuple[int, ...], rows: int | None, cols: int | None, where: str
) -> str | None:
    """Why a constant is not a valid Gemm C for a [rows, cols] output, if it is not."""
    if len(shape) > 2:
        return (
            f"the constant has rank {len(shape)}, higher than the rank-2 {where}, "
            "so the result would broadcast to a larger output"
        )
    r, c = (1,) * (2 - len(shape)) + tuple(shape)
    if c != 1 and c != cols:
        known = f"has {cols}" if cols else "has an unknown number of"
        return f"the constant has {c} columns but the {where} {known} columns"
    if r != 1 and r != rows:
        if rows is None:
            return (
                f"the constant of shape {list(shape)} varies along the rows and the {where} "
                "row count is not static, so it may broadcast to more rows than a Gemm C can"
            )
        return f"the constant has {r} rows but the {where} has {rows}"
    return None


# ----------------------------------------------------------------------------- rewrite


def _rewrite(m: Match, plan: _Plan, names: set[str]) -> None:
    what = "C" if plan.op == "Gemm" or m.producer.op == "Gemm" else "bias"
    name = fresh_name(f"{m.node.outputs[0].name}_fused_{what}", names)
    set_input(m.producer, 2, gs.Constant(name, plan.bias))
    if plan.op:
        m.producer.op = plan.op
    m.producer.attrs.update(plan.attrs)
    absorb(m)
