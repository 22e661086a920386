"""Doctor `type-mismatch`: a type variable bound to two element types (what a float16
converter leaves when it misses tensors: onnxruntime refuses such models)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from doctorhelpers import findings, model, one, vi
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F, H = TP.FLOAT, TP.FLOAT16


def _refused_by_onnxruntime(m) -> bool:
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - onnxruntime's type error, whatever its class
        return True
    return False


def test_add_of_float_and_float16_is_found():
    w = numpy_helper.from_array(np.ones((4,), np.float16), "w")
    m = model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
              [vi("x", F, [2, 4])], [vi("y", F, [2, 4])], [w])
    assert _refused_by_onnxruntime(m)
    f = one(m, "10", "type-mismatch")
    assert (f.severity, f.nodes, f.tensors, f.op) == ("warn", ("Add 'add'",), ("x", "w", "y"),
                                                      "Add")
    assert "(T to float and float16)" in f.message
    assert "trtexec --fp16" in f.fix


def test_casts_whose_declared_output_contradicts_to_are_one_finding():
    nodes = [helper.make_node("Cast", ["x"], ["c1"], name="c1", to=F),
             helper.make_node("Cast", ["c1"], ["c2"], name="c2", to=F),
             helper.make_node("Relu", ["c2"], ["y"], name="r")]
    m = model(nodes, [vi("x", H, [3])], [vi("y", H, [3])])
    m.graph.value_info.extend([vi("c1", H, [3]), vi("c2", H, [3])])  # a converter's leftovers
    assert _refused_by_onnxruntime(m)
    f = one(m, "10", "type-mismatch")
    assert f.nodes == ("Cast 'c1'", "Cast 'c2'")
    assert f.tensors == ("c1", "c2")
    assert "(T2 to float and float16, one of them by its to attribute)" in f.message


def test_variadic_inputs_are_compared_with_each_other():
    m = model([helper.make_node("Concat", ["a", "b", "c"], ["y"], name="cat", axis=0)],
              [vi("a", F, [1]), vi("b", F, [1]), vi("c", H, [1])], [vi("y", F, [3])])
    assert _refused_by_onnxruntime(m)
    assert one(m, "10", "type-mismatch").nodes == ("Concat 'cat'",)


@pytest.mark.parametrize("case", ["float16 throughout", "casts", "if outputs",
                                  "sibling branches"])
def test_valid_models_have_no_finding(case):
    if case == "float16 throughout":
        w = numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
        m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", H, [2, 4])],
                  [vi("y", H, [2, 4])], [w])
    elif case == "casts":
        m = model([helper.make_node("Cast", ["x"], ["c"], to=H),
                   helper.make_node("Cast", ["c"], ["y"], to=F)],
                  [vi("x", F, [3])], [vi("y", F, [3])])
    elif case == "sibling branches":  # optimum's merged decoder: one name, two types
        def branch(name: str, to: int) -> onnx.GraphProto:
            return helper.make_graph(
                [helper.make_node("Cast", ["x"], ["c"], to=to),
                 helper.make_node("Cast", ["c"], [f"{name}_out"], to=F)],
                name, [], [vi(f"{name}_out", F, [3])],
                value_info=[vi("c", to, [3])])
        m = model([helper.make_node("If", ["cond"], ["y"], then_branch=branch("a", F),
                                    else_branch=branch("b", TP.INT64))],
                  [vi("cond", TP.BOOL, []), vi("x", F, [3])], [vi("y", F, [3])])
    else:  # If's outputs are a heterogeneous variadic: each may have its own type
        then = helper.make_graph([helper.make_node("Constant", [], ["t1"], value_float=1.0),
                                  helper.make_node("Constant", [], ["t2"], value_int=1)],
                                 "then", [], [vi("t1", F, []), vi("t2", TP.INT64, [])])
        other = helper.make_graph([helper.make_node("Constant", [], ["e1"], value_float=2.0),
                                   helper.make_node("Constant", [], ["e2"], value_int=2)],
                                  "else", [], [vi("e1", F, []), vi("e2", TP.INT64, [])])
        m = model([helper.make_node("If", ["cond"], ["y", "z"], then_branch=then,
                                    else_branch=other)],
                  [vi("cond", TP.BOOL, [])], [vi("y", F, []), vi("z", TP.INT64, [])])
    assert not _refused_by_onnxruntime(m)
    assert [f for f in findings(m, "10") if f.rule == "type-mismatch"] == []
