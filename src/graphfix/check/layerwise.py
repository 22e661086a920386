"""Layer-wise comparison: every tensor two models share, and the node to look at.

    report = compare_layerwise(ref, new, [feeds0, feeds1], renamed=..., removed=...)
    report.first_divergence   # the first tensor out of tolerance, topological order
    report.origins[0]         # the node that amplifies error most (see `_origins`)

Both models run in onnxruntime (graph optimizations off, `runtime.session`) on the
same inputs, one run per sample (`feeds[i]` is sample i, a feed dict of any batch
size). Every main-graph tensor of the reference (graph inputs and node outputs, any
dtype) is compared with the candidate's tensor of the same name, or of the name
`renamed` gives it (what `graphfix run` records); a tensor a pass merged away is
shown as "merged by <pass>" (from `removed`), not as missing. Q/DQ models keep the
float tensor names, so FP32 vs INT8 matches the same way (the DequantizeLinear
outputs exist only in the candidate and are not listed).

Modes: "strict" (FP32 vs rewritten FP32): ok per the dtype's tolerance in
`runtime.tolerances`; "sqnr" (FP32 vs Q/DQ INT8): ok when SQNR >= `sqnr_threshold` dB;
"auto": sqnr when the candidate has QuantizeLinear/DequantizeLinear and the reference
has none. The numbers are defined in `_measure`, the origins in `_origins`.

TensorRT: with `engine` (`check.engine`) the candidate runs in a TensorRT engine
instead of onnxruntime. The tensors compared are those the engine keeps (fused ones
read "fused by TensorRT"). Strict mode then uses `tolerances.ENGINE_FP32`, and auto
mode picks sqnr for reduced-precision or prebuilt engines.

Subgraphs: If branches are inlined per sample group (`_inline`), so a tensor inside
a branch is compared and labelled with its path (`If 'sel'.then_branch > Conv 'c'`).
Loop and Scan bodies are not compared; a note says how many tensors that leaves out.
Memory: see `_runs` (chunks under `memory_budget`, results merged). The library
never prints: `progress(phase, done, total)` is called per sample of each run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import onnx

from graphfix.check._inline import (
    Producer,
    hidden_tensors,
    prepare,
    split_by_branches,
    topo_order,
)
from graphfix.check._origins import ERROR_FLOOR, MIN_AMPLIFICATION, Origin, find_origins
from graphfix.check._runs import Plan, SessionCache, plan_group, run_plan
from graphfix.check._ties import mark_ill_conditioned, mark_random
from graphfix.check._widen import CandidateConvs, widen_by_operands
from graphfix.check.status import UNJUDGED, TensorStatus
from graphfix.errors import GraphfixError
from graphfix.graph.protos import graph_protos, walk_protos
from graphfix.runtime import references
from graphfix.runtime.measure import Tally
from graphfix.runtime.tolerances import ENGINE_FP32, Tolerance
from graphfix.runtime.work import check_work

if TYPE_CHECKING:
    from graphfix.check.engine import TrtEngine

__all__ = ["ERROR_FLOOR", "MIN_AMPLIFICATION", "SCHEMA", "LayerwiseReport", "Origin",
           "TensorResult", "compare_layerwise"]

SCHEMA = "graphfix.check/2"  # /2: status is a TensorStatus value, with detail
MODES = ("auto", "strict", "sqnr")
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
GRAPH_INPUT = "graph input"
_NONE: Mapping[str, str] = MappingProxyType({})


@dataclass
class TensorResult:
    """One reference tensor: how it compares (numbers: worst over samples, SQNR the
    minimum; `ok` None when not compared)."""

    name: str
    candidate: str | None  # the candidate's name for it; None when not compared
    node: str  # label of the producing reference node; "graph input" for inputs
    op: str  # "" for graph inputs
    dtype: str
    status: TensorStatus
    max_abs: float | None
    max_rel: float | None
    sqnr_db: float | None
    worst_sample: int | None
    ok: bool | None
    order: int  # position in the reference's topological order (index in report.tensors)
    node_key: str = ""  # the node's name as --exclude-nodes takes it ("" for inputs)
    quantized: bool = False  # sqnr mode: the candidate computes it from DequantizeLinear outputs
    detail: str = ""  # MERGED: the pass; NOT_COMPARABLE: why

    def describe_status(self) -> str:
        return self.status.describe(self.detail)


@dataclass
class LayerwiseReport:
    mode: str
    samples: int
    tensors: list[TensorResult]
    first_divergence: TensorResult | None
    origins: list[Origin]
    outputs_ok: bool
    chunks: int
    notes: list[str] = field(default_factory=list)
    sqnr_threshold: float = 20.0
    runtime: str = "onnxruntime"  # where the candidate ran: "onnxruntime" | "tensorrt"
    # calibrate --exclude-nodes names, sqnr mode (`_exclude_names`)
    exclude_nodes: list[str] = field(default_factory=list)
    doctor: dict | None = None  # graphfix.doctor/1 of the candidate (check --trt)
    # graph outputs of the reference neither compared nor judged ill-conditioned (only in
    # the reference, or not comparable): the check cannot say the models agree
    uncompared_outputs: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """The check's verdict: strict mode, every compared tensor agrees and every graph
        output was compared (or is ill-conditioned on the samples); sqnr mode (a
        quantized candidate is expected to differ), every graph output meets the SQNR
        threshold."""
        if self.mode == "sqnr":
            return self.outputs_ok
        return self.first_divergence is None and not self.uncompared_outputs

    def tensor(self, name: str) -> TensorResult:
        """The result for reference tensor `name` (KeyError when it has none)."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def sensitivity(self, top: int = 10) -> list[TensorResult]:
        """The quantized layers with the lowest SQNR, lowest first (sqnr mode; empty in
        strict mode, where nothing is quantized)."""
        rows = [t for t in self.tensors if t.quantized and t.sqnr_db is not None]
        return sorted(rows, key=lambda t: (t.sqnr_db, t.order))[:top]

    def to_json(self) -> dict:
        """Schema "graphfix.check/2". Non-finite numbers are the strings "inf", "-inf",
        "nan" (an exact tensor has sqnr_db "inf"); null means "not compared"."""
        first = self.first_divergence
        return _jsonable({
            "schema": SCHEMA,
            "mode": self.mode,
            "runtime": self.runtime,
            "samples": self.samples,
            "chunks": self.chunks,
            "sqnr_threshold": self.sqnr_threshold,
            "outputs_ok": self.outputs_ok,
            "passed": self.passed,
            "first_divergence": asdict(first) if first else None,
            "origins": [asdict(o) for o in self.origins],
            "sensitivity": [t.name for t in self.sensitivity()] if self.mode == "sqnr" else [],
            "exclude_nodes": list(self.exclude_nodes),
            "tensors": [asdict(t) for t in self.tensors],
            "notes": list(self.notes),
            **({"doctor": self.doctor} if self.doctor is not None else {}),
        })


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def resolve_mode(mode: str, reference: onnx.ModelProto, candidate: onnx.ModelProto,
                 engine: TrtEngine | None = None) -> str:
    """"auto" -> "sqnr" when only the candidate has Q/DQ, or the candidate is an engine
    of reduced or unknown precision (`TrtEngine.sqnr_by_default`); else "strict"."""
    if mode not in MODES:
        raise GraphfixError(f"Unknown comparison mode '{mode}'",
                            f"the modes are {', '.join(MODES)}",
                            "use strict for rewrites, sqnr for a quantized candidate, or auto")
    if mode != "auto":
        return mode
    if engine is not None and engine.sqnr_by_default:
        return "sqnr"
    return "sqnr" if has_qdq(candidate) and not has_qdq(reference) else "strict"


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether any graph of the model has QuantizeLinear or DequantizeLinear."""
    return any(n.op_type in _QDQ for n, _, _ in walk_protos(model.graph))


def tensor_names(model: onnx.ModelProto) -> list[str]:
    """The main graph's inputs and node outputs, in graph order: what an engine is asked
    to expose. Tensors inside If/Loop bodies are left out: TensorRT forbids marking
    them as outputs (NvInfer.h, markOutput), and marking them as debug tensors is
    untried."""
    inits = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in inits]
    names += [o for n in model.graph.node for o in n.output if o]
    return list(dict.fromkeys(names))


def compare_layerwise(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    renamed: Mapping[str, str] = _NONE,
    removed: Mapping[str, str] = _NONE,
    mode: str = "auto",
    sqnr_threshold: float = 20.0,
    memory_budget: int | None = None,
    providers: Sequence[str] = ("cpu",),
    progress: Callable[[str, int, int], None] | None = None,
    min_amplification: float = MIN_AMPLIFICATION,
    tolerance: Tolerance | None = None,
    engine: TrtEngine | None = None,
) -> LayerwiseReport:
    """Compare every tensor the two models share on every sample (module docstring).

    `feeds[i]` is sample i (a single feed dict counts as one sample). `renamed` maps
    reference names to candidate names; `removed` maps reference names to the pass
    that merged them away. `memory_budget` (bytes) bounds the activations one
    onnxruntime run exposes. `min_amplification` is the origin rule's factor
    (`_origins`). `tolerance` replaces the per-dtype tolerance of float tensors in strict
    mode (`graphfix check --atol/--rtol`). `engine` (`check.engine.open_engine`): the
    candidate runs in that TensorRT engine, `candidate` only names its tensors; the
    caller closes it. Raises GraphfixError when there is no sample, a model input has
    no data, or onnxruntime cannot run a model.
    """
    samples = [dict(feeds)] if isinstance(feeds, Mapping) else [dict(f) for f in feeds]
    if not samples:
        raise GraphfixError("No inputs to compare the models on", "the feeds are empty",
                            "give at least one feed dict {input name: array}")
    given_candidate = candidate
    check_work(reference, label="REFERENCE")  # before any run: a Loop that never ends
    if engine is None:
        check_work(candidate, label="CANDIDATE")
    mode = resolve_mode(mode, reference, candidate, engine)
    if engine is not None and mode == "strict" and tolerance is None:
        tolerance = ENGINE_FP32
    reference, stand_ins = _stand_ins(reference, "REFERENCE")
    if engine is None:  # a TensorRT engine runs its plugins itself
        candidate, more = _stand_ins(candidate, "CANDIDATE")
        stand_ins += more
    cache = SessionCache(samples, renamed, providers)
    if progress and any(n.op_type == "If" for n in (*reference.graph.node,
                                                    *candidate.graph.node)):
        progress("reading If conditions", 0, len(samples))
    groups = split_by_branches(prepare(reference), prepare(candidate),
                               list(range(len(samples))), cache)
    if progress and (len(groups) > 1 or groups[0].reference.model is not reference):
        progress("reading If conditions", len(samples), len(samples))
    cache.close()
    plans = [plan_group(g, samples, renamed, removed, memory_budget, engine) for g in groups]
    total = sum(len(p.chunks) for p in plans)
    tallies: dict[str, Tally] = {}
    done = 0
    for plan in plans:
        run_plan(plan, samples, tallies, renamed=renamed, mode=mode, threshold=sqnr_threshold,
                 tolerance=tolerance, providers=providers, progress=progress,
                 step=(done, total), engine=engine)
        done += len(plan.chunks)
    producers = _merged_producers(plans)
    if mode == "strict":
        widen_by_operands(tallies, producers,
                          CandidateConvs(given_candidate if engine is None else None))
    results = _results(reference, plans, tallies, producers, _quantized(candidate))
    random = mark_random(reference, results)
    pairs = [(g.reference.model, g.candidate.model, g.samples) for g in groups
             ] if engine is None else []  # an engine's candidate has no nodes to match
    unjudged = (mark_ill_conditioned(reference, results, tallies, producers, pairs)
                if mode == "strict" else 0)
    first = next((t for t in results if t.ok is False), None)
    origins = find_origins(results, tallies, producers, min_amplification)
    outputs = {t.name: t for t in results}
    outputs_ok = all(outputs[o.name].ok is True for o in reference.graph.output
                     if o.name in outputs)
    notes = _notes(reference, renamed, plans)
    if stand_ins:
        notes.append("reference forms ran in place of nodes onnxruntime cannot run "
                     "(docs/references.md): " + "; ".join(stand_ins))
    if engine is not None:
        notes[:0] = [n for n in engine.notes if n not in notes]
    if unjudged:
        notes.append(f"{unjudged} tensor(s) not judged: they follow a selection that chose "
                     "differently among values tied to within rounding (status "
                     f"'{TensorStatus.ILL_CONDITIONED.value}'); pass --data with real inputs "
                     "to judge them")
    if random:
        from graphfix.runtime.randomness import FIX

        notes.append(f"{random} tensor(s) not judged: they follow a Dropout in training mode, "
                     "whose mask onnxruntime draws anew on every run (status "
                     f"'{TensorStatus.RANDOM.value}'); {FIX}")
    if first is not None and not origins:
        notes.append(f"no node amplifies the error {min_amplification:g}x or more: it grows "
                     "gradually; start at the first divergence, "
                     f"{first.node} ({first.name})")
    uncompared = [outputs[o.name] for o in reference.graph.output
                  if o.name in outputs and outputs[o.name].ok is None
                  and outputs[o.name].status not in UNJUDGED]
    if uncompared:
        notes.append("graph output(s) not compared: " + ", ".join(
            f"'{t.name}' ({t.describe_status()})" for t in uncompared)
            + "; a check that does not compare the model's outputs cannot say the models "
            "agree: give the candidate the reference's output names and shapes (graphfix "
            "run keeps them)")
    report = LayerwiseReport(mode, len(samples), results, first, origins, outputs_ok, total,
                             notes, sqnr_threshold,
                             "tensorrt" if engine is not None else "onnxruntime")
    report.uncompared_outputs = [t.name for t in uncompared]
    report.exclude_nodes = _exclude_names(report, given_candidate)
    return report


def _exclude_names(report: LayerwiseReport, candidate: onnx.ModelProto,
                   top: int = 5) -> list[str]:
    """calibrate --exclude-nodes names (sqnr mode; none in strict mode), as the candidate
    names its nodes (calibrate plans on the model after fold-bn, whose node names a Q/DQ
    candidate keeps, while a BatchNorm of the reference is gone): the producers of the
    quantized origins in rank order, then of the failing lowest-SQNR layers."""
    if report.mode != "sqnr":
        return []
    producers = {o: n.name or o for n in candidate.graph.node for o in n.output if o}
    by_name = {t.name: t for t in report.tensors}
    tensors = [by_name[o.name] for o in report.origins if by_name[o.name].quantized]
    tensors += [t for t in report.sensitivity(len(report.tensors)) if t.ok is False]
    names = [producers.get(t.candidate or t.name) for t in tensors]
    return list(dict.fromkeys(n for n in names if n))[:top]


def _merged_producers(plans: Sequence[Plan]) -> dict[str, Producer]:
    producers: dict[str, Producer] = {}
    for plan in plans:
        for name, info in plan.group.reference.producers.items():
            producers.setdefault(name, info)
    return producers


def _quantized(candidate: onnx.ModelProto) -> set[str]:
    """Candidate tensors computed by a node that reads a DequantizeLinear output."""
    dq = {o for n in candidate.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {o for n in candidate.graph.node if n.op_type not in _QDQ
            and any(i in dq for i in n.input) for o in n.output if o}


def _results(reference: onnx.ModelProto, plans: Sequence[Plan], tallies: Mapping[str, Tally],
             producers: Mapping[str, Producer], quantized: set[str]) -> list[TensorResult]:
    """One TensorResult per reference tensor of any group, in topological order."""
    order = topo_order(reference)
    names: dict[str, Plan] = {}
    for plan in plans:
        for t in plan.tensors:
            names.setdefault(t, plan)
    ranked = sorted(names, key=lambda t: (order.get(t, len(order)), t))
    results = []
    for index, name in enumerate(ranked):
        plan = next((p for p in plans if name in p.status), names[name])
        tally = tallies.get(name)
        producer = producers.get(name)
        result = TensorResult(
            name=name, candidate=None,
            node=producer.label if producer else GRAPH_INPUT,
            op=producer.op if producer else "",
            dtype=(tally.dtype if tally and tally.dtype else plan.dtypes.get(name, "")),
            status=plan.status.get(name, (TensorStatus.COMPARED, ""))[0],
            detail=plan.status.get(name, (TensorStatus.COMPARED, ""))[1],
            max_abs=None, max_rel=None, sqnr_db=None, worst_sample=None, ok=None,
            order=index, node_key=producer.key if producer else "",
        )
        if tally is not None and tally.compared:
            result.candidate = tally.candidate
            result.status, result.detail = TensorStatus.COMPARED, ""
            result.max_abs, result.max_rel = tally.max_abs, tally.max_rel
            result.sqnr_db, result.worst_sample, result.ok = tally.sqnr_db, tally.worst, tally.ok
            result.quantized = tally.candidate in quantized
        elif tally is not None and tally.why:
            result.status, result.detail = TensorStatus.NOT_COMPARABLE, tally.why
        results.append(result)
    return results


def _stand_ins(model: onnx.ModelProto, which: str) -> tuple[onnx.ModelProto, list[str]]:
    """The model with reference forms for the nodes onnxruntime cannot run (standard-ONNX
    decompositions write the node's own output names, so tensors still line up), and
    what was substituted. GraphfixError for a node without a usable reference."""
    if not references.needs_reference(model):
        return model, []
    sub = references.substitute(model)
    if sub.not_checkable:
        raise GraphfixError(
            f"{which} cannot be compared: not checkable: {', '.join(sub.not_checkable)}",
            "onnxruntime cannot run these nodes and graphfix has no reference form for them",
            "register a reference (docs/references.md), or compare a model without them")
    if sub.kernels:
        labels = ", ".join(sorted({k.node.op_type for k in sub.kernels}))
        raise GraphfixError(
            f"{which} cannot be compared layer by layer: {labels} runs as a numpy kernel",
            "graphfix check reads every tensor from one onnxruntime session, and a numpy "
            "kernel runs outside it",
            "compare the outputs with graphfix run's check, or register a standard-ONNX "
            "decomposition (docs/references.md)")
    return sub.model, [f"{which} {r}" for r in sub.replaced]


def _notes(reference: onnx.ModelProto, renamed: Mapping[str, str],
           plans: Sequence[Plan]) -> list[str]:
    notes: list[str] = []
    hidden = hidden_tensors(reference)
    if hidden:
        notes.append(f"{hidden} tensor{'s' * (hidden != 1)} inside Loop/Scan bodies "
                     "are not compared: an ONNX graph output can only name a main-graph "
                     "tensor, and a body runs a varying number of times")
    if len(plans) > 1:
        notes.append(f"the samples took {len(plans)} different combinations of If branches; "
                     "each was inlined and compared on its own samples")
    known = {t for p in plans for t in p.tensors}
    unknown = sorted(set(renamed) - known - _all_names(reference))
    if unknown:
        shown = ", ".join(f"'{t}'" for t in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        notes.append(f"{len(unknown)} renamed tensor(s) are not tensors of the reference: "
                     f"{shown}")
    for plan in plans:
        notes.extend(n for n in plan.notes if n not in notes)
    return notes


def _all_names(model: onnx.ModelProto) -> set[str]:
    """Every tensor name of the model, subgraphs and weights included."""
    names = {vi.name for vi in model.graph.input}
    for graph in graph_protos(model.graph):
        names |= {t.name for t in graph.initializer}
        names |= {o for n in graph.node for o in n.output if o}
    return names
