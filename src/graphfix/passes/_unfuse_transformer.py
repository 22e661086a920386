"""unfuse-contrib's transformer part: the fusions onnxruntime's transformer optimizer writes
(`onnxruntime.transformers.optimizer`, Olive), rewritten as standard ONNX ops::

    SkipLayerNormalization(x, skip, gamma, beta?, bias?)  -> LayerNorm(x + skip + bias)
    SkipSimplifiedLayerNormalization(x, skip, gamma, bias?) -> RMSNorm(x + skip + bias)
    SimplifiedLayerNormalization(x, scale) (domain "")     -> RMSNorm(x)
    LayerNormalization below opset 17 (domain "")           -> the ONNX function's ops
    Gelu(x), BiasGelu(a, b)                                 -> 0.5 * x * (1 + erf(x / sqrt 2))
    FastGelu(x, bias?), GemmFastGelu(x, w, bias?)           -> 0.5 * x * (1 + tanh(...))
    QuickGelu(x){alpha}                                     -> x * Sigmoid(alpha * x)
    BiasAdd(x, bias, skip)                                  -> x + bias + skip
    BiasSplitGelu(x, bias)                                  -> left * Gelu(right) of x + bias

The formulas are onnxruntime's operator docs (its schemas' text, and their defaults:
epsilon 1e-12 for the Skip* ops, 1e-5 for the others, QuickGelu alpha 1.702). A layer
norm is a standard LayerNormalization from opset 17 (stash_type 1, as onnxruntime
computes it); below 17, and for every RMS norm (ONNX has RMSNormalization only from
opset 23), the reduction is written out, in float32 for float16/bfloat16 tensors, as
onnxruntime's kernels compute it. The optional outputs are kept: a Skip* op's
`input_skip_bias_sum` is its last Add's output, `mean` and `inv_std_var` the reduction's.
Each rewrite returns None, or the reason it left the node alone.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from graphfix.graph.dtypes import float_dtype
from graphfix.graph.ort_ops import LAYER_NORM_OPSET
from graphfix.passes._unfuse_emit import Emitter

SKIP_EPSILON = 1e-12  # onnxruntime's kDefaultSkipLayerNormEpsilon
NORM_EPSILON = 1e-5  # LayerNormalization / SimplifiedLayerNormalization's default
QUICK_GELU_ALPHA = 1.702
NO_DTYPE = ("its float type is unknown, so the constants it needs cannot be typed; "
            "run shape inference on the model first")
_FAST_ALPHA = math.sqrt(2 / math.pi)  # FastGelu: 0.5x(1 + tanh(alpha x + alpha * 0.044715 x^3))
_FAST_BETA = _FAST_ALPHA * 0.044715


def present_output(node: gs.Node, i: int) -> gs.Variable | None:
    """Output `i` of `node` when the model asks for it, else None."""
    if i < len(node.outputs) and not node.outputs[i].is_empty():
        return node.outputs[i]
    return None


def present_input(node: gs.Node, i: int) -> gs.Tensor | None:
    """Input `i` of `node` when given (not omitted), else None."""
    if i < len(node.inputs) and not node.inputs[i].is_empty():
        return node.inputs[i]
    return None


def detach(node: gs.Node) -> str:
    """Disconnect `node` (cleanup removes it); its name or first output's, for new names."""
    base = node.name or node.outputs[0].name
    node.inputs.clear()
    node.outputs.clear()
    return base


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """onnxruntime's kernels compute float16 (and bfloat16) norms in float32."""
    return np.dtype(np.float32) if str(dtype) in ("float16", "bfloat16") else np.dtype(dtype)


