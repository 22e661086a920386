"""int64-to-int32: exact ops and dtypes after, onnxruntime numerics, checker, idempotence,
and the reason for every island that stays INT64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import (
    apply,
    assert_idempotent,
    assert_skips,
    build_model,
    feeds_for,
    ops,
    output_types,
    parse,
)
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import fingerprint, to_graph
from graphfix.passes.base import Note, PassContext
from graphfix.passes.int64_to_int32 import Int64ToInt32
from graphfix.passes.manager import run_passes
from graphfix.report import APPLIED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck
from graphfix.runtime.session import run_model

H = '<ir_version: 8, opset_import: ["" : 17]>'
INITS = "converted INT64 initializers to INT32"
INPUTS = "converted INT64 graph inputs to INT32"
INTERFACE = "graph input is now INT32: the model's interface changed, so callers must feed INT32"
TABLE = "float[8,3] d = {" + ", ".join(str(v / 4) for v in range(24)) + "}"


def _inits(model: onnx.ModelProto, graph: onnx.GraphProto | None = None) -> dict[str, int]:
    return {t.name: t.data_type for t in (graph or model.graph).initializer}


def _inputs(model: onnx.ModelProto) -> dict[str, int]:
    return {i.name: i.type.tensor_type.elem_type for i in model.graph.input}


def _narrowed(feeds: dict[str, np.ndarray], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The feeds in the dtypes `model` declares (values checked to survive the cast)."""
    out = {}
    for info in graph_inputs(model):
        value = feeds[info.name].astype(info.dtype)
        np.testing.assert_array_equal(value, feeds[info.name])
        out[info.name] = value
    return out


def assert_converts(model, ops_after, counts, notes=(), feed_sets=None, pass_=None):
    """Run the pass; check ops, counts, notes, checker (apply), output names and dtypes,
    numerics (inputs cast to the new interface), and that a second run changes nothing."""
    pass_ = pass_ or Int64ToInt32()
    out, result = apply(pass_, model)
    assert result.changed
    assert dict(result.counts) == counts
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert ops(out) == ops_after
    assert output_types(out) == output_types(model)
    for feeds in feed_sets or [feeds_for(model)]:
        before, after = run_model(model, feeds), run_model(out, _narrowed(feeds, out))
        assert list(after) == list(before)
        for name, ref in before.items():
            assert after[name].dtype == ref.dtype
            np.testing.assert_array_equal(after[name], ref, err_msg=name)
    assert_idempotent(pass_, out)
    return out


def assert_notes(model, notes, pass_=None) -> None:
    """The pass leaves the graph exactly as it was and gives exactly these notes."""
    graph = to_graph(model)
    before = fingerprint(graph)
    result = (pass_ or Int64ToInt32()).run(graph, PassContext())
    assert not result.changed and not result.counts
    assert [(n.subject, n.reason) for n in result.notes] == notes
    assert fingerprint(graph) == before


# ----------------------------------------------------------------------------- conversions


def test_gather_indices_initializer_becomes_int32():
    model = parse(H + f"""
    g (float[2,3] x) => (float[2,3] y) <{TABLE}, int64[2] idx = {{3, 1}}> {{
        r = Gather(d, idx)
        y = Add(r, x)
    }}""")
    out = assert_converts(model, ["Gather", "Add"], {INITS: 1})
    assert _inits(out)["idx"] == TensorProto.INT32
    assert numpy_helper.to_array(out.graph.initializer[1]).tolist() == [3, 1]


def test_slice_bounds_share_one_type_and_convert_together():
    model = parse(H + """
    g (float[4,6] x) => (float[4,3] y) <int64[1] s = {1}, int64[1] e = {4}, int64[1] a = {1}> {
        y = Slice(x, s, e, a)
    }""")
    out = assert_converts(model, ["Slice"], {INITS: 3})
    assert set(_inits(out).values()) == {TensorProto.INT32}


def test_constant_node_with_value_ints_becomes_int32():
    model = parse(H + f"""
    g (float[2,3] x) => (float[2,3] y) <{TABLE}> {{
        idx = Constant<value_ints=[2, 0]>()
        r = Gather(d, idx)
        y = Add(r, x)
    }}""")
    out = assert_converts(model, ["Constant", "Gather", "Add"],
                          {"converted INT64 Constant nodes to INT32": 1})
    assert out.graph.node[0].attribute[0].t.data_type == TensorProto.INT32
    assert out.graph.node[0].output == ["idx"]


