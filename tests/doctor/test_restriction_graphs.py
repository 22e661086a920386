"""Restriction sentences about If branches and Loop bodies, and restrictions of nodes
inside subgraphs (silero_vad: LSTMs inside Ifs, Ifs whose branches differ in rank)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from doctorhelpers import findings, messages, model, recurrent, said, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.doctor import diagnose
from graphfix.trt import parse_target

F = TP.FLOAT
ONLY = ["restrictions"]
SILERO = Path("/work/zoo/wheels/x_silero_vad-5.1.2-py3-none-any.whl/silero_vad/data/"
              "silero_vad.onnx")


def if_model(then_shape, else_shape, same_name=False):
    """If on a runtime condition: then Neg(x) -> reshaped, else Identity."""
    target = numpy_helper.from_array(np.array(then_shape, np.int64), "target")
    then = helper.make_graph([helper.make_node("Reshape", ["x", "target"], ["t"])], "then", [],
                             [vi("t", F, then_shape)])
    out = "t" if same_name else "e"
    other = helper.make_graph([helper.make_node("Reshape", ["x", "target"], [out])], "else",
                              [], [vi(out, F, else_shape)])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    return model([node], [vi("c", TP.BOOL, []), vi("x", F, [2, 3])], [vi("y", F, None)],
                 [target])


def test_if_branches_of_different_rank_from_10_1():
    m = if_model([6], [2, 3])
    assert said(m, "10.16") == [
        ("If: output 0: rank 1 in then_branch, 2 in else_branch",
         "matrix 10.16, If restriction: Output tensors of the two conditional branches must "
         "have the same rank and must have different names")]
    assert findings(if_model([1, 6], [2, 3]), "10.16", ONLY) == []


def test_if_branches_must_broadcast_before_10_1():
    assert messages(if_model([3, 2], [2, 3]), "8.6") == [
        "If: output 0: shapes [3, 2] and [2, 3] do not broadcast"]
    assert findings(if_model([1, 3], [2, 3]), "8.6", ONLY) == []


def test_if_branches_must_name_their_outputs_differently():
    assert messages(if_model([2, 3], [2, 3], same_name=True), "10.16") == [
        "If: output 0 is 't' in both branches"]


def loop_model(trip=True, carried_out_shape=(2,), scan=True, cond="pass"):
    """A Loop carrying v [2] (v + 1 each iteration), with a scan output of v."""
    body_nodes = [helper.make_node("Add", ["v_in", "one"], ["v_out"]),
                  helper.make_node("Identity", ["v_out"], ["s"])]
    if cond == "pass":
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:
        body_nodes.append(helper.make_node("Less", ["i", "lim"], ["cond_out"]))
    outputs = [vi("cond_out", TP.BOOL, []), vi("v_out", F, list(carried_out_shape))]
    body = helper.make_graph(
        body_nodes, "body",
        [vi("i", TP.INT64, []), vi("cond_in", TP.BOOL, []), vi("v_in", F, [2])],
        outputs + ([vi("s", F, [2])] if scan else []),
        [numpy_helper.from_array(np.ones(2, np.float32), "one"),
         numpy_helper.from_array(np.array(3, np.int64), "lim")])
    inits = [numpy_helper.from_array(np.array(5, np.int64), "m"),
             numpy_helper.from_array(np.array(True), "c")]
    node = helper.make_node("Loop", ["m" if trip else "", "c", "v0"],
                            ["v_last"] + (["scan"] if scan else []), name="loop", body=body)
    return model([node], [vi("v0", F, [2])], [vi("v_last", F, None)], inits, opset=13)


def test_loop_with_a_trip_count_and_steady_shapes_is_met():
    assert findings(loop_model(), "10.16", ONLY) == []


def test_loop_scan_outputs_need_a_trip_count():
    assert messages(loop_model(trip=False), "10.16") == [
        "Loop: it has 1 scan output(s) and no trip count `M`, so their length is decided at "
        "run time by its condition"]
    assert findings(loop_model(trip=False, scan=False), "10.16", ONLY) == []
    assert findings(loop_model(trip=False), "10.0", ONLY) == []  # not in the 10.0 matrix


def test_loop_that_computes_its_condition_is_unchecked():
    assert said(loop_model(cond="computed"), "10.16", "restriction-unchecked") == [
        ("Loop: TensorRT states a restriction doctor cannot check from the model alone",
         "matrix 10.16, Loop restriction: Scan output length cannot be dynamic")]


def test_loop_carried_value_must_keep_its_shape():
    m = loop_model(carried_out_shape=(2, 1), scan=False)
    assert messages(m, "10.16") == [
        "Loop: 'v_in' is rank 1 entering the body and 2 leaving it"]


def test_lstm_inside_an_if_branch_is_checked():
    lstm = recurrent("LSTM", ["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Tanh", "Relu"])
    then = helper.make_graph(list(lstm.graph.node), "then", [], [vi("y", F, None)],
                             list(lstm.graph.initializer))
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [vi("e", F, None)])
    node = helper.make_node("If", ["c"], ["out"], name="if", then_branch=then,
                            else_branch=other)
    m = model([node], [vi("c", TP.BOOL, []), vi("x", F, [5, 2, 3])], [vi("out", F, None)])
    found = [f for f in findings(m, "10.16", ONLY) if f.op == "LSTM"]
    assert [(f.rule, f.nodes) for f in found] == [
        ("restriction-violated", ("If 'if'.then_branch > LSTM 'rnn'",))]


@pytest.mark.skipif(not SILERO.exists(), reason="silero_vad 5.1.2 is not on this machine")
def test_silero_vad_lstms_are_checked_and_its_ifs_differ_in_rank():
    d = diagnose(onnx.load(SILERO), parse_target("10"), only=ONLY)
    assert [f for f in d.findings if f.op == "LSTM"] == []  # forward LSTMs: met
    violated = [f for f in d.findings if f.rule == "restriction-violated"]
    assert {f.op for f in violated} == {"If"}
    assert sum(len(f.nodes) for f in violated) == 16
    assert d.verdict() == "TensorRT 10.16 will parse this model: no — 16 blocking nodes"
