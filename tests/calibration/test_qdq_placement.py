"""graphfix.calibration.qdq placement rules (see calibration/_placement.py): exact edges for
residual Adds, Concat groups, pools, graph outputs, BatchNormalization, exclusions, skips."""

from __future__ import annotations

import numpy as np
import pytest
from gfhelpers import build_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from qdqhelpers import (
    assert_close_to_fp32,
    assert_trt_form,
    conv,
    conv_relu_conv,
    dq_sources,
    init,
    node,
    quantized,
    relu,
    residual_model,
    vi,
)

from graphfix.calibration import qdq
from graphfix.errors import GraphfixError


def test_residual_add_quantizes_the_residual_input_only():
    model = residual_model()
    plan, q = quantized(model)
    assert plan.edges == (("x", "conv1", 0), ("r", "conv2", 0), ("r", "add", 1))
    assert plan.activations == ("x", "r")
    sources = dq_sources(q)
    assert sources[("add", 1)] == "r" and ("add", 0) not in sources  # Conv side fuses
    assert node(q, "add").input[1] == node(q, "conv2").input[0]  # one shared pair
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_residual_add_with_two_conv_sides_keeps_the_longer_branch_fused():
    """ResNet downsample block: Add(shortcut conv, main conv): the shortcut is residual."""
    nodes = [conv("conv1", "x", "w1", "c1"), relu("relu1", "c1", "h"),
             conv("conv2", "h", "w2", "main"), conv("short", "x", "w3", "s"),
             helper.make_node("Add", ["s", "main"], ["y"], name="add")]
    inits = [init("w1", [4, 3, 3, 3], 1), init("w2", [4, 4, 3, 3], 2), init("w3", [4, 3, 3, 3], 3)]
    model = build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)], inits)
    plan, q = quantized(model)
    assert ("s", "add", 0) in plan.edges and not any(e[1] == "add" and e[2] == 1
                                                     for e in plan.edges)
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_add_without_a_fused_conv_side_stays_float():
    nodes = [relu("r1", "x", "a"), helper.make_node("Add", ["a", "x"], ["s"], name="add"),
             conv("conv", "s", "w", "y")]
    model = build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)],
                        [init("w", [2, 3, 3, 3])])
    assert qdq.plan(model).edges == (("s", "conv", 0),)


def concat_model():
    """Two convs concatenated, read by conv_c; `a` also read by conv_d."""
    nodes = [conv("conv_a", "x", "wa", "ca"), relu("relu_a", "ca", "a"),
             conv("conv_b", "x", "wb", "cb"), relu("relu_b", "cb", "b"),
             helper.make_node("Concat", ["a", "b"], ["c"], name="concat", axis=1),
             conv("conv_c", "c", "wc", "y1"), conv("conv_d", "a", "wd", "y2")]
    inits = [init("wa", [4, 3, 3, 3], 1), init("wb", [4, 3, 3, 3], 2),
             init("wc", [2, 8, 3, 3], 3), init("wd", [2, 4, 3, 3], 4)]
    return build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y1", None), vi("y2", None)], inits)


def test_concat_output_shares_its_scale_with_quantized_inputs():
    model = concat_model()
    plan = qdq.plan(model)
    assert plan.activations == ("x", "a", "c")
    assert plan.shared == (("a", "c"),)
    q = qdq.quantize(model, plan, {"x": 1.0, "a": 2.0, "c": 5.08})
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    assert inits["a_scale"] == inits["c_scale"] == np.float32(0.04)
    assert "b_scale" not in inits and node(q, "concat").input == ["a", "b"]
    assert_trt_form(q)


def test_concat_through_a_copy_op_is_grouped_by_the_quantized_tensor():
    nodes = [conv("conv_a", "x", "wa", "a"), conv("conv_b", "x", "wb", "b"),
             helper.make_node("Concat", ["a", "b"], ["c"], name="concat", axis=1),
             helper.make_node("Identity", ["c"], ["ci"], name="id"),
             conv("conv_c", "ci", "wc", "y"),
             conv("conv_d", "b", "wd", "y2")]
    inits = [init("wa", [4, 3, 3, 3], 1), init("wb", [4, 3, 3, 3], 2),
             init("wc", [2, 8, 3, 3], 3), init("wd", [2, 4, 3, 3], 4)]
    model = build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None), vi("y2", None)], inits)
    assert qdq.plan(model).shared == (("b", "ci"),)


