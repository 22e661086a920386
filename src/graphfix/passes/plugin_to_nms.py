"""`plugin-to-nms`: TensorRT NMS plugin nodes become standard ONNX, under the same output names.

    EfficientNMS_TRT(boxes, scores) -> (num [B,1], boxes [B,K,4], scores [B,K], classes [B,K])
      == NonMaxSuppression per (image, class) + ScatterND + TopK(K) + padding
    BatchedNMS(Dynamic)_TRT likewise (per-class topK first, classes as float, -1 padding)
    NMS(Dynamic)_TRT(loc, conf, priors) -> (detections [B,1,keepTopK,7], keep_count [B,1,1,1])
      == prior decoding by codeType + the BatchedNMS form + the SSD DetectionOutput rows

The decompositions are `graphfix.nms.efficient` and `graphfix.nms.ssd` (also the plugins'
reference forms for the check): ONNX's strict thresholds are moved one float32 ulp
down, so EfficientNMS's `>=` holds exactly. The result runs in onnxruntime and builds
natively on TensorRT >= 11, where BatchedNMS*/NMS* are removed and EfficientNMS_TRT is
deprecated (since 10.12). Scalar attributes exported as one-element lists
(yolov6/yolov7's `box_coding = (1,)`) are read as scalars. Not handled, with a note:
EfficientNMS's anchors input, BatchedNMS's caffe IoU and box clipping, NMS_TRT with
isNormalized=0 (caffe IoU) and what else `nms.ssd` refuses, nodes in subgraphs.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from graphfix.graph.convert import node_proto
from graphfix.nms.efficient import batched_nms, efficient_nms
from graphfix.nms.onnxops import clashes, replace_node
from graphfix.nms.ssd import SSD_PLUGINS, detection_output
from graphfix.passes.base import LIMIT_REACHED, NoOptions, Note, Pass, PassContext, PassResult
from graphfix.runtime.references import Unavailable

_BUILD = {"EfficientNMS_TRT": efficient_nms, "BatchedNMS_TRT": batched_nms,
          "BatchedNMSDynamic_TRT": batched_nms,
          **{op: detection_output for op in SSD_PLUGINS}}
CONVERTS = tuple(_BUILD)  # the plugin op types this pass replaces
COUNT = "replaced NMS plugins by standard ONNX"


class PluginToNms(Pass):
    """Replaces EfficientNMS_TRT / BatchedNMS(Dynamic)_TRT / NMS(Dynamic)_TRT nodes of the
    main graph by their standard-ONNX decomposition; every graph output keeps its name."""

    name = "plugin-to-nms"
    summary = ("Replace EfficientNMS_TRT / BatchedNMS(Dynamic)_TRT / NMS(Dynamic)_TRT plugin "
               "nodes by standard ONNX (prior decoding, NonMaxSuppression, TopK) with the "
               "same outputs (for onnxruntime and TensorRT >= 11).")
    Options = NoOptions
    counts_rewrites = True

    def run(self, graph: gs.Graph, ctx: PassContext) -> PassResult:
        result = PassResult(changed=False)
        opset = graph.opset or 11
        for node in list(graph.nodes):
            label = f"{node.op} '{node.name}'"
            if node.op not in _BUILD:
                continue
            try:
                dec = _BUILD[node.op](node_proto(node), opset)
            except Unavailable as err:
                result.notes.append(Note(label, str(err)))
                continue
            if taken := clashes(graph, dec, {t.name for t in node.outputs}):
                result.notes.append(Note(label, f"its decomposition's names {taken[:3]} are "
                                                "taken in the graph"))
                continue
            if not ctx.allow_rewrite(self.name, label):
                result.notes.append(Note(label, LIMIT_REACHED))
                continue
            replace_node(graph, node, dec)
            result.counts[COUNT] += 1
            result.changed = True
        if not result.changed and not result.notes:
            result.notes.append(Note("graph", "no " + " / ".join(CONVERTS) + " node"))
        return result
