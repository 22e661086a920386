"""What became of one reference tensor in a layer-wise check (`TensorResult.status`).

A str enum: the JSON holds the value. Where the status needs a word more (the pass that
merged the tensor, why it cannot be compared), `TensorResult.detail` has it.
"""

from __future__ import annotations

from enum import StrEnum


class TensorStatus(StrEnum):
    COMPARED = "compared"
    MERGED = "merged"  # detail: the graphfix pass that merged it away
    ONLY_IN_REFERENCE = "only in reference"
    NOT_COMPARABLE = "not comparable"  # detail: why (dtype or shape differ, ...)
    RESHAPE_TARGET = "reshape target"  # a constant Reshape target in the candidate
    FUSED = "fused by TensorRT"  # the engine does not expose it
    NOT_DEBUG = "not a debug tensor of the engine"
    NOT_MARKED = "not marked in the engine (inside an If branch)"
    ILL_CONDITIONED = "ill-conditioned on this sample"  # detail: the selection it follows
    RANDOM = "random on every run"  # detail: the training-mode Dropout it follows

    def describe(self, detail: str = "") -> str:
        """The status in words: "merged by fold-bn", "not comparable (dtype differs)"."""
        if self is TensorStatus.MERGED:
            return f"merged by {detail}"
        if self is TensorStatus.RESHAPE_TARGET:
            return "a constant Reshape target in the candidate (its Reshape's output is " \
                   "compared)"
        return f"{self.value} ({detail})" if detail else self.value


UNJUDGED = frozenset({TensorStatus.ILL_CONDITIONED, TensorStatus.RANDOM})
"""Statuses of tensors a check does not judge (`ok` None), that need not fail it."""
