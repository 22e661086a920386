"""ONNX shape inference for an onnx-graphsurgeon graph, written back onto its tensors."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.graph.convert import export_skeleton
from graphfix.graph.dtypes import np_dtype
from graphfix.graph.protos import graph_protos
from graphfix.graph.protos import infer_shapes as proto_infer_shapes
from graphfix.graph.walk import all_graphs, tensor_map

Dim = int | str | None


def infer_shapes(graph: gs.Graph, clear: bool = False, symbolic: bool = False) -> int:
    """Run ONNX shape inference (with data propagation) and store the shapes it finds.

    With `clear`, every tensor's shape except the graphs' inputs is dropped first, so
    stale shapes (after an input shape changed) cannot survive; graph outputs that
    inference cannot work out get their old shape back. Otherwise a tensor takes the
    inferred shape only where that is more static than what it has. Inference runs
    on a weightless skeleton of the exported graph. Returns how many tensors got a
    new shape.

    With `symbolic`, onnxruntime's symbolic inference refines what ONNX's leaves unknown
    (`symbolic_shapes`) where a Shape or Size reads a dim that is neither static nor a
    named dim of the graph inputs: it costs a second or so and sympy's memory (about
    200 MiB), so only fold-constants asks, and only where it may fold more.
    """
    outputs = {id(t): t.shape for g in all_graphs(graph) for t in g.outputs}
    if clear:
        for t in _inner_variables(graph):
            t.shape = None
    inferred = proto_infer_shapes(export_skeleton(graph))
    updated = apply_inferred(graph, inferred)
    if symbolic and not any(graph.subgraphs()) and reads_unnamed_dims(graph):
        refined = symbolic_shapes(inferred)
        if refined is not None:
            updated += apply_inferred(graph, refined, refine_only=True)
    for g in all_graphs(graph):
        for t in g.outputs:
            if t.shape is None and outputs.get(id(t)) is not None:
                t.shape = outputs[id(t)]
    return updated


def reads_unnamed_dims(graph: gs.Graph) -> bool:
    """Whether a Shape or Size of the main graph reads a tensor of unknown rank, or with
    a dim neither static nor named after a graph input's dim."""
    return bool(_unnamed_readers(graph))


def unnamed_dims_may_be_static(graph: gs.Graph, sizes: dict[str, tuple[int, ...]]
                               ) -> bool:
    """Whether some dim a Shape or Size of the main graph reads that ONNX's inference left
    unnamed might be static: onnxruntime's symbolic inference (`symbolic_shapes`) can
    help only there, and it costs sympy's import (0.36 s) and a walk over the graph.

    Decided by ONNX's inference at two sizes of the dynamic input dims: `sizes` (the
    run's input shapes; 1 for a dim they do not give) and twice those. A dim that
    differs between the two depends on the input dims, so no inference can find it
    static; a dim unknown at either, or equal at both, might be (RAFT's pyramid dims: H/8
    at a dynamic batch). swin_t at a dynamic batch: every such dim is batch*64 or
    batch*16, so the symbolic run is skipped. Where ONNX's inference stops at an op its
    data propagation lacks (Range: a detector's anchor grid over a feature map's width),
    the dims are computed instead (`_computed_shapes`)."""
    dynamic = {t.name: [i for i, d in enumerate(t.shape or ()) if not isinstance(d, int)]
               for t in graph.inputs}
    readers = _unnamed_readers(graph)
    if not readers:
        return False
    if not any(dynamic.values()):
        return True
    model = export_skeleton(graph)
    del model.graph.value_info[:]
    wanted = [t.name for t, _ in readers]
    at = [_concrete_dims(model, dynamic, sizes, scale, wanted) for scale in (1, 2)]
    counted = _DataDependence()
    for tensor, positions in readers:
        if positions is None:  # unknown rank
            return True
        one, two = at[0].get(tensor.name), at[1].get(tensor.name)
        if one is None or two is None or len(one) != len(two):
            return True
        if any(one[i] is not None and one[i] == two[i] for i in positions):
            return True
        if any(one[i] is None or two[i] is None for i in positions) and not counted(tensor):
            return True
    return False