def test_input_and_constant_tied_by_max_convert_together():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y) <{TABLE}, int64[1] c = {{1}}> {{
        m = Max(x, c)
        y = Gather(d, m)
    }}""")
    out = assert_converts(model, ["Max", "Gather"], {INPUTS: 1, INITS: 1}, [("x", INTERFACE)])
    assert _inputs(out)["x"] == TensorProto.INT32
    assert _inits(out)["c"] == TensorProto.INT32


def test_int64_input_gets_a_cast_before_the_op_that_needs_int64():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y, float[?,?] z) <{TABLE}> {{
        y = Gather(d, x)
        z = Reshape(d, x)
    }}""")
    feeds = {"x": np.array([4, 6], np.int64)}
    out = assert_converts(
        model, ["Gather", "Cast", "Reshape"],
        {INPUTS: 1, "inserted Cast to INT64 before an op that needs INT64": 1},
        [("x", INTERFACE)], [feeds])
    assert _inputs(out)["x"] == TensorProto.INT32
    cast, reshape = out.graph.node[1], out.graph.node[2]
    assert cast.input == ["x"] and reshape.input == ["d", cast.output[0]]


def test_constant_of_a_converted_island_stays_int64_for_an_op_that_needs_it():
    model = parse(H + f"""
    g (int64[2] x, float[2,3] w) => (float[2,3] y, float[1,2,3] z) <{TABLE}, int64[1] c = {{0}}> {{
        m = Max(x, c)
        y = Gather(d, m)
        z = Unsqueeze(w, c)
    }}""")
    out = assert_converts(model, ["Max", "Unsqueeze", "Gather"], {INPUTS: 1, INITS: 1},
                          [("x", INTERFACE)])
    assert _inits(out) == {"d": TensorProto.FLOAT, "c": TensorProto.INT64,
                           "c_int32": TensorProto.INT32}
    assert [list(n.input) for n in out.graph.node] == [["x", "c_int32"], ["w", "c"], ["d", "m"]]


def test_graph_output_keeps_its_name_and_int64():
    model = parse(H + """
    g (int64[3] x) => (int64[3] y) <int64[1] c = {2}> {
        y = Max(x, c)
    }""")
    out = assert_converts(
        model, ["Max", "Cast"],
        {INPUTS: 1, INITS: 1, "inserted Cast to INT64 before a graph output": 1},
        [("x", INTERFACE)])
    assert output_types(out) == [("y", TensorProto.INT64)]
    assert out.graph.node[1].output == ["y"]
    assert out.graph.node[0].output == ["y_int32"]


def test_constants_read_inside_if_branches_convert():
    then = "t () => (float[2,3] o) <int64[2] k = {5, 2}> { o = Gather(d, k) }"
    else_ = "e () => (float[2,3] o2) { o2 = Gather(d, j) }"
    model = parse(H + f"""
    g (bool cond, float[2,3] x) => (float[2,3] y) <{TABLE}, int64[2] j = {{7, 0}}> {{
        r = If(cond) <then_branch = {then}, else_branch = {else_}>
        y = Add(r, x)
    }}""")
    x = feeds_for(model)["x"]
    feed_sets = [{"cond": np.array(c), "x": x} for c in (True, False)]
    out = assert_converts(model, ["If", "Add"], {INITS: 2}, feed_sets=feed_sets)
    # onnx-graphsurgeon exports an outer constant read only in a subgraph into that subgraph
    branches = {a.name: _inits(out, a.g) for a in out.graph.node[0].attribute}
    assert branches["then_branch"]["k"] == TensorProto.INT32
    assert branches["else_branch"]["j"] == TensorProto.INT32


def test_input_read_inside_a_branch_gets_its_cast_in_the_main_graph():
    model = parse(H + f"""
    g (bool cond, int64[2] x) => (float[?,?] y) <{TABLE}> {{
        y = If(cond) <then_branch = t () => (float[?,?] o) {{ o = Reshape(d, x) }},
                      else_branch = e () => (float[?,?] o2) {{ o2 = Gather(d, x) }}>
    }}""")
    x = np.array([4, 6], np.int64)
    out = assert_converts(
        model, ["Cast", "If"],
        {INPUTS: 1, "inserted Cast to INT64 before an op that needs INT64": 1},
        [("x", INTERFACE)], [{"cond": np.array(c), "x": x} for c in (True, False)])
    branches = {a.name: [list(n.input) for n in a.g.node] for a in out.graph.node[1].attribute}
    assert branches == {"then_branch": [["d", "x_int64"]], "else_branch": [["d", "x"]]}


