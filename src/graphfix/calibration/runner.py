"""The calibration itself (under `graphfix.calibrate`, `calibration.command`): statistics
once, every requested method from them, each Q/DQ model compared with FP32 on held-apart
samples, bad clips found, and a recommendation.

    model --fold-bn--> FP32 --plan--> tensors --collect(data)--> stats
    stats --every method (methods.plain_ranges)--> amaxes --auto/--method--> chosen
    chosen --quantize--> Q/DQ model --compare(eval data, one FP32 run)--> agreement
    chosen vs every method's amax --clipping--> warnings

The statistics pass is shared by all methods (the expensive part); each method only
computes thresholds from the histograms and writes a model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphfix import provenance
from graphfix.calibration import clipping, methods, qdq, stats
from graphfix.calibration._placement import WEIGHT_FROM_CONSTANTS
from graphfix.calibration.evaluate import Agreement, compare_many
from graphfix.errors import GraphfixError

Progress = Callable[[str, int, int], None]
ACCURACY_MARGIN = 0.005  # recommendation: accuracies this close count as equal
SQNR_MARGIN_DB = 1.0  # and output SQNRs this close


@dataclass
class MethodOutcome:
    method: str
    amaxes: dict[str, float]
    model: onnx.ModelProto
    seconds: float
    agreement: Agreement | None = None
    chosen_by_tensor: dict[str, str] = field(default_factory=dict)  # auto / --per-tensor
    clips: list[clipping.Clip] = field(default_factory=list)

    @property
    def cache_algorithm(self) -> str:
        name = self.method if self.method in methods.names() else "auto"
        return methods.get(name).cache_algorithm

    def summary(self) -> dict[str, Any]:
        out = {"method": self.method, "seconds": round(self.seconds, 3),
               "clipped_tensors": len(self.clips)}
        if self.chosen_by_tensor:
            picked = list(self.chosen_by_tensor.values())
            out["chosen"] = {m: picked.count(m) for m in dict.fromkeys(picked)}
        if self.agreement is not None:
            out.update(self.agreement.to_json())
        return out


@dataclass
class CalibrationResult:
    fp32: onnx.ModelProto  # the model the statistics ran on (after fold-bn)
    plan: qdq.QuantPlan
    stats: dict[str, stats.TensorStats]
    outcomes: list[MethodOutcome]
    recommended: str
    stats_seconds: float
    notes: list[str] = field(default_factory=list)
    requested: tuple[str, ...] = ()  # the methods asked for (outcomes may add alternates)

    def outcome(self, method: str | None = None) -> MethodOutcome:
        wanted = method or self.recommended
        return next(o for o in self.outcomes if o.method == wanted)

    def ranges_json(self) -> dict[str, Any]:
        """Per tensor: amax of every method, and the statistics behind them."""
        return {
            "schema": "graphfix.ranges/2",
            "recommended": self.recommended,
            "tensors": {
                name: {"min": s.min, "max": s.max, "amax_observed": s.amax,
                       "amax": {o.method: o.amaxes.get(name) for o in self.outcomes},
                       "chosen": {o.method: o.chosen_by_tensor[name] for o in self.outcomes
                                  if name in o.chosen_by_tensor}}
                for name, s in self.stats.items()
            },
            "methods": [o.summary() for o in self.outcomes],
        }


@dataclass(frozen=True)
class Request:
    """What to compute, checked before any work: method names (`methods.parse`),
    option values per method (`methods.options_for`), and the --per-tensor choice."""

    methods: tuple[str, ...]
    options: dict[str, dict[str, float]]
    per_tensor: bool = False

    @classmethod
    def make(cls, names: Sequence[str] | str = (methods.DEFAULT,),
             values: Mapping[str, float] | None = None, per_tensor: bool = False) -> Request:
        parsed = methods.parse(names if isinstance(names, str) else ",".join(names))
        request = cls(parsed, methods.options_for(values or {}), per_tensor)
        if per_tensor and len(request.choices()) < 2:
            raise GraphfixError(
                f"--per-tensor has nothing to choose from with --method {','.join(parsed)}",
                "it picks, per tensor, among two or more methods",
                "list several (e.g. --method entropy,percentile), or use --method auto",
            )
        return request

    def choices(self) -> tuple[str, ...]:
        """--per-tensor's choices: the plain methods asked for (auto's, for auto/all)."""
        plain = tuple(m for m in self.methods if methods.get(m).amax is not None)
        return methods.AUTO_CHOICES if "auto" in self.methods else plain

    def labels(self) -> tuple[str, ...]:
        """One outcome per label: the methods, or the single per-tensor choice."""
        if not self.per_tensor:
            return self.methods
        choices = self.choices()
        return ("auto",) if choices == methods.AUTO_CHOICES else \
            (f"per-tensor({','.join(choices)})",)

    @property
    def exact(self) -> bool:
        """Whether the statistics need the exact two-pass histogram (entropy asked for)."""
        return any(methods.get(m).exact_histogram for m in self.methods)


QDQ_OPSET = 13  # per-axis DequantizeLinear (per-channel weight scales)


def prepare(model: onnx.ModelProto, fold_bn: bool = True) -> tuple[onnx.ModelProto, list[str]]:
    """The FP32 model calibration runs on: BatchNormalization folded, and the model moved
    to opset 13 when older (per-channel Q/DQ needs it), by graphfix's own passes.

    These run without graphfix run's numerical check (the data's shapes are not known
    here); the comparison of every method against this FP32 model shows what they did.
    """
    passes = []
    if fold_bn and any(n.op_type == "BatchNormalization" for n in model.graph.node):
        passes.append("fold-bn")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset and opset < QDQ_OPSET:
        passes.append(f"opset{{version={QDQ_OPSET}}}")
    if not passes:
        return model, []
    from graphfix.api import run

    result = run(model, passes=",".join(passes), check=False)
    return result.model, [f"{r.spec}: {r.did()}" for r in result.report.passes]


def planned(model: onnx.ModelProto, fold_bn: bool = True, exclude_nodes: Sequence[str] = (),
            exclude_op_types: Sequence[str] = ()
            ) -> tuple[onnx.ModelProto, list[str], qdq.QuantPlan]:
    """`prepare`d model, its notes and its quantization plan. A weighted op whose weight
    is computed from constants (torch's default exporter writes a tied embedding's
    Transpose as GPT-2's lm_head weight) would stay float: such weights are folded first
    (`fold-constants`, its size limit raised to twice the largest initializer, so a
    Transpose or a float16 Cast of any weight folds), and the model is planned again."""
    fp32, notes = prepare(model, fold_bn)
    plan = qdq.plan(fp32, exclude_nodes=exclude_nodes, exclude_op_types=exclude_op_types)
    if not any(why == WEIGHT_FROM_CONSTANTS for _, why in plan.skipped):
        return fp32, notes, plan
    from graphfix.api import run

    largest = max((_tensor_bytes(t) for t in fp32.graph.initializer), default=0)
    spec = f"fold-constants{{size-threshold={max(2 * largest, 16 << 20)}}}"
    result = run(fp32, passes=spec, check=False)
    notes += [f"{r.spec}: {r.did()}" for r in result.report.passes]
    fp32 = result.model
    return fp32, notes, qdq.plan(fp32, exclude_nodes=exclude_nodes,
                                 exclude_op_types=exclude_op_types)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of an initializer's values (its shape times its element size)."""
    count = math.prod(tensor.dims)
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize \
        if tensor.data_type not in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) else 0


