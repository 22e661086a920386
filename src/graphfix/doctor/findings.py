"""Findings and the diagnosis that collects them (the `graphfix.doctor/1` JSON schema).

A finding is one fact about the model that matters to TensorRT: which rule found
it (a stable id), how bad it is, where (node labels with their subgraph path,
tensor names), the TensorRT fact it rests on (matrix version and restriction
text, quoted from `graphfix/trt/data`) and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

SCHEMA = "graphfix.doctor/1"



RUN_BY_TRT = "(the default --trt pipeline runs it)"
"""Said after a pass named as a fix that `graphfix run --trt` runs (`Diagnosis.after_run`)."""


class Severity(StrEnum):
    """How bad a finding is (a str: the JSON holds the value). ERROR: the target's parser
    rejects the model; WARN: it parses, but something is lost or slow; INFO: a fact."""

    ERROR = "error"
    WARN = "warn"
    INFO = "info"


ERROR, WARN, INFO = Severity
SEVERITIES = (ERROR, WARN, INFO)  # most severe first
_RANK = {ERROR: 2, WARN: 1, INFO: 0}


def at_least(severity: str, threshold: str) -> bool:
    """Whether `severity` is as severe as `threshold` or more."""
    return _RANK[severity] >= _RANK[threshold]


@dataclass(frozen=True)
class Finding:
    """One fact. `rule` is a stable id (see graphfix.doctor.engine.RULES)."""

    rule: str
    severity: Severity
    message: str
    nodes: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    fact: str = ""
    fix: str = ""
    op: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        object.__setattr__(self, "severity", Severity(self.severity))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"], data["tensors"] = list(self.nodes), list(self.tensors)
        return data

    def same_fact(self) -> tuple[str, ...]:
        """What the finding says, without where: findings equal in this say the same thing
        about different nodes or tensors."""
        return (self.rule, self.severity, self.message, self.fact, self.fix, self.op)


def grouped(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per `same_fact()`, naming the nodes and tensors of all of them (each
    once, in order of first mention), at the place of the first.

    Rules report per node or per tensor where that is what they look at (a UINT8 tensor,
    a Q/DQ pair); a quantized model repeats such a finding for every tensor, so doctor
    shows it once, with every place it applies to.
    """
    groups: dict[tuple[str, ...], list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.same_fact(), []).append(finding)
    return [replace(same[0], nodes=_each_once(f.nodes for f in same),
                    tensors=_each_once(f.tensors for f in same)) for same in groups.values()]


def _each_once(names: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for group in names for n in group))


@dataclass
class Diagnosis:
    """Everything doctor found for one model and one TensorRT target."""

    model: str
    target: str  # e.g. "TensorRT 10.12 (matrix 10.1)"
    target_note: str
    matrix: str
    findings: list[Finding] = field(default_factory=list)
    parser: dict[str, Any] | None = None  # the live TensorRT parser's verdict, when it ran
    seconds: float = 0.0

    def by_severity(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    def nodes_of(self, severity: str) -> list[str]:
        """Distinct nodes named by the findings of `severity`, in order of first mention."""
        return list(_each_once(f.nodes for f in self.by_severity(severity)))

    def blocking_nodes(self) -> list[str]:
        """Distinct nodes named by error findings, in order of first mention."""
        return self.nodes_of(ERROR)

    def parses(self) -> bool:
        return not self.by_severity(ERROR)

    def verdict(self) -> str:
        """One line: "TensorRT 10.16 will parse this model: no — 3 blocking nodes"."""
        errors = self.by_severity(ERROR)
        if not errors:
            warns = len(self.by_severity(WARN))
            tail = f" ({warns} warning{'s' * (warns != 1)})" if warns else ""
            return f"{self.target} will parse this model: yes{tail}"
        nodes = len(self.blocking_nodes())
        model_wide = sum(1 for f in errors if not f.nodes)
        parts = []
        if nodes:
            parts.append(f"{nodes} blocking node{'s' * (nodes != 1)}")
        if model_wide:
            parts.append(f"{model_wide} model-wide error{'s' * (model_wide != 1)}")
        return f"{self.target} will parse this model: no — {', '.join(parts)}"

    def after_run(self, ran: dict[str, dict[str, str]]) -> None:
        """After `graphfix run`: a finding whose fix is a pass the run ran (`RUN_BY_TRT`)
        on a node that pass left says why it left it, from the pass's own note, and then
        the fix for elsewhere. `ran`: pass name -> {node label: the reason it noted}."""
        for i, finding in enumerate(self.findings):
            name, _, rest = finding.fix.partition(f" {RUN_BY_TRT}")
            said = ran.get(name, {}) if rest else {}
            reasons = list(dict.fromkeys(said[n] for n in finding.nodes if n in said))
            if not reasons:
                continue
            it = "them" if len(finding.nodes) > 1 else "it"
            fix = f"{name} ran and left {it}: {reasons[0]}"
            if len(reasons) > 1:
                fix += f" (and {len(reasons) - 1} other reason(s): the run's --report)"
            _, _, elsewhere = rest.partition("; elsewhere: ")
            if elsewhere:
                fix += f"; instead: {elsewhere}"
            self.findings[i] = replace(finding, fix=fix)

    def fails(self, fail_on: str) -> bool:
        """Whether a finding at or above `fail_on` ("error", "warn", "never") exists."""
        if fail_on == "never":
            return False
        return any(at_least(f.severity, fail_on) for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        counts = {s: len(self.by_severity(s)) for s in SEVERITIES}
        node_counts = {s: len(self.nodes_of(s)) for s in SEVERITIES}
        return {
            "schema": SCHEMA,
            "model": self.model,
            "target": {"label": self.target, "matrix": self.matrix, "note": self.target_note},
            "parses": self.parses(),
            "verdict": self.verdict(),
            "counts": counts,
            "node_counts": node_counts,
            "blocking_nodes": self.blocking_nodes(),
            "findings": [f.to_json() for f in self.findings],
            "parser": self.parser,
            "seconds": round(self.seconds, 3),
        }
