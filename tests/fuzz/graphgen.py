"""A hypothesis strategy for small valid ONNX models built from the ops graphfix's passes
touch: Conv (groups, dilations, strides, pads, auto_pad), ConvTranspose,
BatchNormalization, Gemm, MatMul, Add/Mul/Sub/Div with broadcast constants or a second
tensor, Relu/Clip/HardSwish/Sigmoid (and the forms normalize-activations rewrites),
Pad, Reshape/Transpose/Squeeze/Unsqueeze/Concat/Slice, Identity/Dropout/Cast, and If with
small bodies; fp32 or fp16; opsets 11-21.

Every node is built for the shapes of its inputs (tracked here, checked against ONNX
shape inference), with the form of its opset (axes as inputs from 13, HardSwish from 14,
Pad's axes from 18, ...). Constants come from a seeded generator: the strategy draws the
structure and one seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

IMAGE, MATRIX = "image", "matrix"


@dataclass(frozen=True)
class T:
    """A tensor of the model being built: name and static shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Builder:
    """Nodes, constants and inputs of one graph (or one If body: `prefix` keeps its
    names apart; its constants are Constant nodes, as exporters write them)."""

    opset: int
    dtype: type
    rng: np.random.Generator
    prefix: str = ""
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    body: bool = False
    count: int = 0

    @property
    def elem(self) -> int:
        return helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype))

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{self.prefix}{stem}{self.count}"

    def const(self, array, stem: str = "k") -> str:
        name = self.name(stem)
        tensor = numpy_helper.from_array(np.asarray(array), name)
        if self.body:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor,
                                               name=self.name("Constant")))
        else:
            self.inits.append(tensor)
        return name

    def floats(self, shape, scale: float = 0.5, low: float = 0.0) -> np.ndarray:
        """Seeded values in the model's float dtype: N(0, scale^2), or with `low`
        magnitudes in [low, low + scale] with random signs (divisors)."""
        if low:
            mag = low + self.rng.random(shape) * scale
            values = np.where(self.rng.random(shape) < 0.5, -mag, mag)
        else:
            values = self.rng.standard_normal(shape) * scale
        return np.asarray(values).astype(self.dtype)

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def node(self, op: str, inputs: list[str], shape, **attrs) -> T:
        out = T(self.name(op.lower() + "_"), tuple(int(d) for d in shape))
        self.nodes.append(helper.make_node(op, inputs, [out.name], name=self.name(op), **attrs))
        return out


# ----------------------------------------------------------------------------- ops


