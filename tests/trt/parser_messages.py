"""Real TensorRT ONNX-parser messages, copied from public bug reports, with what
graphfix.trt.parser must read out of each.

Every `text` is quoted from the cited source (log timestamps and the program's own
prefix such as "RuntimeError: Failed to parse onnx, " kept where the reporter's output
had them; "\\n" marks a line break of the original). `trt` is the TensorRT release
the reporter states. None of these strings was made up; models that reproduce the
node names and indices are built in test_trt_parser.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PLUGIN_NOT_FOUND = '"Plugin not found, are the plugin name, version, and namespace correct?"'


@dataclass(frozen=True)
class RealMessage:
    key: str
    trt: str  # as the reporter states it
    source: str  # repository and issue
    text: str
    expect: dict = field(default_factory=dict)  # ParserError fields to check


MESSAGES = (
    # onnx/onnx-tensorrt issue #800 ("&&&& FAILED TensorRT.trtexec [TensorRT v8003]").
    RealMessage(
        "onnx-tensorrt-800", "8.0.3", "onnx/onnx-tensorrt#800",
        "[02/03/2022-06:14:51] [E] [TRT] ModelImporter.cpp:726: ERROR: "
        "builtin_op_importers.cpp:4643 In function importFallbackPluginImporter:\n"
        f"[8] Assertion failed: creator && {PLUGIN_NOT_FOUND}",
        dict(node_index=None, node_name=None, op_type=None, code="UNSUPPORTED_NODE",
             function="importFallbackPluginImporter"),
    ),
    # NVIDIA/TensorRT issue #2317 (Jetson, l4t-tensorrt r8.0.1 image).
    RealMessage(
        "tensorrt-2317", "8.0.1", "NVIDIA/TensorRT#2317",
        "In node 143 (importResize): UNSUPPORTED_NODE: Assertion failed: "
        'scales.is_weights() && "Resize scales must be an initializer!"',
        dict(node_index=143, node_name=None, op_type="Resize", code="UNSUPPORTED_NODE",
             function="importResize"),
    ),
    # open-mmlab/mmdeploy issue #1057 ("tensorrt: 8.2.3.0" in its environment dump).
    RealMessage(
        "mmdeploy-1057", "8.2.3.0", "open-mmlab/mmdeploy#1057",
        "RuntimeError: Failed to parse onnx, In node 2291 (importTopK): UNSUPPORTED_NODE: "
        "Assertion failed: (inputs.at(1).is_weights()) && "
        '"This version of TensorRT only supports input K as an initializer."',
        dict(node_index=2291, node_name=None, op_type="TopK", code="UNSUPPORTED_NODE",
             function="importTopK"),
    ),
    # Monday-Leo/YOLOv7_Tensorrt issue #1 ("FAILED TensorRT.trtexec [TensorRT v8401]").
    RealMessage(
        "yolov7-tensorrt-1", "8.4.1", "Monday-Leo/YOLOv7_Tensorrt#1",
        "[07/10/2022-18:30:00] [E] [TRT] ModelImporter.cpp:779: ERROR: ModelImporter.cpp:180 "
        "In function parseGraph:\n[6] Invalid Node - Mul_446\n"
        "[graphShapeAnalyzer.cpp::analyzeShapes::1294] Error Code 4: Miscellaneous "
        "(IElementWiseLayer Mul_446: broadcast dimensions must be conformable)",
        dict(node_index=None, node_name="Mul_446", op_type=None, code="INVALID_NODE",
             function="parseGraph"),
    ),
    # open-mmlab/mmdeploy issue #2774 ("tensorrt 8.6.1" in its package list).
    RealMessage(
        "mmdeploy-2774", "8.6.1", "open-mmlab/mmdeploy#2774",
        "RuntimeError: Failed to parse onnx, In node 426 (importFallbackPluginImporter): "
        f"UNSUPPORTED_NODE: Assertion failed: creator && {PLUGIN_NOT_FOUND}",
        dict(node_index=426, node_name=None, op_type=None, code="UNSUPPORTED_NODE",
             function="importFallbackPluginImporter"),
    ),
    # NVIDIA/TensorRT issue #3728 ("Internal Error failure of TensorRT 8.6.1 ...").
    RealMessage(
        "tensorrt-3728", "8.6.1", "NVIDIA/TensorRT#3728",
        "[03/21/2024-12:12:47] [TRT] [E] ModelImporter.cpp:777: ERROR: ModelImporter.cpp:195 "
        "In function parseGraph:\n[6] Invalid Node - /Where\n"
        "[graphShapeAnalyzer.cpp::checkCalculationStatusSanity::1503] Error Code 2: Internal "
        "Error (Assertion !isPartialWork(p.second.outputExtents) failed. )",
        dict(node_index=None, node_name="/Where", op_type=None, code="INVALID_NODE",
             function="parseGraph"),
    ),
    # NVIDIA/Model-Optimizer issue #2016 ("TensorRT: 10.3.0"): the str() of the error ...
    RealMessage(
        "modelopt-2016-str", "10.3.0", "NVIDIA/Model-Optimizer#2016",
        "Failed to parse ONNX file: In node 0 with name:  and operator: DummyOp "
        f"(checkFallbackPluginImporter): INVALID_NODE: creator && {PLUGIN_NOT_FOUND}",
        dict(node_index=0, node_name=None, op_type="DummyOp", code="INVALID_NODE",
             function="checkFallbackPluginImporter"),
    ),
    # ... and the two logger lines before it in the same report.
    RealMessage(
        "modelopt-2016-log", "10.3.0", "NVIDIA/Model-Optimizer#2016",
        "[07/31/2026-16:57:53] [TRT] [E] ModelImporter.cpp:954: ERROR: onnxOpCheckers.cpp:781 "
        f"In function checkFallbackPluginImporter:\n[6] creator && {PLUGIN_NOT_FOUND}",
        dict(node_index=None, node_name=None, op_type=None, code="INVALID_NODE",
             function="checkFallbackPluginImporter"),
    ),
    RealMessage(
        "modelopt-2016-registry", "10.3.0", "NVIDIA/Model-Optimizer#2016",
        "[07/31/2026-16:57:53] [TRT] [E] IPluginRegistry::getCreator: Error Code 4: API Usage "
        "Error (Cannot find plugin: DummyOp, version: 1, namespace:.)",
        dict(node_index=None, node_name=None, op_type="DummyOp", code=None),
    ),
    # NVIDIA/TensorRT issue #4488 (Jetson Orin Nano, "tensorrt10.3.0").
    RealMessage(
        "tensorrt-4488", "10.3.0", "NVIDIA/TensorRT#4488",
        "[06/13/2025-19:41:36] [E] [TRT] parsers/onnx/ModelImporter.cpp:961: While parsing "
        'node number 267 [Conv -> "/model/prediction/layers/layers.0/Conv_output_0"]:',
        dict(node_index=267, node_name=None, op_type="Conv", code=None,
             output="/model/prediction/layers/layers.0/Conv_output_0"),
    ),
    # spacewalk01/depth-anything-tensorrt issue #48 ("Tensorrt 10.3.0.20").
    RealMessage(
        "depth-anything-48", "10.3.0.20", "spacewalk01/depth-anything-tensorrt#48",
        "ModelImporter.cpp:953: ERROR: ModelImporter.cpp:222 In function parseNode:\n"
        "[5] Assertion failed: (node.output().size() <= static_cast<int32_t>(outputs.size())): "
        "Node has more output tensors than TRT expected, expected output size is 1, actual "
        "output size is 3.",
        dict(node_index=None, node_name=None, op_type=None, code="INVALID_GRAPH",
             function="parseNode"),
    ),
    # antgroup/ditto-talkinghead issue #45: release not stated; the 10.x message form and
    # onnxOpCheckers.cpp (a 10.x file) place it in TensorRT 10.
    RealMessage(
        "ditto-45", "10.x", "antgroup/ditto-talkinghead#45",
        "In node 11 with name: /dense_motion_network/GridSample and operator: GridSample3D "
        f"(checkFallbackPluginImporter): INVALID_NODE: creator && {PLUGIN_NOT_FOUND}",
        dict(node_index=11, node_name="/dense_motion_network/GridSample",
             op_type="GridSample3D", code="INVALID_NODE",
             function="checkFallbackPluginImporter"),
    ),
    # NVIDIA/TensorRT issue #425 ("TensorRT Version: 7.0").
    RealMessage(
        "tensorrt-425", "7.0", "NVIDIA/TensorRT#425",
        "In node 1511 (parseGraph): INVALID_GRAPH: Assertion failed: "
        "ctx->tensors().count(inputName)",
        dict(node_index=1511, node_name=None, op_type=None, code="INVALID_GRAPH",
             function="parseGraph"),
    ),
    # GeekAlexis/FastMOT issue #232 (rt.__version__ '7.2.0.14'): node -1 = no node.
    RealMessage(
        "fastmot-232", "7.2.0.14", "GeekAlexis/FastMOT#232",
        "2021-12-23 10:38:38 [   ERROR] In node -1 (scaleHelper): UNSUPPORTED_NODE: "
        "Assertion failed: dims.nbDims == 4 || dims.nbDims == 5",
        dict(node_index=None, node_name=None, op_type=None, code="UNSUPPORTED_NODE",
             function="scaleHelper"),
    ),
    # onnx/onnx-tensorrt issue #410 ("tensorrt 7.0.0.11"): two lines of one failure.
    RealMessage(
        "onnx-tensorrt-410-while", "7.0.0.11", "onnx/onnx-tensorrt#410",
        'While parsing node number 80 [Resize -> "301"]:',
        dict(node_index=80, node_name=None, op_type="Resize", code=None, output="301"),
    ),
    RealMessage(
        "onnx-tensorrt-410-error", "7.0.0.11", "onnx/onnx-tensorrt#410",
        "ERROR: /opt/onnx-tensorrt/ModelImporter.cpp:124 In function parseGraph:\n"
        "[5] Assertion failed: ctx->tensors().count(inputName)",
        dict(node_index=None, node_name=None, op_type=None, code="INVALID_GRAPH",
             function="parseGraph"),
    ),
)
