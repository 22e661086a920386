"""Reading real TensorRT ONNX-parser messages and tying them to nodes."""

from __future__ import annotations

import sys
import types

import onnx
import pytest
from onnx import helper
from parser_messages import MESSAGES

from graphfix.trt.parser import (
    ERROR_CODES,
    ParserError,
    map_errors_to_nodes,
    parse_error_message,
    run_trt_parser,
)

BY_KEY = {m.key: m for m in MESSAGES}


def test_recorded_messages_span_releases():
    assert len(MESSAGES) >= 6
    majors = {m.trt.split(".")[0] for m in MESSAGES}
    releases = {".".join(m.trt.split(".")[:2]) for m in MESSAGES if "x" not in m.trt}
    assert {"7", "8", "10"} <= majors and len(releases) >= 3


@pytest.mark.parametrize("real", MESSAGES, ids=lambda m: m.key)
def test_parse_real_message(real):
    error = parse_error_message(real.text)
    assert error.message == real.text
    for name, value in real.expect.items():
        assert getattr(error, name) == value, name


def test_description_is_the_parsers_own_words():
    error = parse_error_message(BY_KEY["mmdeploy-1057"].text)
    assert error.description.startswith("Assertion failed: (inputs.at(1).is_weights())")
    error = parse_error_message(BY_KEY["yolov7-tensorrt-1"].text)
    assert error.description.startswith("Invalid Node - Mul_446\n[graphShapeAnalyzer")


def test_bracketed_number_is_the_error_code_value():
    assert ERROR_CODES.index("UNSUPPORTED_NODE") == 8 and ERROR_CODES.index("INVALID_NODE") == 6


def test_text_without_parser_facts_gives_empty_fields():
    error = parse_error_message("Segmentation fault")
    assert error == ParserError("Segmentation fault", None, None, None, None)


def _model(nodes: list[onnx.NodeProto], functions=()) -> onnx.ModelProto:
    """A ModelProto holding `nodes` (only their names, ops and outputs matter here)."""
    graph = helper.make_graph(nodes, "g", [], [])
    return helper.make_model(graph, functions=list(functions))


def _fillers(count: int, start: int = 0) -> list[onnx.NodeProto]:
    return [helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"], name=f"id_{i}")
            for i in range(start, start + count)]


def _labels(messages: list[str], model: onnx.ModelProto) -> list[str | None]:
    return [label for _, label in map_errors_to_nodes(messages, model)]


def test_map_by_name_wins_over_index():
    grid = helper.make_node("GridSample3D", ["x", "g"], ["y"],
                            name="/dense_motion_network/GridSample", domain="custom")
    model = _model([*_fillers(3), grid, *_fillers(10, start=3)])  # not at index 11
    assert _labels([BY_KEY["ditto-45"].text], model) == [
        "GridSample3D '/dense_motion_network/GridSample'"]


def test_map_by_name_from_log_line():
    mul = helper.make_node("Mul", ["a", "b"], ["645"], name="Mul_446")
    model = _model([*_fillers(5), mul])
    assert _labels([BY_KEY["yolov7-tensorrt-1"].text], model) == ["Mul 'Mul_446'"]


def test_map_by_index_in_top_level_graph():
    topk = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="TopK_2291")
    model = _model([*_fillers(2291), topk])
    pairs = map_errors_to_nodes([BY_KEY["mmdeploy-1057"].text, BY_KEY["mmdeploy-2774"].text],
                                model)
    assert [label for _, label in pairs] == ["TopK 'TopK_2291'", "Identity 'id_426'"]
    assert pairs[0][0].op_type == "TopK"


def test_index_needs_a_matching_op():
    dummy = helper.make_node("DummyOp", ["x"], ["y"])  # unnamed: labelled by its output
    text = BY_KEY["modelopt-2016-str"].text  # "In node 0 with name:  and operator: DummyOp"
    assert _labels([text], _model([dummy])) == ["DummyOp 'y'"]
    assert _labels([text], _model(_fillers(1))) == [None]


def test_named_node_that_is_absent_is_not_guessed_by_index():
    model = _model([*_fillers(11), helper.make_node("GridSample3D", ["x"], ["y"])])
    assert _labels([BY_KEY["ditto-45"].text], model) == [None]


def test_map_by_output_tensor():
    conv = helper.make_node("Conv", ["x", "w"], ["/model/prediction/layers/layers.0/Conv_output_0"],
                            name="/model/prediction/layers/layers.0/Conv")
    model = _model([*_fillers(4), conv])  # index 267 in the report; the output decides
    assert _labels([BY_KEY["tensorrt-4488"].text], model) == [
        "Conv '/model/prediction/layers/layers.0/Conv'"]


def test_map_into_subgraph_and_local_function():
    where = helper.make_node("Where", ["c", "a", "b"], ["w"], name="/Where")
    body = helper.make_graph([where], "then", [], [])
    if_node = helper.make_node("If", ["cond"], ["o"], name="If_7", then_branch=body,
                               else_branch=helper.make_graph([], "else", [], []))
    grid = helper.make_node("GridSample3D", ["x"], ["y"], name="/dense_motion_network/GridSample")
    func = helper.make_function("custom", "Warp", ["x"], ["y"], [grid],
                                [helper.make_opsetid("", 17)])
    model = _model([if_node], functions=[func])
    assert _labels([BY_KEY["tensorrt-3728"].text, BY_KEY["ditto-45"].text], model) == [
        "If 'If_7'.then_branch > Where '/Where'",
        "function 'Warp' > GridSample3D '/dense_motion_network/GridSample'"]


def test_messages_without_a_node_map_to_none():
    keys = ["fastmot-232", "onnx-tensorrt-800", "depth-anything-48"]  # node -1, none, none
    model = _model(_fillers(3000))
    assert _labels([BY_KEY[k].text for k in keys], model) == [None, None, None]
    assert _labels([BY_KEY["tensorrt-425"].text], _model(_fillers(10))) == [None]  # past end


def test_run_trt_parser_without_tensorrt(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert run_trt_parser(str(tmp_path / "model.onnx")) is None


def _fake_tensorrt(version: str, errors: list[str], calls: dict) -> types.ModuleType:
    """Just enough of the tensorrt API for run_trt_parser's control flow."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version

    class ILogger:
        def __init__(self):
            pass

    class Network:
        pass

    class Builder:
        def __init__(self, logger):
            calls["logger"] = logger

        def create_network(self, flags):
            calls["flags"] = flags
            return Network()

    class OnnxParser:
        num_errors = len(errors)

        def __init__(self, network, logger):
            pass

        def parse_from_file(self, path):
            calls["path"] = path
            return not errors

        def get_error(self, i):
            return errors[i]

    trt.ILogger, trt.Builder, trt.OnnxParser = ILogger, Builder, OnnxParser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(EXPLICIT_BATCH=0)
    return trt


@pytest.mark.parametrize(("version", "flags"), [("10.3.0", 0), ("8.6.1", 1)])
def test_run_trt_parser_flow_with_fake_tensorrt(monkeypatch, tmp_path, version, flags):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"")
    calls: dict = {}
    text = BY_KEY["ditto-45"].text
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(version, [text], calls))
    assert run_trt_parser(str(path)) == [text]
    assert calls["flags"] == flags and calls["path"] == str(path)
    calls.clear()
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_tensorrt(version, [], calls))
    assert run_trt_parser(str(path)) == []