def calibrate(
    model: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]],
    request: Request | Sequence[str] = (methods.DEFAULT,),
    *,
    eval_data: Iterable[dict[str, np.ndarray]] | None = None,
    labels: np.ndarray | None = None,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    bins: int = 2048,
    memory_budget: int | None = None,
    fold_bn: bool = True,
    every_tensor: bool = False,
    providers: Sequence[str] = ("cpu",),
    progress: Progress | None = None,
) -> CalibrationResult:
    """Calibrate `model` on `data` with each requested method (see the module docstring).

    `request` is a `Request` or method names. With an evaluation set and `auto` as the
    only method, the plain methods are evaluated too, as alternates that confirm auto's
    choice or replace it (`_recommend`).
    `every_tensor` also measures every float tensor of the main graph (its inputs and
    node outputs), not only the ones the Q/DQ model quantizes: what a legacy TensorRT
    calibration cache holds, since TensorRT may ask for any tensor of its network.
    """
    if not isinstance(request, Request):
        request = Request.make(request)
    fp32, notes, plan = planned(model, fold_bn, exclude_nodes, exclude_op_types)
    qdq.require_activations(plan, fp32)  # before the statistics pass: nothing to quantize
    tensors = list(plan.activations)
    if every_tensor:
        named = [i.name for i in fp32.graph.input] + [o for n in fp32.graph.node
                                                      for o in n.output if o]
        tensors += [t for t in dict.fromkeys(named) if t not in set(tensors)]
    start = time.perf_counter()
    collected = stats.collect(fp32, tensors, data, bins=bins, exact=request.exact,
                              memory_budget=memory_budget, providers=providers,
                              progress=progress)
    stats_seconds = time.perf_counter() - start
    missing = {t: collected.skipped.get(t, "no statistics") for t in plan.activations
               if t not in collected}
    if missing:  # an ORT-optimized model's SkipLayerNormalization output has no known type
        plan = plan.without(missing, fp32)
        qdq.require_activations(plan, fp32)
    notes += [collected.summary(), *collected.notes]
    notes += [f"not quantized: {where}: {why}" for where, why in plan.skipped]
    plain = methods.plain_ranges(collected, request.options)
    labels_wanted = list(request.labels())
    if eval_data is not None and labels_wanted == ["auto"]:
        labels_wanted += list(methods.AUTO_CHOICES)  # alternates, to confirm auto
    readers = plan.reader_keys(fp32)
    quantized = {t: collected[t] for t in plan.activations if t in collected}
    outcomes = []
    for label in labels_wanted:
        t0 = time.perf_counter()
        if label in plain:
            chosen = plain[label]
        else:
            chosen = methods.choose(collected, plain, request.choices(), label)
        q = qdq.quantize(fp32, plan, chosen.amaxes)
        provenance.attach(q, *provenance.read(fp32))  # fold-bn's merges, for check
        clips = clipping.find(quantized, chosen, plain, readers)
        outcomes.append(MethodOutcome(label, chosen.amaxes, q, time.perf_counter() - t0,
                                      chosen_by_tensor=chosen.chosen, clips=clips))
    if eval_data is not None:
        agreements = compare_many(fp32, {o.method: o.model for o in outcomes}, eval_data,
                                  labels, providers, progress)
        for outcome in outcomes:
            outcome.agreement = agreements[outcome.method]
    recommended = _recommend(outcomes)
    notes += _evaluation_notes(outcomes, recommended, request)
    return CalibrationResult(fp32, plan, collected, outcomes, recommended, stats_seconds,
                             notes, request.labels())


