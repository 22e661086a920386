"""The NMS strategy for the target TensorRT: one finding per NMS node, naming the passes
that apply it.

What each version does with NMS, from the shipped data (`graphfix.trt`):
- ONNX NonMaxSuppression, TensorRT 8.0-8.4: imported through the experimental plugin
  EfficientNMS_ONNX_TRT; max_output_boxes_per_class and the thresholds must be
  initializers; the output is padded. 8.5+: the native NMS layer (INMSLayer), with a
  data-dependent output shape and a 5000-box candidate limit
  (`parser_behaviour_notes.NonMaxSuppression` in onnx_trt_operators.json).
- NMS plugins (trt_plugins.json's "detection/NMS" category: EfficientNMS_TRT,
  BatchedNMS(Dynamic)_TRT, NMS(Dynamic)_TRT, ...): their
  status at the target (`PluginSpec.status_at`): deprecated ones still build, removed
  ones do not; rules_plugins reports the status itself, this rule says what to do.

Each finding ends with the NMS region as `graphfix.nms.find_regions` traces it (the
pre-NMS boxes and scores, layout, box format, thresholds, the steps before the NMS, the
tail, and why split-nms cannot cut before it), the same line `graphfix run --explain`
prints; its tensors are the pre-NMS boxes and scores.

The fix names only passes in the registry (`graphfix passes`), so it never points at one
that does not exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from graphfix.doctor.findings import INFO, WARN, Finding
from graphfix.doctor.view import ModelView, NodeRef
from graphfix.trt import TrtTarget, is_nms_plugin, native_nms_from, parser_behaviour_notes

IDS = ("nms-strategy",)
_INT32_MAX = np.iinfo(np.int32).max


def nms(view: ModelView, target: TrtTarget) -> Iterable[Finding]:
    regions = None
    for ref in view.nodes:
        onnx_nms = ref.standard and ref.op == "NonMaxSuppression"
        if not onnx_nms and not is_nms_plugin(ref.op):
            continue
        if regions is None:
            from graphfix.nms.regions import find_regions

            regions = {out: r for r in find_regions(view.model) for out in r.outputs if out}
        region = next((regions[o] for o in ref.node.output if o in regions), None)
        splittable = region is None or region.splittable
        finding = _onnx_nms(view, ref, target, splittable) if onnx_nms else \
            _plugin_nms(ref, target)
        yield finding if region is None else dataclasses.replace(
            finding, message=f"{finding.message}. Region: {region.describe()}",
            tensors=(*region.boxes, *region.scores))


def _onnx_nms(view: ModelView, ref: NodeRef, target: TrtTarget, splittable: bool) -> Finding:
    """`splittable`: whether split-nms can cut before it (else the fix does not name it)."""
    split = [("split-nms", "build only the backbone in TensorRT")] if splittable else []
    notes = _parser_notes()
    where = " (inside a subgraph: TensorRT builds the If/Loop around it too)" if ref.path else ""
    if not target.at_least(native_nms_from()):
        return Finding(
            "nms-strategy", WARN,
            f"TensorRT {target.effective} imports NonMaxSuppression as the experimental "
            f"EfficientNMS_ONNX_TRT plugin{where}",
            nodes=(ref.label,), fact=f"parser notes 8.0-8.4: {notes.get('8.0-8.4', '')}",
            fix=_fix([*([("nms-to-plugin", "EfficientNMS_TRT instead")] if not ref.path else []),
                      *split], "use TensorRT 8.5+ (native NMS layer)"), op=ref.op)
    cap = _cap(view, ref)
    unbounded = cap is None or cap > _INT32_MAX
    text = (f"TensorRT {target.effective} builds NonMaxSuppression natively (INMSLayer): a "
            "data-dependent output shape and at most 5000 candidates per image" + where)
    if unbounded:
        text += ("; its max_output_boxes_per_class is "
                 + ("computed" if cap is None else f"{cap}, beyond INT32") +
                 ", so the engine has no useful upper bound for its outputs")
    return Finding(
        "nms-strategy", WARN if unbounded else INFO, text, nodes=(ref.label,),
        fact=f"parser notes 8.5+: {notes.get('8.5+', '')}",
        fix=_fix([("bound-nms", "a constant per-class cap"), *split]), op=ref.op)


def _plugin_nms(ref: NodeRef, target: TrtTarget) -> Finding:
    from graphfix.trt.plugins import plugin_for

    spec = plugin_for(ref.op)
    status = spec.status_at(target) if spec is not None else "unknown"
    if status in ("removed", "deprecated"):
        return Finding(
            "nms-strategy", WARN,
            f"{ref.op} is {status} at TensorRT {target.effective}: the NMS should become "
            f"ONNX NonMaxSuppression, which TensorRT builds natively from {native_nms_from()}",
            nodes=(ref.label,), fact=f"trt_plugins.json: {ref.op} {status}",
            fix=_fix([("plugin-to-nms", "the same NMS in standard ONNX ops")],
                     "replace the plugin by ONNX NonMaxSuppression and its post-processing"),
            op=ref.op)
    return Finding(
        "nms-strategy", INFO,
        f"{ref.op} is available at TensorRT {target.effective}: fixed output shapes, the "
        "fastest NMS TensorRT builds", nodes=(ref.label,),
        fact=f"trt_plugins.json: {ref.op} {status}", op=ref.op)


def _cap(view: ModelView, ref: NodeRef) -> int | None:
    name = ref.input(2)
    if not name:
        return 0
    value = view.value(name)
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    return int(flat[0]) if flat.size else 0


def _fix(passes: list[tuple[str, str]], otherwise: str = "") -> str:
    """The passes that are registered, each with what it does; `otherwise` after them
    (or alone when none is)."""
    from graphfix.passes.registry import PASSES

    known = {p.name for p in PASSES}
    named = [f"{name} ({what})" for name, what in passes if name in known]
    return ", or ".join(named + ([otherwise] if otherwise else []))


def _parser_notes() -> dict[str, str]:
    return dict(parser_behaviour_notes().get("NonMaxSuppression", {}))
