"""Plugin -> standard ONNX forms of the layout plugins (see `plugins.native`, whose
registry lists them): ResizeNearest_TRT, Split, FlattenConcat_TRT, Reorg_TRT."""

from __future__ import annotations

import numpy as np
import onnx

from graphfix.plugins.native_common import (
    emitter_for,
    require,
    scalar_attrs,
    single_input_attribute,
)
from graphfix.runtime.references import Decomposition, Unavailable, attributes


def resize_nearest(node: onnx.NodeProto, opset: int) -> Decomposition:
    """ResizeNearest_TRT {scale FLOAT, required} on [N, C, H, W] (float32): output
    [N, C, int(H * scale), int(W * scale)], `out[oy, ox] = in[int(oy / scale), int(ox /
    scale)]` in float32 (maskRCNNKernels.cu) -> Resize(x, scales [1, 1, s, s], nearest,
    asymmetric, floor), the same sizes and indices. 4-D only (the plugin's kernel reads
    [C, H, W] per batch item; other ranks fail here at run time)."""
    scale = float(single_input_attribute(node, opset, 11, "Resize with "
                                         "coordinate_transformation_mode", "scale"))
    if scale <= 0:
        raise Unavailable(f"scale {scale} gives an empty output")
    em = emitter_for(node, opset)
    roi = em.const([], np.float32, "roi") if opset < 13 else ""
    scales = em.const([1.0, 1.0, scale, scale], np.float32, "scales")
    em.op("Resize", [node.input[0], roi, scales], node.output[0], mode="nearest",
          coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    return em.decomposition()


def split(node: onnx.NodeProto, opset: int) -> Decomposition:
    """Split plugin (legacy): its creator has no fields and cannot build a plugin from a
    node (getFieldNames and createPlugin are "not implemented"); older ONNX parsers made
    it from ONNX Split, so the node's `axis` (INT, default 0) and lengths (`split` or the
    constructor's `output_lengths`, INTS, one per output) are read as ONNX's. It copies
    segments of `axis` -> Split. Not reproduced: the kernel multiplies its outer extent by
    dim 0 once more (a leftover of implicit batch) and reads past its input when dim 0 > 1;
    this form is the split it was meant to be."""
    a = attributes(node)
    lengths = a.get("split", a.get("output_lengths"))
    if lengths is None or len(lengths) != len(node.output) or len(node.input) != 1 \
            or not node.input[0]:
        raise Unavailable("needs one input and split (or output_lengths) with one length "
                          "per output")
    axis = int(np.ravel(a.get("axis", 0))[0])
    em = emitter_for(node, opset)
    if opset >= 13:
        em.ops("Split", [node.input[0], em.const(list(lengths))], len(lengths),
               list(node.output), axis=axis)
    else:
        em.ops("Split", [node.input[0]], len(lengths), list(node.output), axis=axis,
               split=[int(v) for v in lengths])
    return em.decomposition()


_FLAT_SHAPE = {1: [0, -1, 1, 1], 2: [0, 1, -1, 1], 3: [0, 1, 1, -1]}


def flatten_concat(node: onnx.NodeProto, opset: int) -> Decomposition:
    """FlattenConcat_TRT(x0, x1, ...) {axis INT in 1..3, ignoreBatch INT, required}: per
    batch item, each input's C*H*W values one after the other, in a [total, 1, 1] /
    [1, total, 1] / [1, 1, total] item for axis 1 / 2 / 3 -> Flatten(axis=1) per input,
    Concat(axis=1), Reshape. Not reproduced: axis 2 (3) with a first dim (first two dims)
    other than 1, where the plugin copies each whole input once per leading index and
    reads past it; ignoreBatch=1 with a batch > 1, where the plugin writes only item 0."""
    a = scalar_attrs(node)
    require(a, ("axis", "ignoreBatch"), node.op_type)
    axis = int(a["axis"])
    inputs = [i for i in node.input if i]
    if axis not in _FLAT_SHAPE or not inputs or len(node.output) != 1:
        raise Unavailable(f"the plugin takes axis 1, 2 or 3 (got {axis}) and one output")
    em = emitter_for(node, opset)
    flats = [em.op("Flatten", [x], axis=1) for x in inputs]
    joined = em.op("Concat", flats, axis=1)
    em.op("Reshape", [joined, em.const(_FLAT_SHAPE[axis])], node.output[0])
    return em.decomposition()


def reorg(node: onnx.NodeProto, opset: int) -> Decomposition:
    """Reorg_TRT v1/v2 {stride INT s, required, > 0}: darknet's reorg (blas.c reorg_cpu,
    forward=0) on x [N, C, H, W]: the input's memory read as [N, C/s^2, H*s, W*s], its
    space-to-depth written as [N, C, H, W] and returned as [N, C*s^2, H/s, W/s]. That is
    `x.reshape(N, C/s^2, H, s, W, s).transpose(0, 3, 5, 1, 2, 4)` reshaped to the output:
    not SpaceToDepth, which reshapes to [N, C, H/s, s, W/s, s]. H and W must be multiples
    of s (the plugin asserts it) and C of s^2. Not reproduced: v2 declares a 3-D output
    shape ([N*s^2, C/s, H/s]) in getOutputDimensions; this form has the shape of the
    README and the kernel."""
    s = int(single_input_attribute(node, opset, 10, "the Reorg form (Slice on a shape)",
                                   "stride"))
    if s <= 0:
        raise Unavailable(f"the plugin rejects stride {s}")
    em, x = emitter_for(node, opset), node.input[0]
    shape = em.op("Shape", [x])
    h, w = em.dim(shape, 2), em.dim(shape, 3)
    six = em.op("Concat", [em.const([0, -1]), h, em.const([s]), w, em.const([s])], axis=0)
    moved = em.op("Transpose", [em.op("Reshape", [x, six])], perm=[0, 3, 5, 1, 2, 4])
    out = em.op("Concat", [em.const([0, -1]), em.op("Div", [h, em.const([s])]),
                           em.op("Div", [w, em.const([s])])], axis=0)
    em.op("Reshape", [moved, out], node.output[0])
    return em.decomposition()