def pool_model(pool):
    nodes = [conv("conv1", "x", "w1", "c1"), relu("relu", "c1", "r"),
             helper.make_node(pool, ["r"], ["p"], name="pool",
                              **({} if pool.startswith("Global") else {"kernel_shape": [2, 2]})),
             conv("conv2", "p", "w2", "y")]
    return build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)],
                       [init("w1", [4, 3, 3, 3], 1), init("w2", [2, 4, 3, 3], 2)])


@pytest.mark.parametrize("pool", ["AveragePool", "GlobalAveragePool"])
def test_average_pool_after_a_quantized_conv_gets_its_input_quantized(pool):
    model = pool_model(pool)
    plan, q = quantized(model)
    assert plan.edges == (("x", "conv1", 0), ("r", "pool", 0), ("p", "conv2", 0))
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


@pytest.mark.parametrize("pool", ["MaxPool", "GlobalMaxPool"])
def test_max_pool_commutes_so_only_its_consumer_is_quantized(pool):
    model = pool_model(pool)
    plan, q = quantized(model)
    assert plan.edges == (("x", "conv1", 0), ("p", "conv2", 0))
    assert_trt_form(q)


def test_average_pool_with_only_a_quantized_consumer_and_exclusion():
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], name="pool", kernel_shape=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w"], ["y"], name="gemm", transB=1)]
    model = build_model(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", None)], [init("w", [3, 18])])
    assert qdq.plan(model).edges == (("x", "pool", 0), ("f", "gemm", 0))
    plan = qdq.plan(model, exclude_op_types=["AveragePool"])
    assert plan.edges == (("f", "gemm", 0),)
    assert plan.skipped == (("AveragePool 'pool'", "excluded by op type (--exclude-op-types "
                                                   "AveragePool): its input stays float"),)


def test_a_graph_output_read_by_a_quantized_op_stays_float():
    nodes = [conv("conv1", "x", "w1", "c1"), relu("relu", "c1", "r"),
             conv("conv2", "r", "w2", "y")]
    model = build_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("r", None), vi("y", None)],
                        [init("w1", [4, 3, 3, 3], 1), init("w2", [2, 4, 3, 3], 2)])
    _, q = quantized(model)
    assert [o.name for o in q.graph.output] == ["r", "y"]
    assert node(q, "relu").output == ["r"]
    assert dq_sources(q)[("conv2", 0)] == "r"
    assert_trt_form(q)


def test_matmul_of_two_activations_is_skipped_with_a_reason():
    nodes = [helper.make_node("MatMul", ["x", "z"], ["y"], name="attn")]
    model = build_model(nodes, [vi("x", [2, 4]), vi("z", [4, 3])], [vi("y", None)], [])
    plan = qdq.plan(model)
    assert (plan.activations, plan.weights) == ((), ())
    assert plan.skipped == (("MatMul 'attn'", "both inputs are activations (attention-style "
                                              "MatMul): kept in float"),)


def test_unfolded_batchnorm_after_a_quantized_conv_is_refused():
    nodes = [conv("conv", "x", "w", "c"),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["y"],
                              name="bn")]
    inits = [init("w", [2, 3, 3, 3]), init("g", [2], 1), init("beta", [2], 2),
             init("mean", [2], 3), numpy_helper.from_array(np.ones(2, np.float32), "var")]
    model = build_model(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], inits)
    with pytest.raises(GraphfixError, match="BatchNormalization 'bn' after Conv 'conv'") as err:
        qdq.plan(model)
    assert "--passes fold-bn" in str(err.value)
    plan = qdq.plan(model, exclude_nodes=["conv"])  # a float Conv may keep its BN
    assert plan.activations == ()


@pytest.mark.parametrize("other", ["reader", "graph output"])
def test_batchnorm_beside_another_reader_of_the_conv_stays_a_float_op(other):
    """maxvit_t's stem: the Conv's output is read by the BatchNormalization and by a
    shortcut (or is a graph output). Neither fold-bn (it would need a copy of the Conv)
    nor TensorRT (a second consumer stops the fusion) folds it, so the Conv is quantized
    as it is and the BatchNormalization stays float."""
    nodes = [conv("conv", "x", "w", "c"),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"],
                              name="bn")]
    outputs = [vi("n", None)]
    if other == "reader":
        nodes += [helper.make_node("AveragePool", ["c"], ["p"], name="pool", kernel_shape=[1, 1]),
                  helper.make_node("Add", ["n", "p"], ["y"], name="add")]
        outputs = [vi("y", None)]
    else:
        outputs.append(vi("c", None))
    inits = [init("w", [2, 3, 3, 3]), init("g", [2], 1), init("beta", [2], 2),
             init("mean", [2], 3), numpy_helper.from_array(np.ones(2, np.float32), "var")]
    model = build_model(nodes, [vi("x", [1, 3, 6, 6])], outputs, inits)
    plan, q = quantized(model)
    assert plan.weights == (("w", "conv", 0),)
    assert [n.op_type for n in q.graph.node if n.name in ("bn", "conv")] == \
        ["Conv", "BatchNormalization"]
    assert dq_sources(q).get(("bn", 0)) is None  # the BN reads the Conv's float output
    assert_trt_form(q)
    assert_close_to_fp32(model, q)