def _spatial_out(size: int, k: int, d: int, s: int, pb: int, pe: int) -> int:
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def _conv(draw, b: Builder, t: T) -> T:
    n, c, *spatial = t.shape
    group = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    m = group * draw(st.integers(1, 3))
    ks, ds, ss, pads_b, pads_e = [], [], [], [], []
    for size in spatial:
        k, d = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        pb, pe = draw(st.integers(0, (k - 1) * d)), draw(st.integers(0, (k - 1) * d))
        if size + pb + pe < (k - 1) * d + 1:
            k, d, pb, pe = 1, 1, 0, 0
        ks.append(k), ds.append(d), ss.append(draw(st.integers(1, 2)))
        pads_b.append(pb), pads_e.append(pe)
    auto_pad = draw(st.sampled_from(["NOTSET"] * 4 + ["SAME_UPPER", "VALID"]))
    if auto_pad == "SAME_UPPER":
        ds = [1] * len(ds)  # SAME with dilations: onnxruntime and onnx disagree on shapes
        out = [-(-size // s) for size, s in zip(spatial, ss, strict=True)]
    else:
        if auto_pad == "VALID":
            pads_b, pads_e = [0] * len(ks), [0] * len(ks)
            ks = [min(k, size) for k, size in zip(ks, spatial, strict=True)]
            ds = [1 if (k - 1) * d + 1 > size else d for k, d, size in zip(ks, ds, spatial,
                                                                            strict=True)]
        out = [_spatial_out(*a) for a in zip(spatial, ks, ds, ss, pads_b, pads_e, strict=True)]
    weights = b.const(b.floats([m, c // group, *ks], scale=0.5 / np.sqrt(max(1, c // group))),
                      "W")
    inputs = [t.name, weights]
    if draw(st.booleans()):
        inputs.append(b.const(b.floats([m], 0.3), "B"))
    attrs = {"dilations": ds, "strides": ss}
    if auto_pad == "NOTSET":
        attrs["pads"] = pads_b + pads_e
    else:
        attrs["auto_pad"] = auto_pad
    if group > 1 or draw(st.booleans()):
        attrs["group"] = group
    if draw(st.booleans()):
        attrs["kernel_shape"] = ks
    return b.node("Conv", inputs, [n, m, *out], **attrs)


def _conv_transpose(draw, b: Builder, t: T) -> T:
    n, c, *spatial = t.shape
    group = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    m = group * draw(st.integers(1, 2))
    ks, ds, ss, pads_b, pads_e, out_pad, out = [], [], [], [], [], [], []
    for size in spatial:
        k, d, s = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
        extent = (k - 1) * d + 1
        full = s * (size - 1) + extent
        op = draw(st.integers(0, s - 1))
        pb, pe = draw(st.integers(0, k - 1)), draw(st.integers(0, k - 1))
        if full + op - pb - pe < 1:
            pb = pe = 0
        ks.append(k), ds.append(d), ss.append(s), pads_b.append(pb), pads_e.append(pe)
        out_pad.append(op), out.append(full + op - pb - pe)
    weights = b.const(b.floats([c, m // group, *ks], scale=0.5 / np.sqrt(c)), "W")
    inputs = [t.name, weights]
    if draw(st.booleans()):
        inputs.append(b.const(b.floats([m], 0.3), "B"))
    attrs = {"dilations": ds, "strides": ss, "pads": pads_b + pads_e, "group": group}
    if any(out_pad):
        attrs["output_padding"] = out_pad
    return b.node("ConvTranspose", inputs, [n, m, *out], **attrs)


def _batchnorm(draw, b: Builder, t: T) -> T:
    c = t.shape[1]
    scale, bias, mean = b.floats([c], 1.0), b.floats([c], 0.5), b.floats([c], 0.5)
    var = (0.5 + b.rng.random(c) * 1.5).astype(b.dtype)
    names = [b.const(a, s) for a, s in ((scale, "scale"), (bias, "bias"), (mean, "mean"),
                                       (var, "var"))]
    eps = draw(st.sampled_from([1e-5, 1e-3]))
    return b.node("BatchNormalization", [t.name, *names], t.shape, epsilon=eps)


def _gemm(draw, b: Builder, t: T) -> T:
    m, k = t.shape
    n = draw(st.integers(1, 6))
    trans_b = draw(st.booleans())
    weights = b.const(b.floats([n, k] if trans_b else [k, n], 0.5 / np.sqrt(k)), "W")
    inputs = [t.name, weights]
    attrs = {}
    if trans_b:
        attrs["transB"] = 1
    for key in ("alpha", "beta"):
        value = draw(st.sampled_from([None, 1.0, 0.5, 2.0]))
        if value is not None:
            attrs[key] = value
    bias = draw(st.sampled_from([None, (n,), (1, n), (m, n), (1,), ()]))
    if bias is not None:
        inputs.append(b.const(b.floats(list(bias), 0.3), "C"))
    return b.node("Gemm", inputs, [m, n], **attrs)


def _matmul(draw, b: Builder, t: T) -> T:
    k = t.shape[-1]
    n = draw(st.integers(1, 6))
    weights = b.const(b.floats([k, n], 0.5 / np.sqrt(k)), "W")
    return b.node("MatMul", [t.name, weights], [*t.shape[:-1], n])


def _broadcast_shape(draw, b: Builder, shape: tuple[int, ...]) -> list[int]:
    """A constant's shape that broadcasts to `shape`: a scalar, per-channel (axis 1), or
    any trailing dims each kept or 1."""
    kind = draw(st.sampled_from(["scalar", "channel", "channel", "any"]))
    if kind == "scalar":
        return draw(st.sampled_from([[], [1]]))
    if kind == "channel" and len(shape) >= 2:
        lead = draw(st.sampled_from([[], [1]]))
        return lead + [shape[1]] + [1] * (len(shape) - 2)
    rank = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - rank:]
    return [d if draw(st.booleans()) else 1 for d in tail]


def _binary(draw, b: Builder, t: T, live: list[T]) -> T:
    op = draw(st.sampled_from(["Add", "Mul", "Sub", "Div"]))
    peers = [p for p in live if p.shape == t.shape]
    if draw(st.integers(0, 3)) == 0 and op != "Div":
        other = draw(st.sampled_from(peers)).name  # x op x, or a residual
        return b.node(op, [t.name, other], t.shape)
    cshape = _broadcast_shape(draw, b, t.shape)
    value = b.floats(cshape, 1.5, low=0.5) if op == "Div" else b.floats(cshape, 1.0)
    const = b.const(value)
    first = op == "Div" or draw(st.booleans())
    out = np.broadcast_shapes(tuple(cshape), t.shape)
    return b.node(op, [t.name, const] if first else [const, t.name], out)


def _unary(draw, b: Builder, t: T) -> T:
    ops = ["Relu", "Sigmoid", "Clip", "ClipRelu", "Max0", "HardSigmoidMul"]
    if b.opset >= 14:
        ops.append("HardSwish")
    op = draw(st.sampled_from(ops))
    if op == "Clip":
        low, high = draw(st.sampled_from([(0.0, 6.0), (-1.0, 1.0), (0.0, None),
                                          (None, 0.5), (None, None)]))
        inputs = [t.name, b.const(np.asarray(low, b.dtype)) if low is not None else ""]
        if high is not None:
            inputs.append(b.const(np.asarray(high, b.dtype)))
        while inputs[-1] == "":
            inputs.pop()
        return b.node("Clip", inputs, t.shape)
    if op == "ClipRelu":  # Clip(x, 0, +inf): normalize-activations makes it a Relu
        inf = np.asarray(np.inf, b.dtype)
        return b.node("Clip", [t.name, b.const(np.asarray(0, b.dtype)), b.const(inf)],
                      t.shape)
    if op == "Max0":
        return b.node("Max", [t.name, b.const(np.zeros([1] * draw(st.integers(0, 1)),
                                                       b.dtype))], t.shape)
    if op == "HardSigmoidMul":  # x * HardSigmoid(x) with HardSwish's constants
        hs = b.node("HardSigmoid", [t.name], t.shape, alpha=1.0 / 6, beta=0.5)
        pair = [t.name, hs.name] if draw(st.booleans()) else [hs.name, t.name]
        return b.node("Mul", pair, t.shape)
    return b.node(op, [t.name], t.shape)


def _pad(draw, b: Builder, t: T, spatial: bool = False) -> T:
    """Pad with any mode on any axes; with `spatial`, zeros around the spatial axes only
    (what fuse-pad-conv folds into a Conv)."""
    mode = "constant" if spatial else draw(st.sampled_from(["constant", "constant",
                                                            "reflect", "edge"]))
    rank = t.rank
    axes = list(range(rank))
    if b.opset >= 18 and draw(st.booleans()):
        axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank)))
    limit = {a: (t.shape[a] - 1 if mode == "reflect" else 2) for a in axes}
    if spatial:
        limit.update({a: 0 for a in axes if a < 2})
    begin = [draw(st.integers(0, min(2, limit[a]))) for a in axes]
    end = [draw(st.integers(0, min(2, limit[a]))) for a in axes]
    inputs = [t.name, b.ints(begin + end)]
    if mode == "constant" and draw(st.booleans()):
        value = 0.0 if spatial else draw(st.sampled_from([0.0, 1.5]))
        inputs.append(b.const(np.asarray(value, b.dtype)))
    if len(axes) != rank:
        inputs += [""] * (3 - len(inputs)) + [b.ints(axes)]
    shape = list(t.shape)
    for a, pb, pe in zip(axes, begin, end, strict=True):
        shape[a] += pb + pe
    attrs = {} if mode == "constant" and draw(st.booleans()) else {"mode": mode}
    return b.node("Pad", inputs, shape, **attrs)


def _reshape(draw, b: Builder, t: T) -> T:
    kind = draw(st.sampled_from(["flatten", "same", "merge", "split"]))
    shape = list(t.shape)
    if kind == "flatten":
        out = [shape[0], int(np.prod(shape[1:]))]
        target = draw(st.sampled_from([out, [shape[0], -1], [0, -1]]))
    elif kind == "same":
        out = shape
        target = [draw(st.sampled_from([d, 0])) for d in shape]
    elif kind == "merge" and t.rank >= 2:
        i = draw(st.integers(0, t.rank - 2))
        out = shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
        target = list(out)
        target[i] = -1
    else:  # split the last dim in two, or add a leading 1
        last = shape[-1]
        f = draw(st.sampled_from([d for d in range(1, last + 1) if last % d == 0]))
        out = shape[:-1] + [f, last // f]
        target = list(out)
    return b.node("Reshape", [t.name, b.ints(target)], out)


def _transpose(draw, b: Builder, t: T) -> T:
    perm = draw(st.permutations(range(t.rank)))
    shape = [t.shape[p] for p in perm]
    if draw(st.integers(0, 2)) == 0:  # then its inverse: a no-op pair
        first = b.node("Transpose", [t.name], shape, perm=list(perm))
        return b.node("Transpose", [first.name], t.shape,
                      perm=[int(i) for i in np.argsort(perm)])
    return b.node("Transpose", [t.name], shape, perm=list(perm))


def _axes(b: Builder, op: str, inputs: list[str], axes: list[int], shape) -> T:
    if b.opset >= 13:
        return b.node(op, [*inputs, b.ints(axes)], shape)
    return b.node(op, inputs, shape, axes=axes)


def _unsqueeze(draw, b: Builder, t: T) -> T:
    axis = draw(st.integers(-(t.rank + 1), t.rank))
    pos = axis if axis >= 0 else axis + t.rank + 1
    shape = list(t.shape)
    shape.insert(pos, 1)
    return _axes(b, "Unsqueeze", [t.name], [axis], shape)


def _squeeze(draw, b: Builder, t: T) -> T:
    ones = [i for i, d in enumerate(t.shape) if d == 1]
    axes = sorted(draw(st.sets(st.sampled_from(ones), min_size=1)))[:t.rank - 1]  # rank >= 1
    if len(axes) == len(ones) < t.rank and draw(st.booleans()):  # no axes: every 1
        return b.node("Squeeze", [t.name], [d for d in t.shape if d != 1])
    shape = [d for i, d in enumerate(t.shape) if i not in axes]
    signed = [a - t.rank if draw(st.booleans()) else a for a in axes]
    return _axes(b, "Squeeze", [t.name], signed, shape)


def _concat(draw, b: Builder, t: T, live: list[T]) -> T:
    axis = draw(st.integers(0, t.rank - 1))
    peers = [p for p in live if p.rank == t.rank and all(
        p.shape[i] == t.shape[i] for i in range(t.rank) if i != axis)]
    others = draw(st.lists(st.sampled_from(peers), min_size=1, max_size=2))
    shape = list(t.shape)
    shape[axis] += sum(o.shape[axis] for o in others)
    signed = axis - t.rank if draw(st.booleans()) else axis
    return b.node("Concat", [t.name, *(o.name for o in others)], shape, axis=signed)


def _slice(draw, b: Builder, t: T) -> T:
    axes = sorted(draw(st.sets(st.integers(0, t.rank - 1), min_size=1, max_size=t.rank)))
    starts, ends, steps, shape = [], [], [], list(t.shape)
    for a in axes:
        size = t.shape[a]
        step = draw(st.sampled_from([1, 1, 2, -1]))
        start = draw(st.integers(-size, size - 1))
        end = draw(st.sampled_from([size, 2**62, -(2**62)] + list(range(-size, size + 1))))
        n = len(range(size)[slice(start, end, step)])
        if n == 0:  # keep every dim non-empty
            start, end, step = 0, size, 1
            n = size
        starts.append(start), ends.append(end), steps.append(step)
        shape[a] = n
    inputs = [t.name, b.ints(starts), b.ints(ends)]
    with_steps = any(s != 1 for s in steps) or draw(st.booleans())
    if with_steps or axes != list(range(len(axes))) or draw(st.booleans()):
        inputs.append(b.ints(axes))
    if with_steps:
        inputs.append(b.ints(steps))
    return b.node("Slice", inputs, shape)


def _passthrough(draw, b: Builder, t: T) -> T:
    op = draw(st.sampled_from(["Identity", "Dropout", "Cast", "CastPair"]))
    if op == "Identity":
        return b.node("Identity", [t.name], t.shape)
    if op == "Dropout":
        if b.opset >= 12 and draw(st.booleans()):
            ratio = b.const(np.asarray(0.5, np.float32))
            return b.node("Dropout", [t.name, ratio], t.shape)
        return b.node("Dropout", [t.name], t.shape)
    if op == "Cast":  # to its own type: a no-op
        return b.node("Cast", [t.name], t.shape, to=b.elem)
    # there and back: exact through double; not a no-op through int32 or the other float
    other = draw(st.sampled_from([TP.DOUBLE, TP.INT32, TP.FLOAT16 if b.elem == TP.FLOAT
                                  else TP.FLOAT]))
    there = b.node("Cast", [t.name], t.shape, to=other)
    return b.node("Cast", [there.name], t.shape, to=b.elem)


def _if(draw, b: Builder, t: T, cond: str) -> T:
    """If(cond) whose branches each apply one or two shape-keeping ops to `t`."""
    branches = []
    for which in ("then", "else"):
        body = Builder(b.opset, b.dtype, b.rng, prefix=f"{b.prefix}{which}{b.count}_",
                       body=True)
        cur = t
        for _ in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["unary", "binary", "batchnorm", "conv1x1"]))
            if kind == "unary":
                cur = _unary(draw, body, cur)
            elif kind == "binary":
                cur = _binary(draw, body, cur, [cur])
                if cur.shape != t.shape:  # a constant broadcast it wider: not in a branch
                    cur = body.node("Identity", [t.name], t.shape)
            elif kind == "batchnorm" and t.rank >= 2:
                cur = _batchnorm(draw, body, cur)
            elif t.rank >= 3:
                c = t.shape[1]
                w = body.const(body.floats([c, c] + [1] * (t.rank - 2), 0.5), "W")
                cur = body.node("Conv", [cur.name, w], t.shape)
        if cur.name == t.name:
            cur = body.node("Identity", [t.name], t.shape)
        out = helper.make_tensor_value_info(cur.name, b.elem, list(t.shape))
        branches.append(helper.make_graph(body.nodes, f"{which}{b.count}", [], [out]))
        b.count += body.count
    return b.node("If", [cond], t.shape, then_branch=branches[0], else_branch=branches[1])


def _conv_chain(draw, b: Builder, t: T) -> T:
    """What the fusion passes look for: [Pad ->] Conv -> BatchNormalization, or Add, Sub,
    Mul or Div by a per-channel constant -> [an activation]."""
    if draw(st.booleans()):
        t = _pad(draw, b, t, spatial=True)
    cur = _conv(draw, b, t)
    op = draw(st.sampled_from(["BatchNormalization", "Add", "Sub", "Mul", "Div", "None"]))
    if op == "BatchNormalization":
        cur = _batchnorm(draw, b, cur)
    elif op != "None":
        shape = [cur.shape[1]] + [1] * (cur.rank - 2)
        if draw(st.booleans()):
            shape = [1, *shape]
        value = b.floats(shape, 1.5, low=0.5) if op == "Div" else b.floats(shape, 1.0)
        const = b.const(value)
        first = op == "Div" or draw(st.booleans())
        cur = b.node(op, [cur.name, const] if first else [const, cur.name], cur.shape)
    return _unary(draw, b, cur) if draw(st.booleans()) else cur


def _constant_expr(draw, b: Builder, t: T) -> T:
    """t op f(c1, c2): a constant computed in the graph (fold-constants folds it)."""
    shape = _broadcast_shape(draw, b, t.shape)
    folded = b.node("Mul", [b.const(b.floats(shape, 1.0)), b.const(b.floats(shape, 1.0))],
                    shape)
    if draw(st.booleans()):
        folded = b.node("Relu", [folded.name], shape)
    op = draw(st.sampled_from(["Add", "Mul", "Sub"]))
    return b.node(op, [t.name, folded.name], np.broadcast_shapes(tuple(shape), t.shape))


def _shape_reshape(draw, b: Builder, t: T) -> T:
    """Reshape(t, Concat(Shape(t)[0:1], [-1])): a target fold-reshape-targets makes
    constant when shapes are static."""
    shape = b.node("Shape", [t.name], [t.rank])
    lead = b.node("Slice", [shape.name, b.ints([0]), b.ints([1])], [1])
    target = b.node("Concat", [lead.name, b.ints([-1])], [2], axis=0)
    return b.node("Reshape", [t.name, target.name], [t.shape[0], int(np.prod(t.shape[1:]))])


# ----------------------------------------------------------------------------- models


def _choices(t: T, opset: int) -> list[str]:
    ops = ["binary", "unary", "passthrough", "reshape", "transpose", "unsqueeze", "concat",
           "slice", "if", "constant-expr", "shape-reshape"]
    if t.rank >= 3:
        ops += ["conv", "conv", "convtranspose", "pad", "conv-chain", "conv-chain"]
    if t.rank >= 2:
        ops += ["batchnorm", "matmul"]
    if t.rank == 2:
        ops += ["gemm", "gemm"]
    if 1 in t.shape and t.rank >= 2:
        ops.append("squeeze")
    if t.rank >= 5:  # keep ranks small
        ops = [o for o in ops if o not in ("unsqueeze", "reshape", "shape-reshape")]
    if t.rank <= 1:
        ops = [o for o in ops if o not in ("squeeze", "transpose")]
    return ops


_OPS = {  # name -> build(draw, builder, tensor, live tensors, If condition) -> new tensor
    "binary": lambda draw, b, t, live, cond: _binary(draw, b, t, live),
    "concat": lambda draw, b, t, live, cond: _concat(draw, b, t, live),
    "if": lambda draw, b, t, live, cond: _if(draw, b, t, cond),
    "conv": lambda draw, b, t, live, cond: _conv(draw, b, t),
    "convtranspose": lambda draw, b, t, live, cond: _conv_transpose(draw, b, t),
    "batchnorm": lambda draw, b, t, live, cond: _batchnorm(draw, b, t),
    "gemm": lambda draw, b, t, live, cond: _gemm(draw, b, t),
    "matmul": lambda draw, b, t, live, cond: _matmul(draw, b, t),
    "unary": lambda draw, b, t, live, cond: _unary(draw, b, t),
    "pad": lambda draw, b, t, live, cond: _pad(draw, b, t),
    "reshape": lambda draw, b, t, live, cond: _reshape(draw, b, t),
    "transpose": lambda draw, b, t, live, cond: _transpose(draw, b, t),
    "unsqueeze": lambda draw, b, t, live, cond: _unsqueeze(draw, b, t),
    "squeeze": lambda draw, b, t, live, cond: _squeeze(draw, b, t),
    "slice": lambda draw, b, t, live, cond: _slice(draw, b, t),
    "passthrough": lambda draw, b, t, live, cond: _passthrough(draw, b, t),
    "conv-chain": lambda draw, b, t, live, cond: _conv_chain(draw, b, t),
    "constant-expr": lambda draw, b, t, live, cond: _constant_expr(draw, b, t),
    "shape-reshape": lambda draw, b, t, live, cond: _shape_reshape(draw, b, t),
}


@dataclass
class Drawn:
    """A drawn model and what the test needs to feed it."""

    model: onnx.ModelProto
    cond: str | None  # the bool input of If nodes, when there are any

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        return f"Drawn(cond={self.cond!r}, model=\n{onnx.printer.to_text(self.model)})"


@st.composite
def models(draw, max_nodes: int = 6) -> Drawn:
    opset = draw(st.integers(11, 21))
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float32, np.float16]))
    b = Builder(opset, dtype, np.random.default_rng(draw(st.integers(0, 2**16))))
    if draw(st.sampled_from([IMAGE, IMAGE, MATRIX])) == IMAGE:
        shape = [draw(st.integers(1, 2)), draw(st.integers(1, 6))]
        shape += [draw(st.integers(1, 7)) for _ in range(draw(st.integers(1, 2)))]
    else:
        shape = [draw(st.integers(1, 4)), draw(st.integers(1, 6))]
    x = T("x", tuple(shape))
    b.inputs.append(helper.make_tensor_value_info("x", b.elem, shape))
    live, used, cond = [x], {"x"}, None
    for _ in range(draw(st.integers(1, max_nodes))):
        t = live[-1] if draw(st.integers(0, 2)) else draw(st.sampled_from(live))
        op = draw(st.sampled_from(_choices(t, opset)))
        if op == "if" and cond is None:
            cond = "cond"
            b.inputs.append(helper.make_tensor_value_info(cond, TP.BOOL, [1]))
        new = _OPS[op](draw, b, t, live, cond)
        used.update(i for n in b.nodes for i in n.input)
        if op == "if":
            used.add(t.name)  # read by the branches
        live.append(new)
    leaves = [t for t in live[1:] if t.name not in used] or [live[-1]]
    outputs = [helper.make_tensor_value_info(t.name, b.elem, list(t.shape)) for t in leaves]
    graph = helper.make_graph(b.nodes, "fuzz", b.inputs, outputs, b.inits)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    _check(model, {t.name: t.shape for t in leaves})
    return Drawn(model, cond)


def _check(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """The generator's own bugs fail here: onnx must accept the model and infer the
    shapes tracked above."""
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    for out in inferred.graph.output:
        dims = tuple(d.dim_value for d in out.type.tensor_type.shape.dim)
        assert dims == shapes[out.name], (out.name, dims, shapes[out.name])
