"""`nms-for-trt`: the NMS rewrite that suits the run's TensorRT target.

    target < 8.5   -> nms-to-plugin{max}: the parser imports ONNX NonMaxSuppression only
                      through the experimental EfficientNMS_ONNX_TRT plugin (initializer
                      thresholds, per-image cap, padding that repeats the last row), so the
                      NMS becomes EfficientNMS_TRT with fixed-shape outputs;
    target >= 8.5  -> bound-nms{max}: the parser imports it natively (INMSLayer), which
                      needs a constant per-class cap for a bounded output.

The target is `ctx.trt` (`graphfix run --trt`, `graphfix.run(..., trt=)`); without one,
the newest documented TensorRT (../shared/trt/nms_notes.md, section 1).

Presets are static pass lists, so this is a pass that builds the chosen pass, runs it on
the same graph and context and returns its result, plus a note naming the choice and why.
Whether the graph outputs change depends on that choice (nms-to-plugin changes them,
bound-nms does not): `changes_outputs` is set on the instance by `run()`, and the manager
reads it after `run()`, so it compares outputs for bound-nms and requires the delegate's
own check (`PassResult.verified`) for nms-to-plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.passes.bound_nms import BoundNms, BoundNmsOptions
from graphfix.passes.nms_to_plugin import NmsToPlugin, NmsToPluginOptions


@dataclass(frozen=True)
class NmsForTrtOptions:
    """`max`: nms-to-plugin's per-image cap, or bound-nms's per-class cap."""

    max: int = 100


def choose(target) -> tuple[str, str]:
    """(pass name, why) for a graphfix.trt.TrtTarget (None: newest documented)."""
    from graphfix.trt import documented_versions, native_nms_from, parse_target

    target = target or parse_target(documented_versions()[-1])
    if target.at_least(native_nms_from()):
        return "bound-nms", (f"{target.label()} imports ONNX NonMaxSuppression natively "
                             "(INMSLayer, 8.5+), which needs a constant per-class cap")
    return "nms-to-plugin", (f"{target.label()} imports ONNX NonMaxSuppression only through "
                             "the experimental EfficientNMS_ONNX_TRT plugin (before 8.5), "
                             "so it becomes EfficientNMS_TRT")


class NmsForTrt(Pass):
    """Runs nms-to-plugin (TensorRT < 8.5) or bound-nms (8.5+), by the run's target."""

    name = "nms-for-trt"
    summary = ("NMS for the --trt target: nms-to-plugin before TensorRT 8.5, bound-nms from "
               "8.5 (no --trt: the newest documented); option max=100.")
    Options = NmsForTrtOptions
    counts_rewrites = True

    def __init__(self, options: NmsForTrtOptions | None = None) -> None:
        super().__init__(options)
        self.changes_outputs = False  # set by run() to the chosen pass's

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        chosen, why = choose(ctx.trt)
        delegate: Pass = NmsToPlugin(NmsToPluginOptions(self.options.max)) \
            if chosen == "nms-to-plugin" else BoundNms(BoundNmsOptions(self.options.max))
        self.changes_outputs = delegate.changes_outputs
        result = delegate.run(graph, ctx)
        result.notes.insert(0, Note("nms-for-trt", f"chose {chosen}: {why}"))
        return result
