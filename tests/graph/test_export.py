"""graph.export: onnx-graphsurgeon's export written into one ModelProto (byte-identical
to gs's), and `settle_constants`, which keeps a pass's large new arrays as protos."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from gfhelpers import parse
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.logger import G_LOGGER

from graphfix import io
from graphfix.graph import constant_value, to_graph
from graphfix.graph.convert import (
    SETTLE_MIN_ELEMENTS,
    export,
    export_skeleton,
    settle_constants,
)
from graphfix.graph.export import export_model
from graphfix.graph.shapes import infer_shapes
from graphfix.graph.skeleton import skeleton

BODIES = '<ir_version: 8, opset_import: ["" : 17, "local" : 1]>' + """
g (bool c, float[2] x) => (float[2] y, float[2] z) <float[2] k = {1.0, 2.0}> {
    one = Constant <value = float[2] {1.0, 1.0}> ()
    y = If(c) <
        then_branch = t () => (float[2] ty) { n = Neg(k) ty = Add(x, n) },
        else_branch = e () => (float[2] ey) { ey = Mul(x, one) }
    >
    z = local.scaled <alpha = 2.0> (x)
}
<domain: "local", opset_import: ["" : 17]>
scaled <alpha> (a) => (b) {
    s = Constant <value_float: float = @alpha> ()
    b = Mul(a, s)
}"""


def _gs_bytes(graph: gs.Graph) -> bytes:
    with G_LOGGER.suppress():
        return gs.export_onnx(graph, do_type_check=False).SerializeToString()


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large.onnx",
                                  "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                                  "mobilenet_v3_small_bn.onnx"])
def test_the_export_is_byte_identical_to_onnx_graphsurgeons_on_real_models(name, shared_model):
    path = shared_model(name)
    for weights in (True, False):
        graph = to_graph(io.load(str(path), weights=weights))
        assert export_model(graph).SerializeToString() == _gs_bytes(graph)


@pytest.mark.parametrize("name", ["ssdlite320_mobilenet_v3_large.onnx",
                                  "mobilenet_v3_small_bn.onnx"])
def test_inferred_shapes_export_as_gs_does_and_the_skeleton_drops_only_weights(name,
                                                                                shared_model):
    """After shape inference nearly every tensor has a value_info (filled in place here,
    not by gs): byte-identical still, also with unknown and named dims; `export_skeleton`
    equals `skeleton(export(...))` for lazy (file), in-memory and spilled weights."""
    path = shared_model(name)
    for weights in (True, False):
        graph = to_graph(io.load(str(path), weights=weights))
        infer_shapes(graph)
        inner = [t for t in graph.tensors().values() if isinstance(t, gs.Variable)
                 and t.shape and t not in graph.inputs]
        assert len(inner) > 100
        inner[0].shape = [None, "n", *inner[0].shape[2:]]
        inner[1].shape = []  # rank 0: an empty shape, not none
        big = gs.Constant("gf_big", np.arange(2048, dtype=np.float32).reshape(2, 1024))
        graph.nodes[0].outputs[0].outputs[0].inputs.append(big)  # a large in-memory one
        assert export_model(graph).SerializeToString() == _gs_bytes(graph)
        light, want = export_skeleton(graph), skeleton(export(graph))
        assert light.graph == want.graph  # the skeleton also drops the producer fields
        assert light.opset_import == want.opset_import and light.ir_version == want.ir_version
        assert "gf_big" in {i.name for i in light.graph.input}
        graph.nodes[0].outputs[0].outputs[0].inputs.pop()


def test_bodies_functions_and_attribute_references_export_as_gs_does():
    model = parse(BODIES)
    graph = to_graph(model)
    graph.nodes[1].outputs[0].shape = ["n"]  # value_info from a changed annotation too
    ours = export_model(graph)
    assert ours.SerializeToString() == _gs_bytes(graph)
    onnx.checker.check_model(ours, full_check=True)
    assert [f.name for f in ours.functions] == ["scaled"]


def test_large_new_arrays_are_kept_as_protos_and_export_the_same():
    model = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[128,128] x) => (float[128,128] y) <float[128,128] w = {1.0}> {
        a = Add(x, w)
        y = Mul(a, w)
    }""".replace("{1.0}", "{" + ", ".join(["1.0"] * 128 * 128) + "}"))
    graph = to_graph(model)
    big = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    small = np.ones(4, np.float32)
    graph.nodes[0].inputs[1] = gs.Constant("w_big", big)
    graph.nodes[1].inputs[1] = gs.Constant("w_small", small)
    assert big.size >= SETTLE_MIN_ELEMENTS > small.size
    before = export(graph).SerializeToString()
    assert settle_constants(graph) == 1
    settled, kept = graph.nodes[0].inputs[1], graph.nodes[1].inputs[1]
    assert type(settled._values) is LazyValues and kept._values is small
    np.testing.assert_array_equal(constant_value(settled), big)
    assert export(graph).SerializeToString() == before
    assert settle_constants(graph) == 0  # a second call finds nothing to do


