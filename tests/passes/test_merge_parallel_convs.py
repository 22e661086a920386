"""merge-parallel-convs: RepVGG/MobileOne training-form blocks as one Conv: exact ops
after, onnxruntime numerics, checker, idempotence, and the sums it leaves (with why)."""

import numpy as np
import onnx
import pytest
from gfhelpers import (
    assert_rewrites,
    assert_same_outputs,
    assert_skips,
    build_model,
    feeds_for,
    init,
    ops,
    seeded,
    value,
)
from onnx import helper

from graphfix.api import run as api_run
from graphfix.passes.merge_parallel_convs import MergeParallelConvs

KEY = "merged sums of parallel branches into one Conv"
C = 4


def _conv(name, k, x="x", stride=1, group=1, dilation=1, pads=None, bias=True, seed=0,
          channels=C):
    pad = dilation * (k - 1) // 2
    inputs = [x, f"{name}_w"] + ([f"{name}_b"] if bias else [])
    node = helper.make_node("Conv", inputs, [name], name=name, kernel_shape=[k, k],
                            strides=[stride, stride], group=group, dilations=[dilation] * 2,
                            pads=pads if pads is not None else [pad] * 4)
    inits = [init(f"{name}_w", seeded((channels, C // group, k, k), seed=seed))]
    if bias:
        inits.append(init(f"{name}_b", seeded((channels,), seed=seed + 100)))
    return node, inits


def _bn(name, x="x", seed=7):
    rng = np.random.default_rng(seed)
    params = {"scale": rng.uniform(0.5, 1.5, C), "b": rng.uniform(-0.2, 0.2, C),
              "mean": rng.uniform(-0.3, 0.3, C), "var": rng.uniform(0.5, 2.0, C)}
    node = helper.make_node("BatchNormalization", [x, *(f"{name}_{k}" for k in params)],
                            [name], name=name, epsilon=1e-5)
    return node, [init(f"{name}_{k}", v.astype(np.float32)) for k, v in params.items()]


def _sum(parts, terms, out_shape=(1, C, 6, 6), relu=True, extra_outputs=()):
    """Add the `terms` in a chain (an Add tree), then a Relu."""
    nodes, inits = [], []
    for node, weights in parts:
        nodes.append(node)
        inits += weights
    acc = terms[0]
    for i, t in enumerate(terms[1:]):
        out = "s" if i == len(terms) - 2 and not relu else f"add{i}"
        nodes.append(helper.make_node("Add", [acc, t], [out], name=out))
        acc = out
    if relu:
        nodes.append(helper.make_node("Relu", [acc], ["s"], name="relu"))
    outputs = [value("s", list(out_shape))] + [value(o, None) for o in extra_outputs]
    return build_model(nodes, [value("x", [1, C, 6, 6])], outputs, inits)


def test_a_repvgg_block_becomes_one_conv():
    # 3x3 + 1x1 + BatchNormalization identity (timm's repvgg_a0 as exported)
    model = _sum([_conv("k3", 3), _conv("k1", 1, seed=1), _bn("id")], ["k3", "k1", "id"])
    out = assert_rewrites(MergeParallelConvs(), model, ["Conv", "Relu"], {KEY: 1}, atol=1e-5)
    conv = out.graph.node[0]
    assert [onnx.helper.get_attribute_value(a) for a in conv.attribute
            if a.name in ("kernel_shape", "pads")] == [[3, 3], [1, 1, 1, 1]]


def test_a_depthwise_mobileone_block_with_three_kernels_becomes_one_conv():
    parts = [_conv("a", 3, group=C), _conv("b", 3, group=C, seed=2),
             _conv("c", 1, group=C, seed=3, bias=False), _bn("id")]
    model = _sum(parts, ["a", "b", "c", "id"])
    assert_rewrites(MergeParallelConvs(), model, ["Conv", "Relu"], {KEY: 1}, atol=1e-5)


@pytest.mark.parametrize(("parts", "terms"), [
    ([_conv("k3", 3)], ["k3", "x"]),                       # the input itself
    ([_conv("k3", 3, dilation=2), _conv("k1", 1, dilation=2, seed=1)], ["k3", "k1"]),
    ([_conv("k5", 5), _conv("k3", 3, seed=1, bias=False)], ["k3", "k5"]),
])
def test_identity_dilated_and_larger_kernels(parts, terms):
    model = _sum(parts, terms)
    assert_rewrites(MergeParallelConvs(), model, ["Conv", "Relu"], {KEY: 1}, atol=1e-5)


def test_strided_branches_merge_without_an_identity():
    model = _sum([_conv("k3", 3, stride=2), _conv("k1", 1, stride=2, seed=1)], ["k3", "k1"],
                 out_shape=(1, C, 3, 3))
    assert_rewrites(MergeParallelConvs(), model, ["Conv", "Relu"], {KEY: 1}, atol=1e-5)


@pytest.mark.parametrize(("parts", "terms", "reason"), [
    ([_conv("k3", 3), _conv("k1", 1, dilation=2, seed=1)], ["k3", "k1"],
     "its Convs differ in group, strides or dilations"),
    ([_conv("k3", 3, pads=[2, 2, 0, 0]), _conv("k1", 1, seed=1)], ["k3", "k1"],
     "Conv 'k3': its padding [2, 2, 0, 0] is not centred on its [3, 3] kernel"),
])
def test_sums_that_cannot_merge_stay_with_the_reason(parts, terms, reason):
    model = _sum(parts, terms)
    assert_skips(MergeParallelConvs(), model, "Add 'add0'", reason)


def test_a_branch_read_elsewhere_stays():
    model = _sum([_conv("k3", 3), _conv("k1", 1, seed=1)], ["k3", "k1"], extra_outputs=["k1"])
    assert_skips(MergeParallelConvs(), model, "Add 'add0'", "k1 is read elsewhere too")


def test_a_residual_add_of_another_input_is_not_its_business():
    # ResNet: Add(Conv(Relu(x)), x): the Conv reads another tensor than the identity
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="r")]
    conv, weights = _conv("k3", 3, x="r")
    model = build_model([*nodes, conv, helper.make_node("Add", ["k3", "x"], ["s"], name="s")],
                        [value("x", [1, C, 6, 6])], [value("s", [1, C, 6, 6])], weights)
    assert_skips(MergeParallelConvs(), model, "graph", "no Add sums Convs of one input")


def test_the_default_pipeline_folds_each_branchs_bn_then_merges():
    # the training form as torch exports it: Conv -> BatchNormalization per branch
    parts = [_conv("k3", 3, bias=False), _conv("k1", 1, seed=1, bias=False),
             _bn("bn3", x="k3", seed=3), _bn("bn1", x="k1", seed=4), _bn("id", seed=5)]
    model = _sum(parts, ["bn3", "bn1", "id"])
    result = api_run(model, check=True)
    assert ops(result.model) == ["Conv", "Relu"]
    applied = {r.spec for r in result.report.passes if r.status.value == "applied"}
    assert {"fold-bn", "merge-parallel-convs"} <= applied
    assert_same_outputs(model, result.model, feeds_for(model))
