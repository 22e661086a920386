"""Byte sizes as users write them on the command line (--memory-budget 512MB)."""

from __future__ import annotations

import re

from graphfix.errors import GraphfixError

_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str, option: str = "--memory-budget") -> int:
    """'512MB', '2GB', '1.5GiB', '1000000' -> bytes (K/M/G are powers of 1024)."""
    match = _BYTES.match(text)
    if not match:
        raise GraphfixError(f"{option} {text!r} is not a size",
                            "it bounds the activation bytes one onnxruntime run exposes",
                            "write it like 512MB or 2GB")
    unit = (match.group(2) or "B").upper()[0]
    return int(float(match.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])
