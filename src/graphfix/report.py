"""What a `graphfix run` did, per pass, as data (terminal table and JSON report)."""

from __future__ import annotations

import copy
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

    from graphfix.passes.base import Rewrite



class PassStatus(StrEnum):
    """What became of one pass run (a str: the JSON report holds the value)."""

    APPLIED = "applied"
    UNCHANGED = "unchanged"
    ROLLED_BACK = "rolled back"


class RollbackCause(StrEnum):
    """Why a pass was rolled back (PassRecord.rollback_cause)."""

    RAISED = "raised"  # the pass (or exporting its graph) raised: there is no candidate model
    INVALID = "invalid"  # onnx.checker or shape inference rejects the candidate
    NUMBERS = "numbers"  # the candidate's outputs differ from the original's


APPLIED, UNCHANGED, ROLLED_BACK = PassStatus
RAISED, INVALID, NUMBERS = RollbackCause

_TOOLS = ("graphfix", "onnx", "onnx-graphsurgeon", "onnxruntime", "polygraphy", "numpy")


@dataclass
class PassRecord:
    """One pass in one run: what it did, how long it took, and whether it was kept."""

    index: int
    spec: str
    status: PassStatus
    seconds: float
    nodes_before: int
    nodes_after: int
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    check: str = ""
    max_abs_error: float | None = None
    rollback_reason: str = ""
    traceback: str = ""
    preset: str = ""
    round: int = 0
    rollback_cause: RollbackCause | str = ""  # a RollbackCause when rolled back
    rejected: onnx.ModelProto | None = field(default=None, repr=False, compare=False)
    """The model the pass produced when it was rolled back after exporting one (INVALID,
    NUMBERS): what `--dump-after` writes as REJECTED. Never in the JSON report."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: copy.deepcopy(getattr(self, f.name))
                for f in fields(self) if f.name != "rejected"}

    def did(self) -> str:
        if self.status == ROLLED_BACK:
            return f"rolled back: {self.rollback_reason}"
        if not self.counts:
            return "nothing to do" + (f" ({self.notes[0]})" if len(self.notes) == 1 else "")
        return "; ".join(f"{what} ({n})" for what, n in self.counts.items())


@dataclass
class CheckInfo:
    """How outputs were checked: or why they were not."""

    enabled: bool
    skipped_reason: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    data: str = ""
    seed: int | None = None
    providers: list[str] = field(default_factory=list)
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)
    # output -> why it is not judged on this sample (ill-conditioned or empty,
    # runtime.outputs)
    unjudged: dict[str, str] = field(default_factory=dict)
    # every output is unjudged: the check ran and compared no value
    judged_nothing: bool = False


@dataclass
class FileRef:
    """A model file a run read or wrote: `path` as given, `written` where its bytes are
    (the same path; a temporary until a write set commits). The sha256 is read when the
    JSON is made, not before: a run that prints no JSON never hashes 350 MB."""

    path: str
    written: str = ""
    _sha256: str = field(default="", repr=False)

    def to_json(self) -> dict[str, str]:
        if not self._sha256:
            import os

            from graphfix.io import sha256_file

            staged = self.written and os.path.exists(self.written)
            self._sha256 = sha256_file(self.written if staged else self.path)
        return {"path": self.path, "sha256": self._sha256}


@dataclass
class Report:
    pipeline: str
    passes: list[PassRecord]
    check: CheckInfo
    verify_notes: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)  # tensor -> pass that removed it
    rounds: dict[str, int] = field(default_factory=dict)
    explain: dict[str, Any] = field(default_factory=dict)
    doctor: dict[str, Any] = field(default_factory=dict)  # graphfix.doctor/1, with --trt
    seconds: float = 0.0
    input: FileRef | None = None  # the model file read (None: the caller gave a ModelProto)
    output: FileRef | None = None  # the model file written (None: not written)
    rewrite_limit: int | None = None  # --max-rewrites; the two below only with a budget
    rewrites: list[Rewrite] = field(default_factory=list)  # every rewrite the budget allowed

    @property
    def rolled_back(self) -> list[PassRecord]:
        return [p for p in self.passes if p.status == ROLLED_BACK]

    @property
    def nodes_before(self) -> int:
        return self.passes[0].nodes_before if self.passes else 0

    @property
    def nodes_after(self) -> int:
        return self.passes[-1].nodes_after if self.passes else 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(replace(self, passes=[], input=None, output=None))  # records hold models
        data["passes"] = [p.to_json() for p in self.passes]
        data["input"] = self.input.to_json() if self.input else {}
        data["output"] = self.output.to_json() if self.output else {}
        data["schema"] = "graphfix.run/1"
        data["nodes_before"] = self.nodes_before
        data["nodes_after"] = self.nodes_after
        data["tools"] = tool_versions()
        return data


def tool_versions() -> dict[str, str]:
    """Versions of graphfix and its dependencies (and tensorrt when importable)."""
    import platform
    from importlib import metadata

    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _TOOLS + ("tensorrt",):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name != "tensorrt":
                versions[name] = "not installed"
    ort = sys.modules.get("onnxruntime")
    if ort is not None:  # the one that ran: onnxruntime-gpu installs under another name
        gpu = "CUDAExecutionProvider" in ort.get_available_providers()
        versions["onnxruntime"] = ort.__version__ + (" (gpu)" if gpu else "")
    return versions
