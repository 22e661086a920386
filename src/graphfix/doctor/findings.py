"""Findings and the diagnosis that collects them (the `graphfix.doctor/1` JSON schema).

A finding is one fact about the model that matters to TensorRT: which rule found
it (a stable id), how bad it is, where (node labels with their subgraph path,
tensor names), the TensorRT fact it rests on (matrix version and restriction
text, quoted from `graphfix/trt/data`) and the fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "graphfix.doctor/1"

ERROR, WARN, INFO = "error", "warn", "info"
SEVERITIES = (ERROR, WARN, INFO)  # most severe first
_RANK = {ERROR: 2, WARN: 1, INFO: 0}


def at_least(severity: str, threshold: str) -> bool:
    """Whether `severity` is as severe as `threshold` or more."""
    return _RANK[severity] >= _RANK[threshold]


@dataclass(frozen=True)
class Finding:
    """One fact. `rule` is a stable id (see graphfix.doctor.engine.RULES)."""

    rule: str
    severity: str
    message: str
    nodes: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    fact: str = ""
    fix: str = ""
    op: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"], data["tensors"] = list(self.nodes), list(self.tensors)
        return data


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

    def blocking_nodes(self) -> list[str]:
        """Distinct nodes named by error findings, in order of first mention."""
        seen: dict[str, None] = {}
        for f in self.by_severity(ERROR):
            for n in f.nodes:
                seen.setdefault(n, None)
        return list(seen)

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

    def fails(self, fail_on: str) -> bool:
        """Whether a finding at or above `fail_on` ("error", "warn", "never") exists."""
        if fail_on == "never":
            return False
        return any(at_least(f.severity, fail_on) for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        counts = {s: len(self.by_severity(s)) for s in SEVERITIES}
        return {
            "schema": SCHEMA,
            "model": self.model,
            "target": {"label": self.target, "matrix": self.matrix, "note": self.target_note},
            "parses": self.parses(),
            "verdict": self.verdict(),
            "counts": counts,
            "blocking_nodes": self.blocking_nodes(),
            "findings": [f.to_json() for f in self.findings],
            "parser": self.parser,
            "seconds": round(self.seconds, 3),
        }
