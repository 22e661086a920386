"""Which ONNX operators the TensorRT ONNX parser supports, per TensorRT version.

The facts are the upstream `docs/operators.md` tables of onnx/onnx-tensorrt for the
documented versions (8.0 ... 11.1), as parsed into onnx_trt_operators.json. A user's
TensorRT version is mapped onto the nearest documented table at or below it: a table
only grows within a release line, so an older table never claims support that the
user's parser lacks (TensorRT 10.12 is read with the 10.1 table).

`tensorrt` is imported only by `installed_tensorrt_version`, and only when called.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from graphfix.errors import GraphfixError, InternalError
from graphfix.trt._data import leading_version, operators_data, version_key

TYPE_NAMES = {1: "FP32", 10: "FP16", 16: "BF16", 11: "DOUBLE", 6: "INT32", 7: "INT64",
              3: "INT8", 2: "UINT8", 9: "BOOL", 17: "FP8", 22: "INT4"}
"""ONNX element type (TensorProto.FLOAT = 1, ...) -> the name the table's Supported Types
column uses."""

_VERSION_TEXT = re.compile(r"[vV]?(\d+(?:\.\d+)*)")
_TYPE_NAME = re.compile(r"[A-Z][A-Z0-9]*")


@dataclass(frozen=True)
class OpSupport:
    """One row of the operator table of one documented TensorRT version.

    `types` are the 'Supported Types' names as the table writes them ("FP32", "FP16",
    "BF16", "INT64", "BOOL", ...; not ONNX's FLOAT/FLOAT16). Two upstream slips are
    mended here: an entry holding several names without a comma ("INT64 BOOL", Split in
    10.0) is split, and prose written in the types column (DynamicQuantizeLinear in
    10.16/11.1) is moved to the end of `restrictions`.
    """

    op: str
    supported: bool  # Y or Y* in the table
    experimental: bool  # Y*
    types: tuple[str, ...]
    restrictions: str  # verbatim, "" when none
    matrix: str  # the documented version this row comes from, e.g. "10.16"


@dataclass(frozen=True)
class TrtTarget:
    """The TensorRT a model is checked against: what was asked, and the documented
    table used for it. Build it with `parse_target`.

    `effective` is the version `at_least`, `major` and `label` use: the requested
    version when one was given ("10.12", "installed 10.3.0" -> "10.3.0"), else the
    table's version ("10" -> "10.16").
    """

    requested: str  # "8.6", "10", "10.12", "installed 10.3.0" or "newest documented"
    version: str  # the documented table used, e.g. "10.1"
    note: str  # one sentence for reports
    effective: str = ""  # "" means the table's version

    def __post_init__(self) -> None:
        if self.version not in documented_versions():
            raise InternalError(f"TrtTarget built with undocumented table {self.version!r}")
        if not self.effective:
            object.__setattr__(self, "effective", self.version)

    def op(self, op_type: str) -> OpSupport | None:
        """The table row for an ai.onnx op type (case-sensitive); None when the op is
        not listed in this version's table at all."""
        return _table(self.version).get(op_type)

    def unlisted_type(self, op_type: str, elem_type: int) -> str | None:
        """The Supported Types name of an ONNX element type that the row for `op_type`
        lists types without, else None (no row, no types, the type listed, or a type the
        column never names). Up to 8.6 the parser casts INT64 to INT32 (parser notes,
        "INT64"), so INT64 counts as listed where INT32 is, and is named "INT64 (INT32
        after the parser's cast)" where it is not."""
        row = self.op(op_type)
        name = TYPE_NAMES.get(elem_type)
        if row is None or not row.types or name is None or name in row.types:
            return None
        if name == "INT64" and not self.at_least("9.0"):
            if "INT32" in row.types:
                return None
            return "INT64 (INT32 after the parser's cast)"
        return name

    def listed_ops(self) -> frozenset[str]:
        """Every op type in this version's table, supported or not."""
        return frozenset(_table(self.version))

    @property
    def opset_range(self) -> tuple[int, int] | None:
        """(lowest, highest) ai.onnx opset the parser supports, from the table's header.

        The 8.x and 9.3 headers say only "supports operators up to Opset N", which
        is given as (1, N); 10.x and later state both ends ("opset 9 to opset 20").
        None if the data has no opset for this version.
        """
        header = _header(self.version)
        high = header.get("opset_max")
        if high is None:
            return None
        return int(header.get("opset_min", 1)), int(high)

    @property
    def data_types(self) -> tuple[str, ...]:
        """The header's "TensorRT supports the following ONNX data types" list, as
        written there: ONNX-style names ("FLOAT32", "FLOAT16", "BFLOAT16", "DOUBLE"),
        unlike the per-op `types` ("FP32", "FP16", "BF16")."""
        return tuple(_header(self.version).get("onnx_data_types", ()))

    @property
    def header_notes(self) -> tuple[str, ...]:
        """The header's notes, verbatim ("Note: There is limited support for ...")."""
        return tuple(_header(self.version).get("notes", ()))

    def at_least(self, version: str) -> bool:
        """Whether the effective version is `version` or newer, compared numerically
        ("10.12" is at least "10.2"; "10.1.0" equals "10.1")."""
        return version_key(self.effective) >= version_key(version)

    @property
    def major(self) -> int:
        return version_key(self.effective)[0]

    def label(self) -> str:
        """"TensorRT 10.12 (matrix 10.1)", or "TensorRT 10.16" when they agree."""
        if version_key(self.effective) == version_key(self.version):
            return f"TensorRT {self.effective}"
        return f"TensorRT {self.effective} (matrix {self.version})"


@cache
def documented_versions() -> tuple[str, ...]:
    """The TensorRT versions with an operator table, oldest first (8.0 ... 11.1)."""
    return tuple(sorted(operators_data()["versions"], key=version_key))


def parser_behaviour_notes() -> dict[str, Any]:
    """The data's `parser_behaviour_notes` (NMS importer history, plugin fallback,
    INT64 and Q/DQ rules, opset ranges ...), as in the file; a copy, so callers may
    keep or change it."""
    return copy.deepcopy(operators_data()["parser_behaviour_notes"])


def native_nms_from() -> str:
    """The first TensorRT version that imports ONNX NonMaxSuppression natively (INMSLayer):
    the "8.5+" key of `parser_behaviour_notes.NonMaxSuppression`."""
    notes = operators_data()["parser_behaviour_notes"]["NonMaxSuppression"]
    return next(key[:-1] for key in notes if key.endswith("+"))


def installed_tensorrt_version() -> str | None:
    """`tensorrt.__version__` when `import tensorrt` works, else None. Never raises:
    a missing module, a broken CUDA install or anything else gives None."""
    try:
        import tensorrt  # lazy on purpose: tensorrt is optional and heavy

        version = getattr(tensorrt, "__version__", None)
        return str(version) if version else None
    except Exception:  # the contract is "never raises"
        return None


def import_tensorrt(purpose: str) -> Any:
    """The `tensorrt` module, imported now (the one place graphfix imports it for use);
    GraphfixError saying what needed it when it is not installed."""
    try:
        import tensorrt  # lazy on purpose: tensorrt is optional and heavy
    except ImportError as err:
        raise GraphfixError(
            f"cannot {purpose}: tensorrt is not installed",
            str(err),
            "install TensorRT 8.6 or newer (pip install 'graphfix[trt]'); running an "
            "engine also needs an NVIDIA GPU",
        ) from None
    return tensorrt


def parse_target(text: str | None) -> TrtTarget:
    """The TrtTarget for `--trt` text.

    None: the installed tensorrt's version (imported only here), else the newest
    documented table. "10": the newest documented 10.x. "10.12", "8.6.1": the nearest
    documented table at or below. Newer than every table: the newest, with a note.
    Older than every table, or not a version: GraphfixError listing the documented ones.
    """
    if text is None:
        return _from_installed(installed_tensorrt_version())
    cleaned = text.strip()
    match = _VERSION_TEXT.fullmatch(cleaned)
    if match is None:
        raise _unknown(text, "it is not a version number")
    number = match.group(1)
    if "." not in number:
        newest = [v for v in documented_versions() if version_key(v)[0] == int(number)]
        if newest:
            return TrtTarget(
                requested=cleaned, version=newest[-1], effective=newest[-1],
                note=f"TensorRT {number} means the newest documented {number}.x; "
                f"using the {newest[-1]} matrix",
            )
    return _nearest(number, requested=cleaned, subject=f"TensorRT {number}")


def _from_installed(installed: str | None) -> TrtTarget:
    newest = documented_versions()[-1]
    if installed is None:
        return TrtTarget(
            requested="newest documented", version=newest,
            note=f"tensorrt is not installed; using the newest documented matrix, {newest}",
        )
    number = leading_version(installed)
    if number is None:
        return TrtTarget(
            requested="newest documented", version=newest,
            note=f"the installed tensorrt reports version {installed!r}, which graphfix "
            f"cannot read; using the newest documented matrix, {newest}",
        )
    return _nearest(number, requested=f"installed {number}",
                    subject=f"TensorRT {number} (installed)")


def _nearest(number: str, requested: str, subject: str) -> TrtTarget:
    versions = documented_versions()
    key = version_key(number)
    at_or_below = [v for v in versions if version_key(v) <= key]
    if not at_or_below:
        raise _unknown(requested, f"TensorRT {number} is older than the oldest documented "
                       f"version, {versions[0]}")
    chosen = at_or_below[-1]
    chosen_key = version_key(chosen)
    if chosen_key == key:
        note = f"{subject} is documented; using its matrix"
    elif chosen == versions[-1] and key[:2] > chosen_key[:2]:
        note = (f"{subject} is newer than every documented version; using the {chosen} "
                "matrix (the newest documented)")
    elif key[:2] == chosen_key[:2]:
        note = f"{subject} uses the {chosen} matrix (tables are per minor release)"
    else:
        note = (f"{subject} is not documented; using the {chosen} matrix "
                "(nearest documented at or below)")
    return TrtTarget(requested=requested, version=chosen, note=note, effective=number)


def _unknown(text: str, why: str) -> GraphfixError:
    listed = ", ".join(documented_versions())
    return GraphfixError(
        f"Cannot use {text!r} as the TensorRT version",
        f"{why}; graphfix has operator tables for TensorRT {listed}",
        "give a version such as 8.6, 10, 10.12 or 11.1 (a major alone means its newest "
        "documented minor)",
    )


def _header(version: str) -> dict[str, Any]:
    return operators_data()["versions"][version]


@cache
def _table(version: str) -> dict[str, OpSupport]:
    rows = _header(version)["operators"]
    return {op: _row(op, row, version) for op, row in rows.items()}


def _row(op: str, row: dict[str, Any], version: str) -> OpSupport:
    types: list[str] = []
    prose: list[str] = []
    for entry in row.get("types", ()):
        names = entry.split()
        if names and all(_TYPE_NAME.fullmatch(n) for n in names):
            types.extend(names)
        else:
            prose.append(entry)
    restrictions = "\n".join([r for r in (row.get("restrictions", ""), *prose) if r])
    return OpSupport(
        op=op, supported=bool(row["supported"]), experimental=bool(row.get("experimental")),
        types=tuple(dict.fromkeys(types)), restrictions=restrictions, matrix=version,
    )
