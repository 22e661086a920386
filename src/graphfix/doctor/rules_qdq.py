"""Doctor rules about explicit quantization (QuantizeLinear/DequantizeLinear, Q/DQ).

TensorRT accepts only symmetric INT8 Q/DQ: zero point 0, INT8 (not UINT8), per-channel
weight scales on the output-channel axis, per-tensor activations. The facts are the
target's operator table (restriction text, header notes and data types) and the data's
`parser_behaviour_notes["QuantizeLinear/DequantizeLinear"]`, both from `graphfix.trt`.

`qdq-unfusable` relies on ../shared/trt/calibration_notes.md, section (d) "Q/DQ placement"
(TensorRT developer guide, recalled there, not re-read) and "ModelOpt ONNX INT8 placement"
(verified in ModelOpt's code); that file is not shipped in graphfix.trt, so its op lists
are written below with the line each comes from. The rule is a warning for that reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from onnx import TensorProto

from graphfix.doctor.findings import ERROR, WARN, Finding
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.trt import TrtTarget, parser_behaviour_notes

IDS = ("qdq-zero-point", "qdq-uint8", "qdq-axis", "qdq-unfusable")

Q, DQ = "QuantizeLinear", "DequantizeLinear"
_NOTES_KEY = "QuantizeLinear/DequantizeLinear"
_REQUANTIZE = "re-quantize symmetrically (graphfix calibrate)"

# calibration_notes.md (d) Q/DQ placement: 1 "Quantize all inputs of weighted ops
# (Convolution, ConvTranspose/Deconvolution, GEMM/MatMul)"; 4 "Quantize the residual input
# of element-wise Add"; 5 TensorRT "fuses Q/DQ with 'quantizable' ops (e.g. AveragePool,
# element-wise Add)". ModelOpt placement: ModelOpt "Adds BatchNormalization/
# LayerNormalization/LRN (QDQNormalization), ConvTranspose, and HardSwish"; "pooling/window
# ops are quantized only if they have a quantizable neighbour" (GlobalAveragePool).
INT8_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "AveragePool",
                      "GlobalAveragePool", "BatchNormalization", "LayerNormalization", "LRN",
                      "HardSwish"})
# calibration_notes.md (d) Q/DQ placement 5: TensorRT "propagates DQ forward and Q backward
# through 'commuting' ops (e.g. MaxPool, Reshape/Transpose-like copy ops, Concat where
# scales are equal)": a DQ feeding these is judged by what they feed. GlobalMaxPool is read
# as MaxPool; Identity, Flatten, Squeeze, Unsqueeze as "Reshape/Transpose-like copy ops".
COMMUTING_OPS = frozenset({"MaxPool", "GlobalMaxPool", "Reshape", "Transpose", "Flatten",
                           "Squeeze", "Unsqueeze", "Identity", "Concat"})
_PLACEMENT = ('calibration_notes.md (d) Q/DQ placement 5: "TRT propagates DQ forward and Q '
              'backward through \'commuting\' ops (e.g. MaxPool, Reshape/Transpose-like copy '
              'ops, Concat where scales are equal), and fuses Q/DQ with \'quantizable\' ops '
              '(e.g. AveragePool, element-wise Add)"; 1: quantize the inputs of Convolution, '
              'ConvTranspose, GEMM/MatMul')
# Output-channel axis of the weight (input 1) per consumer; Gemm/MatMul are decided below.
_WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1}


def qdq(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`qdq-zero-point` and `qdq-uint8` (errors; Q/DQ nodes grouped per op type, like
    op-unsupported), `qdq-axis` and `qdq-unfusable` (warns, one per DequantizeLinear,
    grouped by the engine where they say the same)."""
    refs = [r for r in view.nodes if r.standard and r.op in (Q, DQ)]
    for op in (Q, DQ):
        yield from _zero_points(view, target, [r for r in refs if r.op == op])
    yield from _uint8(view, target, refs)
    for ref in refs:
        if ref.op == DQ:
            yield from _axis(view, ref)
            yield from _unfusable(view, ref)


def _note_clause(word: str) -> str:
    """The ';'-separated clause of the parser notes on Q/DQ that contains `word`."""
    text = str(parser_behaviour_notes().get(_NOTES_KEY, ""))
    return next((c.strip() for c in text.split(";") if word in c), "")


def _restriction(target: TrtTarget, op: str) -> str:
    row = target.op(op)
    if row is None:
        return f"matrix {target.version}: {op} not listed"
    return f'matrix {row.matrix}: {op} restriction "{row.restrictions}"'