DATA_DEPENDENT = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress"})
"""Ops whose output's size is a count of data: no inference can make it static."""


class _DataDependence:
    """Whether a tensor of the main graph is computed from the output of a
    `DATA_DEPENDENT` op (YOLO exported with NMS: the detections' count, read by Shape).
    onnxruntime's symbolic inference gives such a count a fresh symbol, so a dim
    unknown at both probe sizes downstream of one is taken as not static; at worst that
    misses a fold the symbolic run would find (a dim of such a tensor that cancels out),
    never a wrong one."""

    def __init__(self) -> None:
        self.memo: dict[int, bool] = {}

    def __call__(self, start: gs.Tensor) -> bool:
        stack = [(start, False)]
        while stack:  # depth first; a tensor is decided after all its producer's inputs
            t, expanded = stack.pop()
            if expanded:
                self.memo[id(t)] = any(self.memo.get(id(i), False) for i in t.inputs[0].inputs)
                continue
            if id(t) in self.memo or len(t.inputs) != 1:
                continue
            node = t.inputs[0]
            if node.op in DATA_DEPENDENT and node.domain in ("", "ai.onnx", None):
                self.memo[id(t)] = True
                continue
            self.memo[id(t)] = False  # in progress: a cycle reads as not dependent
            stack.append((t, True))
            stack.extend((i, False) for i in node.inputs if id(i) not in self.memo)
        return self.memo.get(id(start), False)


def _unnamed_readers(graph: gs.Graph) -> list[tuple[gs.Tensor, list[int] | None]]:
    """(tensor, positions) for each Shape/Size of the main graph reading dims that are
    neither static nor named after a graph input's dim; positions None where the rank
    is unknown."""
    named = {d for t in graph.inputs for d in (t.shape or ()) if isinstance(d, str)}
    out = []
    for node in graph.nodes:
        if node.op not in ("Shape", "Size") or not node.inputs:
            continue
        t = node.inputs[0]
        if t.shape is None:
            out.append((t, None))
            continue
        positions = [i for i, d in enumerate(t.shape)
                     if d is None or (isinstance(d, str) and d not in named)]
        if positions:
            out.append((t, positions))
    return out


def _concrete_dims(model: onnx.ModelProto, dynamic: dict[str, list[int]],
                   sizes: dict[str, tuple[int, ...]], scale: int,
                   wanted: list[str]) -> dict[str, list]:
    """Every tensor's dims (None: unknown) by ONNX's inference with the dynamic input
    dims set to `sizes` times `scale`; those of `wanted` that it leaves unknown computed
    where they can be (`_computed_shapes`)."""
    concrete = onnx.ModelProto()
    concrete.CopyFrom(model)
    for vi in concrete.graph.input:
        given = sizes.get(vi.name)
        for i in dynamic.get(vi.name, ()):
            base = given[i] if given and i < len(given) and given[i] > 0 else 1
            dim = vi.type.tensor_type.shape.dim[i]
            dim.Clear()
            dim.dim_value = base * scale
    try:
        inferred = proto_infer_shapes(concrete)
    except Exception:  # noqa: BLE001 - the sizes do not suit the model: undecided
        return {}
    dims = {}
    g = inferred.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.tensor_type.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                             for d in vi.type.tensor_type.shape.dim]
    unknown = [n for n in dict.fromkeys(wanted) if None in dims.get(n, [None])]
    if unknown:
        dims.update(_computed_shapes(inferred, dims, unknown))
    return dims


COMPUTED_NODES = 256
"""The most nodes `_computed_shapes` runs for the tensors it is asked about."""


