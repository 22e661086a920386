"""Building the backbone and the NMS part of a split (`split.SplitPlan`) as models.

The backbone keeps every original input and the nodes the cut tensors and the
original outputs it makes need; its outputs are those outputs, then the cut tensors.
The NMS part takes the cut tensors (and the original inputs the post-processing reads)
as inputs and holds the post-processing plus the constant-only nodes it reads; its
outputs are the original outputs it makes, with their names and types. Types of the
cut tensors come from shape inference with the model's declared input shapes (so a
symbolic batch stays symbolic), else with the check's fixed shapes (`fixed`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from graphfix.errors import InternalError
from graphfix.graph.protos import infer_shapes
from graphfix.graph.skeleton import skeleton
from graphfix.nms._flow import Flow
from graphfix.nms.chain import FROM_BACKBONE, FROM_NMS, SplitManifest, TensorSpec
from graphfix.nms.split import SplitPlan

Info = Mapping[str, tuple[int, list | None]]


def tensor_info(model: onnx.ModelProto) -> dict[str, tuple[int, list | None]]:
    """name -> (elem type, dims: int, symbolic name or None) from shape inference."""
    try:
        inferred = infer_shapes(skeleton(model))
    except Exception:  # inference fails on some custom ops: keep what the model declares
        inferred = model
    g = inferred.graph
    info: dict[str, tuple[int, list | None]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tt.shape.dim] if tt.HasField("shape") else None
        info[vi.name] = (tt.elem_type, dims)
    return info


def build_parts(model: onnx.ModelProto, plan: SplitPlan, info: Info, fixed: Info
                ) -> tuple[onnx.ModelProto, onnx.ModelProto, SplitManifest] | str:
    """(backbone, NMS part, manifest), or why a cut tensor has no known type."""
    graph = model.graph
    static = all(isinstance(d, int) for i in graph.input for d in (_dims(i) or [None]))
    cut_specs = []
    for name in plan.cut + plan.passthrough:
        elem, dims = info.get(name, (0, None))
        if not elem:
            elem, dims = fixed.get(name, (0, None))
        if not elem:
            return f"shape inference gives no type for the cut tensor '{name}'"
        cut_specs.append(_spec(name, elem, _known(dims, fixed.get(name, (0, None))[1], static)))
    flow = Flow(graph)
    keep_back = _needed(flow, [*plan.backbone_outputs, *plan.cut], exclude=plan.post)
    outputs = {o.name: o for o in graph.output}
    back_outputs = [outputs[n] for n in plan.backbone_outputs] + [
        _value_info(s) for s in cut_specs[:len(plan.cut)]]
    backbone = _model(model, "backbone", keep_back, list(graph.input), back_outputs)
    needed_consts = _needed(flow, [n for i in plan.post for n in flow.reads[i]],
                            exclude=plan.post, only_constant=True)
    keep_nms = sorted(plan.post | needed_consts)
    nms = _model(model, "nms", keep_nms, [_value_info(s) for s in cut_specs],
                 [outputs[n] for n in plan.nms_outputs])
    manifest = SplitManifest(
        backbone="", nms="",
        inputs=[_spec(i.name, i.type.tensor_type.elem_type, _dims(i)) for i in graph.input
                if i.name in flow.inputs],
        cut=cut_specs[:len(plan.cut)],
        nms_inputs=[*plan.cut, *plan.passthrough],
        outputs=[(o, FROM_BACKBONE if o in plan.backbone_outputs else FROM_NMS)
                 for o in flow.outputs],
        regions=[r.label for r in plan.regions],
    )
    return backbone, nms, manifest


def _needed(flow: Flow, names: list[str], exclude: set[int],
            only_constant: bool = False) -> set[int]:
    """Node indices outside `exclude` that `names` need (only constant-only ones)."""
    seen: set[int] = set()
    todo = [flow.producer[n] for n in names if n in flow.producer]
    while todo:
        i = todo.pop()
        if i in seen or i in exclude:
            continue
        if only_constant and not all(flow.is_constant(o) for o in flow.nodes[i].output if o):
            continue
        seen.add(i)
        todo.extend(flow.producer[n] for n in flow.reads[i] if n in flow.producer)
    return seen


def _model(like: onnx.ModelProto, suffix: str, keep: list[int] | set[int],
           inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
           ) -> onnx.ModelProto:
    graph = like.graph
    nodes = [graph.node[i] for i in sorted(keep)]
    used = {n for node in nodes for n in _reads(node)} | {o.name for o in outputs}
    inits = [t for t in graph.initializer if t.name in used]
    produced = {o for node in nodes for o in node.output} | {t.name for t in inits}
    declared = {i.name for i in inputs}
    missing = sorted(n for n in used if n not in produced and n not in declared)
    if missing:
        raise InternalError(f"split-nms built a {suffix} part that reads undefined {missing}")
    ends = declared | {o.name for o in outputs}
    value_info = [v for v in graph.value_info if v.name in produced and v.name not in ends]
    g = helper.make_graph(nodes, f"{graph.name or 'model'}_{suffix}", inputs, outputs,
                          inits, value_info=value_info)
    model = helper.make_model(g, opset_imports=list(like.opset_import))
    model.ir_version = like.ir_version
    model.producer_name, model.producer_version = like.producer_name, like.producer_version
    model.metadata_props.extend(like.metadata_props)
    model.functions.extend(like.functions)
    return model


def _reads(node: onnx.NodeProto) -> list[str]:
    from graphfix.graph.protos import node_reads

    return node_reads(node)


def _known(dims: list | None, fixed: list | None, static: bool) -> list | None:
    """Dims inference invented a name for (`unk__3`) are unknown (None), or the fixed
    shapes' value when every model input has a static shape."""
    if dims is None:
        return list(fixed) if static and fixed is not None else None
    out = []
    for k, d in enumerate(dims):
        if isinstance(d, str) and d.startswith("unk__"):
            d = fixed[k] if static and fixed is not None and k < len(fixed) else None
        out.append(d)
    return out


def _spec(name: str, elem: int, dims: list | None) -> TensorSpec:
    return TensorSpec(name, str(np.dtype(helper.tensor_dtype_to_np_dtype(elem))), dims)


def _dims(vi: onnx.ValueInfoProto) -> list | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim]


def _value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    return helper.make_tensor_value_info(spec.name, elem, spec.shape)
