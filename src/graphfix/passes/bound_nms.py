"""bound-nms: give every ONNX NonMaxSuppression a constant per-class cap, for TensorRT's
native NMS layer (INMSLayer, TensorRT 8.5+).

    NonMaxSuppression(boxes, scores, M, iou, score)       M > max, INT64_MAX or computed
        -> NonMaxSuppression(boxes, scores, max, iou, score)

TensorRT imports ONNX NonMaxSuppression natively from 8.5; its output has a
data-dependent shape whose upper bound the engine derives from
max_output_boxes_per_class (`graphfix.trt` parser notes: "clamped to INT32_MAX").
torchvision exports INT64_MAX there (SSDlite's NMS), which leaves the engine a bound of
2^31 rows per class. With a constant cap the selected-indices tensor, and every
Gather/TopK of the post-processing behind it, has a static upper bound of
batch x classes x max.

The rewrite changes results only where more than `max` boxes of one class survive in one
image: those are dropped (lowest scores first, as NMS selects in score order). The
per-pass check compares the outputs on its inputs and rolls back a cap that drops boxes
there: SSDlite keeps 300 boxes per image on random inputs (torchvision keeps 300
candidates per class), so bound-nms{max=100} is rolled back on it and {max=300} kept.
Pick `max` from your data, and check with it (`--data`).

Also noted, not changed: TensorRT's NMS layer considers only the top 5000 candidate
boxes per image (2000 on SM 5.3/6.2; same parser notes). A NonMaxSuppression with more
candidates, or whose candidate count the graph does not tell, gets a note.

Left alone, with a note: a cap already constant and <= max (including an absent one,
ONNX's default 0, "no output"), and a node whose cap is computed when `force` is off
(a computed cap may be smaller than `max`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError
from graphfix.graph import all_graphs, constant_value, is_onnx, names_in_use, node_label
from graphfix.passes.base import LIMIT_REACHED, Note, Pass, PassContext, PassResult

TOPK_LIMIT = 5000  # parser_behaviour_notes.NonMaxSuppression["8.5+"] in onnx_trt_operators.json
INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class BoundNmsOptions:
    """`max`: the per-class cap written into max_output_boxes_per_class; `force`: also
    replace a cap the graph computes."""

    max: int = 100
    force: bool = False

    def __post_init__(self) -> None:
        if self.max < 1:
            raise GraphfixError(
                f"Option 'max' of pass 'bound-nms' got {self.max}",
                "the per-class cap must be at least 1 (0 means NonMaxSuppression selects "
                "nothing)", "write bound-nms{max=100}")


class BoundNms(Pass):
    """Write a constant max_output_boxes_per_class into every ONNX NonMaxSuppression whose
    cap is larger than `max`, INT64_MAX, or (with `force`) computed; main graph and
    If/Loop bodies. Notes candidate counts above TensorRT's 5000-box limit."""

    name = "bound-nms"
    summary = "Constant per-class cap on ONNX NonMaxSuppression (TensorRT's native NMS layer)"
    Options = BoundNmsOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        names = names_in_use(graph)
        found = 0
        for g in all_graphs(graph):
            for node in [n for n in g.nodes if is_onnx(n, "NonMaxSuppression")]:
                found += 1
                self._candidates_note(node, result)
                reason = self._check(node)
                if reason:
                    result.notes.append(Note(node_label(node), reason))
                    continue
                if not ctx.allow_rewrite(self.name, node_label(node)):
                    result.notes.append(Note(node_label(node), LIMIT_REACHED))
                    continue
                _write_cap(node, self.options.max, names)
                result.changed = True
                result.counts[f"capped max_output_boxes_per_class at {self.options.max}"] += 1
        if not found:
            result.notes.append(Note("graph", "no ONNX NonMaxSuppression"))
        return result

    def _check(self, node: gs.Node) -> str | None:
        """Why this node's cap stays as it is, or None to rewrite it."""
        if len(node.inputs) < 3 or node.inputs[2].is_empty():
            return "no max_output_boxes_per_class: ONNX's default 0 selects nothing, a bound"
        value = constant_value(node.inputs[2])
        if value is None:
            if self.options.force:
                return None
            return ("its max_output_boxes_per_class is computed by the graph; "
                    "bound-nms{force=true} replaces it with the constant max")
        cap = int(np.asarray(value).reshape(-1)[0]) if np.size(value) else 0
        if cap <= self.options.max:
            return f"its max_output_boxes_per_class is already the constant {cap}"
        return None

    def _candidates_note(self, node: gs.Node, result: PassResult) -> None:
        shape = node.inputs[0].shape if node.inputs else None
        count = shape[1] if shape is not None and len(shape) == 3 else None
        if isinstance(count, (int, np.integer)) and 0 < count <= TOPK_LIMIT:
            return
        told = f"{count} candidate boxes" if isinstance(count, (int, np.integer)) and count > 0 \
            else "a candidate count the graph does not tell"
        result.notes.append(Note(node_label(node), (
            f"it gets {told}: TensorRT's NMS layer considers only the top {TOPK_LIMIT} "
            "per image (2000 on SM 5.3/6.2); keep the candidates below that with a TopK "
            "before it")))


def _write_cap(node: gs.Node, cap: int, names: set[str]) -> None:
    from graphfix.graph import fresh_name

    base = f"{node.name or node.outputs[0].name}_max_output_boxes_per_class"
    node.inputs[2] = gs.Constant(fresh_name(base, names), np.array([cap], np.int64))
