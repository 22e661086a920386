"""Write det.onnx: a tiny detector whose post-processing is ONNX NonMaxSuppression.

    feats [1, 12, 7] -> MatMul (the "backbone") -> boxes [1, 12, 4] (corners),
                                                   scores = Sigmoid(logits) [1, 12, 3]
    NonMaxSuppression(boxes, scores^T, max 8 per class, IoU 0.5, score 0.3) -> selected
    Gather tail -> det_boxes [K, 4] (the kept boxes of image 0), labels [K]

The NMS and everything after it form the part TensorRT handles badly (data-dependent
shapes); split-nms cuts the graph at boxes/scores.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N, C = 12, 3  # boxes, classes


def const(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(value, dtype), name))


rng = np.random.default_rng(0)
weights = (np.eye(4 + C) + 0.005 * rng.standard_normal((4 + C, 4 + C))).astype(np.float32)
nodes = [
    # The "backbone": one MatMul, then the two heads
    const("w", weights, np.float32),
    helper.make_node("MatMul", ["feats", "w"], ["raw"], name="backbone"),
    const("s0", [0]), const("s4", [4]), const("s_end", [4 + C]), const("axis2", [2]),
    helper.make_node("Slice", ["raw", "s0", "s4", "axis2"], ["boxes"], name="box_head"),
    helper.make_node("Slice", ["raw", "s4", "s_end", "axis2"], ["logits"], name="cls_head"),
    helper.make_node("Sigmoid", ["logits"], ["scores"], name="sigmoid"),
    # NMS wants scores as [batch, classes, boxes]
    helper.make_node("Transpose", ["scores"], ["scores_t"], perm=[0, 2, 1], name="transpose"),
    const("max_k", [8]), const("iou", [0.5], np.float32), const("score_thr", [0.3], np.float32),
    helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou", "score_thr"],
                     ["selected"], name="nms"),
    # selected [K, 3] = (batch, class, box) -> the kept boxes and their labels
    const("two", 2), const("one", 1), const("zero", 0),
    helper.make_node("Gather", ["selected", "two"], ["box_idx"], axis=1, name="box_idx"),
    helper.make_node("Gather", ["selected", "one"], ["labels"], axis=1, name="labels"),
    helper.make_node("Gather", ["boxes", "zero"], ["boxes0"], axis=0, name="image0"),
    helper.make_node("Gather", ["boxes0", "box_idx"], ["det_boxes"], axis=0, name="det_boxes"),
]
graph = helper.make_graph(
    nodes, "detector",
    [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, N, 4 + C])],
    [helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, [None, 4]),
     helper.make_tensor_value_info("labels", TensorProto.INT64, [None])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model, full_check=True)
onnx.save(model, "det.onnx")
print(f"wrote det.onnx ({len(nodes)} nodes, NonMaxSuppression 'nms')")
