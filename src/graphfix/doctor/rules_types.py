"""Doctor rule `type-mismatch`: nodes that bind one of their op's type variables to two
element types, which the ONNX schema forbids.

A float16 converter that misses a tensor leaves `Add(float, float16)` or a `Gemm` with a
float input and float16 weights, or a value_info declaring float for what a node now
writes in float16 (onnxconverter-common's `convert_float_to_float16` does both on BERT
and YOLOv8 exports, seen here). onnxruntime refuses to load such a model; ONNX's own
shape inference, which doctor runs leniently, does not say so. What TensorRT does with it
is not in graphfix's facts: onnx-tensorrt's importers do not check the types themselves
(elementwiseHelper, importerUtils.cpp at 10.1-GA), so the finding is a warning that the
model is invalid ONNX, not a claim about the parser.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import onnx
import onnx.defs

from graphfix.doctor.findings import WARN, Finding
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.graph.protos import graph_protos
from graphfix.trt import TrtTarget

IDS = ("type-mismatch",)
TO_ATTRIBUTE = "to"  # where a Cast's output type comes from, beside its tensors


def type_mismatch(view: ModelView, target: TrtTarget) -> Iterator[Finding]:
    """One finding per node whose inputs and outputs give a type variable two types."""
    shared = _defined_in_several_graphs(view)
    for ref in view.nodes:
        if not ref.standard:
            continue
        bindings = _bindings(view, ref, shared)
        clashes = {param: types for param, types in bindings.items() if len(types) > 1}
        if not clashes:
            continue
        said = "; ".join(f"{param} to " + " and ".join(sorted(_name(e) for e in types))
                         for param, types in clashes.items())
        involved = {t for types in clashes.values() for names in types.values() for t in names}
        tensors = tuple(dict.fromkeys(t for t in (*ref.node.input, *ref.node.output)
                                      if t in involved))
        yield Finding(
            "type-mismatch", WARN,
            f"{ref.op} binds a type variable of its ONNX schema to two types ({said}"
            f"{', one of them by its to attribute' if ref.op == 'Cast' else ''}). The model "
            "is invalid ONNX: onnxruntime refuses to load it, and what TensorRT does with it "
            "is not checked here",
            nodes=(ref.label,), tensors=tensors, op=ref.op,
            fact=f"ONNX schema {ref.op}: every input and output typed by one variable has "
                 "one element type",
            fix="the model's float16 (or other) conversion missed these tensors: convert or "
                "export it again; to run float16 in TensorRT, keep the model float32 and "
                "let the builder choose precisions (trtexec --fp16)",
        )


def _defined_in_several_graphs(view: ModelView) -> set[str]:
    """Names that more than one graph defines (as a node output, graph input or
    initializer): the view keeps one type per name, which is then not this node's own
    (optimum's merged decoders name tensors alike in both If branches, one float, the
    other int64). Their types are not compared."""
    owners: dict[str, set[int]] = {}
    # graphs by their place in the walk, not id(): protobuf's wrappers are transient
    for k, g in enumerate(graph_protos(view.model.graph)):
        outputs = (name for node in g.node for name in node.output if name)
        for name in [*outputs, *(t.name for t in g.initializer), *(i.name for i in g.input)]:
            owners.setdefault(name, set()).add(k)
    return {name for name, graphs in owners.items() if len(graphs) > 1}


def _bindings(view: ModelView, ref: NodeRef, shared: set[str] = frozenset()
              ) -> dict[str, dict[int, list[str]]]:
    """type variable -> element type -> the tensors that give it (known types only), and
    a Cast's `to` for its output's variable."""
    schema = _schema(ref.op, view.opset)
    if schema is None:
        return {}
    variables = {c.type_param_str for c in schema.type_constraints}
    found: dict[str, dict[int, list[str]]] = {}
    for formals, names in ((schema.inputs, ref.node.input), (schema.outputs, ref.node.output)):
        for i, name in enumerate(names):
            formal = _formal(formals, i)
            if formal is None or formal.type_str not in variables or not name or name in shared:
                continue
            if (formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic
                    and not formal.is_homogeneous):
                continue
            elem = view.elem_type(name)
            if elem:
                found.setdefault(formal.type_str, {}).setdefault(elem, []).append(name)
    if (ref.op == "Cast" and ref.has_attr("to") and ref.node.output
            and ref.node.output[0] not in shared):  # `to` types the output
        found.setdefault(schema.outputs[0].type_str, {}).setdefault(
            int(ref.attr("to")), []).insert(0, TO_ATTRIBUTE)
    return found


def _formal(formals, i: int):
    """The formal parameter input/output `i` binds to (the last one when it is variadic)."""
    if i < len(formals):
        return formals[i]
    last = formals[-1] if formals else None
    if last is not None and last.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return last
    return None


@cache
def _schema(op: str, opset: int):
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def _name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower()
