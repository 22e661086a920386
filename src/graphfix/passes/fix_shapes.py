"""`fix-shapes`: make dynamic graph-input dims static and re-infer every shape.

`x: [batch, 3, H, W] -> x: [1, 3, 224, 224]`, then every intermediate and output
shape is cleared and re-inferred with ONNX shape inference, so stale symbolic
shapes do not linger. Options name model inputs: `fix-shapes{input=1x3x224x224}`;
inputs not named take the run's resolved shapes (`--input-shape`, or 1 for a
dynamic axis 0). Follow it with `fold-constants` to fold the `Shape` subgraphs
that became static.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.graph.shapes import infer_shapes
from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.runtime.feeds import parse_input_shape


@dataclass(frozen=True)
class FixShapesOptions:
    """INPUT=DIMS per model input, e.g. `input=1x3x224x224`."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


class FixShapes(Pass):
    """Sets static input shapes and re-runs shape inference."""

    name = "fix-shapes"
    annotates_shapes = True  # its shape inference
    summary = "Make dynamic input dims static (INPUT=DIMS, default batch=1) and re-infer shapes."
    Options = FixShapesOptions
    option_syntax = "INPUT=DIMS (one per input, e.g. input=1x3x224x224)"

    @classmethod
    def parse_options(cls, pairs: list[tuple[str, str]]) -> Any:
        return FixShapesOptions(tuple(parse_input_shape(f"{k}:{v}") for k, v in pairs))

    def implied_input_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.options.shapes)

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        wanted = dict(ctx.input_shapes)
        names = {t.name for t in graph.inputs}
        for name, shape in self.options.shapes:
            if name not in names:
                raise GraphfixError(
                    f"fix-shapes names '{name}', which is not an input of the model",
                    f"its inputs are: {', '.join(sorted(names))}",
                    "use one of those names: fix-shapes{INPUT=1x3x224x224}",
                )
            wanted[name] = shape
        result = PassResult(changed=False)
        for t in graph.inputs:
            old = list(t.shape) if t.shape is not None else None
            if old is not None and all(isinstance(d, int) and d > 0 for d in old):
                if t.name in dict(self.options.shapes) and tuple(old) != wanted[t.name]:
                    raise GraphfixError(
                        f"fix-shapes asks {t.name} to be {wanted[t.name]}, "
                        f"but the model fixes it to {tuple(old)}",
                        "only dynamic dims can be set",
                        "drop that input from the fix-shapes options",
                    )
                continue
            if t.name not in wanted:
                raise GraphfixError(
                    f"fix-shapes cannot choose a shape for input '{t.name}' ({old})",
                    "only a dynamic axis 0 defaults to 1",
                    f"write fix-shapes{{{t.name}=DIMS}} or pass --input-shape {t.name}:DIMS",
                )
            _check_fits(t, wanted[t.name])
            t.shape = list(wanted[t.name])
            result.counts["fixed input shapes"] += 1
        if not result.counts:
            result.notes.append(Note("graph", "every input shape is already static"))
            return result
        infer_shapes(graph, clear=True)
        result.changed = True
        return result


def _check_fits(t: gs.Tensor, shape: tuple[int, ...]) -> None:
    if t.shape is None:
        return
    if len(t.shape) != len(shape) or any(
        isinstance(d, int) and d > 0 and d != v for d, v in zip(t.shape, shape, strict=True)
    ):
        raise GraphfixError(
            f"Shape {'x'.join(map(str, shape))} does not fit input '{t.name}' {list(t.shape)}",
            "the rank and every static dim must match",
            "fill in only the dynamic dims",
        )