def _onnx_type(dtype: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _norm_axes(axis: int, x: gs.Tensor) -> list[int] | str:
    """The axes a norm with attribute `axis` reduces, all negative (so no rank is needed
    when `axis` is negative); a reason when `axis` is not negative and the rank is unknown."""
    if axis < 0:
        return list(range(axis, 0))
    if x.shape is None:
        return f"its axis is {axis} and its input's rank is unknown"
    rank = len(x.shape)
    return list(range(axis - rank, 0))


def norm_refusal(x: gs.Tensor, *, rms: bool, mean_out: gs.Tensor | None) -> str | None:
    """Why `emit_norm` cannot write this norm, or None: checked before anything changes."""
    if float_dtype(x) is None:
        return NO_DTYPE
    if rms and mean_out is not None:
        return "it asks for its mean output, which an RMS norm does not compute"
    return None


def widen(em: Emitter, t: gs.Tensor | None, compute: np.dtype, base: str) -> gs.Tensor | None:
    """`t` in the `compute` dtype: itself, or Cast to float32 (a float16 or bfloat16 tensor;
    a constant's Cast is folded later)."""
    if t is None or float_dtype(t) in (None, compute):
        return t
    return em.node("Cast", f"{base}_to_float", [t], {"to": TensorProto.FLOAT}, dtype=compute)


def emit_norm(em: Emitter, base: str, x: gs.Tensor, scale: gs.Tensor, bias: gs.Tensor | None,
              *, epsilon: float, axes: list[int], rms: bool, out: gs.Tensor, out_dtype,
              mean_out: gs.Tensor | None = None, inv_out: gs.Tensor | None = None) -> None:
    """Normalize `x` over `axes` (layer norm, or RMS norm when `rms`), times `scale` plus
    `bias`, computed in float32 for float16/bfloat16 tensors as onnxruntime's kernels do;
    the last node writes `out` (a Cast to `out_dtype` when that is narrower), the
    statistics go to `mean_out` / `inv_out`. `norm_refusal` said None for `x`."""
    compute = _compute_dtype(float_dtype(x))
    xc, scale, bias = (widen(em, t, compute, f"{base}_{k}")
                       for t, k in ((x, "x"), (scale, "scale"), (bias, "bias")))
    narrowed = compute != np.dtype(out_dtype)
    result = gs.Variable(em.fresh(f"{base}_norm"), dtype=compute) if narrowed else out
    if not rms and em.opset >= LAYER_NORM_OPSET and axes == list(range(axes[0], 0)):
        outs = [result, mean_out or gs.Variable.empty(), inv_out or gs.Variable.empty()]
        while outs[-1].is_empty():
            outs.pop()
        node = gs.Node("LayerNormalization", em.fresh(f"{base}_layernorm"),
                       {"axis": axes[0], "epsilon": float(epsilon), "stash_type": 1},
                       [xc, scale, *([bias] if bias is not None else [])], outs)
        em.graph.nodes.append(node)
    else:
        _emit_reduced_norm(em, base, xc, scale, bias, epsilon=epsilon, axes=axes, rms=rms,
                           out=result, compute=compute, mean_out=mean_out, inv_out=inv_out)
    if narrowed:
        em.node("Cast", f"{base}_cast_back", [result], {"to": _onnx_type(out_dtype)},
                output=out, dtype=out_dtype)


def _emit_reduced_norm(em: Emitter, base: str, x: gs.Tensor, scale: gs.Tensor,
                       bias: gs.Tensor | None, *, epsilon: float, axes: list[int], rms: bool,
                       out: gs.Tensor, compute, mean_out: gs.Tensor | None,
                       inv_out: gs.Tensor | None) -> None:
    """The norm written out: (x - mean) / sqrt(mean((x - mean)^2) + epsilon) * scale + bias
    (x / sqrt(mean(x^2) + epsilon) * scale for an RMS norm), all in `compute`; the
    deviation and its root mean square as lower-unsupported's layer norm writes them."""
    # imported here: the default pipeline runs unfuse-contrib, and the lowerings (einsum
    # planner included) are not otherwise loaded by a run without --trt
    from graphfix.plugins.lowering import Builder, Env, deviation_and_std

    b = Builder(Env(em.graph, em.opset, np.dtype(compute)), em.names, base)
    centred, std = deviation_and_std(b, x, axes, epsilon, np.dtype(compute), mean_out,
                                     centred=not rms)
    em.graph.nodes.extend(b.nodes)
    if inv_out is not None:
        em.node("Reciprocal", f"{base}_inv", [std], output=inv_out, dtype=compute)
    y = em.node("Div", f"{base}_div", [centred, std], dtype=compute)
    if bias is None:
        em.node("Mul", f"{base}_scale", [y, scale], output=out, dtype=compute)
    else:
        y = em.node("Mul", f"{base}_scale", [y, scale], dtype=compute)
        em.node("Add", f"{base}_bias", [y, bias], output=out, dtype=compute)


def emit_erf_gelu(em: Emitter, base: str, x: gs.Tensor, out: gs.Tensor, dtype) -> None:
    """0.5 * x * (1 + erf(x / sqrt 2)), as Mul, Erf, Add, Mul, Mul; the last writes `out`."""
    def const(what: str, value: float) -> gs.Constant:
        return em.const(f"{base}_{what}", np.array(value, dtype))

    t = em.node("Mul", f"{base}_mul", [x, const("rsqrt2", 1 / math.sqrt(2))], dtype=dtype)
    t = em.node("Erf", f"{base}_erf", [t], dtype=dtype)
    t = em.node("Add", f"{base}_add", [t, const("one", 1.0)], dtype=dtype)
    t = em.node("Mul", f"{base}_mul", [t, x], dtype=dtype)
    em.node("Mul", f"{base}_mul", [t, const("half", 0.5)], output=out, dtype=dtype)


def _emit_tanh_gelu(em: Emitter, base: str, x: gs.Tensor, out: gs.Tensor, dtype) -> None:
    """0.5 * x * (1 + tanh(x * (beta * x * x + alpha))), onnxruntime's FastGelu."""
    def const(what: str, value: float) -> gs.Constant:
        return em.const(f"{base}_{what}", np.array(value, dtype))

    t = em.node("Mul", f"{base}_mul", [x, x], dtype=dtype)
    t = em.node("Mul", f"{base}_mul", [t, const("beta", _FAST_BETA)], dtype=dtype)
    t = em.node("Add", f"{base}_add", [t, const("alpha", _FAST_ALPHA)], dtype=dtype)
    t = em.node("Mul", f"{base}_mul", [t, x], dtype=dtype)
    t = em.node("Tanh", f"{base}_tanh", [t], dtype=dtype)
    t = em.node("Add", f"{base}_add", [t, const("one", 1.0)], dtype=dtype)
    t = em.node("Mul", f"{base}_mul", [t, x], dtype=dtype)
    em.node("Mul", f"{base}_mul", [t, const("half", 0.5)], output=out, dtype=dtype)


# ----------------------------------------------------------------------------- rewrites


def skip_layer_norm(node: gs.Node, em: Emitter) -> str | None:
    """SkipLayerNormalization(input, skip, gamma, beta?, bias?) and the Simplified one
    (input, skip, gamma, bias?): the sum, then the norm over the last axis."""
    rms = node.op == "SkipSimplifiedLayerNormalization"
    x, skip, gamma = present_input(node, 0), present_input(node, 1), present_input(node, 2)
    if x is None or skip is None or gamma is None:
        return "it lacks one of its input, skip and gamma inputs"
    beta = None if rms else present_input(node, 3)
    bias = present_input(node, 3 if rms else 4)
    out, mean_out, inv_out, sum_out = (present_output(node, i) for i in range(4))
    if out is None:
        return "its output is not used"
    reason = norm_refusal(x, rms=rms, mean_out=mean_out)
    if reason:
        return reason
    dtype = float_dtype(x)
    compute = _compute_dtype(dtype)
    base = detach(node)
    # onnxruntime sums in float32 too: a float16 sum rounded before the norm would not match
    x, skip, bias = (widen(em, t, compute, f"{base}_{k}")
                     for t, k in ((x, "x"), (skip, "skip"), (bias, "bias")))
    direct = sum_out if compute == dtype else None
    total = em.node("Add", f"{base}_skip", [x, skip],
                    output=direct if bias is None else None, dtype=compute)
    if bias is not None:
        total = em.node("Add", f"{base}_bias_add", [total, bias], output=direct, dtype=compute)
    if sum_out is not None and direct is None:
        em.node("Cast", f"{base}_sum", [total], {"to": _onnx_type(dtype)}, output=sum_out,
                dtype=dtype)
    epsilon = float(node.attrs.get("epsilon", SKIP_EPSILON))
    emit_norm(em, base, total, gamma, beta, epsilon=epsilon, axes=[-1], rms=rms, out=out,
              out_dtype=dtype, mean_out=mean_out, inv_out=inv_out)
    return None


def onnx_domain_norm(node: gs.Node, em: Emitter) -> str | None:
    """onnxruntime's SimplifiedLayerNormalization(X, scale) and LayerNormalization(X,
    scale, B?) below opset 17, both with `axis`, `epsilon` (and `stash_type`: float32,
    what the rewrite computes narrow types in)."""
    rms = node.op == "SimplifiedLayerNormalization"
    x, scale = present_input(node, 0), present_input(node, 1)
    if x is None or scale is None:
        return "it lacks its input or scale"
    if int(node.attrs.get("stash_type", 1)) != 1:
        return f"its stash_type is {node.attrs['stash_type']}, not 1 (float32)"
    axes = _norm_axes(int(node.attrs.get("axis", -1)), x)
    if isinstance(axes, str):
        return axes
    out = present_output(node, 0)
    stats = [present_output(node, i) for i in (1, 2)]
    mean_out, inv_out = (None, stats[0]) if rms else (stats[0], stats[1])
    if out is None:
        return "its output is not used"
    reason = norm_refusal(x, rms=rms, mean_out=mean_out)
    if reason:
        return reason
    bias = None if rms else present_input(node, 2)
    epsilon = float(node.attrs.get("epsilon", NORM_EPSILON))
    out_dtype = float_dtype(scale) or float_dtype(x)  # onnxruntime's Y has scale's type V
    base = detach(node)
    emit_norm(em, base, x, scale, bias, epsilon=epsilon, axes=axes, rms=rms, out=out,
              out_dtype=out_dtype, mean_out=mean_out, inv_out=inv_out)
    return None


class _InFloat:
    """Where an activation writes: `out` itself, or (float16/bfloat16 data, `wide`) a
    float32 tensor that `done` Casts into `out`, so that the chain rounds once, as
    onnxruntime's kernels, which compute in float32, do. Gelu, FastGelu and QuickGelu are
    not `wide`: onnxruntime's CPU provider evaluates float16 ones op by op in float16
    (measured: bit-identical that way, up to 3e-4 of the range off in float32).
    `inputs` are widened to `compute`."""

    def __init__(self, em: Emitter, base: str, dtype, out: gs.Tensor, wide: bool = True) -> None:
        self.em, self.base, self.dtype, self.out = em, base, np.dtype(dtype), out
        self.compute = _compute_dtype(self.dtype) if wide else self.dtype
        self.narrow = self.compute != self.dtype
        self.target = (gs.Variable(em.fresh(f"{base}_float"), dtype=self.compute)
                       if self.narrow else out)

    def inputs(self, *tensors: gs.Tensor | None) -> list[gs.Tensor | None]:
        return [widen(self.em, t, self.compute, f"{self.base}_in{i}")
                for i, t in enumerate(tensors)]

    def done(self) -> None:
        if self.narrow:
            self.em.node("Cast", f"{self.base}_cast_back", [self.target],
                         {"to": _onnx_type(self.dtype)}, output=self.out, dtype=self.dtype)


def _arity(node: gs.Node, count: int) -> str | None:
    """Why `node` does not have exactly `count` present inputs, or None."""
    if len(node.inputs) != count or any(t.is_empty() for t in node.inputs):
        return f"it has {len(node.inputs)} inputs instead of {count}"
    return None


def _start(node: gs.Node, em: Emitter, x: gs.Tensor, wide: bool = True) -> _InFloat | str:
    """Detach an activation node whose data `x` has a float type, and say where its
    replacement writes; the reason when the type is unknown (nothing changed then)."""
    dtype = float_dtype(x)
    if dtype is None:
        return NO_DTYPE
    out = node.outputs[0]
    return _InFloat(em, detach(node), dtype, out, wide)


def gelu(node: gs.Node, em: Emitter) -> str | None:
    """Gelu(X) and BiasGelu(A, B) = Gelu(A + B): the exact (Erf) form."""
    wanted = 2 if node.op == "BiasGelu" else 1
    if len(node.inputs) != wanted:
        return f"it has {len(node.inputs)} inputs instead of {wanted}"
    x, bias = node.inputs[0], present_input(node, 1)
    f = _start(node, em, x, wide=bias is not None)
    if isinstance(f, str):
        return f
    base = f.base
    x, bias = f.inputs(x, bias)
    if bias is not None:
        x = em.node("Add", f"{base}_bias", [x, bias], dtype=f.compute)
    emit_erf_gelu(em, base, x, f.target, f.compute)
    f.done()
    return None


def fast_gelu(node: gs.Node, em: Emitter) -> str | None:
    """FastGelu(X, bias?) and GemmFastGelu(X, W, bias?) = FastGelu(MatMul(X, W), bias)."""
    gemm = node.op == "GemmFastGelu"
    x = present_input(node, 0)
    weight = present_input(node, 1) if gemm else None
    if x is None or (gemm and weight is None):
        return "it lacks its input" + (" or its weights" if gemm else "")
    bias = present_input(node, 2 if gemm else 1)
    f = _start(node, em, x, wide=gemm)
    if isinstance(f, str):
        return f
    base = f.base
    x, weight, bias = f.inputs(x, weight, bias)
    if weight is not None:
        x = em.node("MatMul", f"{base}_matmul", [x, weight], dtype=f.compute)
    if bias is not None:
        x = em.node("Add", f"{base}_bias", [x, bias], dtype=f.compute)
    _emit_tanh_gelu(em, base, x, f.target, f.compute)
    f.done()
    return None


def quick_gelu(node: gs.Node, em: Emitter) -> str | None:
    """QuickGelu(X){alpha} = X * Sigmoid(alpha * X)."""
    x = present_input(node, 0)
    if x is None:
        return "it lacks its input"
    alpha = float(node.attrs.get("alpha", QUICK_GELU_ALPHA))
    f = _start(node, em, x, wide=False)
    if isinstance(f, str):
        return f
    base = f.base
    (x,) = f.inputs(x)
    scaled = x if alpha == 1.0 else em.node(
        "Mul", f"{base}_alpha", [x, em.const(f"{base}_alpha", np.array(alpha, f.compute))],
        dtype=f.compute)
    gate = em.node("Sigmoid", f"{base}_sigmoid", [scaled], dtype=f.compute)
    em.node("Mul", f"{base}_mul", [x, gate], output=f.target, dtype=f.compute)
    f.done()
    return None


def bias_add(node: gs.Node, em: Emitter) -> str | None:
    """BiasAdd(X, bias, skip) = X + bias + skip."""
    if reason := _arity(node, 3):
        return reason
    x, bias, skip = node.inputs
    f = _start(node, em, x)
    if isinstance(f, str):
        return f
    base = f.base
    x, bias, skip = f.inputs(x, bias, skip)
    total = em.node("Add", f"{base}_bias", [x, bias], dtype=f.compute)
    em.node("Add", f"{base}_skip", [total, skip], output=f.target, dtype=f.compute)
    f.done()
    return None


def bias_split_gelu(node: gs.Node, em: Emitter) -> str | None:
    """BiasSplitGelu(X, bias): X + bias halved on the last axis, left * Gelu(right)."""
    if reason := _arity(node, 2):
        return reason
    x, bias = node.inputs
    width = bias.shape[0] if bias.shape is not None and len(bias.shape) == 1 else None
    if not isinstance(width, int) or width % 2:
        return "its bias's length is unknown or odd, so the halves cannot be sliced"
    if em.opset < 10:
        return f"Slice takes its bounds as inputs from opset 10, not {em.opset}"
    f = _start(node, em, x)
    if isinstance(f, str):
        return f
    base = f.base
    x, bias = f.inputs(x, bias)
    total = em.node("Add", f"{base}_bias", [x, bias], dtype=f.compute)

    def half(what: str, start: int, end: int) -> gs.Tensor:
        bounds = [em.const(f"{base}_{what}_{k}", np.array([v], np.int64))
                  for k, v in (("start", start), ("end", end), ("axis", -1))]
        return em.node("Slice", f"{base}_{what}", [total, *bounds], dtype=f.compute)

    left, right = half("left", 0, width // 2), half("right", width // 2, width)
    gated = gs.Variable(em.fresh(f"{base}_gelu_out"), dtype=f.compute)
    emit_erf_gelu(em, f"{base}_gelu", right, gated, f.compute)
    em.node("Mul", f"{base}_mul", [left, gated], output=f.target, dtype=f.compute)
    f.done()
    return None


MS_REWRITES = {
    "Gelu": gelu, "BiasGelu": gelu, "FastGelu": fast_gelu, "GemmFastGelu": fast_gelu,
    "QuickGelu": quick_gelu, "BiasAdd": bias_add, "BiasSplitGelu": bias_split_gelu,
    "SkipLayerNormalization": skip_layer_norm, "SkipSimplifiedLayerNormalization": skip_layer_norm,
}
def erfc(node: gs.Node, em: Emitter) -> str | None:
    """TensorFlow's Erfc(x) = 1 - Erf(x), in x's type (tf2onnx leaves Erfc in the ONNX
    domain where it has no handler: Keras 3's ONNX export of GELU)."""
    if reason := _arity(node, 1):
        return reason
    x = node.inputs[0]
    f = _start(node, em, x, wide=False)
    if isinstance(f, str):
        return f
    erf = em.node("Erf", f"{f.base}_erf", [x], dtype=f.compute)
    em.node("Sub", f"{f.base}_sub", [em.const(f"{f.base}_one", np.array(1.0, f.compute)), erf],
            output=f.target, dtype=f.compute)
    return None


ONNX_DOMAIN_REWRITES = {"SimplifiedLayerNormalization": onnx_domain_norm,
                        "LayerNormalization": onnx_domain_norm, "Erfc": erfc}