def _zero_points(view: ModelView, target: TrtTarget, refs: list[NodeRef]
                 ) -> Iterator[Finding]:
    """One finding for all nodes of one op type whose constant zero point is not 0."""
    bad: list[NodeRef] = []
    values: set[float] = set()
    for ref in refs:
        value = view.value(ref.input(2)) if ref.input(2) else None
        if value is None:
            continue  # no zero point (0), or one computed at run time
        flat = np.asarray(value, dtype=np.float64).ravel()
        if np.any(flat != 0):
            bad.append(ref)
            values.update(float(v) for v in np.unique(flat)[:4])
    if not bad:
        return
    op, count = bad[0].op, len(bad)
    listed = ", ".join(f"{v:g}" for v in sorted(values)[:4])
    yield Finding(
        "qdq-zero-point", ERROR,
        f"{count} {op} node{'s' * (count != 1)} with a non-zero zero point ({listed}): "
        f"asymmetric quantization, which TensorRT {target.version} rejects (symmetric "
        "Q/DQ only)",
        nodes=tuple(r.label for r in bad), tensors=tuple(dict.fromkeys(r.input(2) for r in bad)),
        op=op, fact=f"{_restriction(target, op)}; parser notes, {_NOTES_KEY}: "
                    f'"{_note_clause("zero point must be 0")}"',
        fix=_REQUANTIZE,
    )


def _quantized_type(view: ModelView, ref: NodeRef) -> int:
    """The element type of the quantized side: Q's output, DQ's input (zero point first)."""
    zp = ref.input(2)
    if zp and view.elem_type(zp):
        return view.elem_type(zp)
    if ref.op == DQ:
        return view.elem_type(ref.input(0))
    out = view.elem_type(ref.node.output[0]) if ref.node.output else 0
    if out:
        return out
    if not zp and ref.attr("output_dtype", 0) == 0:
        return TensorProto.UINT8  # the ONNX default when y_zero_point is omitted
    return int(ref.attr("output_dtype", 0))


def _uint8_fact(target: TrtTarget, op: str | None = None) -> str:
    """Per target: the header note on UINT8 (9.3+), or the data-type list without UINT8
    (8.x), plus the matrix types of DequantizeLinear and the 8.6 importer note."""
    note = next((n for n in target.header_notes if "UINT8" in n), "")
    if "UINT8" in target.data_types and note:
        parts = [f'matrix {target.version} notes: "{note}"']
    else:
        parts = [f"matrix {target.version}: supported ONNX data types "
                 f"{', '.join(target.data_types)} (no UINT8)"]
    row = target.op(DQ)
    if op is not None and row is not None:
        parts.append(f"matrix {row.matrix}: {DQ} supported types {', '.join(row.types)}")
    if op is not None and target.version == "8.6":
        parts.append(f'parser notes, {_NOTES_KEY}: "{_note_clause("UINT8")}"')
    return "; ".join(parts)


def _uint8(view: ModelView, target: TrtTarget, refs: list[NodeRef]) -> Iterator[Finding]:
    """UINT8 Q/DQ nodes (one finding per op type), then other UINT8 tensors inside the
    network and graph inputs/outputs (only when the target lists no UINT8 at all), one
    finding per tensor that names no tensor, so the engine groups them (`grouped`)."""
    covered: set[str] = set()
    for op in (Q, DQ):
        bad = [r for r in refs if r.op == op and _quantized_type(view, r) == TensorProto.UINT8]
        if not bad:
            continue
        tensors: dict[str, None] = {}
        for ref in bad:
            side = ref.node.output[0] if op == Q and ref.node.output else ref.input(0)
            tensors.update(dict.fromkeys(t for t in (side, ref.input(2)) if t))
        covered.update(tensors)
        count = len(bad)
        yield Finding(
            "qdq-uint8", ERROR,
            f"{count} {op} node{'s' * (count != 1)} quantiz{'e' if count != 1 else 'es'} to "
            f"UINT8; TensorRT "
            f"{target.version} takes INT8 Q/DQ only (a QuantizeLinear without a zero point "
            "also means UINT8 in ONNX)",
            nodes=tuple(r.label for r in bad), tensors=tuple(tensors), op=op,
            fact=_uint8_fact(target, op), fix=f"{_REQUANTIZE}: INT8 zero points of 0",
        )
    io = {vi.name for vi in (*view.graph_inputs, *view.graph_outputs)}
    seen: set[str] = set()
    for ref in view.nodes:
        for name in (*ref.node.input, *ref.node.output):
            if (not name or name in io or name in covered or name in seen
                    or view.elem_type(name) != TensorProto.UINT8):
                continue
            seen.add(name)
            owner = view.producers.get(name)
            nodes = (owner.label,) if owner else tuple(r.label for r in view.consumers[name])
            yield Finding(
                "qdq-uint8", ERROR,
                f"UINT8 tensor inside the network; TensorRT {target.version} takes UINT8 "
                "only as a network input or output",
                nodes=nodes, tensors=(name,), fact=_uint8_fact(target),
                fix="Cast it to a supported type (INT32 or FP32) where it is made, or keep "
                    "UINT8 only at the graph inputs/outputs",
            )
    if "UINT8" in target.data_types:
        return
    for vi in (*view.graph_inputs, *view.graph_outputs):
        if vi.type.tensor_type.elem_type == TensorProto.UINT8 and vi.name not in covered:
            yield Finding(
                "qdq-uint8", WARN,
                f"UINT8 graph input/output, a type the TensorRT {target.version} table "
                "does not list",
                tensors=(vi.name,), fact=_uint8_fact(target),
                fix="feed/return FP32 or INT32 and Cast inside the model, or target "
                    "TensorRT 9.3 or newer",
            )