def test_subgraph_outputs_keep_int64_behind_a_cast():
    model = parse(H + """
    g (bool cond, int64[2] x) => (int64[2] y) {
        y = If(cond) <then_branch = t () => (int64[2] o) { o = Identity(x) },
                      else_branch = e () => (int64[2] o2) { o2 = Max(x, x) }>
    }""")
    x = np.array([4, 6], np.int64)
    out = assert_converts(
        model, ["If"], {INPUTS: 1, "inserted Cast to INT64 before a graph output": 2},
        [("x", INTERFACE)], [{"cond": np.array(c), "x": x} for c in (True, False)])
    branches = {a.name: [(n.op_type, list(n.output)) for n in a.g.node]
                for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": [("Identity", ["o_int32"]), ("Cast", ["o"])],
                        "else_branch": [("Max", ["o2_int32"]), ("Cast", ["o2"])]}


def test_eyelike_without_dtype_ties_its_output_and_with_dtype_does_not():
    model = parse(H + """
    g (float[2,3] x) => (float[2,3] y) <int64[2,3] c = {1, 2, 3, 4, 5, 6}> {
        e = EyeLike<dtype=1>(c)
        y = Add(e, x)
    }""")
    assert_converts(model, ["EyeLike", "Add"], {INITS: 1})
    tied = parse(H + """
    g () => (int64[2,3] y) <int64[2,3] c = {1, 2, 3, 4, 5, 6}> { y = EyeLike(c) }""")
    assert_notes(tied, [("c", "stays INT64: its type is tied to 'y', and "
                              "'y' is an output of the model, which keeps its dtype")])


# ----------------------------------------------------------------------------- stays


def test_reshape_shape_stays_int64_with_the_schema_reason():
    model = parse(H + """
    g (float[4,3] x) => (float[3,4] y) <int64[2] shape = {3, 4}> { y = Reshape(x, shape) }""")
    assert_skips(Int64ToInt32(), model, "shape",
                 "stays INT64: Reshape 'y' reads 'shape' as 'shape', which must be tensor(int64)")


@pytest.mark.parametrize(("value", "clamp"), [(3_000_000_000, 2147483647),
                                              (-3_000_000_000, -2147483647)])
def test_value_outside_int32_is_refused_not_truncated(value, clamp):
    model = parse(H + f"""
    g (int32[2] i) => (int64[2] y) <int64[3] big = {{{value}, 1, 2}}> {{ y = Gather(big, i) }}""")
    assert_skips(Int64ToInt32(), model, "big",
                 f"stays INT64: 'big' holds {value}, which does not fit in INT32 "
                 f"(TensorRT <= 8.6 would clamp it to {clamp})")


def test_add_of_input_and_constant_stays_as_one_island():
    # Converting c alone would break Add's type equality; converting both could overflow.
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y) <{TABLE}, int64[1] c = {{1}}> {{
        s = Add(x, c)
        y = Gather(d, s)
    }}""")
    why = ("stays INT64: its type is tied to 's', and Add 's' computes 's' by arithmetic, "
           "which could overflow INT32 where INT64 does not")
    assert_notes(model, [("x", why), ("c", why)])


def test_inputs_false_keeps_the_interface_and_the_island_with_it():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y) <{TABLE}, int64[1] c = {{1}}> {{
        m = Max(x, c)
        y = Gather(d, m)
    }}""")
    why = "'x' is a graph input, and inputs=false keeps the model's interface"
    pass_ = Int64ToInt32(Int64ToInt32.parse_options([("inputs", "false")]))
    assert_notes(model, [("x", f"stays INT64: {why}"),
                         ("c", f"stays INT64: its type is tied to 'x', and {why}")], pass_)


def test_constant_tied_to_a_shape_output_stays():
    model = parse(H + """
    g (float[4,3] x) => (float[12] y) <int64[1] c = {-1}> {
        s = Shape(x)
        t = Concat<axis=0>(s, c)
        f = ReduceProd<keepdims=1>(t)
        y = Reshape(x, f)
    }""")
    assert_skips(Int64ToInt32(), model, "c",
                 "stays INT64: its type is tied to 's', and "
                 "'s' is computed by Shape 's', which always computes it as tensor(int64)")


