"""The two TensorRT data files shipped in `graphfix/trt/data`, loaded once, and version
numbers as comparable tuples.

The files are byte-identical copies of ../shared/trt/onnx_trt_operators.json and
../shared/trt/trt_plugins.json (a test checks this when ../shared exists). They are
package data, read with importlib.resources, so a non-editable install has them.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files
from typing import Any

from graphfix.errors import InternalError

OPERATORS_FILE = "onnx_trt_operators.json"
PLUGINS_FILE = "trt_plugins.json"

_VERSION = re.compile(r"\d+(?:\.\d+)*")


def read_text(name: str) -> str:
    """The text of one shipped data file."""
    return (files("graphfix.trt") / "data" / name).read_text(encoding="utf-8")


@cache
def _load(name: str) -> dict[str, Any]:
    try:
        return json.loads(read_text(name))
    except (OSError, ValueError) as exc:  # a broken install, not the user's input
        raise InternalError(f"graphfix.trt cannot read its data file {name}: {exc}") from exc


def operators_data() -> dict[str, Any]:
    """onnx_trt_operators.json, parsed once. Callers must not mutate it."""
    return _load(OPERATORS_FILE)


def plugins_data() -> dict[str, Any]:
    """trt_plugins.json, parsed once. Callers must not mutate it."""
    return _load(PLUGINS_FILE)


def version_key(version: str) -> tuple[int, ...]:
    """"10.12" -> (10, 12, 0): numeric order, trailing zeros insignificant (10.1 == 10.1.0).

    Only the first three numbers count ("8.6.1.6" compares as 8.6.1). Raises ValueError
    on text that is not dotted digits.
    """
    parts = [int(p) for p in version.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def leading_version(text: str | None) -> str | None:
    """The first version number in free text: "10.12 (together with ...)" -> "10.12",
    "11.0 (plugin/... absent ...)" -> "11.0"; None when there is none."""
    if not text:
        return None
    match = _VERSION.search(text)
    return match.group(0) if match else None
