"""Declared graph-output shapes that the graph's own nodes contradict.

An exporter (or a hand edit) can declare an output shape that is not what the model
computes: ddddocr's OCR model declares its output `[1, seqlen]`, its nodes make
`[N, 1, 8210]`, and onnxruntime only warns on every run ("Expected shape from model of
{1,-1} does not match actual shape"). ONNX's inference cannot tell while a Reshape's
target is computed at run time, so the input passes it; a rewrite that makes the rank
known (unflatten-linear there, or a folded target) then fails inference on the
declaration, and a correct pass would be rolled back for it.

The rule: a declared output shape is checked against what inference computes from the
nodes alone (`unconfirmed`); one the input's nodes do not bear out is a declaration, not
part of the computation. When a result fails inference and, with those declarations set
aside, passes it, the declarations it contradicts give way to the computed shapes
(`redeclare`). One the input's nodes bear out stays binding: a pass that contradicts it
is at fault and is rolled back, as before. The output check, when on, still compares
every output (shape included) with the original's run.
"""

from __future__ import annotations

import onnx

from graphfix.graph.protos import infer_shapes
from graphfix.graph.shapes import proto_dim


def unconfirmed(model: onnx.ModelProto) -> frozenset[str]:
    """The main graph's outputs with a declared shape that inference from the nodes alone
    (every output's declared shape set aside) does not reproduce: no shape, another
    rank, or another number where the declaration has one. `model`: a weightless
    skeleton, copied here. Empty when that inference fails (nothing can be told)."""
    declared = {o.name: o for o in model.graph.output if _has_shape(o)}
    if not declared:
        return frozenset()
    inferred = _inferred(model, set(declared), strict=False)
    if inferred is None:
        return frozenset()
    computed = {o.name: o for o in inferred.graph.output}
    return frozenset(name for name, vi in declared.items()
                     if name not in computed or not _reproduces(vi, computed[name]))


Change = tuple[onnx.TypeProto.Tensor, onnx.TypeProto.Tensor]
"""An output's declared tensor type (a copy) and the one its nodes compute."""


def redeclare(model: onnx.ModelProto, names: frozenset[str], strict: bool
              ) -> tuple[onnx.ModelProto, dict[str, Change]] | None:
    """Shape inference of `model` (a skeleton, copied) with the declared shapes of the
    outputs `names` set aside: the inferred model and, for each of those outputs whose
    declaration the nodes contradict, its declared and its computed tensor type. None
    when inference still fails, or when it passes but contradicts none of them (the
    failure was elsewhere)."""
    aside = {o.name for o in model.graph.output if o.name in names and _has_shape(o)}
    if not aside:
        return None
    declared = {o.name: o for o in model.graph.output if o.name in aside}
    inferred = _inferred(model, aside, strict)
    if inferred is None:
        return None
    changes = {}
    for out in inferred.graph.output:
        if out.name not in aside:
            continue
        was = declared[out.name]
        if _conflict(was, out):
            copy = onnx.TypeProto.Tensor()
            copy.CopyFrom(was.type.tensor_type)
            changes[out.name] = (copy, out.type.tensor_type)
        else:  # the nodes do not contradict it: it keeps its declaration
            out.type.CopyFrom(was.type)
    return (inferred, changes) if changes else None


def set_declarations(outputs, changes: dict[str, Change]) -> None:
    """Give the outputs (ValueInfoProtos) named in `changes` their computed types."""
    for out in outputs:
        if out.name in changes:
            out.type.tensor_type.CopyFrom(changes[out.name][1])


def contradicts(shape: list | None, computed: onnx.TypeProto.Tensor) -> bool:
    """Whether a tensor's shape (graphfix's list form, None for unknown) has another rank
    than `computed`, or another number at a dim both give as a number."""
    if shape is None:
        return True
    return _differ(list(shape), dims(computed))


def describe(name: str, declared: onnx.TypeProto.Tensor,
             computed: onnx.TypeProto.Tensor) -> str:
    """The run's note for one redeclared output."""
    return (f"output '{name}' was declared with shape {dims(declared)}, but its nodes "
            f"compute {dims(computed)} (onnxruntime warns of it on every run): the output "
            "declares the computed shape now")


def dims(tensor_type: onnx.TypeProto.Tensor) -> list:
    """The shape as a list: numbers, dim names, None for an unknown dim."""
    return [proto_dim(d) for d in tensor_type.shape.dim]


def _inferred(model: onnx.ModelProto, aside: set[str], strict: bool
              ) -> onnx.ModelProto | None:
    bare = onnx.ModelProto()
    bare.CopyFrom(model)  # a skeleton: no weights to copy
    for out in bare.graph.output:
        if out.name in aside:
            out.type.tensor_type.ClearField("shape")
    try:
        return infer_shapes(bare, strict)
    except Exception:  # noqa: BLE001 - onnx raises several types; the caller says why
        return None


def _has_shape(vi: onnx.ValueInfoProto) -> bool:
    return vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")


def _reproduces(declared: onnx.ValueInfoProto, computed: onnx.ValueInfoProto) -> bool:
    """Whether the computed shape has the declared rank and every number it declares."""
    if not _has_shape(computed):
        return False
    a, b = dims(declared.type.tensor_type), dims(computed.type.tensor_type)
    return len(a) == len(b) and all(y == x for x, y in zip(a, b, strict=True) if isinstance(x, int))


def _conflict(declared: onnx.ValueInfoProto, computed: onnx.ValueInfoProto) -> bool:
    """Whether the computed shape contradicts the declared one: another rank, or another
    number at a dim both give as a number. An unknown computed shape contradicts
    nothing."""
    if not _has_shape(computed):
        return False
    return _differ(dims(declared.type.tensor_type), dims(computed.type.tensor_type))


def _differ(a: list, b: list) -> bool:
    if len(a) != len(b):
        return True
    return any(isinstance(x, int) and isinstance(y, int) and x != y
               for x, y in zip(a, b, strict=True))
