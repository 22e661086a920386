"""The work estimate: a Loop that would never finish is found before onnxruntime runs it."""

import time

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from typer.testing import CliRunner

import graphfix
from graphfix.check.layerwise import compare_layerwise
from graphfix.cli.app import app
from graphfix.runtime.work import (
    WORK_LIMIT,
    TooMuchWork,
    check_work,
    model_work,
    runaway_loops,
)

HUGE = 2**62
INT64_MAX = 2**63 - 1


def _body(cond: str = "pass") -> onnx.GraphProto:
    """v -> v + 1; the condition passed through, computed (v < 5), or a constant false."""
    nodes = [h.make_node("Add", ["v_in", "one"], ["v_out"])]
    if cond == "pass":
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    elif cond == "computed":
        nodes += [h.make_node("ReduceMax", ["v_out"], ["mx"], keepdims=0),
                  h.make_node("Less", ["mx", "five"], ["c_out"])]
    else:
        nodes.append(h.make_node("Constant", [], ["c_out"],
                                 value=h.make_tensor("", T.BOOL, [], [False])))
    return h.make_graph(
        nodes, "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, [2])],
        [h.make_tensor_value_info("c_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, [2])],
        [h.make_tensor("one", T.FLOAT, [], [1.0]), h.make_tensor("five", T.FLOAT, [], [5.0])])


def _loop_model(trips: int, cond: str = "pass", first: bool | None = None) -> onnx.ModelProto:
    """x -> Loop(trips) -> Identity -> Relu: eliminate-noops has an Identity to remove."""
    inits = [h.make_tensor("M", T.INT64, [], [trips])]
    if first is not None:
        inits.append(h.make_tensor("first", T.BOOL, [], [first]))
    nodes = [h.make_node("Loop", ["M", "first" if first is not None else "", "x"], ["y"],
                         body=_body(cond), name="loop"),
             h.make_node("Identity", ["y"], ["yi"]), h.make_node("Relu", ["yi"], ["z"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("z", T.FLOAT, [2])], inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_a_constant_trip_count_with_a_condition_that_never_turns_false_is_runaway():
    loops = runaway_loops(_loop_model(HUGE))
    assert [(w.node, w.trips, w.body) for w in loops] == [("loop", HUGE, 2)]
    assert "Loop 'loop' would run its body 4611686018427387904 times" in loops[0].describe()
    with pytest.raises(TooMuchWork, match="REFERENCE cannot be run: Loop 'loop'"):
        check_work(_loop_model(HUGE), label="REFERENCE")


def test_the_same_estimate_on_an_onnx_graphsurgeon_graph():
    graph = gs.import_onnx(_loop_model(HUGE))
    assert [(w.node, w.trips, w.body) for w in runaway_loops(graph)] == [("loop", HUGE, 2)]
    assert runaway_loops(gs.import_onnx(_loop_model(10))) == []


def test_the_estimate_reads_a_lazy_trip_count_without_loading_it(tmp_path):
    # Constant.values would replace gs's lazy value object: the pass manager's fingerprint
    # then saw fold-constants change maskrcnn every round, and trt-prep hit its bound
    from graphfix.graph import fingerprint, to_graph

    path = tmp_path / "loop.onnx"
    onnx.save(_loop_model(HUGE), path, save_as_external_data=True, size_threshold=0)
    graph = to_graph(onnx.load(path))
    before = fingerprint(graph)
    assert [w.trips for w in runaway_loops(graph)] == [HUGE]
    assert fingerprint(graph) == before


@pytest.mark.parametrize(("model", "work"), [
    (_loop_model(10), 3 + 10 * 2),                 # Loop + Identity + Relu, 10 trips of 2
    (_loop_model(INT64_MAX, "computed"), 3 + 3),   # PyTorch's while: length is data's, once
    (_loop_model(HUGE, "pass", first=False), 3),   # never starts
    (_loop_model(HUGE, "false"), 3 + 2),           # stops after one trip: counted once
])
def test_loops_that_end_are_not_runaway(model, work):
    assert runaway_loops(model) == []
    assert model_work(model) == work
    check_work(model)  # no error


def test_nested_loops_multiply_and_the_outer_one_is_named():
    inner = _loop_model(10**4).graph.node[0]
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]),
         h.make_node("Loop", ["M", "", "v_in"], ["v_out"], body=inner.attribute[0].g,
                     name="inner")],
        "outer_body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, [2])],
        [h.make_tensor_value_info("c_out", T.BOOL, []),
         h.make_tensor_value_info("v_out", T.FLOAT, [2])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="outer")],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2])],
                     [h.make_tensor("M", T.INT64, [], [10**4])])  # inner reads it from outside
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    loops = runaway_loops(model)
    assert [(w.node, w.trips) for w in loops] == [("outer", 10**4)]
    assert loops[0].work == 10**4 * (2 + 10**4 * 2) > WORK_LIMIT
    assert runaway_loops(model, limit=10**9) == []


def test_run_skips_the_check_of_an_endless_loop_with_a_note_and_still_rewrites():
    t0 = time.perf_counter()
    result = graphfix.run(_loop_model(HUGE), passes="eliminate-noops")
    assert time.perf_counter() - t0 < 30
    assert not result.report.check.enabled
    reason = result.report.check.skipped_reason
    assert "Loop 'loop' would run its body 4611686018427387904 times" in reason
    assert "onnxruntime would not finish" in reason
    assert [n.op_type for n in result.model.graph.node] == ["Loop", "Relu"]


def test_a_loop_of_ten_trips_is_run_and_checked():
    result = graphfix.run(_loop_model(10), passes="eliminate-noops")
    assert result.report.check.enabled, result.report.check.skipped_reason
    assert result.report.passes[0].check.startswith("passed")
    assert [n.op_type for n in result.model.graph.node] == ["Loop", "Relu"]
    feeds = {"x": np.array([-20.0, 1.0], np.float32)}
    report = compare_layerwise(_loop_model(10), result.model, feeds)
    assert report.passed and report.outputs_ok
    assert report.tensor("z").status == "compared" and report.tensor("z").max_abs == 0


def test_check_refuses_an_endless_loop_before_running_it(tmp_path):
    path = tmp_path / "loop.onnx"
    onnx.save(_loop_model(HUGE), path)
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, ["check", str(path), str(path)])
    assert time.perf_counter() - t0 < 30
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "REFERENCE cannot be run: Loop 'loop' would run its body 4611686018427387904" in text
    with pytest.raises(TooMuchWork):
        compare_layerwise(_loop_model(HUGE), _loop_model(HUGE),
                          {"x": np.zeros(2, np.float32)})


def test_a_loop_only_inside_an_if_branch_is_still_found():
    # the look for a Loop before the estimate goes into bodies, proto and gs alike
    loop = _loop_model(HUGE)
    branch = h.make_graph(list(loop.graph.node[:1]), "then", [],
                          [h.make_tensor_value_info("y", T.FLOAT, [2])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["y2"])], "else", [],
                         [h.make_tensor_value_info("y2", T.FLOAT, [2])])
    g = h.make_graph([h.make_node("If", ["flag"], ["z"], then_branch=branch,
                                  else_branch=other, name="if")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [2]),
                      h.make_tensor_value_info("flag", T.BOOL, [])],
                     [h.make_tensor_value_info("z", T.FLOAT, [2])],
                     list(loop.graph.initializer))
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    assert [w.node for w in runaway_loops(model)] == ["loop"]
    assert [w.node for w in runaway_loops(gs.import_onnx(model))] == ["loop"]
    assert runaway_loops(_loop_model(10)) == []