def _computed_shapes(model: onnx.ModelProto, dims: dict[str, list],
                     names: list[str]) -> dict[str, list[int]]:
    """The shapes of those `names` that can be computed from constants and the static
    shapes in `dims`, by running onnxruntime on the nodes that make them: a Shape or Size
    of a tensor whose dims are all known becomes that constant, and a tensor that needs
    a graph input (or a weight the skeleton leaves out), a node with a body or outside
    ONNX's domain, or more than COMPUTED_NODES nodes, is left out (unknown). Where ONNX's
    inference cannot follow (its data propagation has no Range), this finds what
    onnxruntime would, for these sizes."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    known = {t.name for t in graph.initializer}
    consts: dict[str, np.ndarray] = {}
    ok: dict[str, bool] = {}
    visiting: set[str] = set()

    def computable(name: str) -> bool:  # iterative: graphs are deep
        stack = [name]
        while stack:
            top = stack[-1]
            if top in ok:
                stack.pop()
                continue
            if not top or top in known:
                ok[top] = True
                stack.pop()
                continue
            node = producer.get(top)
            value = _static_shape_value(node, dims) if node is not None else None
            if value is not None:
                consts[top] = value
                ok[top] = True
                stack.pop()
                continue
            if (node is None or node.domain not in ("", "ai.onnx")
                    or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                           for a in node.attribute)):
                ok[top] = False
                stack.pop()
                continue
            pending = [i for i in node.input if i not in ok]
            if pending and top in visiting:  # back with inputs unresolved: a cycle
                ok.update(dict.fromkeys(node.output, False))
                stack.pop()
                continue
            if pending:
                visiting.add(top)
                stack.extend(pending)
                continue
            ok.update(dict.fromkeys(node.output, all(ok[i] for i in node.input)))
            stack.pop()
        return ok[name]

    targets = [n for n in names if computable(n)]
    if not targets:
        return {}
    needed: set[int] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if name in consts or node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(node.input)
    if len(needed) > COMPUTED_NODES:
        return {}
    nodes = [n for n in graph.node if id(n) in needed]
    read = {i for n in nodes for i in n.input}
    closure = onnx.helper.make_model(
        onnx.helper.make_graph(
            nodes, "shapes", [], [onnx.helper.make_empty_tensor_value_info(n) for n in targets],
            [t for t in graph.initializer if t.name in read]
            + [onnx.numpy_helper.from_array(v, k) for k, v in consts.items() if k in read]),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    from graphfix.runtime.session import make_session

    try:
        values = make_session(closure, once=True).run(targets, {})
    except Exception:  # noqa: BLE001 - onnxruntime cannot: unknown, as before
        return {}
    return {n: list(np.shape(v)) for n, v in zip(targets, values, strict=True)}


def _static_shape_value(node: onnx.NodeProto, dims: dict[str, list]) -> np.ndarray | None:
    """The output of a Shape or Size node whose input's dims are all in `dims`, else None."""
    if node.op_type not in ("Shape", "Size") or node.domain not in ("", "ai.onnx"):
        return None
    shape = dims.get(node.input[0]) if node.input else None
    if shape is None or None in shape:
        return None
    if node.op_type == "Size":
        return np.array(math.prod(shape), dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[start:end], dtype=np.int64)  # ONNX clamps as Python slices do


def symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference of `model`, or None where it fails.

    ONNX's inference names every dim it cannot compute afresh and computes no arithmetic
    on dims (a Div, a Sqrt of a size); onnxruntime's (`onnxruntime.tools.
    symbolic_shape_infer`, sympy underneath) keeps one symbol per input dim and does:
    RAFT's correlation pyramid has 18 Shape nodes whose dims only it finds static at a
    dynamic batch. `auto_merge` stays off: merging two unknown dims on a broadcast would
    assume they are equal where one may be 1, so a conflict fails the inference
    instead, and then ONNX's shapes stand alone. Not used on graphs with If/Loop/Scan:
    it gives an If output the shape of one branch, and silero's VAD has Ifs whose
    branches differ in rank; folded on those shapes, its LSTM got a 4-D input.

    Its `infer_shapes` entry point saves "sym_shape_infer_temp.onnx" into the current
    directory when some shape stays unknown; graphfix writes no file a user did not ask
    for, so this runs the same steps (its `_preprocess` / `_infer_impl` loop) and keeps
    the partial result instead. Private methods: any change in them means no help here,
    not an error. The module is loaded from its file (`_symbolic_module`)."""
    try:
        module = _symbolic_module()
        SymbolicShapeInference, get_opset = module.SymbolicShapeInference, module.get_opset

        if (get_opset(model) or 0) < 7:
            return None
        with _quiet_logging():
            inference = SymbolicShapeInference(2**31 - 1, False, False, 0)
            inference._preprocess(model)
            while inference.run_:
                inference._infer_impl()
            inference._update_output_from_vi()
        return inference.out_mp_
    except Exception:  # noqa: BLE001 - its asserts and sympy's errors all mean "no help"
        return None


_SYMBOLIC = "onnxruntime.tools.symbolic_shape_infer"


@functools.cache
def _symbolic_module():
    """onnxruntime's `tools/symbolic_shape_infer.py`, executed from its file under its own
    name, without the package `onnxruntime.tools`: that package's `__init__` imports
    torch whenever torch is installed (a helper for exporting PyTorch models), and most
    graphfix users export from PyTorch. With torch 2.13 installed that import cost BERT's
    run 1.1 s and 190 MiB of its 2.2 s and 330 MiB. The module itself imports only
    numpy, onnx, sympy and packaging."""
    if _SYMBOLIC in sys.modules:  # imported by someone already: the same code
        return sys.modules[_SYMBOLIC]
    package = importlib.util.find_spec("onnxruntime")
    if package is None or not package.submodule_search_locations:
        raise ImportError("onnxruntime is not installed")
    path = Path(next(iter(package.submodule_search_locations)), "tools",
                "symbolic_shape_infer.py")
    spec = importlib.util.spec_from_file_location(_SYMBOLIC, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _quiet_logging():
    """The symbolic inference logs warnings per node it cannot handle; not ours to print."""
    logger = logging.getLogger(_SYMBOLIC)
    root = logging.getLogger()
    levels = logger.level, root.level
    logger.setLevel(logging.ERROR)
    root.setLevel(max(root.level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(levels[0])
        root.setLevel(levels[1])


def apply_inferred(graph: gs.Graph, inferred: onnx.ModelProto, refine_only: bool = False
                   ) -> int:
    """Copy shapes and dtypes from a shape-inferred export of `graph` onto its tensors:
    a shape where it is more static than what the tensor has, a dtype where the tensor
    has none. Returns how many tensors changed.

    Each graph's tensors take the types inferred in that graph's own proto (the export
    has the same bodies in the same order): sibling bodies may name different tensors
    alike (optimum's merged decoders: both If branches are the same decoder, one casting
    `/model/decoder/Cast_1_output_0` to float, the other to int64), so a type is never
    looked up by name across bodies, except where the two walks disagree (by name then,
    as a fallback).

    `refine_only` (onnxruntime's symbolic shapes): only where the tensor's rank is known
    and the same."""
    graphs, protos = list(all_graphs(graph)), list(graph_protos(inferred.graph))
    if len(graphs) != len(protos):
        types = _types(protos)
        return sum(_apply_type(t, *types, refine_only) for t in _inner_variables(graph))
    inputs = {id(t) for g in graphs for t in g.inputs}
    updated = 0
    for g, proto in zip(graphs, protos, strict=True):
        types = _types([proto])
        for node in g.nodes:
            for t in node.outputs:
                if isinstance(t, gs.Variable) and id(t) not in inputs:
                    updated += _apply_type(t, *types, refine_only)
    return updated


def _types(protos: list[onnx.GraphProto]) -> tuple[dict[str, onnx.TypeProto.Tensor],
                                                   dict[str, int]]:
    """The inferred tensor types of `protos` by name: those with a shape, and dtypes."""
    shaped: dict[str, onnx.TypeProto.Tensor] = {}  # the types that have a shape
    dtypes: dict[str, int] = {}
    for g in protos:
        for vi in list(g.value_info) + list(g.output):
            tensor_type = vi.type.tensor_type
            if tensor_type.HasField("shape"):
                shaped[vi.name] = tensor_type
            if tensor_type.elem_type:
                dtypes[vi.name] = tensor_type.elem_type
    return shaped, dtypes


def _apply_type(t: gs.Variable, shaped: dict[str, onnx.TypeProto.Tensor],
                dtypes: dict[str, int], refine_only: bool) -> bool:
    """Give `t` its inferred shape where more static, its dtype where it has none
    (`apply_inferred`); whether it changed."""
    inferred_type = shaped.get(t.name)
    old = t.shape
    if refine_only and (inferred_type is None or old is None
                        or len(inferred_type.shape.dim) != len(old)):
        return False
    changed = False
    if inferred_type is not None:
        dims = inferred_type.shape.dim
        count = static_count(old)
        if count < len(dims):  # else no inferred shape can be more static
            new = [proto_dim(d) for d in dims]
            if static_count(new) > count:
                t.shape = new
                changed = True
    if t.dtype is None and t.name in dtypes:
        dtype = np_dtype(dtypes[t.name])
        if dtype is not None:
            t.dtype = dtype
            changed = True
    return changed


def _inner_variables(graph: gs.Graph) -> list[gs.Variable]:
    """Every non-constant tensor that is not an input of the graph or of a subgraph."""
    graphs = list(all_graphs(graph))
    inputs = {id(t) for g in graphs for t in g.inputs}
    return [t for g in graphs for t in tensor_map(g).values()
            if isinstance(t, gs.Variable) and id(t) not in inputs]


def proto_dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    """A dim of an inferred shape as graphfix holds it: its value, its name, or None."""
    if d.HasField("dim_value"):
        return d.dim_value
    return d.dim_param or None


def reshape_dims(shape: list[Dim], target: list[Dim], allowzero: bool) -> list[Dim]:
    """Reshape's output dims, as far as its input's `shape` and its `target` entries
    (ints, names, None) say: a 0 entry copies the input's dim (unless `allowzero`; None
    past its rank), a single -1 is what the input's elements leave when the input is
    static and every other entry a known number, any other negative entry is None."""
    dims: list[Dim] = []
    for i, t in enumerate(target):
        if isinstance(t, int) and t == 0 and not allowzero:
            dims.append(shape[i] if i < len(shape) else None)
        else:
            dims.append(None if isinstance(t, int) and t < 0 else t)
    others = [d for t, d in zip(target, dims, strict=True) if t != -1]
    if target.count(-1) == 1 and static_count(shape) == len(shape) and (
            static_count(others) == len(others)):
        total, rest = math.prod(shape), math.prod(others)
        if rest and total % rest == 0:
            dims[target.index(-1)] = total // rest
    return dims


def static_count(shape: list[Dim] | None) -> int:
    """-1 for an unknown shape, else how many dims are known numbers (rank counts too)."""
    if shape is None:
        return -1
    return sum(isinstance(d, int) and d >= 0 for d in shape)


def contradicted_types(model: onnx.ModelProto) -> tuple[str, ...]:
    """The main graph's value_info entries whose element type is not the one ONNX's
    inference computes from the nodes (inferred without any value_info), in order.
    `model` is a weightless skeleton (`graph.skeleton`): it is copied. A
    converter that retyped nodes and kept their old declarations leaves such (a float16
    Identity declared float): onnxruntime then refuses to load the model."""
    declared = [(vi.name, vi.type.tensor_type.elem_type) for vi in model.graph.value_info
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type]
    if not declared:
        return ()
    bare = onnx.ModelProto()
    bare.CopyFrom(model)  # a skeleton: no weights to copy
    del bare.graph.value_info[:]
    try:
        inferred = proto_infer_shapes(bare)
    except Exception:  # noqa: BLE001 - onnx raises several types; nothing can be told
        return ()
    computed = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
                if vi.type.HasField("tensor_type")}
    return tuple(name for name, elem in declared
                 if computed.get(name, elem) not in (elem, 0))
