"""The Q/DQ model TensorRT accepts: which tensors to calibrate (`plan`), and the model with
QuantizeLinear/DequantizeLinear from their ranges (`quantize`).

    plan(model)                    -> QuantPlan (activations to calibrate, weights, groups)
    quantize(model, plan, amaxes)  -> model with Q/DQ

The form is what TensorRT takes (../shared/trt/calibration_notes.md (d), parser rules):
symmetric INT8, zero points of 0 (INT8 initializers, always given: TensorRT 8.6 requires
three inputs), activations per tensor, weights per output channel. Placement (which edges,
which weights, which scales are shared) is in `graphfix.calibration._placement`, with its
sources.

Numbers:

- activation: scale = amax / 127 (float32), one per tensor; a shared group (`plan.shared`)
  gets the max of its members' amaxes.
- weight: stored pre-quantized, an INT8 initializer `<W>_quantized` read by a
  DequantizeLinear (the smaller of the two forms ModelOpt and TensorRT accept; ModelOpt's
  default keeps a float weight behind a Q/DQ pair). Per channel: scale_c = max|W_c| / 127
  over the other axes, q = clip(round_half_to_even(W / scale_c), -127, 127). With
  `per_channel=False`, one scale for the whole weight.
- amax 0 (a tensor that was zero on every calibration sample, an all-zero weight channel)
  gets scale `MIN_SCALE` (1e-12): TensorRT requires every scale > 0, and a tensor that
  calibrated to zero stays (nearly) zero.

Opset: per-axis DequantizeLinear needs opset 13 (10 for per-tensor only). A lower model
opset is refused with the `opset` pass to run; `quantize(..., opset=N)` converts the model
to opset N first with that pass (onnx.version_converter).

Names, for tensor `t`: nodes `t_QuantizeLinear`, `t_DequantizeLinear`, tensors
`t_QuantizeLinear_Output`, `t_DequantizeLinear_Output`, initializers `t_scale`,
`t_zero_point` (`W_quantized` for a weight); a clash gets a `_1`, `_2`... suffix.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.calibration._placement import WEIGHTED_OPS, node_key, place
from graphfix.errors import GraphfixError
from graphfix.graph import constant_value, fresh_name, is_onnx, opset_of, to_graph, to_model
from graphfix.graph.dtypes import float_dtype
from graphfix.graph.protos import proto_label, walk_protos

__all__ = ["MIN_SCALE", "QuantPlan", "plan", "quantize", "quantize_weight",
           "require_activations"]

MIN_SCALE = 1e-12
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                      "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"})
_FOLD_BN = "graphfix run model.onnx --passes fold-bn"


@dataclass(frozen=True)
class QuantPlan:
    """What `quantize` will do to a model (built by `plan`).

    - `activations`: tensors that get one Q/DQ pair each; each needs an amax.
    - `weights`: (weight tensor, reader node key, channel axis), quantized per channel.
    - `shared`: groups of activations that get one scale, the max of their amaxes. Rule:
      a Concat whose output is quantized (directly or after copy ops) groups it with its
      quantized inputs, so TensorRT can run the Concat in INT8 (see `_placement`, rule 6).
    - `skipped`: (node label, reason) for weighted ops, residual Adds and pools left in
      float (excluded, or not quantizable), for the report.
    - `edges`: (tensor, reader node key, input index): the inputs that read the DQ output.
      Empty means every reader of each activation does.

    A node key is the node's name, or its first output's name when it has none.
    """

    activations: tuple[str, ...]
    weights: tuple[tuple[str, str, int], ...]
    shared: tuple[tuple[str, ...], ...]
    skipped: tuple[tuple[str, str], ...]
    edges: tuple[tuple[str, str, int], ...] = ()

    def without(self, uncalibrated: Mapping[str, str], model: onnx.ModelProto) -> QuantPlan:
        """This plan less the activations in `uncalibrated` (name -> why the statistics
        pass could not measure it: a type shape inference cannot find, behind an op
        ONNX does not know): every node that reads one of them in INT8 stays float, its
        weight too, and `skipped` says why."""
        gone = {t: why for t, why in uncalibrated.items() if t in self.activations}
        if not gone:
            return self
        edges = self.edges or tuple(
            (t, key, -1) for t, keys in self.reader_keys(model).items() for key in keys)
        floats = {key: t for t, key, _ in edges if t in gone}
        ops = {n.name or (n.output[0] if n.output else ""): n.op_type for n in model.graph.node}
        kept = tuple(e for e in edges if e[1] not in floats)
        activations = tuple(dict.fromkeys(t for t, _, _ in kept))
        shared = tuple(group for group in (tuple(t for t in g if t in activations)
                                           for g in self.shared) if len(group) > 1)
        skipped = self.skipped + tuple(
            (f"{ops.get(key, 'node')} '{key}'", f"its input '{t}' was not calibrated: {gone[t]}")
            for key, t in floats.items())
        return QuantPlan(activations, tuple(w for w in self.weights if w[1] not in floats),
                         shared, skipped, kept if self.edges else ())

    def reader_keys(self, model: onnx.ModelProto) -> dict[str, list[str]]:
        """Per activation, the keys of the nodes that read its DQ output (what
        --exclude-nodes takes): the plan's edges, or every reader when it has none."""
        out: dict[str, list[str]] = {}
        if self.edges:
            for tensor, key, _ in self.edges:
                out.setdefault(tensor, []).append(key)
        else:
            wanted = set(self.activations)
            for node in model.graph.node:
                key = node.name or (node.output[0] if node.output else "")  # as node_key
                for name in node.input:
                    if name in wanted:
                        out.setdefault(name, []).append(key)
        return {t: list(dict.fromkeys(keys)) for t, keys in out.items()}


