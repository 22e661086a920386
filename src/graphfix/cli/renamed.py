"""Flags whose spelling changed when the commands got one grammar (issue 17): an old
spelling is caught before parsing, with an error naming the new one, instead of a
parser message about a missing value or an extra argument (or, worse, a new meaning).

    graphfix check ref.onnx cand.onnx --trt        # was: build an engine from CANDIDATE
    graphfix check ref.onnx cand.onnx --json r.json    # was: write the JSON to r.json
    graphfix check ref.onnx cand.onnx --report run.json  # was: read a run report
    graphfix calibrate model.onnx --data d --max-samples 64
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from graphfix.errors import GraphfixError

VERSION = re.compile(r"\d+(\.\d+)*")


@dataclass(frozen=True)
class Renamed:
    """`flag` of `command` used the old way (`old(value)`, value: the next argument or
    None): the error says what changed (`why`) and the new spelling (`fix`)."""

    command: str
    flag: str
    why: str
    fix: str
    old: Callable[[str | None], bool]

    def error(self, arg: str) -> GraphfixError:
        return GraphfixError(f"{self.command} {arg}: this spelling changed", self.why, self.fix)


def _not_a_version(value: str | None) -> bool:
    return value is None or value.startswith("-") or VERSION.fullmatch(value) is None


CHECK_TRT = Renamed(
    "check", "--trt",
    "check --trt takes a TensorRT version now, as in every command: the candidate is "
    "diagnosed for it",
    "to run the candidate as a TensorRT engine, use --trt-engine (built from CANDIDATE) or "
    "--engine FILE (an engine already built)", _not_a_version)

RENAMED = (
    CHECK_TRT,
    Renamed("check", "--json", "check --json prints the JSON on standard output now, as in "
            "every command", "to write it to a file, use --json-out FILE",
            lambda value: value is not None and value.lower().endswith(".json")),
    Renamed("check", "--report", "check --report read a run report; --report names an "
            "output file in every command now", "use --run-report FILE", lambda value: True),
    Renamed("calibrate", "--max-samples", "calibrate --max-samples is --samples now, as in "
            "check", "use --samples N", lambda value: True),
)

_GLOBAL_FLAGS = ("--debug",)


def refuse_old_spellings(argv: Sequence[str]) -> None:
    """GraphfixError for the first old spelling in a command line (argv without the
    program name); nothing for a current one."""
    args = list(argv)
    while args and args[0] in _GLOBAL_FLAGS:
        args.pop(0)
    if not args:
        return
    command, rest = args[0], args[1:]
    for index, arg in enumerate(rest):
        if arg == "--":
            return
        flag, eq, inline = arg.partition("=")
        value = inline if eq else (rest[index + 1] if index + 1 < len(rest) else None)
        for renamed in RENAMED:
            if (renamed.command, renamed.flag) == (command, flag) and renamed.old(value):
                raise renamed.error(arg)
