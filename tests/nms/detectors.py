"""Tiny detectors built in code for the NMS-region and split-nms tests.

Every model reads `feats` [B, N, 4 + C]: boxes = feats[..., :4] (corners), scores =
Sigmoid(feats[..., 4:]) in [B, N, C], transposed to [B, C, N] for NonMaxSuppression.
`controlled_feeds` gives inputs where several boxes survive NMS.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64
N, C = 12, 3


def _c(name: str, value, dtype=np.int64) -> onnx.NodeProto:
    arr = np.asarray(value, dtype=dtype)
    return helper.make_node("Constant", [], [name],
                            value=onnx.numpy_helper.from_array(arr, name))


def _heads(b: int = 1) -> list[onnx.NodeProto]:
    """feats -> boxes [b,N,4], scores [b,N,C], scores_t [b,C,N]; with a MatMul 'backbone'."""
    w = np.eye(4 + C, dtype=np.float32)
    return [
        helper.make_node("Constant", [], ["w"], value=onnx.numpy_helper.from_array(w, "w")),
        helper.make_node("MatMul", ["feats", "w"], ["raw"]),
        _c("s0", [0]), _c("s4", [4]), _c("s_end", [4 + C]), _c("ax2", [2]),
        helper.make_node("Slice", ["raw", "s0", "s4", "ax2"], ["boxes"]),
        helper.make_node("Slice", ["raw", "s4", "s_end", "ax2"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Transpose", ["scores"], ["scores_t"], perm=[0, 2, 1]),
    ]


def _limits(iou: float = 0.5, score: float = 0.3, k: int = 4) -> list[onnx.NodeProto]:
    return [_c("max_k", [k]), _c("iou", [iou], np.float32), _c("score_thr", [score], np.float32)]


def _tail(sel: str = "sel", prefix: str = "") -> list[onnx.NodeProto]:
    """sel [K,3] -> det_boxes [K,4] (the boxes of batch 0) and labels [K]."""
    return [
        _c(f"{prefix}two", 2), _c(f"{prefix}one", 1), _c(f"{prefix}zero", 0),
        helper.make_node("Gather", [sel, f"{prefix}two"], [f"{prefix}idx"], axis=1),
        helper.make_node("Gather", [sel, f"{prefix}one"], [f"{prefix}labels"], axis=1),
        helper.make_node("Gather", ["boxes", f"{prefix}zero"], [f"{prefix}boxes0"], axis=0),
        helper.make_node("Gather", [f"{prefix}boxes0", f"{prefix}idx"], [f"{prefix}det_boxes"],
                         axis=0),
    ]


def _model(nodes, outputs, inputs=None, b: int = 1) -> onnx.ModelProto:
    inputs = inputs or [helper.make_tensor_value_info("feats", F, [b, N, 4 + C])]
    graph = helper.make_graph(nodes, "detector", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _out(name: str, dtype=F, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def top_level(center: bool = False) -> onnx.ModelProto:
    """NMS in the main graph, a Gather tail: outputs det_boxes, labels."""
    nodes = [*_heads(), *_limits(),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"],
                              center_point_box=int(center), name="nms"),
             *_tail()]
    return _model(nodes, [_out("det_boxes", F, [None, 4]), _out("labels", I64, [None])])


def no_tail() -> onnx.ModelProto:
    """The NMS's selected indices are the graph output."""
    nodes = [*_heads(), *_limits(),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms")]
    return _model(nodes, [_out("sel", I64, [None, 3])])


def two_regions() -> onnx.ModelProto:
    """Two NMS on the same heads (iou 0.5 and 0.7), each with its own tail."""
    nodes = [*_heads(), *_limits(), _c("iou2", [0.7], np.float32),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms_a"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou2",
                                                    "score_thr"], ["sel2"], name="nms_b"),
             *_tail(), *_tail("sel2", "b_")]
    return _model(nodes, [_out("det_boxes", F, [None, 4]), _out("labels", I64, [None]),
                          _out("b_det_boxes", F, [None, 4])])