def plan(model: onnx.ModelProto, *, exclude_nodes: Sequence[str] = (),
         exclude_op_types: Sequence[str] = ()) -> QuantPlan:
    """The quantization plan for `model` (its main graph), placement as in `_placement`.

    Raises GraphfixError when the model already has Q/DQ or integer ops, when a
    BatchNormalization reads a quantized op's output (run fold-bn first), or when an
    excluded node name or op type does not exist (with the closest names).
    """
    graph = to_graph(model)
    graph.toposort()
    _refuse_quantized(model)
    names = _check_excluded_nodes(model, exclude_nodes)
    ops = _check_excluded_ops(model, exclude_op_types)
    placement = place(graph, names, ops)
    if placement.unfolded_bn:
        pairs = [f"{bn} after {op}" for bn, op in placement.unfolded_bn]
        raise GraphfixError(
            f"{len(pairs)} BatchNormalization node{'s' * (len(pairs) != 1)} still follow"
            f"{'s' * (len(pairs) == 1)} an op to quantize: {', '.join(pairs[:5])}"
            + (f" and {len(pairs) - 5} more" if len(pairs) > 5 else ""),
            "the weights must be quantized as TensorRT will run them, with the "
            "BatchNormalization folded in; calibrating around an unfolded one gives "
            "wrong scales",
            f"run `{_FOLD_BN}` first (or keep those ops in float with --exclude-nodes)",
        )
    skipped = list(placement.skipped) + _subgraph_skips(model)
    activations = tuple(dict.fromkeys(t for t, _, _ in placement.edges))
    return QuantPlan(activations, tuple(placement.weights), tuple(placement.shared),
                     tuple(skipped), tuple(placement.edges))


