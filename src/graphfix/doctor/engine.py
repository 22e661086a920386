"""Run every doctor rule on a model for one TensorRT target; a rule that fails is itself
reported (rule id `internal`), and the others still run."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx

from graphfix.doctor import rules_ops, rules_shapes
from graphfix.doctor.findings import SEVERITIES, WARN, Diagnosis, Finding, grouped
from graphfix.doctor.view import ModelView
from graphfix.errors import InternalError
from graphfix.trt import TrtTarget

Check = Callable[[ModelView, TrtTarget], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """A check and the stable finding ids it can emit (documented in docs/doctor.md)."""

    name: str
    ids: tuple[str, ...]
    check: Check


def _rules() -> tuple[Rule, ...]:
    from graphfix.doctor import (
        rules_nms,
        rules_plugins,
        rules_qdq,
        rules_restrictions,
        rules_types,
    )

    return (
        Rule("opset", ("opset-out-of-range",), rules_ops.opset_range),
        Rule("operators", ("op-unsupported", "op-experimental"), rules_ops.op_support),
        Rule("dtypes", ("dtype-unsupported", "dtype-cast-down"), rules_ops.dtype_support),
        Rule("restrictions", ("restriction-violated", "restriction-unchecked"),
             rules_restrictions.restrictions),
        Rule("domains", ("domain-nonstandard",), rules_ops.custom_domains),
        Rule("plugins", rules_plugins.IDS, rules_plugins.plugins),
        Rule("qdq", rules_qdq.IDS, rules_qdq.qdq),
        Rule("nms", rules_nms.IDS, rules_nms.nms),
        Rule("dynamic-inputs", ("dynamic-input",), rules_shapes.dynamic_inputs),
        Rule("data-dependent", ("data-dependent-shape",), rules_shapes.data_dependent),
        Rule("int64", ("int64-overflow", "int64-input"), rules_shapes.int64_values),
        Rule("inference", ("shape-inference-failed",), rules_ops.inference_failed),
        Rule("types", rules_types.IDS, rules_types.type_mismatch),
    )


def rules() -> tuple[Rule, ...]:
    """Every rule, in the order they run."""
    return _rules()


def diagnose(model: onnx.ModelProto, target: TrtTarget, name: str = "model",
             only: Iterable[str] | None = None) -> Diagnosis:
    """All findings for `model` on `target`, most severe first (rule order within a
    severity), findings that say the same about several nodes or tensors as one
    (`findings.grouped`). `only` limits the run to rules by name (tests,
    `detect-unsupported`)."""
    start = time.perf_counter()
    diagnosis = Diagnosis(name, target.label(), target.note, target.version)
    wanted = set(only) if only is not None else None
    unknown = sorted(wanted - {r.name for r in rules()}) if wanted is not None else []
    if unknown:  # a typo would run no rule and say "will parse: yes"
        raise InternalError(f"diagnose(only=...) names no rule: {', '.join(unknown)}; the "
                            f"rules are: {', '.join(r.name for r in rules())}")
    findings: list[Finding] = []
    try:
        view = ModelView.of(model)
    except Exception as exc:  # noqa: BLE001 - a model doctor cannot read still gets an answer
        diagnosis.findings = [_internal(Rule("model-view", (), _no_rule), exc)]
        diagnosis.seconds = time.perf_counter() - start
        return diagnosis
    for rule in rules():
        if wanted is not None and rule.name not in wanted:
            continue
        try:
            findings.extend(rule.check(view, target))
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
            findings.append(_internal(rule, exc))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    diagnosis.findings = sorted(grouped(findings), key=lambda f: order[f.severity])  # stable
    diagnosis.seconds = time.perf_counter() - start
    return diagnosis


def _no_rule(view: ModelView, target: TrtTarget) -> Iterable[Finding]:
    return ()


def _internal(rule: Rule, exc: Exception) -> Finding:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return Finding(
        "internal", WARN,
        f"the {rule.name} rule failed inside graphfix ({type(exc).__name__}: {exc}); "
        "its findings are missing, the other rules ran",
        fact=f"{where.filename}:{where.lineno}",
        fix="please report this as a graphfix bug, with the model if you can share it",
    )
