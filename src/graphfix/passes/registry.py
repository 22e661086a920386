"""The one explicit list of passes. CLI help, docs and tests enumerate it."""

from __future__ import annotations

import difflib

from graphfix.errors import GraphfixError, InternalError
from graphfix.passes.base import Pass, check_pass_class
from graphfix.passes.cleanup import Cleanup
from graphfix.passes.fix_shapes import FixShapes
from graphfix.passes.fold_bn import FoldBatchNorm
from graphfix.passes.fold_constants import FoldConstants

PASSES: tuple[type[Pass], ...] = (
    Cleanup,
    FoldConstants,
    FoldBatchNorm,
    FixShapes,
)

DEFAULT_PIPELINE = "cleanup,fold-constants,fold-bn,cleanup"


def build_registry(classes: tuple[type[Pass], ...]) -> dict[str, type[Pass]]:
    """Name -> class; a duplicate or malformed pass is a programming error."""
    registry: dict[str, type[Pass]] = {}
    for cls in classes:
        check_pass_class(cls)
        if cls.name in registry:
            raise InternalError(
                f"two passes are named '{cls.name}': "
                f"{registry[cls.name].__qualname__} and {cls.__qualname__}"
            )
        registry[cls.name] = cls
    return registry


REGISTRY: dict[str, type[Pass]] = build_registry(PASSES)


def get_pass(name: str) -> type[Pass]:
    """The pass class named `name`; an unknown name is a user error with suggestions."""
    try:
        return REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise GraphfixError(
            f"Unknown pass '{name}'{hint}",
            f"the passes are: {', '.join(REGISTRY)}",
            "fix the name, or run `graphfix passes` to list every pass with its options",
        ) from None
