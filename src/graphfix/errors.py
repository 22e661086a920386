"""The two error roots of graphfix.

`GraphfixError` is the user's problem (bad file, bad option, unsupported model):
it carries *what* failed, *why*, and *how to fix* it, and the CLI shows it as one
paragraph with exit code 2. `InternalError` is our bug: the CLI shows it with a
request to report it.
"""

from __future__ import annotations


class GraphfixError(Exception):
    """A user-facing error: what failed, why, and how to fix it."""

    def __init__(self, what: str, why: str = "", fix: str = "") -> None:
        self.what = what.rstrip(".")
        self.why = why.rstrip(".")
        self.fix = fix.rstrip(".")
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [self.what + "."]
        if self.why:
            parts.append(self.why[0].upper() + self.why[1:] + ".")
        if self.fix:
            parts.append(self.fix[0].upper() + self.fix[1:] + ".")
        return " ".join(parts)


class InternalError(Exception):
    """A bug in graphfix, not in the user's input."""


def said(err: BaseException, last: bool = False) -> str:
    """What a library's exception says, in one line for a GraphfixError's `why`: its
    first (or `last`) non-empty line, at most 300 characters; the type's name when the
    message is empty."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    return (lines[-1] if last else lines[0])[:300]
