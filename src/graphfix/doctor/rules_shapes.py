"""Doctor rules about shapes and INT64: dynamic inputs, data-dependent shapes, INT64 range."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from onnx import TensorProto

from graphfix.doctor.findings import ERROR, WARN, Finding
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.trt import TrtTarget, native_nms_from, parser_behaviour_notes

# Ops whose output shape depends on the input values, not only on input shapes
# (the ONNX spec of each: the output length is the number of selected elements).
DATA_DEPENDENT = ("NonZero", "NonMaxSuppression", "Unique", "Compress", "TopK")
_INT32 = np.iinfo(np.int32)


def dynamic_inputs(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`dynamic-input` (warn): graph inputs with symbolic or unknown dims need an
    optimization profile. The fix is a trtexec line to complete, each dynamic dim named
    in angle brackets by its dim_param (`<height>`: one name, one size, in every input that
    shares it) or, unnamed, by its input and axis (`<state.d1>`). The batch, the dim at
    axis 0 of the first input where that is dynamic, gets 1/1/8 wherever it appears."""
    dynamic = [(vi.name, _dims(vi)) for vi in view.graph_inputs]
    dynamic = [(name, dims) for name, dims in dynamic
               if dims is None or any(not isinstance(d, int) for d in dims)]
    if not dynamic:
        return
    first = dynamic[0][1]
    batch = first[0] if first and not isinstance(first[0], int) else None

    def shapes(size: int) -> str:
        return ",".join(f"{name}:{_template(dims, batch, size)}" for name, dims in dynamic)

    line = (f"trtexec --onnx=model.onnx --minShapes={shapes(1)} --optShapes={shapes(1)} "
            f"--maxShapes={shapes(8)}")
    names = ", ".join(f"{n}{_shape_text(d)}" for n, d in dynamic)
    fixed = ",".join(f"{name}={_template(dims, batch, 1)}" for name, dims in dynamic)
    yield Finding(
        "dynamic-input", WARN,
        f"dynamic input dimensions: {names}; the engine needs an optimization profile "
        "(fill in the sizes you will run)",
        tensors=tuple(n for n, _ in dynamic),
        fact="TensorRT builds engines for explicit shape ranges (optimization profiles)",
        fix=f"{line}   or fix them: fix-shapes{{{fixed}}}",
    )


def _template(dims: list | None, batch: str | None, size: int) -> str:
    """`dims` for trtexec: numbers as they are, the batch as `size`, other dims as
    <their name>."""
    if dims is None:
        return "<shape>"
    return "x".join(str(d) if isinstance(d, int) else str(size) if d == batch else f"<{d}>"
                    for d in dims)


def _dims(vi) -> list | None:
    """The declared dims: numbers, the dim_param of a named dim, `input.d<axis>` for an
    unnamed one (no value, a negative value, or a placeholder name such as '?' or '-1',
    as some exporters write), so two unnamed dims never share a name."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
            else (d.dim_param if _named(d.dim_param) else f"{vi.name}.d{axis}")
            for axis, d in enumerate(tt.shape.dim)]


def _named(dim_param: str) -> bool:
    return bool(dim_param) and dim_param != "?" and not dim_param.lstrip("-").isdigit()


def _shape_text(dims: list | None) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]" if dims is not None else "[?]"


def data_dependent(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`data-dependent-shape` (warn): ops whose output size depends on tensor values,
    one finding per op type naming each node once (TopK only when K is computed from
    values, not from shapes or constants)."""
    notes = parser_behaviour_notes()
    grouped: dict[str, list] = {}
    for ref in view.nodes:
        if not ref.standard or ref.op not in DATA_DEPENDENT:
            continue
        if ref.op == "TopK" and (view.opset < 10 or _from_shapes(view, ref.input(1))):
            continue
        grouped.setdefault(ref.op, []).append(ref)
    for op, refs in grouped.items():
        fact = notes.get(op) if isinstance(notes.get(op), str) else ""
        if op == "NonMaxSuppression":
            nms = notes.get("NonMaxSuppression", {})
            native = native_nms_from()
            fact = nms.get(f"{native}+", "") if target.at_least(native) else nms.get("8.0-8.4", "")
        yield Finding(
            "data-dependent-shape", WARN,
            f"{op} has a data-dependent output shape ({len(refs)} node"
            f"{'s' * (len(refs) != 1)}): TensorRT sizes such outputs at run time (slower, "
            "and some later layers cannot take such shapes)",
            nodes=tuple(r.label for r in refs),
            tensors=tuple(r.node.output[0] for r in refs if r.node.output), op=op,
            fact=fact or "ONNX spec: the output length is the number of selected elements",
            fix=_bound_fix(op),
        )


