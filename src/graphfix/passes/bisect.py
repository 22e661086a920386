"""Find the first rewrite of a run that breaks the numbers (LLVM's -opt-bisect-limit).

A run with a rewrite budget of N (`RewriteBudget`, `--max-rewrites N`) applies
rewrites #1..#N of the whole pipeline, numbered in order over every pass. A probe
runs the pipeline, with the manager's output check, under such a limit; it is
*broken* when a pass was rolled back because its outputs differ (`NUMBERS`: with
rollback on, a breaking rewrite shows as its pass being rolled back). Rollbacks for
other causes (the pass raised, onnx.checker) are not breaks: they are reported by
every run already, with their reason.

The search: one probe without a limit counts the rewrites (T) and says whether the
run breaks at all; then a binary search over N in [0, T] for the smallest broken N
(about log2(T) probes). The answer is rewrite #N, and the model of probe N - 1 has
exactly the rewrites before it.

It relies on what the budget guarantees: rewrites #1..#N are the same in every
probe (passes are deterministic and a limit only stops rewrites after the N-th),
and a probe with more rewrites applied than a broken one is broken too. A rewrite
that breaks the numbers only together with a later one is found as that later one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx

from graphfix.errors import GraphfixError
from graphfix.passes.base import Rewrite
from graphfix.report import NUMBERS, ROLLED_BACK, PassRecord, Report

Probe = Callable[[int | None], tuple[onnx.ModelProto, Report]]
"""Runs the pipeline with at most that many rewrites (None: all, counted)."""


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe: its limit (None: unlimited), and whether the numbers broke."""

    limit: int | None
    broken: bool


@dataclass
class Bisection:
    """What `bisect_rewrites` found.

    `culprit` is the first rewrite that breaks the numbers (None when none does) and
    `message` the output check's words about it. `model` and `report` are of the run
    with only the rewrites before the culprit, or, when nothing breaks, of the full run.
    """

    total: int
    culprit: Rewrite | None
    message: str
    model: onnx.ModelProto
    report: Report
    probes: list[ProbeOutcome] = field(default_factory=list)

    @property
    def applied(self) -> int:
        """How many rewrites `model` has."""
        return self.total if self.culprit is None else self.culprit.index - 1

    def describe(self) -> str:
        if self.culprit is None:
            return (f"no rewrite breaks the numbers: all {self.total} rewrites of the run "
                    "pass the output check")
        return f"{self.culprit} breaks the numbers: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": "graphfix.bisect/1",
            "pipeline": self.report.pipeline,
            "rewrites": self.total,
            "culprit": asdict(self.culprit) if self.culprit else None,
            "message": self.message,
            "applied": self.applied,
            "probes": [asdict(p) for p in self.probes],
        }


def broke_numbers(report: Report) -> list[PassRecord]:
    """The passes of a run that were rolled back because their outputs differ."""
    return [r for r in report.passes if r.status == ROLLED_BACK and r.rollback_cause == NUMBERS]


def bisect_rewrites(
    probe: Probe, on_probe: Callable[[ProbeOutcome], None] | None = None
) -> Bisection:
    """Find the first rewrite whose application breaks the output check (module docstring).

    `on_probe` hears about each probe once it has run (for progress).
    """
    outcomes: list[ProbeOutcome] = []

    def run(limit: int | None) -> tuple[onnx.ModelProto, Report, bool]:
        model, report = probe(limit)
        broken = bool(broke_numbers(report))
        outcomes.append(ProbeOutcome(limit, broken))
        if on_probe:
            on_probe(outcomes[-1])
        return model, report, broken

    model, report, broken = run(None)
    if not report.check.enabled:
        raise GraphfixError(
            "Cannot bisect without the output check",
            f"the check is off: {report.check.skipped_reason or 'no reason given'}",
            "bisect needs a model onnxruntime can run (give --data or --input-shape if it "
            "needs them), and no --no-check",
        )
    total = len(report.rewrites)
    if not broken:
        return Bisection(total, None, "", model, report, outcomes)
    good, bad, bad_report = 0, total, report
    good_run: tuple[onnx.ModelProto, Report] | None = None
    while bad - good > 1:
        mid = (good + bad) // 2
        m, r, broken = run(mid)
        if broken:
            bad, bad_report = mid, r
        else:
            good, good_run = mid, (m, r)
    if good_run is None:  # good == 0: no probe ran with the rewrites before the culprit
        m, r, _ = run(good)
        good_run = (m, r)
    culprit = bad_report.rewrites[bad - 1]
    return Bisection(total, culprit, _message(bad_report, culprit), *good_run, outcomes)


def _message(report: Report, culprit: Rewrite) -> str:
    """The check's words for the pass the culprit belongs to (or the first that broke)."""
    broken = broke_numbers(report)
    own = [r for r in broken if r.index == culprit.step]
    record = (own or broken)[0]
    return record.rollback_reason