def require_activations(plan: QuantPlan, model: onnx.ModelProto) -> None:
    """Raise GraphfixError when `plan` (made from `model`) calibrates no tensor: its Q/DQ
    model would have no Q/DQ node at all. Says why: the model computes in float16 (or
    another non-float32 type), it has no weighted op in its main graph, or every one
    was skipped (the first reasons). Does nothing when some tensor is calibrated."""
    if plan.activations:
        return
    weighted = [n for n in to_graph(model).nodes if is_onnx(n, *WEIGHTED_OPS)]
    ops = "/".join(WEIGHTED_OPS)
    memo: dict = {}
    types = [float_dtype(n.inputs[1] if len(n.inputs) > 1 else n.inputs[0], memo)
             for n in weighted if n.inputs]
    other = [t for t in types if t is not None and t != np.float32]
    what = ("no tensor of the model can be calibrated: its INT8 model would have no "
            "QuantizeLinear/DequantizeLinear node")
    if other and len(other) == len(weighted):
        names = ", ".join(sorted({str(t) for t in other}))
        raise GraphfixError(
            what,
            f"the model computes in {names} (every one of its {len(weighted)} {ops} "
            f"nodes does), and graphfix calibrates FP32 models: it quantizes float32 weights "
            f"and measures the float32 activations they read",
            "give calibrate the FP32 model (export it again without converting it to "
            f"{names}); TensorRT can still run the layers left in float in FP16 when the "
            "engine is built with FP16 enabled",
        )
    if not weighted:
        inner = f" ({len(plan.skipped)} inside If/Loop/Scan bodies)" if plan.skipped else ""
        raise GraphfixError(
            what,
            f"its main graph has no {ops} node{inner}: graphfix puts Q/DQ on the inputs of "
            "those ops in the main graph (and of the residual Adds and average pools next "
            "to them)",
            "calibrate a model that has convolutions or matrix multiplications; TensorRT "
            "runs this one without INT8 calibration",
        )
    shown = "; ".join(f"{label}: {reason}" for label, reason in plan.skipped[:3])
    more = f"; and {len(plan.skipped) - 3} more" if len(plan.skipped) > 3 else ""
    raise GraphfixError(
        what, f"none of its {len(weighted)} {ops} nodes can be quantized: {shown}{more}",
        "fix what those reasons name (exclude fewer nodes with --exclude-nodes or "
        "--exclude-op-types; fold computed weights with `graphfix run model.onnx --passes "
        "fold-constants`)",
    )


def _refuse_quantized(model: onnx.ModelProto) -> None:
    found = sorted({n.op_type for n, _, _ in walk_protos(model.graph)} & _QDQ_OPS)
    if found:
        raise GraphfixError(
            f"the model is already quantized (it has {', '.join(found)})",
            "graphfix calibrate quantizes a float model",
            "give it the float model the quantized one was made from",
        )


def _check_excluded_nodes(model: onnx.ModelProto, wanted: Sequence[str]) -> set[str]:
    keys = {n.name or (n.output[0] if n.output else "") for n, _, _ in walk_protos(model.graph)}
    unknown = [name for name in wanted if name not in keys]
    if unknown:
        raise GraphfixError(
            f"--exclude-nodes names no node of the model: {_hints(unknown, keys)}",
            "nodes are named by their ONNX name, or their first output's name when unnamed",
            "copy the names from `graphfix doctor` or a model viewer",
        )
    return set(wanted)


def _check_excluded_ops(model: onnx.ModelProto, wanted: Sequence[str]) -> set[str]:
    present = {n.op_type for n, _, _ in walk_protos(model.graph)}
    unknown = [op for op in wanted if op not in present and not onnx.defs.has(op)]
    if unknown:
        raise GraphfixError(
            f"--exclude-op-types names no ONNX op type: "
            f"{_hints(unknown, present | set(WEIGHTED_OPS))}",
            "op types are spelled as in ONNX (Conv, MatMul, GlobalAveragePool)",
            f"pick from the model's op types: {', '.join(sorted(present))}",
        )
    return set(wanted)


