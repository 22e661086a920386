"""Model-derived text made safe to show on a terminal.

Node, tensor and graph names come from the model file, so they can hold anything:
an ANSI escape sequence (`\\x1b[2J` clears the screen), a carriage return that hides
what came before it, a right-to-left override that reverses the text after it. Before
such text reaches a terminal, `printable` spells those characters out as Python does
(`\\x1b`, `\\u202e`), so what is shown is what the model holds. JSON output keeps the
exact names: `json.dumps` escapes control characters itself.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; bidi marks (ALM, LRM, RLM), embeddings and overrides
# (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep: str = "") -> str:
    """`text` with every control and bidi-formatting character written as its escape
    (`\\x1b`, `\\u202e`); the characters in `keep` (e.g. "\\n" for text graphfix itself
    broke into lines) are left as they are."""
    if keep:
        return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _spelled(m), text)
    return _UNSAFE.sub(_spelled, text)
