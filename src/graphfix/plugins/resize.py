"""Cubic Resize's lowering (`plugins.lowering`): no TensorRT version parses `mode=cubic`
(every matrix, 8.0 to 11.1: "Supported resize modes: `nearest`, `linear`").

Keypoint R-CNN resizes its keypoint heatmaps bicubically inside a Loop (to each box's
size, known only at run time); ViTs that interpolate their position table (DINOv2,
YOLOS) do it on a constant, which fold-constants computes first.

The lowering computes what ONNX's Resize defines, in onnxruntime's float32 order
(onnxruntime's CPU kernel is the reference the check runs; its `ResizeBiCubic` and
`GetCubicCoeffs`), one axis at a time, the last axis first::

    for the last axis, then the one before it (n in, m out, scale s):
        m, s = sizes[a], m / n             (sizes given)
               floor(n * scales[a]), scales[a]   (scales given)
        i = Range(0, m, 1)                 (float32)
        x = (i + 0.5) / s - 0.5            half_pixel; pytorch_half_pixel: 0 where m == 1;
            i * (n - 1) / (m - 1)          align_corners (0 where m == 1); i / s asymmetric
        f = Floor(x), t = x - f
        c0 = ((A (t+1) - 5A) (t+1) + 8A) (t+1) - 4A      c1 = ((A+2) t - (A+3)) t t + 1
        c2 = ((A+2) u - (A+3)) u u + 1, u = 1 - t        c3 like c0 with 2 - t
        tap k = Cast<int64>(Min(Max(f + k - 1, 0), n - 1))   (edge values, as the kernel)
        Y = c0 * Gather(X, tap 0, a) + c1 * Gather(X, tap 1, a) + ... (left to right)

With `exclude_outside=1` a tap outside [0, n) gets weight 0 and the rest are divided by
their sum (the last axis: (c / sum) * x; the other: (x * c) / sum, the kernel's order).
An axis whose scale is 1 comes out as it went in (c1 = 1, the others 0, exactly).

What lowers: mode cubic, float32 input of rank 2 or 4 (onnxruntime's kernel takes no
other; a rank-4 input keeps its first two axes, which the lowering checks: scales of 1
there, sizes equal to the input's, or sizes that begin with the input's own Shape, as
torch writes them), coordinate modes half_pixel, pytorch_half_pixel, align_corners and
asymmetric, no antialias, keep_aspect_ratio_policy stretch. With static sizes the index
arithmetic is constant and fold-constants (in trt-tidy) leaves Gathers, Muls and Adds.
Whether TensorRT's kernels would round these ops as onnxruntime's do was not checked
here (no TensorRT); the check compares with onnxruntime.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.graph import constant_value, is_onnx
from graphfix.plugins.einsum import rank_of

if TYPE_CHECKING:
    from graphfix.plugins.lowering import Builder, Emit, Env

CUBIC_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
EMITS = frozenset({"Shape", "Gather", "Cast", "Div", "Mul", "Floor", "Range", "Add", "Sub",
                   "Where", "Greater", "Equal", "Max", "Min", "Reshape"})
_F = np.float32
_F32 = np.dtype(np.float32)


def cubic_resize(node: gs.Node, env: Env) -> Emit | str:
    """The emitting function for a cubic Resize, or why this node has none."""
    attrs = node.attrs
    mode = str(attrs.get("mode", "nearest"))
    if mode != "cubic":
        return f"its mode is '{mode}'; graphfix writes out the cubic mode only"
    coordinates = str(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if coordinates not in CUBIC_COORDINATES:
        return (f"its coordinate_transformation_mode is '{coordinates}'; the lowering takes "
                + ", ".join(CUBIC_COORDINATES))
    if int(attrs.get("antialias", 0)):
        return "it antialiases (antialias=1), which widens the cubic kernel"
    if env.dtype is None or np.dtype(env.dtype) != np.float32:
        return ("its input is not float32 (onnxruntime's cubic kernel, the check's "
                "reference, computes float32 only)")
    x = node.inputs[0]
    scales = node.inputs[2] if len(node.inputs) > 2 and not node.inputs[2].is_empty() else None
    sizes = node.inputs[3] if len(node.inputs) > 3 and not node.inputs[3].is_empty() else None
    if (scales is None) == (sizes is None):
        return "it needs exactly one of scales and sizes"
    if sizes is not None and str(attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        return "its keep_aspect_ratio_policy is not 'stretch'"
    rank = rank_of(x) or _given_rank(scales if sizes is None else sizes, attrs)
    if rank not in (2, 4):
        return (f"its input's rank is {rank if rank is not None else 'unknown'}; onnxruntime's "
                "cubic kernel (the reference) takes rank 2 or 4")
    axes = [int(a) % rank for a in attrs.get("axes", [])] or list(range(rank))
    if any(a < rank - 2 for a in axes) and not _leading_kept(x, scales, sizes, rank, axes):
        return ("it cannot be shown that its first two axes keep their size (scales of 1, "
                "or sizes that begin with the input's own shape)")
    resized = [a for a in (rank - 1, rank - 2) if a in axes]  # the last axis first
    if not resized:
        return "it resizes neither of its last two axes"
    a_coeff = _F(attrs.get("cubic_coeff_a", -0.75))
    exclude = bool(int(attrs.get("exclude_outside", 0)))
    y = node.outputs[0]

    def emit(b: Builder) -> None:
        shape = b.node("Shape", [x], dtype=np.int64)
        out = x
        for step, axis in enumerate(resized):
            last = step == len(resized) - 1
            out = _along(b, out, shape, axis, axes.index(axis), scales, sizes, coordinates,
                         a_coeff, exclude, first=step == 0, y=y if last else None)

    return emit


def _given_rank(values: gs.Tensor, attrs: dict) -> int | None:
    """The rank a constant scales/sizes states (None when computed or given per axes)."""
    value = constant_value(values)
    return None if value is None or attrs.get("axes") else int(np.asarray(value).size)


def _leading_kept(x: gs.Tensor, scales: gs.Tensor | None, sizes: gs.Tensor | None,
                  rank: int, axes: list[int]) -> bool:
    """Whether the axes before the last two come out the size they went in."""
    lead = [(a, axes.index(a)) for a in axes if a < rank - 2]  # (axis, its entry)
    given = constant_value(scales if sizes is None else sizes)
    if given is not None:
        given = np.asarray(given).reshape(-1)
        if sizes is None:
            return all(given[p] == 1 for _, p in lead)
        dims = x.shape
        return dims is not None and len(dims) == rank and all(
            isinstance(dims[a], int) and given[p] == dims[a] for a, p in lead)
    return (sizes is not None and [p for _, p in lead] == list(range(rank - 2))
            and _begins_with_shape(sizes, x, rank - 2))


def _begins_with_shape(sizes: gs.Tensor, x: gs.Tensor, count: int) -> bool:
    """sizes = Concat(Slice(Shape(x), [0], [count]) or Shape<start=0, end=count>(x), ...):
    torch's interpolate(size=...) keeps the batch and channel axes that way."""
    concat = sizes.inputs[0] if len(sizes.inputs) == 1 else None
    if concat is None or not is_onnx(concat, "Concat") or int(concat.attrs.get("axis", 0)) != 0:
        return False
    head = concat.inputs[0]
    made = head.inputs[0] if len(head.inputs) == 1 else None
    if made is not None and is_onnx(made, "Shape"):
        return (made.inputs[0] is x and int(made.attrs.get("start", 0)) == 0
                and int(made.attrs.get("end", count)) == count)
    if made is None or not is_onnx(made, "Slice") or len(made.inputs) < 3:
        return False
    source = made.inputs[0].inputs[0] if len(made.inputs[0].inputs) == 1 else None
    if source is None or not is_onnx(source, "Shape") or source.inputs[0] is not x \
            or source.attrs.get("start") or source.attrs.get("end") is not None:
        return False
    parts = [constant_value(t) if not t.is_empty() else None for t in made.inputs[1:5]]
    starts, ends = parts[0], parts[1]
    axes = parts[2] if len(parts) > 2 else None
    steps = parts[3] if len(parts) > 3 else None
    return (starts is not None and ends is not None and list(np.ravel(starts)) == [0]
            and list(np.ravel(ends)) == [count]
            and (axes is None or list(np.ravel(axes)) == [0])
            and (steps is None or list(np.ravel(steps)) == [1]))