def _hints(unknown: list[str], choices: set[str]) -> str:
    """'name' (did you mean 'a', 'b'?) for each unknown name, closest first."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(choices), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        parts.append(f"'{name}'{hint}")
    return ", ".join(parts)


def _subgraph_skips(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(proto_label(node, path), "inside a subgraph: graphfix quantizes the main graph "
             "only") for node, path, _ in walk_protos(model.graph)
            if path and node.op_type in WEIGHTED_OPS and node.domain in ("", "ai.onnx")]


def quantize(model: onnx.ModelProto, plan: QuantPlan, amaxes: Mapping[str, float], *,
             per_channel: bool = True, opset: int | None = None) -> onnx.ModelProto:
    """`model` with the Q/DQ of `plan`, activation scales from `amaxes` (module docstring).

    `model` is not changed. Raises GraphfixError when an activation has no finite amax
    >= 0, when the plan names tensors or nodes the model lacks, or when the opset is too
    low (see the module docstring for `opset`).
    """
    graph = to_graph(model)
    _ensure_opset(graph, 13 if per_channel else 10, opset)
    scales = _activation_scales(plan, amaxes)
    nodes = _nodes_by_key(graph)
    tensors = graph.tensors()
    taken = set(tensors) | {n.name for n in graph.nodes if n.name}
    for name, readers in _readers(plan, nodes, tensors).items():
        dq = _insert_pair(graph, tensors[name], scales[name], taken)
        for node, index in readers:
            node.inputs[index] = dq
    made: dict[tuple[str, int], gs.Variable] = {}
    for name, key, axis in plan.weights:
        node = nodes.get(key)
        if node is None or len(node.inputs) < 2 or node.inputs[1].name != name:
            raise _mismatch(f"weight '{name}' of node '{key}'")
        if (name, axis) not in made:
            made[(name, axis)] = _weight_dq(graph, node.inputs[1], axis, per_channel, taken)
        node.inputs[1] = made[(name, axis)]
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    out = to_model(graph, model)
    out.ir_version = max(out.ir_version, onnx.helper.find_min_ir_version_for(
        list(out.opset_import), ignore_unknown=True))
    return out


def _nodes_by_key(graph: gs.Graph) -> dict[str, gs.Node | None]:
    """Node key -> node; a key two nodes share maps to None (the plan cannot name them)."""
    nodes: dict[str, gs.Node | None] = {}
    for node in graph.nodes:
        key = node_key(node)
        nodes[key] = None if key in nodes else node
    return nodes


def _mismatch(what: str) -> GraphfixError:
    return GraphfixError(f"the quantization plan does not match the model: no {what}",
                         "a plan is made for one model, and names nodes by their (unique) "
                         "names",
                         "make the plan with graphfix.calibration.qdq.plan(model) from the "
                         "same model you quantize; give nodes that share a name unique names")


def _ensure_opset(graph: gs.Graph, needed: int, opset: int | None) -> None:
    """Convert to `opset` when given (the `opset` pass); else require `needed`."""
    current = opset_of(graph)
    if opset is not None:
        if opset < needed:
            raise GraphfixError(f"cannot quantize at opset {opset}",
                                f"per-axis DequantizeLinear needs opset {needed} or newer",
                                f"give opset={needed} or more")
        if opset != current:
            from graphfix.passes.base import PassContext
            from graphfix.passes.opset import Opset, OpsetOptions

            result = Opset(OpsetOptions(version=opset)).run(graph, PassContext())
            if not result.changed:
                raise GraphfixError(f"cannot convert the model from opset {current} to {opset}",
                                    "; ".join(str(n) for n in result.notes),
                                    "convert it yourself, or quantize at its own opset")
        return
    if current < needed:
        raise GraphfixError(
            f"the model is at opset {current}; Q/DQ needs opset {needed} or newer",
            "per-channel weight scales use DequantizeLinear's axis attribute (opset 13)",
            f"run `graphfix run model.onnx --passes opset{{version={max(needed, 13)}}}` "
            "first, or pass opset=13",
        )


def _activation_scales(plan: QuantPlan, amaxes: Mapping[str, float]) -> dict[str, float]:
    """Scale per activation: amax/127 (floored at MIN_SCALE), shared within a group."""
    missing = [t for t in plan.activations if t not in amaxes]
    if missing:
        raise GraphfixError(
            f"no amax for {len(missing)} of the {len(plan.activations)} tensors to quantize "
            f"(e.g. {', '.join(missing[:3])})",
            "every tensor in plan.activations gets a Q/DQ pair whose scale comes from its "
            "calibrated range",
            "calibrate all of plan.activations",
        )
    bad = [t for t in plan.activations
           if not (math.isfinite(float(amaxes[t])) and float(amaxes[t]) >= 0)]
    if bad:
        raise GraphfixError(f"amax of {', '.join(bad[:3])} is not a finite number >= 0",
                            f"got {', '.join(str(amaxes[t]) for t in bad[:3])}",
                            "check the calibration data for NaN or infinite values")
    amax = {t: float(amaxes[t]) for t in plan.activations}
    wanted = set(plan.activations)
    for group in plan.shared:
        members = [t for t in group if t in wanted]
        if members:
            top = max(amax[t] for t in members)
            amax.update(dict.fromkeys(members, top))
    return {t: max(a / 127.0, MIN_SCALE) for t, a in amax.items()}


def _readers(plan: QuantPlan, nodes: dict[str, gs.Node | None], tensors: dict[str, gs.Tensor]
             ) -> dict[str, list[tuple[gs.Node, int]]]:
    """(node, input index) per activation that reads its DQ output, checked against the model."""
    for name in plan.activations:
        if not isinstance(tensors.get(name), gs.Variable):
            raise _mismatch(f"activation tensor '{name}'")
    readers: dict[str, list[tuple[gs.Node, int]]] = {t: [] for t in plan.activations}
    if not plan.edges:
        for name in plan.activations:
            unique = {id(n): n for n in tensors[name].outputs}.values()
            readers[name] = [(n, i) for n in unique
                             for i, t in enumerate(n.inputs) if t is tensors[name]]
        return readers
    for name, key, index in plan.edges:
        node = nodes.get(key)
        if name not in readers or node is None or index >= len(node.inputs) \
                or node.inputs[index].name != name:
            raise _mismatch(f"input {index} '{name}' of node '{key}'")
        readers[name].append((node, index))
    return readers


def _constants(name: str, scale: np.ndarray, taken: set[str]) -> tuple[gs.Constant, gs.Constant]:
    """The scale (float32) and zero-point (INT8 zeros) initializers for tensor `name`."""
    scale_c = gs.Constant(fresh_name(f"{name}_scale", taken), scale.astype(np.float32))
    zero_c = gs.Constant(fresh_name(f"{name}_zero_point", taken),
                         np.zeros(scale.shape, dtype=np.int8))
    return scale_c, zero_c


def _insert_pair(graph: gs.Graph, tensor: gs.Tensor, scale: float, taken: set[str]
                 ) -> gs.Variable:
    """tensor -> QuantizeLinear -> DequantizeLinear; returns the DQ output (not yet read)."""
    name = tensor.name
    scale_c, zero_c = _constants(name, np.asarray(scale, dtype=np.float32), taken)
    q_out = gs.Variable(fresh_name(f"{name}_QuantizeLinear_Output", taken), np.int8,
                        tensor.shape)
    dq_out = gs.Variable(fresh_name(f"{name}_DequantizeLinear_Output", taken), np.float32,
                         tensor.shape)
    graph.nodes.append(gs.Node("QuantizeLinear", fresh_name(f"{name}_QuantizeLinear", taken),
                               inputs=[tensor, scale_c, zero_c], outputs=[q_out]))
    graph.nodes.append(gs.Node("DequantizeLinear",
                               fresh_name(f"{name}_DequantizeLinear", taken),
                               inputs=[q_out, scale_c, zero_c], outputs=[dq_out]))
    return dq_out


def quantize_weight(weight: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(INT8 values, float32 scales) of `weight`: per slice of `axis`, or one scale (None).

    scale = max|W| / 127 over the other axes (at least MIN_SCALE); values are
    round-half-to-even of W / scale, clipped to [-127, 127].
    """
    w = np.asarray(weight, dtype=np.float64)
    if axis is None:
        amax = np.asarray(np.max(np.abs(w)) if w.size else 0.0)
    else:
        others = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=others) if w.size else np.zeros(w.shape[axis])
    scale = np.asarray(np.maximum(amax / 127.0, MIN_SCALE), dtype=np.float32)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.astype(np.float64).reshape(shape)), -127, 127)
    return q.astype(np.int8), scale


def _weight_dq(graph: gs.Graph, weight: gs.Tensor, axis: int, per_channel: bool,
               taken: set[str]) -> gs.Variable:
    """INT8 initializer -> DequantizeLinear (per-axis on `axis` when per_channel)."""
    values = constant_value(weight)
    if values is None:
        raise _mismatch(f"constant weight '{weight.name}'")
    q, scale = quantize_weight(values, axis if per_channel else None)
    name = weight.name
    q_c = gs.Constant(fresh_name(f"{name}_quantized", taken), q)
    scale_c, zero_c = _constants(name, scale, taken)
    out = gs.Variable(fresh_name(f"{name}_DequantizeLinear_Output", taken), np.float32,
                      list(q.shape))
    attrs = {"axis": axis} if per_channel else {}
    graph.nodes.append(gs.Node("DequantizeLinear", fresh_name(f"{name}_DequantizeLinear", taken),
                               attrs=attrs, inputs=[q_c, scale_c, zero_c], outputs=[out]))
    return out