def _from_shapes(view: ModelView, name: str, limit: int = 64) -> bool:
    """Whether `name` is computed only from constants and Shape/Size of tensors (a
    build-time value for TensorRT), looking at most `limit` nodes up."""
    todo, seen = [name], set()
    while todo:
        tensor = todo.pop()
        if not tensor or tensor in seen or view.is_constant(tensor):
            continue
        seen.add(tensor)
        producer = view.producers.get(tensor)
        if producer is None or len(seen) > limit:
            return False  # a graph input, an outer-scope value, or too far to tell
        if producer.op in ("Shape", "Size"):
            continue
        todo.extend(producer.node.input)
    return True


def _bound_fix(op: str) -> str:
    if op == "NonMaxSuppression":
        return ("bound it: a fixed max_output_boxes_per_class, or replace the NMS with the "
                "EfficientNMS_TRT plugin (fixed-size outputs)")
    if op == "TopK":
        return "make K a constant"
    return f"bound the number of selected elements after {op} (e.g. TopK with a constant K)"


def _clamping_keeps_meaning(view: ModelView, name: str) -> bool:
    """Read only where clamping to +-INT_MAX keeps the meaning. TensorRT <= 8.6 casts
    INT64 down to INT32, "clamping values to +-INT_MAX" (trt/onnx_trt_operators.json:
    parser_behaviour_notes["INT64"] and the 8.6 operators.md note). Exempt readers:

    - Slice starts/ends ("from the start"/"to the end": every dimension is below 2**31);
    - NonMaxSuppression's max_output_boxes_per_class, which the parser clamps to
      INT32_MAX itself (nms_notes.md: "so torchvision's sys.maxsize works");
    - a Loop's trip count M holding exactly INT64_MAX, on a Loop with a `cond` input
      (`_unbounded_trip_count`).
    """
    readers = view.consumers.get(name, [])
    return bool(readers) and all(
        (r.op == "Slice" and all(r.input(i) != name for i in (0, 3, 4))
         and name in (r.input(1), r.input(2)))
        or (r.op == "NonMaxSuppression" and r.input(2) == name
            and name not in (r.input(0), r.input(1), r.input(3), r.input(4)))
        or _unbounded_trip_count(view, r, name)
        for r in readers)


def _unbounded_trip_count(view: ModelView, ref: NodeRef, name: str) -> bool:
    """Whether `name` is `ref`'s Loop trip count M as the "no limit" sentinel INT64_MAX
    (what torch.onnx writes for every scripted `while` loop), on a Loop that also has a
    `cond` input and reads `name` nowhere else.

    Clamped, M becomes INT32_MAX. The two loops agree whenever the condition turns
    false within 2**31 - 1 iterations, and the sentinel says just that: "no trip limit,
    the condition ends it". That a while loop never needs 2**31 iterations is an
    assumption, not a proof (such a TensorRT loop would not finish in any useful time),
    so only the sentinel is exempt: any other value above INT32_MAX is a limit someone
    chose, which the clamp would move, and a Loop without a `cond` input runs exactly
    M iterations, which the clamp would cut short.
    """
    if ref.op != "Loop" or not ref.standard or ref.input(0) != name or not ref.input(1):
        return False
    if name in ref.node.input[1:]:
        return False
    value = view.value(name)
    return (value is not None and value.size == 1
            and int(value.reshape(-1)[0]) == np.iinfo(np.int64).max)


def int64_values(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """`int64-overflow` (error before TensorRT 9.0, which casts INT64 to INT32) and
    `int64-input` (warn for those targets): per initializer/Constant and per input, the
    name in `tensors` only, so the engine groups those that say the same (`grouped`)."""
    if target.at_least("9.0"):
        return
    fact = "parser notes, INT64: " + str(parser_behaviour_notes().get("INT64", ""))
    # initializers and Constant outputs alike: the verdict must not depend on how an
    # exporter (or a pass) stored the constant
    for name in [*view.initializers, *view.constant_nodes]:
        tensor = view.initializers.get(name)
        if tensor is not None and tensor.data_type != TensorProto.INT64:
            continue
        value = view.value(name)
        if value is None or value.dtype != np.int64 or value.size == 0 or \
                _clamping_keeps_meaning(view, name):
            continue
        low, high = int(value.min()), int(value.max())
        if low < _INT32.min or high > _INT32.max:
            worst = high if high > _INT32.max else low
            kind = "initializer" if tensor is not None else "Constant"
            yield Finding(
                "int64-overflow", ERROR,
                f"INT64 {kind} holding {worst}, outside INT32; TensorRT "
                f"{target.version} casts INT64 to INT32 and clamps it to +-INT_MAX",
                tensors=(name,), fact=fact,
                fix=("change the model so the value fits INT32 (large Slice ends: use "
                     "INT32_MAX), or target TensorRT 9.0 or newer"),
            )
    for vi in view.graph_inputs:
        if vi.type.tensor_type.elem_type == TensorProto.INT64:
            yield Finding(
                "int64-input", WARN,
                f"INT64 graph input; TensorRT {target.version} has no INT64 tensors and binds "
                "it as INT32",
                tensors=(vi.name,), fact=fact, fix="int64-to-int32 (feeds INT32 at run time)",
            )
