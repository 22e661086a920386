"""`graphfix.calibrate`: statistics once, every requested method from them, each Q/DQ model
compared with FP32 on held-apart samples, and a recommendation.

    model --fold-bn--> FP32 --plan--> tensors --collect(data)--> stats
    stats --method--> amaxes --quantize--> Q/DQ model --compare(eval data)--> agreement

The statistics pass is shared by all methods (the expensive part); each method only
computes thresholds from the histograms and writes a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from graphfix import provenance
from graphfix.calibration import algorithms, qdq, stats
from graphfix.calibration.evaluate import Agreement, compare
from graphfix.errors import GraphfixError

METHODS = ("entropy", "minmax", "percentile", "mse")
PER_TENSOR_CHOICES = ("minmax", "entropy", "percentile")
Progress = Callable[[str, int, int], None]


@dataclass
class MethodOutcome:
    method: str
    amaxes: dict[str, float]
    model: onnx.ModelProto
    seconds: float
    agreement: Agreement | None = None
    chosen_by_tensor: dict[str, str] = field(default_factory=dict)  # per-tensor mode

    def summary(self) -> dict[str, Any]:
        out = {"method": self.method, "seconds": round(self.seconds, 3)}
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

    def outcome(self, method: str | None = None) -> MethodOutcome:
        wanted = method or self.recommended
        return next(o for o in self.outcomes if o.method == wanted)

    def ranges_json(self) -> dict[str, Any]:
        """Per tensor: amax of every method, and the statistics behind them."""
        return {
            "schema": "graphfix.ranges/1",
            "recommended": self.recommended,
            "tensors": {
                name: {"min": s.min, "max": s.max, "amax_observed": s.amax,
                       "amax": {o.method: o.amaxes.get(name) for o in self.outcomes}}
                for name, s in self.stats.items()
            },
            "methods": [o.summary() for o in self.outcomes],
        }


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


def calibrate(
    model: onnx.ModelProto,
    data: Iterable[dict[str, np.ndarray]],
    methods: Sequence[str] = ("entropy",),
    *,
    eval_data: Iterable[dict[str, np.ndarray]] | None = None,
    labels: np.ndarray | None = None,
    exclude_nodes: Sequence[str] = (),
    exclude_op_types: Sequence[str] = (),
    per_tensor: bool = False,
    percentile: float = 99.99,
    bins: int = 2048,
    memory_budget: int | None = None,
    fold_bn: bool = True,
    every_tensor: bool = False,
    providers: Sequence[str] = ("cpu",),
    progress: Progress | None = None,
) -> CalibrationResult:
    """Calibrate `model` on `data` with each of `methods` (see the module docstring).

    `every_tensor` also measures every float tensor of the main graph (its inputs and
    node outputs), not only the ones the Q/DQ model quantizes: what a legacy TensorRT
    calibration cache holds, since TensorRT may ask for any tensor of its network.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise GraphfixError(
            f"unknown calibration method {', '.join(unknown) or '(none)'}",
            f"graphfix calibrates with {', '.join(METHODS)}",
            "pick one of them, or --method all",
        )
    fp32, notes = prepare(model, fold_bn)
    plan = qdq.plan(fp32, exclude_nodes=exclude_nodes, exclude_op_types=exclude_op_types)
    tensors = list(plan.activations)
    if every_tensor:
        named = [i.name for i in fp32.graph.input] + [o for n in fp32.graph.node
                                                      for o in n.output if o]
        tensors += [t for t in dict.fromkeys(named) if t not in set(tensors)]
    start = time.perf_counter()
    histograms = per_tensor or any(m != "minmax" for m in methods)
    collected = stats.collect(fp32, tensors, data, bins=bins, histograms=histograms,
                              memory_budget=memory_budget, providers=providers,
                              progress=progress)
    stats_seconds = time.perf_counter() - start
    notes += [collected.summary(), *collected.notes]
    notes += [f"not quantized: {where}: {why}" for where, why in plan.skipped]
    outcomes = []
    for method in methods:
        t0 = time.perf_counter()
        options = {"p": percentile} if method == "percentile" else {}
        amaxes = algorithms.compute_amaxes(collected, method, **options)
        chosen: dict[str, str] = {}
        if per_tensor:  # mse minimizes the very error compared here: leave it out
            best = algorithms.best_per_tensor(collected, methods=PER_TENSOR_CHOICES)
            amaxes = {name: value for name, (_, value) in best.items()}
            chosen = {name: how for name, (how, _) in best.items()}
        quantized = qdq.quantize(fp32, plan, amaxes)
        provenance.attach(quantized, *provenance.read(fp32))  # fold-bn's merges, for check
        outcomes.append(MethodOutcome(method if not per_tensor else f"{method}+per-tensor",
                                      amaxes, quantized, time.perf_counter() - t0,
                                      chosen_by_tensor=chosen))
        if per_tensor:
            break  # one per-tensor choice covers every method
    if eval_data is not None:
        for i, outcome in enumerate(outcomes):
            if progress:
                progress(f"evaluating {outcome.method}", i, len(outcomes))
            outcome.agreement = compare(fp32, outcome.model, eval_data, labels, providers)
    return CalibrationResult(fp32, plan, collected, outcomes, _recommend(outcomes),
                             stats_seconds, notes)


def _recommend(outcomes: list[MethodOutcome]) -> str:
    """Highest accuracy when labels were given, then top-1 agreement, then SQNR; without
    an evaluation, the first method asked for."""
    judged = [o for o in outcomes if o.agreement is not None and o.agreement.samples]
    if not judged:
        return outcomes[0].method

    def key(o: MethodOutcome) -> tuple[float, float, float]:
        a = o.agreement
        return (a.accuracy if a.accuracy is not None else 0.0, a.top1_agreement,
                a.sqnr_db if not np.isnan(a.sqnr_db) else -np.inf)

    return max(judged, key=key).method