def _recommend(outcomes: list[MethodOutcome]) -> str:
    """Without an evaluation, the first method asked for. With one: the highest accuracy
    (when labels were given), then the highest output SQNR; results within
    ACCURACY_MARGIN / SQNR_MARGIN_DB of the best count as equal, and the earliest such
    outcome wins (auto first, then the order asked for). Top-1 agreement is shown, not
    ranked: it says little about dense outputs (a text detector's probability map)."""
    judged = [o for o in outcomes if o.agreement is not None and o.agreement.samples]
    if not judged:
        return outcomes[0].method
    if any(o.agreement.accuracy is not None for o in judged):
        best = max(o.agreement.accuracy or 0.0 for o in judged)
        judged = [o for o in judged if (o.agreement.accuracy or 0.0) >= best - ACCURACY_MARGIN]
    def sqnr(o: MethodOutcome) -> float:
        return -math.inf if math.isnan(o.agreement.sqnr_db) else o.agreement.sqnr_db

    best = max(sqnr(o) for o in judged)
    judged = [o for o in judged if sqnr(o) >= best - SQNR_MARGIN_DB]
    return judged[0].method


def _evaluation_notes(outcomes: list[MethodOutcome], recommended: str,
                      request: Request) -> list[str]:
    notes = []
    asked = request.labels()
    if recommended not in asked:
        notes.append(f"the held-apart samples did not confirm {asked[0]}: {recommended} agrees "
                     f"better with FP32 there, so the written model uses {recommended}")
    constant = next((o.agreement for o in outcomes if o.agreement is not None
                     and o.agreement.constant_outputs), None)
    if constant is not None:
        notes.append(
            f"SQNR is not shown for {', '.join(constant.constant_outputs)}: the FP32 output "
            f"is the same for all {constant.samples} evaluation samples (a head initialised "
            "to zero, or inputs it ignores), so there is no signal to compare against; the "
            "ranking uses the other outputs, accuracy and top-1 where there are any")
    return notes
