"""Lowerings: ops a TensorRT target cannot parse, rewritten exactly into ops it can.

Each lowering is the op's ONNX definition written out as standard nodes: the spec text
of `onnx.defs.get_schema(op, opset).doc` and the op's function body (where they differ in
arithmetic form, the spec text's: variance as the mean of squared deviations, where the
normalization function bodies compute E[x^2] - E[x]^2)::

    LayerNormalization(X, Scale, B){axis, epsilon, stash_type}      (U: the stash_type)
        XU = Cast<U>(X)                       (only when U is not X's type)
        Mean = ReduceMean(XU, axes=[axis, ..., -1]); D = Sub(XU, Mean)
        StdDev = Sqrt(Add(ReduceMean(Mul(D, D)), epsilon))
        N = Div(D, StdDev), or when InvStdDev is read:
            InvStdDev = Div(1, StdDev); N = Mul(D, InvStdDev)
        Y = Add(Mul(Cast<T>(N), Scale), B)    (Mean and InvStdDev, type U, written when read)
    GroupNormalization(X, scale, bias){num_groups=G, epsilon, stash_type (21)}
        N = standardize(Reshape(Cast<U>(X), [0, G, -1])) over axis 2, then Cast<T>
        opset 18 (scale, bias per group, [G]):   Y = Reshape(N * scale[G,1] + bias[G,1], Shape(X))
        opset 21 (per channel, [C]; U = stash): Y = Reshape(Reshape(N, [0, C, -1]) * scale[C,1]
                                                            + bias[C,1], Shape(X))
    InstanceNormalization(X, scale, B)  = the same with [0, 0, -1] (one group per channel)
    Gelu(X){approximate="none"}  = Mul(Mul(X, 0.5), Add(Erf(Div(X, sqrt 2)), 1))
    Gelu(X){approximate="tanh"}  = Mul(Mul(X, 0.5), Add(Tanh(Mul(Add(X, Mul(Pow(X, 3), 0.044715)),
                                                                 sqrt(2/pi))), 1))
    HardSigmoid(X){alpha, beta}  = Max(Min(Add(Mul(X, alpha), beta), 1), 0)
    HardSwish(X)                 = Mul(X, HardSigmoid<alpha=1/6, beta=1/2>(X))
    Mish(X)                      = Mul(X, Tanh(Softplus(X)))
    Softplus(X)                  = Log(Add(Exp(X), 1))       (ONNX's ln(exp(x) + 1): Exp
                                   overflows to inf above ~88 in float32, ~11 in float16)
    Einsum(A, B) "bij,bjk->bik"  = [Transpose] MatMul(Transpose?(A), Transpose?(B)) [Transpose]
    Einsum(A) "ij->ji"           = Transpose(A)  (Identity when the order does not change)

Constants take the node's float type (the function bodies' CastLike); epsilon is the
float32 attribute cast to the stash type. ReduceMean takes its axes as an attribute
before opset 18 and as an int64 initializer from 18. Einsum lowers only a (batched)
matrix multiply: one contracted letter, one letter kept from each operand, batch letters
in both, an ellipsis leading everywhere; anything else is left with the reason.

Ops without one here that ONNX defines by a function body are lowered by that body
(`graphfix.plugins.function_bodies`; `lowering_of(op, opset)` gives either).

`LOWERINGS` is the table op type -> `Lowering` (the ops it may emit, its planner, and
what in the target row's restrictions text rules a node out). `lowering_for(op,
target)` is the lowering whose emitted ops the target parses, directly or lowered in
turn (doctor names `lower-unsupported` as the fix when there is one); `unavailable`
lists emitted ops a target can do neither with. Einsum's planner is `plugins.einsum`, cubic
Resize's (a mode no TensorRT version lists) `plugins.resize`. The pass is
`graphfix.passes.lower_unsupported`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper
from onnx.defs import onnx_opset_version

from graphfix.graph import constant_value, fresh_name, is_graph_output
from graphfix.plugins import resize
from graphfix.plugins.einsum import einsum, einsum_restricted, rank_of

Emit = Callable[["Builder"], None]
NO_DTYPE = ("its float type is unknown, so the constants it needs cannot be typed; "
            "run shape inference on the model first")


@dataclass(frozen=True)
class Env:
    """What a planner may know beyond its node: the graph holding it, the model's ai.onnx
    opset, the float type of the node's first input (None when unknown), and the target
    and forced op types (a function body expands the ops in it that these rule out)."""

    graph: gs.Graph
    opset: int
    dtype: np.dtype | None
    target: Any = None
    forced: frozenset[str] = frozenset()


def _unrestricted(node: gs.Node, env: Env, text: str) -> str | None:
    return None


@dataclass(frozen=True)
class Lowering:
    """How one op type lowers. `plan(node, env)` gives the emitting function or why this
    node has no exact lowering; `restricted(node, env, text)` says why the restrictions
    text of a target row that supports the op rules this node out (None: it does not);
    `emits` is every op type the emitting functions may create."""

    op: str
    emits: frozenset[str]
    plan: Callable[[gs.Node, Env], Emit | str]
    restricted: Callable[[gs.Node, Env, str], str | None] = _unrestricted


class Builder:
    """Creates the nodes of one lowering in `env.graph`; a dry builder only records the
    op types it would create (`ops`), so they can be checked before anything changes."""

    def __init__(self, env: Env, names: set[str], base: str, dry: bool = False) -> None:
        self.env, self.names, self.base, self.dry = env, names, base, dry
        self.ops: list[str] = []
        self.nodes: list[gs.Node] = []

    def const(self, what: str, value: Any) -> gs.Constant:
        return gs.Constant(fresh_name(f"{self.base}_{what}", self.names), np.asarray(value))

    def node(self, op: str, inputs: list[gs.Tensor], attrs: dict | None = None,
             out: gs.Tensor | None = None, dtype: Any = None) -> gs.Tensor:
        """Add `op`(inputs); it writes `out`, or a new tensor of `dtype` that it returns."""
        self.ops.append(op)
        if out is None:
            out = gs.Variable(fresh_name(f"{self.base}_{op.lower()}_out", self.names),
                              dtype=dtype)
        if not self.dry:
            self.nodes.append(gs.Node(op, fresh_name(f"{self.base}_{op.lower()}", self.names),
                                      dict(attrs or {}), list(inputs), [out]))
        return out

    def variable(self, what: str, dtype: Any = None) -> gs.Variable:
        return gs.Variable(fresh_name(f"{self.base}_{what}", self.names), dtype=dtype)

    def outputs(self, op: str, inputs: list[gs.Tensor], attrs: dict,
                outputs: list[gs.Tensor]) -> list[gs.Tensor]:
        """Add `op`(inputs) writing every tensor of `outputs` (a Split's two halves)."""
        self.ops.append(op)
        if not self.dry:
            self.nodes.append(gs.Node(op, fresh_name(f"{self.base}_{op.lower()}", self.names),
                                      dict(attrs), list(inputs), list(outputs)))
        return outputs

    def cast(self, x: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
        return self.node("Cast", [x], {"to": helper.np_dtype_to_tensor_dtype(dtype)},
                         dtype=dtype)

    def reduce_mean(self, x: gs.Tensor, axes: list[int], out: gs.Tensor | None = None,
                    dtype: Any = None) -> gs.Tensor:
        """ReduceMean with keepdims; axes an attribute before opset 18, an input from 18."""
        if self.env.opset >= 18:
            axes_input = self.const("axes", np.array(axes, np.int64))
            return self.node("ReduceMean", [x, axes_input], {"keepdims": 1}, out, dtype)
        return self.node("ReduceMean", [x], {"axes": list(axes), "keepdims": 1}, out, dtype)


def emitted_ops(emit: Emit, env: Env) -> tuple[str, ...]:
    """The op types `emit` creates, in order, found by a dry run that changes nothing."""
    dry = Builder(env, set(), "dry", dry=True)
    emit(dry)
    return tuple(dry.ops)


def apply(node: gs.Node, emit: Emit, env: Env, names: set[str]) -> list[gs.Node]:
    """Disconnect `node`, emit its lowering into its graph, return the new nodes (whose
    last writers take the node's output tensors, so names and types are kept)."""
    builder = Builder(env, names, node.name or node.outputs[0].name)
    node.inputs.clear()
    node.outputs.clear()
    emit(builder)
    env.graph.nodes.extend(builder.nodes)
    return builder.nodes


# ----------------------------------------------------------------------------- activations


def _typed(env: Env, value: float) -> np.ndarray:
    """A float32 constant (as ONNX writes them) cast to the node's type (CastLike)."""
    assert env.dtype is not None, "checked by the planner"
    return np.asarray(np.float32(value)).astype(env.dtype)


def _gelu(node: gs.Node, env: Env) -> Emit | str:
    approximate = str(node.attrs.get("approximate", "none"))
    if approximate not in ("none", "tanh"):
        return f"its approximate='{approximate}' is neither 'none' nor 'tanh'"
    if env.dtype is None:
        return NO_DTYPE
    dt, x, y = env.dtype, node.inputs[0], node.outputs[0]

    def emit(b: Builder) -> None:
        if approximate == "none":
            sqrt2 = b.const("sqrt2", np.sqrt(_typed(env, 2.0)))
            inner = b.node("Erf", [b.node("Div", [x, sqrt2], dtype=dt)], dtype=dt)
        else:
            cube = b.node("Pow", [x, b.const("three", _typed(env, 3.0))], dtype=dt)
            cubic = b.node("Mul", [cube, b.const("c0", _typed(env, 0.044715))], dtype=dt)
            scale = b.const("sqrt_2_pi", np.sqrt(_typed(env, 2 / math.pi)))
            arg = b.node("Mul", [b.node("Add", [x, cubic], dtype=dt), scale], dtype=dt)
            inner = b.node("Tanh", [arg], dtype=dt)
        phi = b.node("Add", [inner, b.const("one", _typed(env, 1.0))], dtype=dt)
        half_x = b.node("Mul", [x, b.const("half", _typed(env, 0.5))], dtype=dt)
        b.node("Mul", [half_x, phi], out=y)

    return emit


def _hard_sigmoid(node: gs.Node, env: Env) -> Emit | str:
    if env.dtype is None:
        return NO_DTYPE
    dt, x, y = env.dtype, node.inputs[0], node.outputs[0]
    alpha = float(node.attrs.get("alpha", 0.2))
    beta = float(node.attrs.get("beta", 0.5))

    def emit(b: Builder) -> None:
        t = b.node("Mul", [x, b.const("alpha", _typed(env, alpha))], dtype=dt)
        t = b.node("Add", [t, b.const("beta", _typed(env, beta))], dtype=dt)
        t = b.node("Min", [t, b.const("one", _typed(env, 1.0))], dtype=dt)
        b.node("Max", [t, b.const("zero", _typed(env, 0.0))], out=y)

    return emit


def _hard_swish(node: gs.Node, env: Env) -> Emit | str:
    dt, x, y = env.dtype, node.inputs[0], node.outputs[0]

    def emit(b: Builder) -> None:
        gate = b.node("HardSigmoid", [x], {"alpha": 1 / 6, "beta": 0.5}, dtype=dt)
        b.node("Mul", [x, gate], out=y)

    return emit


def _mish(node: gs.Node, env: Env) -> Emit | str:
    dt, x, y = env.dtype, node.inputs[0], node.outputs[0]

    def emit(b: Builder) -> None:
        soft = b.node("Tanh", [b.node("Softplus", [x], dtype=dt)], dtype=dt)
        b.node("Mul", [x, soft], out=y)

    return emit


def _softplus(node: gs.Node, env: Env) -> Emit | str:
    if env.dtype is None:
        return NO_DTYPE
    dt, x, y = env.dtype, node.inputs[0], node.outputs[0]

    def emit(b: Builder) -> None:
        e = b.node("Add", [b.node("Exp", [x], dtype=dt), b.const("one", _typed(env, 1.0))],
                   dtype=dt)
        b.node("Log", [e], out=y)

    return emit


# ----------------------------------------------------------------------------- normalizations


def deviation_and_std(b: Builder, x: gs.Tensor, axes: list[int], eps: float, dt: np.dtype,
                      mean_out: gs.Tensor | None = None, centred: bool = True
                      ) -> tuple[gs.Tensor, gs.Tensor]:
    """(d, sqrt(mean(d * d) + eps)) over `axes`: d = x - mean (Mean into `mean_out`
    when given), or x itself when not `centred` (an RMS norm)."""
    d = x
    if centred:
        d = b.node("Sub", [x, b.reduce_mean(x, axes, out=mean_out, dtype=dt)], dtype=dt)
    var = b.reduce_mean(b.node("Mul", [d, d], dtype=dt), axes, dtype=dt)
    epsilon = b.const("epsilon", np.asarray(np.float32(eps)).astype(dt))
    return d, b.node("Sqrt", [b.node("Add", [var, epsilon], dtype=dt)], dtype=dt)


def _standardize(b: Builder, x: gs.Tensor, axes: list[int], eps: float, dt: np.dtype,
                 mean_out: gs.Tensor | None = None,
                 inv_out: gs.Tensor | None = None) -> gs.Tensor:
    """(x - mean) / sqrt(var + eps) over `axes`, var the mean of squared deviations;
    writes Mean and InvStdDev into `mean_out` and `inv_out` when they are given."""
    d, std = deviation_and_std(b, x, axes, eps, dt, mean_out)
    if inv_out is None:
        return b.node("Div", [d, std], dtype=dt)
    inv = b.node("Div", [b.const("one", np.ones((), dt)), std], out=inv_out)
    return b.node("Mul", [d, inv], dtype=dt)


def _stash(node: gs.Node, dtype: np.dtype) -> np.dtype | str:
    """The computation type named by `stash_type` (default 1, float32)."""
    stash = int(node.attrs.get("stash_type", 1))
    try:
        found = np.dtype(helper.tensor_dtype_to_np_dtype(stash))
    except (KeyError, TypeError):
        found = None
    if found is None or not np.issubdtype(found, np.floating):
        return f"its stash_type {stash} is not a floating-point type numpy can compute in"
    return found


def _used(node: gs.Node, index: int, env: Env) -> gs.Tensor | None:
    """The node's optional output `index` when something reads it, else None."""
    if len(node.outputs) <= index or node.outputs[index].is_empty():
        return None
    t = node.outputs[index]
    return t if t.outputs or is_graph_output(env.graph, t) else None


def _layer_norm(node: gs.Node, env: Env) -> Emit | str:
    if len(node.inputs) < 2 or env.dtype is None:
        return "it has no Scale input" if len(node.inputs) < 2 else NO_DTYPE
    dt, (x, scale), y = env.dtype, node.inputs[:2], node.outputs[0]
    bias = node.inputs[2] if len(node.inputs) > 2 and not node.inputs[2].is_empty() else None
    axis, rank = int(node.attrs.get("axis", -1)), rank_of(x)
    if axis >= 0 and rank is None:
        return (f"its axis is {axis} and its input's rank is unknown, so the normalized axes "
                "are unknown (a negative axis needs no rank)")
    axes = list(range(axis, rank)) if axis >= 0 else list(range(axis, 0))
    compute = _stash(node, dt)
    if isinstance(compute, str):
        return compute
    eps = float(node.attrs.get("epsilon", 1e-5))
    mean_out, inv_out = _used(node, 1, env), _used(node, 2, env)

    def emit(b: Builder) -> None:
        xu = b.cast(x, compute) if compute != dt else x
        norm = _standardize(b, xu, axes, eps, compute, mean_out, inv_out)
        norm = b.cast(norm, dt) if compute != dt else norm
        scaled = b.node("Mul", [norm, scale], out=None if bias is not None else y, dtype=dt)
        if bias is not None:
            b.node("Add", [scaled, bias], out=y)

    return emit


def _column(b: Builder, t: gs.Tensor, what: str, dt: np.dtype) -> gs.Tensor:
    """`t` ([K]) as [K, 1]: a new constant when it is one, else a Reshape."""
    value = constant_value(t)
    if value is not None:
        return b.const(what, np.array(value).reshape(-1, 1))
    return b.node("Reshape", [t, b.const(f"{what}_shape", np.array([-1, 1], np.int64))],
                  dtype=dt)


def _affine_back(b: Builder, norm: gs.Tensor, io: list[gs.Tensor], dt: np.dtype) -> None:
    """Y = Reshape(norm * scale[K,1] + bias[K,1], Shape(X)), `io` = [X, scale, bias, Y]."""
    x, scale, bias, y = io
    scaled = b.node("Mul", [norm, _column(b, scale, "scale", dt)], dtype=dt)
    shifted = b.node("Add", [scaled, _column(b, bias, "bias", dt)], dtype=dt)
    b.node("Reshape", [shifted, b.node("Shape", [x], dtype=np.int64)], out=y)


def _channels(x: gs.Tensor, scale: gs.Tensor) -> int | None:
    if x.shape is not None and len(x.shape) > 1 and isinstance(x.shape[1], int):
        return int(x.shape[1])
    value = constant_value(scale)
    return int(value.size) if value is not None else None


def _group_norm(node: gs.Node, env: Env) -> Emit | str:
    if len(node.inputs) != 3 or env.dtype is None:
        return NO_DTYPE if env.dtype is None else f"it has {len(node.inputs)} inputs, not 3"
    dt, x, io = env.dtype, node.inputs[0], [*node.inputs, node.outputs[0]]
    groups = int(node.attrs.get("num_groups", 0))
    eps = float(node.attrs.get("epsilon", 1e-5))
    per_channel = env.opset >= 21  # GroupNormalization-21: scale and bias per channel
    compute = _stash(node, dt) if per_channel else dt
    if isinstance(compute, str):
        return compute
    channels = _channels(x, node.inputs[1]) if per_channel else None
    if per_channel and channels is None:
        return ("its channel count is unknown (neither its input's shape nor a constant "
                "scale gives it), so the per-channel scale cannot be laid out")

    def emit(b: Builder) -> None:
        xu = b.cast(x, compute) if compute != dt else x
        shape = b.const("groups_shape", np.array([0, groups, -1], np.int64))
        grouped = b.node("Reshape", [xu, shape], dtype=compute)
        norm = _standardize(b, grouped, [2], eps, compute)
        norm = b.cast(norm, dt) if compute != dt else norm
        if per_channel:
            shape = b.const("channels_shape", np.array([0, channels, -1], np.int64))
            norm = b.node("Reshape", [norm, shape], dtype=dt)
        _affine_back(b, norm, io, dt)

    return emit


def _instance_norm(node: gs.Node, env: Env) -> Emit | str:
    if len(node.inputs) != 3 or env.dtype is None:
        return NO_DTYPE if env.dtype is None else f"it has {len(node.inputs)} inputs, not 3"
    dt, x, io = env.dtype, node.inputs[0], [*node.inputs, node.outputs[0]]
    eps = float(node.attrs.get("epsilon", 1e-5))

    def emit(b: Builder) -> None:
        shape = b.const("channels_shape", np.array([0, 0, -1], np.int64))
        flat = b.node("Reshape", [x, shape], dtype=dt)
        _affine_back(b, _standardize(b, flat, [2], eps, dt), io, dt)

    return emit


def _layer_norm_restricted(node: gs.Node, env: Env, text: str) -> str | None:
    if "only the first output" in text.lower() and (_used(node, 1, env) or _used(node, 2, env)):
        return f"its Mean or InvStdDev output is read, and the table says: {text}"
    return None


_RANK_RANGE = re.compile(r"rank must be >=\s*(\d+)\s*&\s*<=\s*(\d+)", re.I)


def _instance_norm_restricted(node: gs.Node, env: Env, text: str) -> str | None:
    weights = all(isinstance(t, gs.Constant) for t in node.inputs[1:3])
    if "must be initializers" in text and not weights:
        return f"its scale or B is not an initializer, and the table says: {text}"
    bounds, rank = _RANK_RANGE.search(text), rank_of(node.inputs[0])
    if bounds and rank is not None and not int(bounds[1]) <= rank <= int(bounds[2]):
        return f"its input has rank {rank}, and the table says: {text}"
    return None


# ----------------------------------------------------------------------------- the table

_NORM = frozenset({"ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"})
LOWERINGS: dict[str, Lowering] = {
    low.op: low for low in (
        Lowering("LayerNormalization", _NORM | {"Cast"}, _layer_norm, _layer_norm_restricted),
        Lowering("GroupNormalization", _NORM | {"Cast", "Reshape", "Shape"}, _group_norm),
        Lowering("InstanceNormalization", _NORM | {"Reshape", "Shape"}, _instance_norm,
                 _instance_norm_restricted),
        Lowering("Gelu", frozenset({"Div", "Erf", "Add", "Mul", "Pow", "Tanh"}), _gelu),
        Lowering("HardSigmoid", frozenset({"Mul", "Add", "Min", "Max"}), _hard_sigmoid),
        Lowering("HardSwish", frozenset({"HardSigmoid", "Mul"}), _hard_swish),
        Lowering("Mish", frozenset({"Softplus", "Tanh", "Mul"}), _mish),
        Lowering("Softplus", frozenset({"Exp", "Add", "Log"}), _softplus),
        Lowering("Einsum", frozenset({"Transpose", "MatMul", "Identity"}), einsum,
                 einsum_restricted),
        Lowering("Resize", resize.EMITS, resize.cubic_resize, resize.resize_restricted),
    )
}


def parses(target: Any, op: str) -> bool:
    """Whether the target's table lists `op` as supported."""
    row = target.op(op)
    return row is not None and row.supported


def unavailable(ops: Iterable[str], target: Any, seen: frozenset[str] = frozenset()) -> list[str]:
    """The op types among `ops` that `target` (a graphfix.trt.TrtTarget) neither parses
    nor lowers into ops it parses, in turn (`seen`: ops already being lowered)."""
    missing = []
    for op in dict.fromkeys(ops):
        lowering = LOWERINGS.get(op)
        if parses(target, op):
            continue
        if lowering is None or op in seen or unavailable(lowering.emits, target, seen | {op}):
            missing.append(op)
    return missing


def lowering_for(op_type: str, target: Any) -> Lowering | None:
    """The lowering of `op_type` when every op it may emit is one `target` parses, directly
    or lowered in turn; None when there is none. An op without a hand-written lowering
    counts when its function body (`graphfix.plugins.function_bodies`), expanded for a
    typical node of it, emits only such ops."""
    lowering = LOWERINGS.get(op_type)
    if lowering is None:
        from graphfix.plugins.function_bodies import typical_ops  # it imports this module

        ops = typical_ops(op_type, target)
        if ops is None or unavailable(ops, target, frozenset({op_type})):
            return None
        return lowering_of(op_type, onnx_opset_version())
    if unavailable(lowering.emits, target, frozenset({op_type})):
        return None
    return lowering


def lowering_of(op_type: str, opset: int) -> Lowering | None:
    """The hand-written lowering of `op_type`, else its function body's at `opset`."""
    lowering = LOWERINGS.get(op_type)
    if lowering is None:
        from graphfix.plugins.function_bodies import function_lowering  # imports this module

        lowering = function_lowering(op_type, opset)
    return lowering