def test_constants_reaching_a_graph_output_stay():
    model = parse(H + """
    g () => (int64[3] y) <int64[1] a = {1}, int64[2] b = {2, 3}> { y = Concat<axis=0>(a, b) }""")
    why = "'y' is an output of the model, which keeps its dtype"
    assert_notes(model, [("a", f"stays INT64: its type is tied to 'y', and {why}"),
                         ("b", f"stays INT64: its type is tied to 'y', and {why}")])


def test_input_that_is_also_an_output_stays():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y, int64[2] x) <{TABLE}> {{ y = Gather(d, x) }}""")
    assert_skips(Int64ToInt32(), model, "x",
                 "stays INT64: 'x' is both a graph input and a graph output")


def test_constant_returned_by_an_if_branch_stays():
    model = parse(H + """
    g (bool cond) => (int64[2] y) {
        y = If(cond) <
            then_branch = t () => (int64[2] o) <int64[2] k = {1, 2}> { o = Identity(k) },
            else_branch = e () => (int64[2] o2) <int64[2] j = {3, 4}> { o2 = Identity(j) }>
    }""")
    assert_notes(model, [
        ("k", "stays INT64: its type is tied to 'o', and "
              "'o' is an output of a subgraph, which keeps its dtype"),
        ("j", "stays INT64: its type is tied to 'o2', and "
              "'o2' is an output of a subgraph, which keeps its dtype"),
    ])


def test_loop_inputs_stay_int64():
    model = parse(H + """
    g (bool go) => (int64[1] y) <int64 n = {3}, int64[1] v = {5}> {
        y = Loop(n, go, v) <body = b (int64 i, bool c, int64[1] a) => (bool co, int64[1] ao) {
            co = Identity(c)
            ao = Identity(a)
        }>
    }""")
    assert_notes(model, [
        ("n", "stays INT64: Loop 'y' reads 'n' as 'M', which must be tensor(int64)"),
        ("v", "stays INT64: Loop 'y' reads 'v' as 'v_initial', "
              "which must have the type its subgraph has"),
    ])


def test_op_without_schema_keeps_what_it_reads():
    c = numpy_helper.from_array(np.array([1, 2], np.int64), "c")
    node = helper.make_node("Frob", ["c"], ["y"], domain="acme")
    model = build_model([node], [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                        [c], checked=False)
    model.opset_import.append(helper.make_opsetid("acme", 1))
    assert_skips(Int64ToInt32(), model, "c",
                 "stays INT64: Frob 'y' reads 'c' but has no ONNX schema")


def test_nothing_to_do_says_so():
    model = parse(H + "g (float[2] x) => (float[2] y) { y = Relu(x) }")
    assert_skips(Int64ToInt32(), model, "graph",
                 "no INT64 initializers, Constant nodes or graph inputs")


# ----------------------------------------------------------------------------- manager


def _through_manager(model, pass_):
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model)))
    return run_passes(model, [(pass_.name, pass_)], check, PassContext())


def test_constants_convert_through_the_manager():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y) <{TABLE}, int64[8] idx = {{7, 5, 3, 1, 0, 2, 4, 6}}> {{
        r = Gather(d, idx)
        y = Gather(r, x)
    }}""")
    out, report = _through_manager(model, Int64ToInt32(Int64ToInt32.Options(inputs=False)))
    (record,) = report.passes
    assert record.status == APPLIED and record.check.startswith("passed")
    assert record.counts == {INITS: 1}
    assert _inits(out)["idx"] == TensorProto.INT32
    assert _inputs(out)["x"] == TensorProto.INT64
    assert record.notes == [str(Note("x", "stays INT64: 'x' is a graph input, "
                                          "and inputs=false keeps the model's interface"))]


def test_input_conversion_through_the_manager():
    model = parse(H + f"""
    g (int64[2] x) => (float[2,3] y) <{TABLE}> {{ y = Gather(d, x) }}""")
    out, report = _through_manager(model, Int64ToInt32())
    assert report.passes[0].status == APPLIED
    assert _inputs(out)["x"] == TensorProto.INT32