def _along(b: Builder, data: gs.Tensor, shape: gs.Tensor, axis: int, pos: int,
           scales: gs.Tensor | None, sizes: gs.Tensor | None, coordinates: str,
           a_coeff: np.float32, exclude: bool, first: bool, y: gs.Tensor | None
           ) -> gs.Tensor:
    """`data` resized along `axis` (its entry `pos` of scales/sizes); written to `y` when
    given. `first`: the kernel's inner (last-axis) order of products."""
    def const(what: str, value) -> gs.Constant:
        return b.const(what, np.asarray(value))

    def scalar(t: gs.Tensor, index: int, dtype) -> gs.Tensor:
        return b.node("Gather", [t, const("index", np.int64(index))], {"axis": 0}, dtype=dtype)

    n_f = b.cast(scalar(shape, axis, np.int64), _F32)
    if sizes is not None:
        m_f = b.cast(scalar(sizes, pos, np.int64), _F32)
        s = b.node("Div", [m_f, n_f], dtype=_F)
    else:
        s = scalar(scales, pos, _F)
        m_f = b.node("Floor", [b.node("Mul", [s, n_f], dtype=_F)], dtype=_F)
    i = b.node("Range", [const("zero", _F(0)), m_f, const("one", _F(1))], dtype=_F)
    orig = _original(b, i, s, n_f, m_f, coordinates, const)
    floor = b.node("Floor", [orig], dtype=_F)
    t = b.node("Sub", [orig, floor], dtype=_F)
    coeffs = _coefficients(b, t, a_coeff, const)
    top = b.node("Sub", [n_f, const("one", _F(1))], dtype=_F)
    taps, weights = [], []
    for k, c in enumerate(coeffs):
        raw = b.node("Add", [floor, const("offset", _F(k - 1))], dtype=_F)
        clamped = b.node("Min", [b.node("Max", [raw, const("zero", _F(0))], dtype=_F), top],
                         dtype=_F)
        if exclude:  # a tap outside the input weighs nothing
            inside = b.node("Equal", [raw, clamped], dtype=np.bool_)
            c = b.node("Where", [inside, c, const("nothing", _F(0))], dtype=_F)
        taps.append(b.cast(clamped, np.dtype(np.int64)))
        weights.append(c)
    total = None
    if exclude:  # the taps' weights sum, which divides each
        total = weights[0]
        for w in weights[1:]:
            total = b.node("Add", [total, w], dtype=_F)
        if not first:
            total = _column(b, total)
    acc = None
    for k, (tap, w) in enumerate(zip(taps, weights, strict=True)):
        gathered = b.node("Gather", [data, tap], {"axis": axis}, dtype=_F)
        if first:  # the kernel's inner sum: (c / sum) * x
            term = b.node("Mul", [b.node("Div", [w, total], dtype=_F) if exclude else w,
                                  gathered], dtype=_F)
        else:  # its outer one: (x * c) / sum, weights along the axis before the last
            term = b.node("Mul", [gathered, _column(b, w)], dtype=_F)
            if exclude:
                term = b.node("Div", [term, total], dtype=_F)
        last = k == len(taps) - 1
        acc = term if acc is None else b.node("Add", [acc, term], out=y if last else None,
                                              dtype=_F)
    return acc


