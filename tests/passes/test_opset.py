"""opset: exact ops after, onnxruntime numerics, checker, idempotence, every skip reason,
and the graph the manager holds is the one converted."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import (
    apply,
    assert_idempotent,
    assert_same_outputs,
    assert_skips,
    feeds_for,
    ops,
    output_types,
    parse,
)
from onnx import TensorProto, helper, numpy_helper

from graphfix.errors import GraphfixError
from graphfix.graph import to_graph
from graphfix.passes.base import PassContext
from graphfix.passes.manager import run_passes
from graphfix.passes.opset import Opset
from graphfix.report import APPLIED
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck


def header(opset: int, *extra: str) -> str:
    imports = ", ".join([f'"" : {opset}', *extra])
    return f"<ir_version: 7, opset_import: [{imports}]>"


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {o.domain: o.version for o in model.opset_import}


def _inputs_of(model: onnx.ModelProto, op: str) -> list[list[str]]:
    return [list(n.input) for n in model.graph.node if n.op_type == op]


def assert_converts(model, version, ops_after, feed_sets=None, notes=()) -> onnx.ModelProto:
    """Convert; check opset, ops, counts, notes, checker (apply), outputs, numerics, and
    that a second run says the graph is already there."""
    pass_ = Opset(Opset.Options(version=version))
    out, result = apply(pass_, model)
    assert result.changed
    before = _opsets(model)[""]
    assert dict(result.counts) == {f"converted opset {before} to opset {version}": 1}
    assert [(n.subject, n.reason) for n in result.notes] == list(notes)
    assert _opsets(out)[""] == version
    assert ops(out) == ops_after
    assert output_types(out) == output_types(model)
    for feeds in feed_sets or [feeds_for(model)]:
        assert_same_outputs(model, out, feeds)
    assert_idempotent(pass_, out)
    return out


SQUEEZE_SPLIT = header(11) + """
g (float[1,3,1,4] x) => (float[3,2] y, float[3,2] z) <float[3,2] w = {1, 2, 3, 4, 5, 6}> {
    s = Squeeze<axes=[0, 2]>(x)
    a, b = Split<axis=1, split=[2, 2]>(s)
    y = Add(a, w)
    z = Mul(b, w)
}"""


def test_upgrade_moves_squeeze_axes_and_split_sizes_into_inputs():
    out = assert_converts(parse(SQUEEZE_SPLIT), 17,
                          ["Constant", "Constant", "Squeeze", "Split", "Add", "Mul"])
    squeeze = next(n for n in out.graph.node if n.op_type == "Squeeze")
    split = next(n for n in out.graph.node if n.op_type == "Split")
    assert not squeeze.attribute and len(squeeze.input) == 2
    assert [a.name for a in split.attribute] == ["axis"] and len(split.input) == 2
    values = {n.output[0]: numpy_helper.to_array(n.attribute[0].t).tolist()
              for n in out.graph.node if n.op_type == "Constant"}
    assert values == {squeeze.input[1]: [0, 2], split.input[1]: [2, 2]}


def test_upgrade_turns_upsample_into_resize():
    model = parse(header(9) + """
    g (float[1,2,3,3] x) => (float[1,2,6,6] y) <float[4] sc = {1, 1, 2, 2}> {
        y = Upsample<mode="nearest">(x, sc)
    }""")
    out = assert_converts(model, 17, ["Constant", "Resize"])
    assert _inputs_of(out, "Resize")[0][2] == "sc"


def test_downgrade_the_converter_supports():
    model = parse(header(13) + "g (float[2,4] x) => (float[2,4] y) { y = Softmax(x) }")
    assert_converts(model, 12, ["Softmax"])


def test_converts_inside_if_branches():
    model = parse(header(11) + """
    g (float[1,3,1,4] x, bool c) => (float[3,4] y) {
        y = If(c) <then_branch = t () => (float[3,4] o) { o = Squeeze<axes=[0, 2]>(x) },
                   else_branch = e () => (float[3,4] o2) { s = Squeeze<axes=[0, 2]>(x)
                                                            o2 = Neg(s) }>
    }""")
    x = feeds_for(model)["x"]
    feed_sets = [{"x": x, "c": np.array(c)} for c in (True, False)]
    out = assert_converts(model, 17, ["If"], feed_sets)
    branches = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert branches == {"then_branch": ["Constant", "Squeeze"],
                        "else_branch": ["Constant", "Squeeze", "Neg"]}


def test_other_domains_are_left_with_a_note():
    model = parse(header(11, '"com.microsoft" : 1') + """
    g (float[2,3] x) => (float[2,3] y) {
        s = com.microsoft.Gelu(x)
        y = Relu(s)
    }""")
    note = ("com.microsoft", "its nodes are left as they are (Gelu x1): "
                             "the converter changes only the default ONNX domain")
    out = assert_converts(model, 17, ["Gelu", "Relu"], notes=[note])
    assert _opsets(out) == {"": 17, "com.microsoft": 1}
    assert out.graph.node[0].domain == "com.microsoft"


# ----------------------------------------------------------------------------- large weights


def _large_weight_model() -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0], name="unsqueeze"),
             helper.make_node("MatMul", ["u", "W"], ["y"], name="matmul")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    onnx.checker.check_model(model, full_check=True)
    return model


def test_large_weights_skip_the_converter_and_keep_their_objects():
    model = _large_weight_model()
    graph = to_graph(model)
    weight = graph.tensors()["W"]
    result = Opset().run(graph, PassContext())
    assert result.changed and graph.opset == 17
    assert graph.tensors()["W"] is weight
    assert [t.name for t in graph.inputs] == ["x"]
    assert_converts(model, 17, ["Constant", "Unsqueeze", "MatMul"])


def test_conversion_through_the_manager_mutates_the_graph_it_holds():
    model = _large_weight_model()
    check = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model)))
    out, report = run_passes(model, [("opset{version=17}", Opset())], check, PassContext())
    (record,) = report.passes
    assert record.status == APPLIED and record.check.startswith("passed")
    assert record.counts == {"converted opset 11 to opset 17": 1}
    assert _opsets(out) == {"": 17}
    assert ops(out) == ["Constant", "Unsqueeze", "MatMul"]
    assert [i.name for i in out.graph.initializer] == ["W"]


# ----------------------------------------------------------------------------- does not apply


def test_already_at_the_version_is_a_noop_with_reason():
    model = parse(header(17) + "g (float[2] x) => (float[2] y) { y = Relu(x) }")
    assert_skips(Opset(), model, "graph", "it is already at opset 17")


def test_converter_failure_names_the_op_and_quotes_the_converter():
    pass_ = Opset(Opset.parse_options([("version", "9")]))
    model = parse(SQUEEZE_SPLIT)
    out, result = apply(pass_, model)
    assert not result.changed and ops(out) == ops(model)
    (note,) = result.notes
    assert note.subject == "Squeeze 's'"
    assert note.reason.startswith("onnx.version_converter cannot convert opset 11 to opset 9: ")
    assert "Squeeze" in note.reason.split(": ", 1)[1]
    assert_skips(pass_, model, note.subject, note.reason)


@pytest.mark.parametrize("text", ["0", "1000"])
def test_version_outside_what_onnx_knows_is_a_user_error(text):
    with pytest.raises(GraphfixError, match="Pass 'opset' got version="):
        Opset.parse_options([("version", text)])


# ----------------------------------------------------- the --trt default pipeline's downgrade

DYNAMO_18 = header(18) + """
g (float[1,4,6,6] x) => (float[1,2,1,1] y, float[1,2,6,6] z) <int64[2] hw = {2, 3}> {
    a, b = Split<axis = 1, num_outputs = 2>(x)
    y = ReduceMean<keepdims = 1, noop_with_empty_axes = 0>(a, hw)
    m = ReduceMax<keepdims = 1, noop_with_empty_axes = 1>(b, hw)
    z = Add(b, m)
}"""


def test_downgrade_of_a_dynamo_style_model_drops_the_reduce_attribute_17_lacks():
    """onnx's Reduce* downgrade keeps noop_with_empty_axes (only from 18): without the
    mend, onnx.checker rejects the result (`apply` runs it)."""
    out = assert_converts(parse(DYNAMO_18), 17, ["Split", "ReduceMean", "ReduceMax", "Add"])
    split = out.graph.node[0]
    assert [a.name for a in split.attribute] == ["axis"] and list(split.input) == ["x"]
    for node in out.graph.node:
        if node.op_type.startswith("Reduce"):
            assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {
                "axes": [2, 3], "keepdims": 1}


def test_noop_with_empty_axes_set_and_no_axes_is_said_not_mended():
    from graphfix.passes.opset import _repair

    node = helper.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    notes = _repair(model, 17)
    assert [(n.subject, n.reason) for n in notes] == [
        ("ReduceMean", "noop_with_empty_axes=1 with no axes has no ReduceMean-17 form")]
    assert [a.name for a in model.graph.node[0].attribute] == ["noop_with_empty_axes"]


def _to_target(model, trt):
    from graphfix.trt import parse_target

    ctx = PassContext(trt=parse_target(trt) if trt else None)
    return Opset(Opset.Options(to_target=True)), ctx


@pytest.mark.parametrize("trt, reason", [
    (None, "no --trt target: to-target has no range to fit"),
    ("10.16", "opset 18 is within the 9-24 that TensorRT 10.16's parser reads (operator "
              "table)"),
])
def test_to_target_leaves_a_model_the_target_reads(trt, reason):
    model = parse(DYNAMO_18)
    pass_, ctx = _to_target(model, trt)
    graph = to_graph(model)
    result = pass_.run(graph, ctx)
    assert not result.changed
    assert [(n.subject, n.reason) for n in result.notes] == [("graph", reason)]


def test_to_target_converts_into_the_targets_range_and_the_default_trt_run_parses(tmp_path):
    from typer.testing import CliRunner

    from graphfix.cli.app import app

    model = parse(DYNAMO_18)
    pass_, ctx = _to_target(model, "8.6")
    out, result = apply(pass_, model, ctx)
    assert dict(result.counts) == {"converted opset 18 to opset 17": 1}
    assert_same_outputs(model, out, feeds_for(model))
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    runner = CliRunner()
    res = runner.invoke(app, ["run", str(src), "-o", str(dst), "--trt", "8.6"])
    assert res.exit_code == 0, res.output
    assert _opsets(onnx.load(dst))[""] == 17
    res = runner.invoke(app, ["doctor", str(dst), "--trt", "8.6", "--no-parser"])
    assert res.exit_code == 0, res.output


PAD_19 = header(19) + """
g (float[1,2,4,4] x) => (float[1,2,6,6] y, float[1,2,4,4] z) <int64[8] p = {0,0,1,1,0,0,1,1}> {
    y = Pad<mode = "reflect">(x, p)
    z = Identity(x)
}"""


def test_downgrade_keeps_a_pad_without_axes_which_the_converter_has_no_adapter_for():
    out = assert_converts(parse(PAD_19), 17, ["Pad", "Identity"])
    assert out.graph.node[0].domain == ""
    assert {o.domain for o in out.opset_import} == {""}


@pytest.mark.parametrize("text, subject, why", [
    (header(18) + """
     g (float[5,3] x) => (float[3,3] a, float[2,3] b) {
         a, b = Split<axis = 0, num_outputs = 2>(x)
     }""", "Split 'a'", "num_outputs=2 does not divide the dim 5 into equal parts"),
    (header(18) + """
     g (float[1,2,4,4] x) => (float[1,2,4,6] y) <int64[2] p = {1, 1}, int64[1] ax = {3}> {
         y = Pad(x, p, , ax)
     }""", "Pad 'y'", "it uses input axes (from opset 18)"),
])
def test_downgrade_says_which_node_has_no_form_at_the_target(text, subject, why):
    graph = to_graph(parse(text))
    result = Opset(Opset.Options(version=17)).run(graph, PassContext())
    assert not result.changed
    (note,) = result.notes
    assert note.subject == subject
    assert note.reason.startswith("onnx.version_converter cannot convert opset 18 to opset 17")
    assert note.reason.endswith(f"; not held out of it: {subject}: {why}")


def test_an_op_version_not_known_to_keep_the_old_behaviour_is_not_held():
    """Squeeze-11 (negative axes) has no adapter to 9; 11 is not in ADDITIVE, so its node
    is left to the converter, which fails, and the note says why."""
    result = Opset(Opset.Options(version=9)).run(to_graph(parse(SQUEEZE_SPLIT)),
                                                 PassContext())
    assert not result.changed
    (note,) = result.notes
    assert note.reason.endswith("not held out of it: Squeeze-11 is not known to keep "
                                "Squeeze-1's behaviour (graphfix holds only versions that "
                                "add types, or attributes and inputs whose default is the "
                                "old behaviour)")


FROM_14 = header(14) + """
g (float[2,6] x) => (float[3,4] y) <int64[2] shape = {3, 4}, float[1] k = {2.0}> {
    r = Relu(x)
    m = Mul(r, k)
    d = Sub(m, k)
    y0 = Reshape<allowzero = 0>(d, shape)
    y = Reshape<allowzero = 1>(y0, shape)
}"""


def test_type_only_versions_are_held_down_to_opset_13():
    """onnx's converter has no 14 -> 13 adapter for Add/Mul/Sub/Relu/Reshape (14 added
    bfloat16, Reshape's allowzero): TensorRT 8.2 reads up to 13."""
    out = assert_converts(parse(FROM_14), 13, ["Relu", "Mul", "Sub", "Reshape", "Reshape"])
    # allowzero=0 is the default; =1 (as PyTorch's dynamo exporter writes it) changes
    # nothing for a constant shape without zeros: both dropped
    assert [len(n.attribute) for n in out.graph.node[-2:]] == [0, 0]


