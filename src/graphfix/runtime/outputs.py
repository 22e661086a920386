"""The per-pass output check: run the original once, then each rewrite, and compare.

The original model runs in onnxruntime (see `runtime`) on seeded random inputs
or the user's `.npz`; its outputs are the reference. After a pass, the rewritten
model runs on the same inputs and every graph output is compared with the
tolerances in `tolerances`. When onnxruntime cannot run the original (custom
ops, unsupported opset, ...) the check is skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from graphfix.errors import said
from graphfix.runtime.compare import OutputDiff, compare_outputs
from graphfix.runtime.feeds import DEFAULT_SEED, graph_inputs, load_feeds, random_feeds
from graphfix.runtime.session import run_model
from graphfix.runtime.tolerances import tolerance_table


@dataclass
class CheckOutcome:
    """The verdict on one rewritten model."""

    ok: bool
    diffs: list[OutputDiff] = field(default_factory=list)
    error: str = ""

    @property
    def max_abs(self) -> float | None:
        finite = [d.max_abs for d in self.diffs if np.isfinite(d.max_abs)]
        return max(finite) if finite else None

    def describe(self) -> str:
        if self.error:
            return self.error
        bad = [d for d in self.diffs if not d.ok]
        if bad:
            return "outputs differ: " + "; ".join(d.describe() for d in bad)
        worst = self.max_abs
        return "passed" + (f" (max abs {worst:.2g})" if worst else " (exact)")


class OutputCheck:
    """Reference outputs of the original model, and the check of any rewrite against them."""

    def __init__(
        self,
        feeds: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray] | None,
        skipped_reason: str = "",
        providers: Sequence[str] = ("cpu",),
        seed: int | None = None,
        data: str = "",
    ) -> None:
        self.feeds = dict(feeds)
        self.reference = reference
        self.skipped_reason = skipped_reason
        self.providers = tuple(providers)
        self.seed = seed
        self.data = data

    @property
    def enabled(self) -> bool:
        return self.reference is not None

    @classmethod
    def prepare(
        cls,
        model: onnx.ModelProto,
        shapes: Mapping[str, tuple[int, ...]],
        data: str | os.PathLike | None = None,
        seed: int = DEFAULT_SEED,
        providers: Sequence[str] = ("cpu",),
    ) -> OutputCheck:
        """Make the inputs and run the original; a model onnxruntime cannot run is skipped."""
        inputs = graph_inputs(model)
        if data is not None:
            feeds, used_seed = load_feeds(data, inputs), None
        else:
            feeds, used_seed = random_feeds(inputs, shapes, seed), seed
        try:
            reference = run_model(model, feeds, providers)
        except Exception as err:  # onnxruntime raises many types; all mean "cannot run it"
            reason = f"onnxruntime cannot run the input model: {said(err)}"
            return cls(feeds, None, reason, providers, used_seed, str(data or ""))
        return cls(feeds, reference, "", providers, used_seed, str(data or ""))

    @classmethod
    def disabled(cls, reason: str) -> OutputCheck:
        return cls({}, None, reason)

    def verify(self, model: onnx.ModelProto) -> CheckOutcome:
        """Run the rewritten model on the reference inputs and compare every output."""
        assert self.reference is not None, "verify() on a disabled check"
        try:
            outputs = run_model(model, feeds_as_declared(model, self.feeds), self.providers)
        except Exception as err:
            return CheckOutcome(False, error=f"onnxruntime cannot run it: {said(err)}")
        diffs = compare_outputs(self.reference, outputs)
        return CheckOutcome(all(d.ok for d in diffs), diffs)

    def describe_inputs(self) -> dict[str, str]:
        return {k: f"{v.dtype}[{'x'.join(map(str, v.shape))}]" for k, v in self.feeds.items()}

    def tolerances(self) -> dict[str, dict[str, float]]:
        return {k: {"rtol": t.rtol, "atol": t.atol} for k, t in tolerance_table().items()}


def feeds_as_declared(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict:
    """The feeds, each cast to the dtype `model` declares for that input when a pass
    changed it (int64-to-int32) and the cast keeps every value exactly; others as given
    (onnxruntime then says what does not match)."""
    declared = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    out = {}
    for name, value in feeds.items():
        elem = declared.get(name, 0)
        try:
            dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else value.dtype
        except (KeyError, TypeError, ValueError):
            dtype = value.dtype
        if dtype != value.dtype:
            cast = value.astype(dtype)
            if np.array_equal(cast.astype(value.dtype), value):
                value = cast
        out[name] = value
    return out