def test_an_export_never_writes_to_the_model_its_constants_came_from():
    """gs writes a renamed constant's name into the imported model's own TensorProto;
    the output check's thread reads that model while the passes export (`runtime.outputs`).
    The export, and a fold's closure model, carry the new name in a copy."""
    from graphfix.passes._fold_closure import closure_model

    model = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[2] x) => (float[2] y, float[2] z) <float[2] w = {1.0, 2.0}, float[2] v = {3.0, 4.0}> {
        y = Add(x, w)
        z = Neg(v)
    }""")
    before = model.SerializeToString()
    graph = to_graph(model)
    w, v = graph.nodes[0].inputs[1], graph.nodes[1].inputs[0]
    assert isinstance(w._values, LazyValues) and isinstance(v._values, LazyValues)
    w.name, v.name = "w_renamed", "v_renamed"
    ours = export_model(graph)
    closure = closure_model([graph.nodes[1]], graph.nodes[1].outputs, graph)
    assert model.SerializeToString() == before
    assert [t.name for t in ours.graph.initializer] == ["w_renamed", "v_renamed"]
    assert [t.name for t in closure.graph.initializer] == ["v_renamed"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(ours.graph.initializer[0]),
                                  [1.0, 2.0])
    unchanged = export_model(to_graph(model))  # a name as it was: the source, copied
    assert unchanged.graph.initializer[1].SerializeToString() == model.graph.initializer[1] \
        .SerializeToString()
    onnx.checker.check_model(ours)


@pytest.mark.parametrize("value", [3, -1, 2**40, 0.1, float("inf"), "abc", "", "é",
                                   [1, 2, 3], [0.5, 2.0], [7]])
def test_plain_attributes_are_filled_as_make_attribute_writes_them(value):
    from onnx import helper

    from graphfix.graph.export import _fill_plain_attribute

    ours = onnx.AttributeProto()
    _fill_plain_attribute(ours, "k", value)
    assert ours.SerializeToString() == helper.make_attribute("k", value).SerializeToString()


def test_every_spilled_constant_is_one_the_skeleton_leaves_out():
    """A spilled tensor points at a file onnx.checker cannot see: the skeleton that the
    checker gets must never hold one (fold-bn was rolled back when 4 KB biases of 1,024
    floats were spilled, which the skeleton keeps inline)."""
    from graphfix.graph.skeleton import MAX_ELEMENTS
    from graphfix.spill import Spill

    model = parse('<ir_version: 8, opset_import: ["" : 17]>' + """
    g (float[1025] x) => (float[1025] y) {
        y = Identity(x)
    }""")
    for size, spilled in ((MAX_ELEMENTS, False), (MAX_ELEMENTS + 1, True)):
        graph = to_graph(model)
        x = graph.inputs[0]
        x.shape = [size]
        graph.outputs[0].shape = [size]
        add = gs.Node("Add", "add", inputs=[x, gs.Constant("c", np.ones(size, np.float32))],
                      outputs=[gs.Variable("z", np.float32, [size])])
        graph.nodes.append(add)
        graph.outputs.append(add.outputs[0])
        with Spill() as spill:
            assert settle_constants(graph, spill) == int(spilled)
            light = skeleton(export(graph))
            onnx.checker.check_model(light)
            assert ("c" in {i.name for i in light.graph.input}) is spilled


def test_attributes_gs_cannot_export_round_trip_typed_and_byte_exact():
    """tf2onnx leaves TensorFlow attributes on ops it cannot convert: a serialized
    `config_proto` (bytes that are not UTF-8) and an empty `_collective_manager_ids`.
    gs's import raises on the first and its export on the second (no element to type)."""
    from graphfix.graph import to_model

    raw = b"\n\x07\n\x03CPU\x10\x01\x82\x01\x00"
    node = onnx.helper.make_node("Call", ["x"], ["y"], domain="tf", name="call",
                                 config_proto=raw, plain="text")
    for name, kind in (("ids", onnx.AttributeProto.INTS),
                       ("scales", onnx.AttributeProto.FLOATS),
                       ("tags", onnx.AttributeProto.STRINGS)):
        node.attribute.add(name=name, type=kind)
    node.attribute.add(name="keys", type=onnx.AttributeProto.STRINGS, strings=[raw, b"k"])
    f32 = onnx.TensorProto.FLOAT
    body = onnx.helper.make_graph(  # a node with a body is imported by gs's own code
        [onnx.helper.make_node("Identity", ["x"], ["b"])], "body", [],
        [onnx.helper.make_tensor_value_info("b", f32, [2])])
    looped = onnx.helper.make_node("Call2", ["x"], ["z"], domain="tf", name="looped", body=body)
    looped.attribute.add(name="scales", type=onnx.AttributeProto.FLOATS)
    model = onnx.helper.make_model(
        onnx.helper.make_graph([node, looped], "g",
                               [onnx.helper.make_tensor_value_info("x", f32, [2])],
                               [onnx.helper.make_tensor_value_info("y", f32, [2]),
                                onnx.helper.make_tensor_value_info("z", f32, [2])]),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("tf", 1)])
    graph = to_graph(model)
    attrs = graph.nodes[0].attrs
    assert attrs["config_proto"] == raw and attrs["plain"] == "text"
    assert attrs["ids"] == [] and attrs["keys"] == [raw, "k"]
    out = to_model(graph, model)
    onnx.checker.check_model(out)
    written = {a.name: a for a in out.graph.node[0].attribute}
    assert written == {a.name: a for a in node.attribute}  # types and bytes as read
    scales = next(a for a in out.graph.node[1].attribute if a.name == "scales")
    assert scales.type == onnx.AttributeProto.FLOATS


