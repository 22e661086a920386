"""`graph.samecomp`: two models shown to compute the same thing from their graphs alone,
and the run's check skipping onnxruntime for a pass whose candidate is shown so."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.graph.samecomp import same_computation
from graphfix.runtime.outputs import OutputCheck

F = TensorProto.FLOAT


def _model(nodes, inits, outputs=("y",), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2, 4])],
        [helper.make_tensor_value_info(o, F, [2, 4]) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _w(name: str, value: float = 1.0, seed: int = 0) -> TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal((2, 4)) * value).astype(np.float32),
                                   name)


def _base() -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "a"], ["s"], name="add"),
                   helper.make_node("Mul", ["s", "b"], ["y"], name="mul")],
                  [_w("a"), _w("b", seed=1)])


def test_renames_identity_dead_nodes_and_order_are_the_same_computation():
    other = _model([helper.make_node("Identity", ["x"], ["x2"]),
                    helper.make_node("Neg", ["x"], ["dead"]),
                    helper.make_node("Add", ["x2", "A"], ["sum"], name="other"),
                    helper.make_node("Mul", ["sum", "B"], ["y"])],
                   [_w("B", seed=1), _w("A")])
    assert same_computation(_base(), other)


def test_identical_constants_and_duplicate_nodes_merge_into_the_same_computation():
    twice = _model([helper.make_node("Add", ["x", "a1"], ["s1"]),
                    helper.make_node("Add", ["x", "a2"], ["s2"]),
                    helper.make_node("Mul", ["s1", "s2"], ["y"])], [_w("a1"), _w("a2")])
    once = _model([helper.make_node("Add", ["x", "a1"], ["s1"]),
                   helper.make_node("Mul", ["s1", "s1"], ["y"])], [_w("a1")])
    assert same_computation(twice, once)


@pytest.mark.parametrize("change", ["weight by one ulp", "attribute", "op", "output order",
                                    "opset", "operand order"])
def test_any_change_of_what_is_computed_is_not_the_same(change):
    base = _base()
    other = onnx.ModelProto()
    other.CopyFrom(base)
    if change == "weight by one ulp":
        a = numpy_helper.to_array(other.graph.initializer[0]).copy()
        a.flat[3] = np.nextafter(a.flat[3], np.float32(np.inf))
        other.graph.initializer[0].CopyFrom(numpy_helper.from_array(a, "a"))
    elif change == "attribute":
        other.graph.node[1].attribute.append(helper.make_attribute("unused", 1))
    elif change == "op":
        other.graph.node[1].op_type = "Sub"
    elif change == "output order":
        base = _model(list(base.graph.node) + [helper.make_node("Neg", ["s"], ["z"])],
                      list(base.graph.initializer), outputs=("y", "z"))
        other = _model(list(base.graph.node), list(base.graph.initializer),
                       outputs=("z", "y"))
    elif change == "opset":
        other.opset_import[0].version = 16
    else:
        other.graph.node[0].input[:] = ["a", "x"]
    assert not same_computation(base, other)


def test_subgraphs_are_not_shown_either_way():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", F, [2, 4])])
    cond = numpy_helper.from_array(np.array(True), "c")
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=branch,
                                     else_branch=branch)], [cond])
    assert not same_computation(model, model)


def test_the_check_skips_onnxruntime_for_passes_shown_to_keep_the_computation(monkeypatch):
    dup = _model([helper.make_node("Identity", ["x"], ["i"]),
                  helper.make_node("Add", ["i", "a1"], ["s1"]),
                  helper.make_node("Add", ["i", "a2"], ["s2"]),
                  helper.make_node("Mul", ["s1", "s2"], ["y"])], [_w("a1"), _w("a2")])
    calls = []
    verify = OutputCheck.verify
    monkeypatch.setattr(OutputCheck, "verify",
                        lambda self, m: calls.append(1) or verify(self, m))
    result = graphfix.run(dup, passes="cleanup,dedup-constants,merge-duplicates")
    applied = [r for r in result.report.passes if r.status == "applied"]
    assert [r.spec for r in applied] == ["cleanup", "dedup-constants", "merge-duplicates"]
    assert calls == []  # none of them ran the model
    assert all("shown from the graph" in r.check for r in applied)
    assert [n.op_type for n in result.model.graph.node] == ["Add", "Mul"]
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)}
    import onnxruntime as ort

    def run(m):
        return ort.InferenceSession(m.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    np.testing.assert_array_equal(run(dup), run(result.model))


def test_a_pass_claiming_to_keep_the_computation_is_still_checked_when_it_does_not():
    """fold-bn does not claim it; cleanup removing an inference Dropout is not shown
    (Dropout is not modelled), so it is run."""
    model = _model([helper.make_node("Dropout", ["x"], ["d"]),
                    helper.make_node("Add", ["d", "a"], ["y"])], [_w("a")], opset=13)
    result = graphfix.run(model, passes="cleanup")
    (record,) = result.report.passes
    assert record.status == "applied" and "shown from the graph" not in record.check
    assert record.check.startswith("passed")