def input_thresholds() -> onnx.ModelProto:
    """iou and score thresholds are graph inputs (not constants)."""
    nodes = [*_heads(), _c("max_k", [4]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou_in",
                                                    "score_in"], ["sel"], name="nms"),
             *_tail()]
    inputs = [helper.make_tensor_value_info("feats", F, [1, N, 4 + C]),
              helper.make_tensor_value_info("iou_in", F, [1]),
              helper.make_tensor_value_info("score_in", F, [1])]
    return _model(nodes, [_out("det_boxes", F, [None, 4]), _out("labels", I64, [None])],
                  inputs)


def in_if() -> onnx.ModelProto:
    """torchvision-like: If(no candidates) then an empty keep, else NMS over outer boxes."""
    then = helper.make_graph([_c("empty", np.zeros([0], np.int64))], "then", [],
                             [_out("empty", I64, [0])])
    body = [*_limits(), _c("ax0", [0]),
            helper.make_node("Unsqueeze", ["boxes2d", "ax0"], ["b3"]),
            helper.make_node("Unsqueeze", ["scores1d", "ax0"], ["s2"]),
            helper.make_node("Unsqueeze", ["s2", "ax0"], ["s3"]),
            helper.make_node("NonMaxSuppression", ["b3", "s3", "max_k", "iou", "score_thr"],
                             ["sel"], name="nms"),
            _c("two", 2), helper.make_node("Gather", ["sel", "two"], ["keep"], axis=1)]
    orelse = helper.make_graph(body, "else", [], [_out("keep", I64, [None])])
    nodes = [*_heads(), _c("zero", 0), _c("one", 1),
             helper.make_node("Gather", ["boxes", "zero"], ["boxes2d"], axis=0),
             helper.make_node("Gather", ["scores", "zero"], ["scores2d"], axis=0),
             helper.make_node("Gather", ["scores2d", "one"], ["scores1d"], axis=1),
             helper.make_node("Size", ["boxes2d"], ["numel"]),
             _c("nothing", 0), helper.make_node("Equal", ["numel", "nothing"], ["empty_in"]),
             helper.make_node("If", ["empty_in"], ["keep_out"], then_branch=then,
                              else_branch=orelse, name="if_empty"),
             helper.make_node("Gather", ["boxes2d", "keep_out"], ["det_boxes"], axis=0),
             helper.make_node("Gather", ["scores1d", "keep_out"], ["det_scores"], axis=0)]
    return _model(nodes, [_out("det_boxes", F, [None, 4]), _out("det_scores", F, [None])])