def _column(b: Builder, v: gs.Tensor) -> gs.Tensor:
    """[m] as [m, 1]."""
    return b.node("Reshape", [v, b.const("column", np.array([-1, 1], np.int64))], dtype=_F)


def _original(b: Builder, i: gs.Tensor, s: gs.Tensor, n_f: gs.Tensor, m_f: gs.Tensor,
              coordinates: str, const) -> gs.Tensor:
    """Each output index's coordinate in the input, as onnxruntime computes it."""
    if coordinates == "asymmetric":
        return b.node("Div", [i, s], dtype=_F)
    if coordinates == "align_corners":
        one = const("one", _F(1))
        scaled = b.node("Mul", [i, b.node("Sub", [n_f, one], dtype=_F)], dtype=_F)
        spread = b.node("Div", [scaled, b.node("Sub", [m_f, one], dtype=_F)], dtype=_F)
        single = b.node("Equal", [m_f, one], dtype=np.bool_)
        return b.node("Where", [single, const("zero", _F(0)), spread], dtype=_F)
    half = const("half", _F(0.5))
    centred = b.node("Sub", [b.node("Div", [b.node("Add", [i, half], dtype=_F), s], dtype=_F),
                             half], dtype=_F)
    if coordinates == "half_pixel":
        return centred
    several = b.node("Greater", [m_f, const("one", _F(1))], dtype=np.bool_)
    return b.node("Where", [several, centred, const("zero", _F(0))], dtype=_F)