def _weight_source(view: ModelView, dq: NodeRef) -> str | None:
    """The constant a DQ dequantizes (directly, or through a Q of a constant), else None."""
    name = dq.input(0)
    if view.is_constant(name):
        return name
    q = view.producers.get(name)
    if q is not None and q.standard and q.op == Q and view.is_constant(q.input(0)):
        return q.input(0)
    return None


def _scale_count(view: ModelView, name: str) -> int | None:
    shape = view.shape(name)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def _expected_axis(consumer: NodeRef, rank: int | None) -> int | None:
    """The output-channel axis of the weight that `consumer` reads as input 1."""
    if consumer.op in _WEIGHT_AXIS:
        return _WEIGHT_AXIS[consumer.op]
    if consumer.op == "Gemm":
        return 0 if consumer.attr("transB", 0) else 1
    if consumer.op == "MatMul" and rank is not None:
        return rank - 1  # weight [..., K, N]: N is the output channel
    return None


def _axis(view: ModelView, dq: NodeRef) -> Iterator[Finding]:
    """Per-axis scales: count against the axis (error), on an activation (warn), on a
    weight but not its consumer's output-channel axis (warn, per consumer)."""
    count = _scale_count(view, dq.input(1))
    if count is None or count <= 1 or dq.attr("block_size", 0):
        return  # per-tensor, unknown, or blocked (opset 21 INT4 weights: not per-axis)
    shape = view.shape(dq.input(0))
    rank = len(shape) if shape is not None else None
    axis = int(dq.attr("axis", 1))
    if axis < 0 and rank is not None:
        axis += rank
    per_axis = _note_clause("per-axis")
    fact = f'parser notes, {_NOTES_KEY}: "{per_axis}"'
    dim = shape[axis] if shape is not None and 0 <= axis < len(shape) else None
    if isinstance(dim, int) and dim != count:
        yield Finding(
            "qdq-axis", ERROR,
            f"{count} scales for axis {axis} of size {dim}: TensorRT takes per-axis scales "
            "only where their number equals the size of the axis",
            nodes=(dq.label,), tensors=(dq.input(1),), op=DQ, fact=fact, fix=_REQUANTIZE)
        return
    if _weight_source(view, dq) is None:
        yield Finding(
            "qdq-axis", WARN,
            f"per-axis scales ({count}) on an activation: TensorRT quantizes activations "
            "per-tensor",
            nodes=(dq.label,), tensors=(dq.input(0),), op=DQ,
            fact=f"{fact} (read from the 8.6 importer)",
            fix=f"{_REQUANTIZE}: one scale per activation tensor")
        return
    for consumer in view.consumers.get(dq.node.output[0] if dq.node.output else "", []):
        want = _expected_axis(consumer, rank) if consumer.input(1) == dq.node.output[0] else None
        if want is None or want == axis:
            continue
        yield Finding(
            "qdq-axis", WARN,
            f"per-channel weight scales on axis {axis}, but {consumer.op}'s output channels "
            f"are axis {want} of its weight: TensorRT wants per-channel weight scales on the "
            "output-channel axis",
            nodes=(dq.label, consumer.label), tensors=(dq.input(1),), op=DQ,
            fact=f"{fact}; calibration_notes.md (d) Q/DQ placement 1: weights per-channel, "
                 '"axis 0 for Conv, axis 1 for ConvTranspose"',
            fix=f"{_REQUANTIZE}: per-channel scales on axis {want}")


def _int8_reader(view: ModelView, name: str, depth: int = 0) -> bool:
    """Whether some reader of `name`, looking through commuting ops, runs in INT8."""
    for ref in view.consumers.get(name, []):
        if not ref.standard:
            continue
        if ref.op in INT8_OPS:
            return True
        if ref.op in COMMUTING_OPS and depth < 8 and any(
                _int8_reader(view, out, depth + 1) for out in ref.node.output if out):
            return True
    return False


def _unfusable(view: ModelView, dq: NodeRef) -> Iterator[Finding]:
    """A DQ fed by a Q whose readers (through commuting ops) include no INT8 op."""
    q = view.producers.get(dq.input(0))
    out = dq.node.output[0] if dq.node.output else ""
    if q is None or not q.standard or q.op != Q or not out:
        return
    readers = view.consumers.get(out, [])
    is_output = any(o.name == out for o in view.graph_outputs)
    if (not readers and not is_output) or _int8_reader(view, out):
        return
    fed = ", ".join(dict.fromkeys(r.op for r in readers)) or "the graph output only"
    yield Finding(
        "qdq-unfusable", WARN,
        f"a Q/DQ pair feeds only {fed}, which the Q/DQ placement notes do not list among "
        "the ops TensorRT runs in INT8: TensorRT may keep the pair as extra rounding "
        "instead of fusing it",
        nodes=(q.label, dq.label), tensors=(out,), op=DQ, fact=_PLACEMENT,
        fix="remove the pair, or quantize the inputs of the Conv/ConvTranspose/Gemm/MatMul/"
            "Add it is meant for (graphfix calibrate places Q/DQ there)",
    )
