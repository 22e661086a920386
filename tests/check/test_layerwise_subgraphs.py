"""Layer-wise comparison inside subgraphs: If branches are inlined per sample group and
labelled with their path; Loop/Scan bodies are left out with a note."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.check._inline import prepare, split_by_branches
from graphfix.check._runs import SessionCache
from graphfix.check.layerwise import compare_layerwise

C = 4
SHAPE = [1, C, 8, 8]


def _weight(name: str, rng: np.random.Generator) -> onnx.TensorProto:
    w = rng.standard_normal((C, C, 3, 3)) / np.sqrt(C * 9)
    return numpy_helper.from_array(w.astype(np.float32), name)


def _conv(x: str, w: str, y: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w], [y], name=name, pads=[1, 1, 1, 1])


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, SHAPE)


def _then_branch(rng: np.random.Generator, nested: bool) -> onnx.GraphProto:
    """r1 -> Conv 'conv_a' (outer weight wa) -> Relu -> Conv 'c' (branch weight wc) -> Relu.
    With `nested`, Conv 'c' sits in the then branch of an inner If 'inner'."""
    tail = [_conv("tb", "wc", "tc", "c"), helper.make_node("Relu", ["tc"], ["t_out"],
                                                          name="relu_out")]
    inits = [_weight("wc", rng)]
    if nested:
        inner_then = helper.make_graph(tail, "inner_then", [], [_value("t_out")], inits)
        inner_else = helper.make_graph([helper.make_node("Neg", ["tb"], ["n_out"], name="neg2")],
                                       "inner_else", [], [_value("n_out")])
        tail = [helper.make_node("If", ["cond"], ["t_in"], name="inner",
                                 then_branch=inner_then, else_branch=inner_else),
                helper.make_node("Relu", ["t_in"], ["t_res"], name="relu_res")]
        inits = []
    body = [_conv("r1", "wa", "ta", "conv_a"),
            helper.make_node("Relu", ["ta"], ["tb"], name="relu_b"), *tail]
    return helper.make_graph(body, "then", [], [_value(body[-1].output[0])], inits)


def if_model(nested: bool = False) -> onnx.ModelProto:
    """x -> Conv 'conv1' -> Relu -> If 'sel' (sum(x) > 0) -> Conv 'conv2' -> Relu -> out.
    The else branch passes r1 on through Identity 'pass'."""
    rng = np.random.default_rng(0)
    else_branch = helper.make_graph([helper.make_node("Identity", ["r1"], ["e_out"], name="pass")],
                                    "else", [], [_value("e_out")])
    nodes = [
        _conv("x", "w1", "c1", "conv1"), helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["y"], name="sel",
                         then_branch=_then_branch(rng, nested), else_branch=else_branch),
        _conv("y", "w2", "c2", "conv2"), helper.make_node("Relu", ["c2"], ["out"], name="relu2"),
    ]
    inits = [_weight("w1", rng), _weight("wa", rng), _weight("w2", rng),
             numpy_helper.from_array(np.float32(0), "zero")]
    graph = helper.make_graph(nodes, "if_model", [_value("x")], [_value("out")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def perturb_branch_weight(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with one element of 'wc' (inside the branch, at any depth) moved by 0.05."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    from graphfix.graph.protos import graph_protos

    for graph in graph_protos(out.graph):
        for init in graph.initializer:
            if init.name == "wc":
                values = numpy_helper.to_array(init).copy()
                values.flat[values.size // 2] += 0.05
                init.CopyFrom(numpy_helper.from_array(values, "wc"))
    return out


def mixed_feeds() -> list[dict[str, np.ndarray]]:
    """Samples 0 and 2 take the then branch (sum(x) > 0), sample 1 the else branch."""
    rng = np.random.default_rng(1)
    return [{"x": (np.abs(rng.standard_normal(SHAPE)) * sign).astype(np.float32)}
            for sign in (1, -1, 1)]


def test_perturbed_conv_inside_if_branch_is_named_with_its_path():
    ref = if_model()
    report = compare_layerwise(ref, perturb_branch_weight(ref), mixed_feeds())
    first = report.first_divergence
    assert (first.name, first.node) == ("tc", "If 'sel'.then_branch > Conv 'c'")
    assert first.worst_sample in (0, 2) and first.node_key == "c"
    top = report.origins[0]
    assert (top.name, top.node, top.input_error) == ("tc", "If 'sel'.then_branch > Conv 'c'", 0)
    assert [o.node for o in report.origins] == ["If 'sel'.then_branch > Conv 'c'"]
    names = [t.name for t in report.tensors]
    assert names == ["x", "c1", "r1", "s", "cond", "ta", "tb", "tc", "t_out", "e_out", "y", "c2",
                     "out"]
    by = {t.name: t for t in report.tensors}
    assert by["ta"].node == "If 'sel'.then_branch > Conv 'conv_a'" and by["ta"].ok
    assert by["e_out"].node == "If 'sel'.else_branch > Identity 'pass'" and by["e_out"].ok
    assert by["e_out"].worst_sample == 1  # the only sample that took the else branch
    assert by["y"].node == "If 'sel'" and by["y"].op == "If" and by["y"].ok is False
    assert any("2 different combinations of If branches" in n for n in report.notes)


def test_unperturbed_if_model_passes_on_both_branches():
    ref = if_model()
    report = compare_layerwise(ref, if_model(), mixed_feeds())
    assert report.outputs_ok and report.first_divergence is None and report.origins == []
    assert report.tensor("tc").status == "compared"


def test_only_the_samples_that_take_the_branch_diverge():
    ref = if_model()
    feeds = mixed_feeds()
    report = compare_layerwise(ref, perturb_branch_weight(ref), [feeds[1]])
    assert report.outputs_ok and "tc" not in {t.name for t in report.tensors}


def test_nested_if_is_inlined_level_by_level():
    ref = if_model(nested=True)
    report = compare_layerwise(ref, perturb_branch_weight(ref), mixed_feeds())
    label = "If 'sel'.then_branch > If 'inner'.then_branch > Conv 'c'"
    assert report.first_divergence.node == label
    assert report.origins[0].node == label
    assert report.tensor("t_in").node == "If 'sel'.then_branch > If 'inner'"


def test_if_groups_and_chunking_give_the_same_results():
    ref = if_model()
    cand = perturb_branch_weight(ref)
    whole = compare_layerwise(ref, cand, mixed_feeds())
    chunked = compare_layerwise(ref, cand, mixed_feeds(), memory_budget=1)
    assert chunked.chunks > whole.chunks == 2  # one run per branch group
    assert chunked.tensors == whole.tensors and chunked.origins == whole.origins


def test_groups_follow_the_conditions_of_each_sample():
    ref = if_model()
    feeds = mixed_feeds()
    cache = SessionCache(feeds, {}, ("cpu",))
    groups = split_by_branches(prepare(ref), prepare(ref), [0, 1, 2], cache)
    assert sorted(g.samples for g in groups) == [[0, 2], [1]]
    for group in groups:
        ops = [n.op_type for n in group.reference.model.graph.node]
        assert "If" not in ops
        onnx.checker.check_model(group.reference.model)


def test_loop_body_tensors_are_left_out_with_a_note():
    body = helper.make_graph(
        [helper.make_node("Add", ["v", "x"], ["v_next"], name="add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "t", "x"], ["acc"], name="loop", body=body),
         helper.make_node("Relu", ["acc"], ["out"], name="relu")],
        "loop_model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.int64(3), "n"), numpy_helper.from_array(np.bool_(True), "t")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    report = compare_layerwise(model, model, [{"x": np.array([1.0, -2.0], np.float32)}])
    assert [t.name for t in report.tensors] == ["x", "acc", "out"]
    assert report.tensor("acc").node == "Loop 'loop'" and report.outputs_ok
    assert any("2 tensors inside Loop/Scan bodies are not compared" in n for n in report.notes)


def test_condition_given_as_a_graph_input():
    vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("x", "a", "b", "y")]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="relu")], "t", [],
                             [vec[1]])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["b"], name="neg")], "e", [],
                              [vec[2]])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="pick", then_branch=then, else_branch=other)],
        "flagged", [vec[0], helper.make_tensor_value_info("flag", TensorProto.BOOL, [])], [vec[3]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    feeds = [{"x": x, "flag": np.array(flag)} for flag in (True, False)]
    report = compare_layerwise(model, model, feeds)
    rows = {t.name: (t.node, t.worst_sample) for t in report.tensors}
    assert rows == {"x": ("graph input", 0), "flag": ("graph input", 0),
                    "a": ("If 'pick'.then_branch > Relu 'relu'", 0),
                    "b": ("If 'pick'.else_branch > Neg 'neg'", 1), "y": ("If 'pick'", 0)}
    assert report.outputs_ok