def _coefficients(b: Builder, t: gs.Tensor, a: np.float32, const) -> list[gs.Tensor]:
    """The four Keys cubic weights of taps floor(x) - 1 ... floor(x) + 2, in
    onnxruntime's `GetCubicCoeffs` order of operations (its constants 5a, 8a, 4a, a + 2,
    a + 3 computed in float32, as it computes them)."""
    five, eight, four = _F(5) * a, _F(8) * a, _F(4) * a
    a2, a3 = a + _F(2), a + _F(3)

    def outer(v: gs.Tensor) -> gs.Tensor:  # ((a v - 5a) v + 8a) v - 4a
        p = b.node("Sub", [b.node("Mul", [const("a", a), v], dtype=_F), const("a5", five)],
                   dtype=_F)
        p = b.node("Add", [b.node("Mul", [p, v], dtype=_F), const("a8", eight)], dtype=_F)
        return b.node("Sub", [b.node("Mul", [p, v], dtype=_F), const("a4", four)], dtype=_F)

    def inner(v: gs.Tensor) -> gs.Tensor:  # ((a + 2) v - (a + 3)) v v + 1
        p = b.node("Sub", [b.node("Mul", [const("a2", a2), v], dtype=_F), const("a3", a3)],
                   dtype=_F)
        p = b.node("Mul", [b.node("Mul", [p, v], dtype=_F), v], dtype=_F)
        return b.node("Add", [p, const("one", _F(1))], dtype=_F)

    plus_one = b.node("Add", [t, const("one", _F(1))], dtype=_F)
    one_minus = b.node("Sub", [const("one", _F(1)), t], dtype=_F)
    two_minus = b.node("Sub", [const("two", _F(2)), t], dtype=_F)
    return [outer(plus_one), inner(t), inner(one_minus), outer(two_minus)]


_MODES = re.compile(r"Supported resize modes:([^\n]*)", re.IGNORECASE)


def resize_restricted(node: gs.Node, env: Env, text: str) -> str | None:
    """Why a target row's "Supported resize modes: ..." rules this node out (its mode is
    not listed), else None; the row's other Resize restrictions have no lowering."""
    found = _MODES.search(text)
    mode = str(node.attrs.get("mode", "nearest"))
    if found is None or mode in re.findall(r"`(\w+)`", found.group(1)):
        return None
    listed = found.group(1).strip().rstrip(".")
    return f"its mode is '{mode}', and the table says: Supported resize modes: {listed}"
