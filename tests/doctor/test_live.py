"""doctor's live TensorRT parser verdict, with the parser call replaced (no TensorRT here):
each message mapped to its node, None without tensorrt, a clear verdict when it cannot run."""

from __future__ import annotations

import onnx
from onnx import TensorProto as TP
from onnx import helper

from graphfix.doctor import live
from graphfix.errors import GraphfixError

# NVIDIA/TensorRT issue #3728 (TensorRT 8.6.1), as recorded in tests/trt/parser_messages.py.
WHERE_MESSAGE = ("[03/21/2024-12:12:47] [TRT] [E] ModelImporter.cpp:777: ERROR: "
                 "ModelImporter.cpp:195 In function parseGraph:\n[6] Invalid Node - /Where")


def where_model() -> onnx.ModelProto:
    node = helper.make_node("Where", ["c", "a", "b"], ["y"], name="/Where")
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("c", TP.BOOL, [2]),
                               helper.make_tensor_value_info("a", TP.FLOAT, [2]),
                               helper.make_tensor_value_info("b", TP.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    return helper.make_model(graph)


def test_errors_are_mapped_to_nodes(monkeypatch):
    monkeypatch.setattr(live, "run_trt_parser", lambda path: [WHERE_MESSAGE])
    verdict = live.live_verdict("m.onnx", where_model())
    assert verdict["verdict"] == "failed with 1 error(s)"
    assert verdict["errors"] == [{"message": WHERE_MESSAGE, "node": "Where '/Where'",
                                  "code": "INVALID_NODE"}]


def test_parsed_and_not_installed(monkeypatch):
    monkeypatch.setattr(live, "run_trt_parser", lambda path: [])
    assert live.live_verdict("m.onnx", where_model()) == {"verdict": "parsed", "errors": []}
    monkeypatch.setattr(live, "run_trt_parser", lambda path: None)
    assert live.live_verdict("m.onnx", where_model()) is None


def test_tensorrt_that_cannot_start(monkeypatch):
    def fail(path):
        raise GraphfixError("TensorRT could not start", "no GPU", "run where a GPU is")

    monkeypatch.setattr(live, "run_trt_parser", fail)
    verdict = live.live_verdict("m.onnx", where_model())
    assert verdict["verdict"].startswith("could not run: TensorRT could not start")