def in_loop(b: int = 2) -> onnx.ModelProto:
    """Ultralytics-like per-image Loop: NMS on image i, selections concatenated."""
    body_nodes = [
        *_limits(), _c("ax0", [0]),
        helper.make_node("Gather", ["boxes", "i"], ["bi"], axis=0),
        helper.make_node("Gather", ["scores_t", "i"], ["si"], axis=0),
        helper.make_node("Unsqueeze", ["bi", "ax0"], ["bi3"]),
        helper.make_node("Unsqueeze", ["si", "ax0"], ["si3"]),
        helper.make_node("NonMaxSuppression", ["bi3", "si3", "max_k", "iou", "score_thr"],
                         ["sel_i"], name="nms"),
        helper.make_node("Concat", ["acc_in", "sel_i"], ["acc_out"], axis=0),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    body = helper.make_graph(
        body_nodes, "per_image",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", I64, [None, 3])],
        [_out("cond_out", TensorProto.BOOL, []), _out("acc_out", I64, [None, 3])])
    nodes = [*_heads(b), _c("trips", b), _c("acc0", np.zeros([0, 3], np.int64)),
             helper.make_node("Constant", [], ["go"], value=onnx.numpy_helper.from_array(
                 np.array(True), "go")),
             helper.make_node("Loop", ["trips", "go", "acc0"], ["selected"], body=body,
                              name="per_image_loop")]
    return _model(nodes, [_out("selected", I64, [None, 3])], b=b)


def two_stage() -> onnx.ModelProto:
    """A second stage (MatMul) reads the NMS's selected boxes."""
    nodes = [*_heads(), *_limits(),
             helper.make_node("NonMaxSuppression", ["boxes", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms"),
             *_tail(),
             helper.make_node("Constant", [], ["w2"], value=onnx.numpy_helper.from_array(
                 np.ones((4, 2), np.float32), "w2")),
             helper.make_node("MatMul", ["det_boxes", "w2"], ["refined"])]
    return _model(nodes, [_out("refined", F, [None, 2])])


def boxes_from_loop() -> onnx.ModelProto:
    """The boxes NMS reads are the output of a Loop that holds no NMS."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["boxes"], ["b_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "copy",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("b_in", F, [1, N, 4])],
        [_out("cond_out", TensorProto.BOOL, []), _out("b_out", F, [1, N, 4])])
    nodes = [*_heads(), *_limits(), _c("trips", 1),
             helper.make_node("Constant", [], ["go"], value=onnx.numpy_helper.from_array(
                 np.array(True), "go")),
             helper.make_node("Loop", ["trips", "go", "boxes"], ["looped"], body=body,
                              name="box_loop"),
             helper.make_node("NonMaxSuppression", ["looped", "scores_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms")]
    return _model(nodes, [_out("sel", I64, [None, 3])])


def plugin(op: str = "EfficientNMS_TRT", domain: str = "TRT") -> onnx.ModelProto:
    """A plugin NMS node with the yolov7 tuple quirk: scalar attributes as 1-element lists."""
    if op == "EfficientNMS_TRT":
        attrs = dict(score_threshold=[0.25], iou_threshold=[0.45], max_output_boxes=[100],
                     background_class=[-1], box_coding=[1], score_activation=[0],
                     plugin_version="1")
        outs = ["num_dets", "det_boxes", "det_scores", "det_classes"]
        inputs = ["boxes", "scores"]
    else:
        attrs = dict(shareLocation=[1], backgroundLabelId=[-1], numClasses=[C], topK=[100],
                     keepTopK=[50], scoreThreshold=[0.25], iouThreshold=[0.45],
                     isNormalized=[0], clipBoxes=[0])
        outs = ["num_dets", "det_boxes", "det_scores", "det_classes"]
        inputs = ["boxes4", "scores"]
    nodes = [*_heads(), _c("ax2b", [2]),
             helper.make_node("Unsqueeze", ["boxes", "ax2b"], ["boxes4"]),
             helper.make_node(op, inputs, outs, domain=domain, name="plugin_nms", **attrs)]
    graph = helper.make_graph(nodes, "plugin", [helper.make_tensor_value_info(
        "feats", F, [1, N, 4 + C])], [_out(o) for o in outs])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def controlled_feeds(b: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Well-separated boxes with high scores: several survive NMS in every class."""
    rng = np.random.default_rng(seed)
    feats = np.zeros((b, N, 4 + C), np.float32)
    for k in range(N):
        x, y = (k % 4) * 10.0, (k // 4) * 10.0
        feats[:, k, :4] = [x, y, x + 8 + rng.random(), y + 8 + rng.random()]
    feats[:, :, 4:] = rng.normal(1.0, 2.0, size=(b, N, C))
    return {"feats": feats}


def yolov7_ort(b: int = 2, k: int = 100, score: float = 0.3) -> onnx.ModelProto:
    """YOLOv7's ONNX_ORT end2end form: one-class NMS on boxes + ArgMax label * 4096,
    scores = ReduceMax [B,1,N]; the tail gathers [K, 7] = (image, box, class, score)."""
    nodes = [*_heads(b), *_limits(k=k, score=score), _c("span", 4096.0, np.float32),
             helper.make_node("ReduceMax", ["scores"], ["best"], axes=[2], keepdims=1),
             helper.make_node("ArgMax", ["scores"], ["label"], axis=2, keepdims=1),
             helper.make_node("Cast", ["label"], ["label_f"], to=F),
             helper.make_node("Mul", ["label_f", "span"], ["dis"]),
             helper.make_node("Add", ["boxes", "dis"], ["nmsbox"]),
             helper.make_node("Transpose", ["best"], ["best_t"], perm=[0, 2, 1]),
             helper.make_node("NonMaxSuppression", ["nmsbox", "best_t", "max_k", "iou",
                                                    "score_thr"], ["sel"], name="nms"),
             _c("zero", 0), _c("two", 2), _c("ax1", [1]),
             helper.make_node("Gather", ["sel", "zero"], ["x"], axis=1),
             helper.make_node("Gather", ["sel", "two"], ["y"], axis=1),
             helper.make_node("Unsqueeze", ["x", "ax1"], ["x1"]),
             helper.make_node("Unsqueeze", ["y", "ax1"], ["y1"]),
             helper.make_node("Concat", ["x1", "y1"], ["xy"], axis=1),
             helper.make_node("GatherND", ["boxes", "xy"], ["det_boxes"]),
             helper.make_node("GatherND", ["best", "xy"], ["det_scores"]),
             helper.make_node("GatherND", ["label_f", "xy"], ["det_labels"]),
             helper.make_node("Cast", ["x1"], ["x1f"], to=F),
             helper.make_node("Concat", ["x1f", "det_boxes", "det_labels", "det_scores"],
                              ["dets"], axis=1)]
    return _model(nodes, [_out("dets", F, [None, 7])], b=b)


def torchvision_batched(center: bool = False) -> onnx.ModelProto:
    """torchvision's batched_nms while exporting: image 0's boxes moved apart by
    label * (max(boxes) + 1), one-class NMS with the INT64_MAX cap and no score threshold;
    the tail gathers the kept boxes and labels."""
    nodes = [*_heads(), _c("max_k", [np.iinfo(np.int64).max]), _c("iou", [0.5], np.float32),
             _c("zero", 0), _c("ax0", [0]), _c("ax1", [1]), _c("one_f", 1.0, np.float32),
             helper.make_node("Gather", ["boxes", "zero"], ["boxes2d"], axis=0),
             helper.make_node("Gather", ["scores", "zero"], ["scores2d"], axis=0),
             helper.make_node("ReduceMax", ["scores2d"], ["best"], axes=[1], keepdims=0),
             helper.make_node("ArgMax", ["scores2d"], ["label"], axis=1, keepdims=0),
             helper.make_node("ReduceMax", ["boxes2d"], ["top"], keepdims=0),
             helper.make_node("Add", ["top", "one_f"], ["span"]),
             helper.make_node("Cast", ["label"], ["label_f"], to=F),
             helper.make_node("Mul", ["label_f", "span"], ["offsets"]),
             helper.make_node("Unsqueeze", ["offsets", "ax1"], ["offsets2d"]),
             helper.make_node("Add", ["boxes2d", "offsets2d"], ["moved"]),
             helper.make_node("Unsqueeze", ["moved", "ax0"], ["moved3"]),
             helper.make_node("Unsqueeze", ["best", "ax0"], ["best2"]),
             helper.make_node("Unsqueeze", ["best2", "ax0"], ["best3"]),
             helper.make_node("NonMaxSuppression", ["moved3", "best3", "max_k", "iou"],
                              ["sel"], center_point_box=int(center), name="nms"),
             _c("two", 2), helper.make_node("Gather", ["sel", "two"], ["keep"], axis=1),
             helper.make_node("Gather", ["boxes2d", "keep"], ["det_boxes"], axis=0),
             helper.make_node("Gather", ["label", "keep"], ["det_labels"], axis=0)]
    return _model(nodes, [_out("det_boxes", F, [None, 4]), _out("det_labels", I64, [None])])