def test_batchnorm_before_a_conv_is_quantized_after_it():
    """BN -> Conv is not what fold-bn folds; the pair sits between them (TensorRT runs the
    BN as a scale layer)."""
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "beta", "mean", "var"], ["n"],
                              name="bn"), conv("conv", "n", "w", "y")]
    inits = [init("g", [3], 1), init("beta", [3], 2), init("mean", [3], 3),
             numpy_helper.from_array(np.ones(3, np.float32), "var"), init("w", [2, 3, 3, 3])]
    model = build_model(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)], inits)
    plan, q = quantized(model)
    assert plan.edges == (("n", "conv", 0),)
    assert_trt_form(q)


def test_exclude_by_name_keeps_the_node_float():
    model = conv_relu_conv()
    plan, q = quantized(model, exclude_nodes=["conv2"])
    assert plan.activations == ("x",) and plan.weights == (("w1", "conv1", 0),)
    assert plan.skipped == (("Conv 'conv2'", "excluded by name (--exclude-nodes)"),)
    assert node(q, "conv2").input == ["r", "w2"]
    assert_trt_form(q)


def test_exclude_by_op_type():
    nodes = [conv("conv", "x", "w", "c"),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wg"], ["y"], name="gemm", transB=1)]
    model = build_model(nodes, [vi("x", [1, 3, 2, 2])], [vi("y", None)],
                        [init("w", [2, 3, 3, 3]), init("wg", [5, 8], 1)])
    plan = qdq.plan(model, exclude_op_types=["Gemm"])
    assert plan.edges == (("x", "conv", 0),)
    assert plan.skipped == (("Gemm 'gemm'", "excluded by op type (--exclude-op-types Gemm)"),)


def test_unknown_exclusions_suggest_close_names():
    model = conv_relu_conv()
    with pytest.raises(GraphfixError, match="'conv3' \\(did you mean 'conv2', 'conv1'"):
        qdq.plan(model, exclude_nodes=["conv3"])
    with pytest.raises(GraphfixError, match="'Conv2d' \\(did you mean 'Conv'"):
        qdq.plan(model, exclude_op_types=["Conv2d"])
    assert qdq.plan(model, exclude_op_types=["MatMul"]).activations == ("x", "r")  # real op


def test_weighted_ops_in_subgraphs_are_reported_as_skipped():
    branch = helper.make_graph([conv("inner", "x", "w", "t")], "then",
                               [], [vi("t", None)])
    nodes = [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch,
                              else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", TP.BOOL, []),
                                           vi("x", [1, 3, 4, 4])], [vi("y", None)],
                              [init("w", [2, 3, 3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = qdq.plan(model)
    assert plan.activations == ()
    reason = "inside a subgraph: graphfix quantizes the main graph only"
    assert sorted(plan.skipped) == [("If 'if'.else_branch > Conv 'inner'", reason),
                                    ("If 'if'.then_branch > Conv 'inner'", reason)]


def test_a_bias_add_computed_from_constants_is_not_residual():
    """Paddle writes a Conv bias as Add(conv, Reshape(constant)): nothing to quantize there."""
    shape = numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "shape")
    nodes = [conv("conv", "x", "w", "c"),
             helper.make_node("Reshape", ["b", "shape"], ["b4"], name="reshape"),
             helper.make_node("Add", ["c", "b4"], ["y"], name="bias_add")]
    model = build_model(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", None)],
                        [init("w", [4, 3, 3, 3]), init("b", [4], 1), shape])
    assert qdq.plan(model).edges == (("x", "conv", 0),)


def test_a_weight_computed_from_constants_asks_for_fold_constants():
    nodes = [helper.make_node("Transpose", ["wt"], ["w"], name="t", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    model = build_model(nodes, [vi("x", [2, 8])], [vi("y", None)], [init("wt", [4, 8])])
    plan = qdq.plan(model)
    assert plan.activations == ()
    assert plan.skipped == (("MatMul 'mm'", "its weight (input 1) is computed from constants: "
                                            "run the fold-constants pass first"),)