def _merged_decoder(weight_elements: int = 4) -> onnx.ModelProto:
    """optimum's merged decoder, in small: an If whose branches are the same decoder, both
    reading the main graph's weight `w`, and naming a tensor alike (`c`) that one branch
    casts to float and the other to int64."""
    from onnx import TensorProto, helper, numpy_helper

    f32 = TensorProto.FLOAT
    n = weight_elements

    def branch(name: str, to: int) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Mul", ["x", "w"], ["m"]),
             helper.make_node("Cast", ["m"], ["c"], to=to),
             helper.make_node("Cast", ["c"], ["out"], to=f32)],
            name, [], [helper.make_tensor_value_info("out", f32, [n])])

    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch("with_past", f32),
                            else_branch=branch("no_past", TensorProto.INT64))
    weight = numpy_helper.from_array(np.arange(1, n + 1, dtype=np.float32), "w")
    graph = helper.make_graph([node], "merged",
                              [helper.make_tensor_value_info("x", f32, [n]),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])],
                              [helper.make_tensor_value_info("y", f32, [n])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_constant_both_branches_read_is_written_once_in_the_main_graph():
    from graphfix.graph import to_model
    from graphfix.graph.protos import graph_protos

    model = _merged_decoder()
    out = to_model(to_graph(model), model)
    onnx.checker.check_model(out)
    where = [[t.name for t in g.initializer] for g in graph_protos(out.graph)]
    assert where == [["w"], [], []]  # gs writes it into each branch instead
    with G_LOGGER.suppress():
        assert [[t.name for t in g.initializer]
                for g in graph_protos(gs.export_onnx(gs.import_onnx(model)).graph)] == [
                    [], ["w"], ["w"]]


def test_sibling_branches_keep_their_own_types_for_a_shared_name():
    from graphfix.graph.shapes import infer_shapes

    graph = to_graph(_merged_decoder())
    infer_shapes(graph)
    then, other = (a for a in graph.nodes[0].attrs.values())
    casts = {g.name: next(n for n in g.nodes if n.outputs[0].name == "c").outputs[0].dtype
             for g in (then, other)}
    assert casts == {"with_past": np.float32, "no_past": np.int64}


def test_a_merged_decoder_runs_every_pass_through_its_check():
    import graphfix

    model = _merged_decoder(weight_elements=2048)  # deferred: over the skeleton's 1,024
    for flag in (True, False):
        result = graphfix.run(model, input_values={"flag": [flag]})
        assert not result.report.rolled_back, [p.rollback_reason
                                               for p in result.report.rolled_back]
        assert result.report.check.enabled


def test_constants_of_one_name_in_sibling_branches_stay_in_their_branches():
    """onnxslim's silero_vad: both branches of an If hold a constant named alike, each
    read by its branch and by a body inside it. Written in the main graph, they were one
    name twice, which onnx.checker rejects (every pass rolled back)."""
    from onnx import TensorProto, helper, numpy_helper

    from graphfix.graph import to_model
    from graphfix.graph.protos import graph_protos
    from graphfix.runtime.session import run_model

    f32 = TensorProto.FLOAT

    def branch(name: str, value: float) -> onnx.GraphProto:
        inner = helper.make_graph([helper.make_node("Add", ["x", "k"], ["i"])], f"{name}_in",
                                  [], [helper.make_tensor_value_info("i", f32, [2])])
        return helper.make_graph(
            [helper.make_node("If", ["flag"], ["n"], then_branch=inner, else_branch=inner),
             helper.make_node("Mul", ["n", "k"], [f"{name}_out"])],
            name, [], [helper.make_tensor_value_info(f"{name}_out", f32, [2])],
            [numpy_helper.from_array(np.full(2, value, np.float32), "k")])

    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch("a", 2.0),
                            else_branch=branch("b", 3.0))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f32, [2]),
                                            helper.make_tensor_value_info(
                                                "flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", f32, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    out = to_model(to_graph(model), model)
    onnx.checker.check_model(out)
    # gs's placement: each graph that reads `k` holds it (the branches, and their bodies)
    assert [[t.name for t in g.initializer] for g in graph_protos(out.graph)] == [
        [], ["k"], ["k"], ["k"], ["k"], ["k"], ["k"]]
    x = np.array([1.0, -1.0], np.float32)
    for flag, want in ((True, (x + 2) * 2), (False, (x + 3) * 3)):
        feeds = {"x": x, "flag": np.array(flag)}
        np.testing.assert_array_equal(run_model(out, feeds)["y"], want)
