"""split-nms: cut a detector before its NMS post-processing.

    model(x) = post(backbone(x))  ->  graph := backbone;  ctx.artifacts["split-nms"] := post

`backbone(x)` ends at the cut tensors (`nms.split`: the pre-NMS boxes and scores, the
tensors the data-dependent post-processing reads), and holds no NonMaxSuppression,
NonZero, If or Loop of the post-processing: it is what TensorRT builds. `post` takes
the cut tensors and gives the original outputs, with their names, for onnxruntime or
user code; `graphfix.nms.run_split` chains the two, and the CLI writes
`<stem>.nms.onnx` and `<stem>.split.json` beside the backbone.

The graph outputs change (they become the cut tensors), so the manager cannot compare
them with the original's (`Pass.changes_outputs`): the pass checks itself, on the run's
check input (`PassContext.samples`: the first --data batch, --input-value) and `runs`
seeded inputs (`runtime.feeds.model_feeds`, seeds `seed`, `seed + 1`, ...), that
backbone then post reproduces every original output — integers (labels, indices) and
shapes (detection counts) exactly, floats within `runtime.compare`'s verdict — and
refuses the split otherwise, as it refuses every model `nms.split` cannot cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphfix.errors import GraphfixError, said
from graphfix.graph import to_graph
from graphfix.graph.convert import runnable_model
from graphfix.nms.chain import SplitModel, run_split
from graphfix.nms.compare import inputs_said, verify_inputs
from graphfix.nms.parts import build_parts, tensor_info
from graphfix.nms.split import plan_split
from graphfix.passes.base import Note, Pass, PassContext, PassResult
from graphfix.runtime.compare import compare_outputs
from graphfix.runtime.expose import infer_tensor_info
from graphfix.runtime.outputs import run_checkable


@dataclass(frozen=True)
class SplitNmsOptions:
    """runs: seeded inputs the split is verified on; seed: the first one's seed."""

    runs: int = 3
    seed: int = 0


class SplitNms(Pass):
    """Split the model into a TensorRT backbone and an NMS post-processing model.

    Handles ONNX NonMaxSuppression in the main graph, in If branches (torchvision) and
    in Loop bodies (Ultralytics' per-image loop), several NMS regions at once (the cut
    goes before all of them), thresholds that are not constants (they go with the
    post-processing), and an NMS whose result is itself a graph output.

    Refused with a note: no ONNX NonMaxSuppression (a TensorRT NMS plugin is left as
    it is); boxes or scores that come from an If/Loop not holding the NMS; a
    post-processing that would hold convolutions or matrix products (a two-stage
    detector); a split whose chained outputs differ from the original's, or that
    onnxruntime cannot run.
    """

    name = "split-nms"
    summary = ("Cut the model before its NMS post-processing: the graph becomes the backbone "
               "(for TensorRT); the post-processing is written beside it")
    Options = SplitNmsOptions
    leaves_graph_clean = False
    changes_outputs = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        if self.options.runs < 1:
            raise GraphfixError(f"split-nms{{runs={self.options.runs}}}",
                                "the split must be verified on at least one input",
                                "give runs=1 or more")
        model = runnable_model(graph)
        plan = plan_split(model)
        if isinstance(plan, str):
            result.notes.append(Note("graph", plan))
            return result
        try:
            feeds = self._feeds(model, ctx)
        except GraphfixError as err:
            result.notes.append(Note("graph", f"cannot make inputs to verify the split: "
                                              f"{err.message}"))
            return result
        parts = build_parts(model, plan, tensor_info(model), infer_tensor_info(model, feeds[0][1]))
        if isinstance(parts, str):
            result.notes.append(Note("graph", parts))
            return result
        backbone, nms, manifest = parts
        split = SplitModel(nms, manifest, backbone)
        problem, kept = _verify(model, split, feeds)
        if problem:
            result.notes.append(Note("graph", f"the split was not applied: {problem}"))
            return result
        _replace(graph, backbone)
        ctx.artifacts[self.name] = SplitModel(nms, manifest)
        result.changed = True
        result.counts["split off the NMS post-processing"] = 1
        result.counts["nodes moved to the NMS part"] = len(nms.graph.node)
        result.counts["cut tensors"] = len(manifest.cut)
        result.verified = (f"backbone + NMS part give the original outputs on "
                           f"{inputs_said(feeds)}; {kept}")
        return result

    def _feeds(self, model: onnx.ModelProto, ctx: PassContext
               ) -> list[tuple[str, dict[str, np.ndarray]]]:
        seeds = [self.options.seed + k for k in range(self.options.runs)]
        return verify_inputs(model, ctx.input_shapes, ctx.samples, seeds)


def _verify(model: onnx.ModelProto, split: SplitModel,
            feeds: list[tuple[str, dict[str, np.ndarray]]]) -> tuple[str, str]:
    """(what differs or cannot run — "" when all holds, what the NMS kept per run)."""
    kept = []
    first_nms = next((n for n, f in split.manifest.outputs if f == "nms"), None)
    for which, feed in feeds:
        try:
            reference = run_checkable(model, feed)
        except Exception as err:  # onnxruntime's many error types, NotCheckable
            return f"onnxruntime cannot run the original model: {said(err)}", ""
        try:
            chained = run_split(split, feed)
        except Exception as err:
            return f"onnxruntime cannot run the parts: {said(err)}", ""
        bad = [d for d in compare_outputs(reference, chained) if not d.ok]
        if bad:
            return (f"on {which}, the chained parts differ: "
                    + "; ".join(d.describe() for d in bad)), ""
        if first_nms is not None:
            kept.append(str(np.shape(reference[first_nms])[0] if np.ndim(reference[first_nms])
                            else 1))
    what = f"'{first_nms}' has {', '.join(kept)} row(s)" if kept else "no NMS output"
    return "", what


def _replace(graph: gs.Graph, backbone: onnx.ModelProto) -> None:
    """Make `graph` the backbone (the pass contract: mutate the graph given)."""
    new = to_graph(backbone)
    graph.nodes = new.nodes
    graph.inputs = new.inputs
    graph.outputs = new.outputs