def test_a_dynamic_constant_of_shape_is_held_down_to_opset_17():
    """Probe 4: onnx's converter has no ConstantOfShape adapter from 20, whose versions
    since 9 only add types, so run --trt 8.6 on an opset-20 model with a dynamic fill
    (a lowered causal Attention's mask) stopped at opset 20."""
    text = header(20) + """
    g (float[N,4] x) => (float[N,4] y) {
        s = Shape(x)
        c = ConstantOfShape<value = float[1] {1.0}>(s)
        y = Add(x, c)
    }"""
    assert_converts(parse(text), 17, ["Shape", "ConstantOfShape", "Add"])


def test_allowzero_with_a_zero_in_the_shape_is_not_held():
    text = FROM_14.replace("int64[2] shape = {3, 4}", "int64[2] shape = {3, 0}").replace(
        "float[3,4] y", "float[3,0] y").replace("float[2,6] x", "float[3,0] x")
    result = Opset(Opset.Options(version=13)).run(to_graph(parse(text)), PassContext())
    assert not result.changed
    (note,) = result.notes
    assert note.reason.endswith("allowzero=1 with a shape that is not a constant without "
                                "zeros (only then is it the older Reshape)")


def test_a_plugin_node_in_the_default_domain_is_held_out_of_the_conversion():
    """substitute-plugins writes plugin nodes in the default domain; the converter knows
    no such op and would fail on it."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], name="s", axis=0, num_outputs=2),
             helper.make_node("MyPlugin_TRT", ["a"], ["p"], name="plug", plugin_version="1"),
             helper.make_node("Add", ["p", "b"], ["y"], name="add")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 18)])
    graph = to_graph(model)
    result = Opset(Opset.Options(version=17)).run(graph, PassContext())
    assert result.changed, result.notes
    assert graph.opset == 17
    assert [(n.op, n.domain or "") for n in graph.nodes] == [
        ("Split", ""), ("MyPlugin_TRT", ""), ("Add", "")]
    assert {d.domain for d in graph.import_domains or ()} <= {""}


def test_branch_weights_in_external_data_convert_from_another_directory(tmp_path,
                                                                        monkeypatch):
    """torch.cond's dynamo export: top-level weights read only inside If branches, in a
    .data file. The opset pass was rolled back when run from another directory:
    onnx.checker read the branch weights relative to it."""
    import graphfix

    rng = np.random.default_rng(0)

    def branch(name):
        return helper.make_graph([helper.make_node("MatMul", ["x", f"w{name}"], [f"y{name}"])],
                                 name, [], [helper.make_tensor_value_info(
                                     f"y{name}", TensorProto.FLOAT, [1, 64])])
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
         helper.make_node("Greater", ["m", "zero"], ["p"]),
         helper.make_node("If", ["p"], ["y"], then_branch=branch("t"),
                          else_branch=branch("e"))], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero"),
         numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "wt"),
         numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "we")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    src = tmp_path / "model" / "m.onnx"
    src.parent.mkdir()
    onnx.save(model, src, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    reference = onnx.load(src)  # the weights read back (save moved them out of `model`)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = graphfix.run(str(src), passes="opset{version=17}", check=True)
    (record,) = result.report.passes
    assert record.status == APPLIED, record.rollback_reason
    assert _opsets(result.model) == {"": 17}
    onnx.checker.check_model(result.model)
    for x in (np.full((1, 64), 1.0, np.float32), np.full((1, 64), -1.0, np.float32)):
        assert_same_outputs(reference, result.model, {"x": x})
