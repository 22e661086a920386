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


def _loop(inner_reads: str = "v", names: str = "ivw", const: float = 1.0,
          extra_identity: bool = False) -> onnx.ModelProto:
    """y = Loop(3, x) whose body (parameters named by `names`) runs an inner Loop(2)
    whose body adds `inner_reads` (the outer body's "v" or its own "w") and a constant
    `k` read from the main graph."""
    i, v, w = names
    inner = helper.make_graph(
        [helper.make_node("Identity", ["c2"], ["c2o"]),
         helper.make_node("Add", [w, {"v": v, "w": w}[inner_reads]], ["s"]),
         helper.make_node("Add", ["s", "k"], ["wo"])],
        "inner", [helper.make_tensor_value_info("j", TensorProto.INT64, []),
                  helper.make_tensor_value_info("c2", TensorProto.BOOL, []),
                  helper.make_tensor_value_info(w, F, [2, 4])],
        [helper.make_tensor_value_info("c2o", TensorProto.BOOL, []),
         helper.make_tensor_value_info("wo", F, [2, 4])])
    body_nodes = [helper.make_node("Identity", ["c"], ["co"]),
                  helper.make_node("Loop", ["two", "", v], ["vo0"], body=inner)]
    if extra_identity:
        body_nodes.append(helper.make_node("Identity", ["vo0"], ["vo"]))
    else:
        body_nodes[-1].output[0] = "vo"
    body = helper.make_graph(
        body_nodes, "body", [helper.make_tensor_value_info(i, TensorProto.INT64, []),
                             helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                             helper.make_tensor_value_info(v, F, [2, 4])],
        [helper.make_tensor_value_info("co", TensorProto.BOOL, []),
         helper.make_tensor_value_info("vo", F, [2, 4])])
    return _model([helper.make_node("Loop", ["three", "", "x"], ["y"], body=body)],
                  [numpy_helper.from_array(np.array(3, np.int64), "three"),
                   numpy_helper.from_array(np.array(2, np.int64), "two"),
                   numpy_helper.from_array(np.full((2, 4), const, np.float32), "k")])


def test_bodies_that_differ_only_in_names_and_identities_are_the_same_computation():
    a = _loop()
    b = _loop(names="abz", extra_identity=True)
    onnx.checker.check_model(b, full_check=True)
    assert same_computation(a, b)
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    np.testing.assert_array_equal(_run(a, x), _run(b, x))


@pytest.mark.parametrize("change", ["outer constant", "inner op", "scope read"])
def test_a_change_inside_a_body_is_not_the_same(change):
    base = _loop()
    if change == "outer constant":
        other = _loop(const=2.0)
    elif change == "scope read":
        # the inner body adds its own parameter instead of the outer body's: the two are
        # at the same position of their bodies, numbered apart by depth
        other = _loop(inner_reads="w")
    else:
        other = _loop()
        inner = other.graph.node[0].attribute[0].g.node[1].attribute[0].g
        inner.node[1].op_type = "Mul"
    onnx.checker.check_model(other, full_check=True)
    assert not same_computation(base, other)
    x = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    assert not np.array_equal(_run(base, x), _run(other, x))


def _run(model: onnx.ModelProto, feeds) -> np.ndarray:
    from graphfix.runtime.session import run_model

    return run_model(model, feeds)["y"]


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
