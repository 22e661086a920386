"""Deliberately wrong versions of real rewrites, for measuring what the verdict catches.

Each mutant patches one function of a real pass for the duration of a `with` block, so
the pass applies its usual rewrites with one bug in them. The single-channel mutants
touch channel 0 of the first rewrite the pass makes (in graph order); the others are
systematic (every rewrite). `tests/runtime/test_mutations.py` asserts the verdict
rolls each back; `bench/mutations.py` prints the detection table of docs/verdict.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphfix.graph import constant_value
from graphfix.passes import _noop_pairs, fold_bn, fuse_pad_conv


@dataclass(frozen=True)
class Mutant:
    name: str
    passes: str  # the pipeline the mutated pass runs in
    what: str  # the bug, in words
    patch: Callable[[], contextlib.AbstractContextManager]


class _FirstOnly:
    """Calls `wrong` the first time in each run of fold-bn and `right` after: a bug in the
    pass's first rewrite, made again in every run as a real bug would be (the manager
    runs the passes again when its batched check fails). Use inside `per_run()`."""

    def __init__(self, wrong: Callable, right: Callable) -> None:
        self.wrong, self.right, self.calls = wrong, right, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return (self.wrong if self.calls == 1 else self.right)(*args, **kwargs)

    @contextlib.contextmanager
    def per_run(self) -> Iterator[None]:
        original = fold_bn.FoldBatchNorm.run

        def run(pass_, graph, ctx):
            self.calls = 0
            return original(pass_, graph, ctx)

        with mock.patch.object(fold_bn.FoldBatchNorm, "run", run):
            yield


@contextlib.contextmanager
def _bn_without_epsilon() -> Iterator[None]:
    original = fold_bn._affine

    def affine(bn, opset):
        had = "epsilon" in bn.attrs
        eps = bn.attrs.get("epsilon")
        bn.attrs["epsilon"] = 0.0
        try:
            return original(bn, opset)
        finally:
            if had:
                bn.attrs["epsilon"] = eps
            else:
                bn.attrs.pop("epsilon")

    with mock.patch.object(fold_bn, "_affine", affine):
        yield


@contextlib.contextmanager
def _bn_mean_sign_flipped() -> Iterator[None]:
    original = fold_bn._affine

    def wrong(bn, opset):
        affine = original(bn, opset)
        if isinstance(affine, str):
            return affine
        mean = np.asarray(constant_value(bn.inputs[3]), np.float64).reshape(-1)
        shift = affine.shift.copy()
        shift[0] += 2 * mean[0] * affine.scale[0]  # beta + mean * s instead of beta - mean * s
        return dataclasses.replace(affine, shift=shift)

    first = _FirstOnly(wrong, original)
    with mock.patch.object(fold_bn, "_affine", first), first.per_run():
        yield


def _weight_scaled(factor: float) -> Callable[[], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def patch() -> Iterator[None]:
        original = fold_bn._FOLDERS["Conv"]

        def wrong(node, bn, affine):
            plan = original(node, bn, affine)
            if isinstance(plan, str):
                return plan
            weight = plan.weight().copy()  # the plan computes its weight when asked
            weight[0] *= np.asarray(factor, weight.dtype)
            return dataclasses.replace(plan, weight=lambda: weight)

        first = _FirstOnly(wrong, original)
        with mock.patch.dict(fold_bn._FOLDERS, {"Conv": first}), first.per_run():
            yield

    return patch


@contextlib.contextmanager
def _bias_twice() -> Iterator[None]:
    original = fold_bn._new_bias

    def wrong(bias, affine, dtype):
        new = original(bias, affine, dtype).copy()
        new[0] *= 2  # the folded bias counted twice on channel 0
        return new

    first = _FirstOnly(wrong, original)
    with mock.patch.object(fold_bn, "_new_bias", first), first.per_run():
        yield


@contextlib.contextmanager
def _conv_transpose_group_axis_swapped() -> Iterator[None]:
    original = fold_bn._FOLDERS["ConvTranspose"]

    def wrong(node, bn, affine):
        groups = int(node.attrs.get("group", 1))
        scale = affine.scale.reshape(groups, -1).T.reshape(-1)  # channel j*g+i, not i*per+j
        return original(node, bn, dataclasses.replace(affine, scale=scale))

    with mock.patch.dict(fold_bn._FOLDERS, {"ConvTranspose": wrong}):
        yield


@contextlib.contextmanager
def _pad_on_the_wrong_axis() -> Iterator[None]:
    original = fuse_pad_conv._spatial_pads

    def wrong(pad, consumer, opset):
        pads = original(pad, consumer, opset)
        if isinstance(pads, str):
            return pads
        k = pads.size // 2
        return np.concatenate([pads[:k][::-1], pads[k:][::-1]])  # H and W swapped

    with mock.patch.object(fuse_pad_conv, "_spatial_pads", wrong):
        yield


@contextlib.contextmanager
def _transpose_perm_inverted() -> Iterator[None]:
    original = _noop_pairs.compose_perms

    def wrong(p1, p2):
        perm = original(p1, p2)
        return None if perm is None else [int(i) for i in np.argsort(perm)]

    with mock.patch.object(_noop_pairs, "compose_perms", wrong):
        yield


MUTANTS = [
    Mutant("bn-without-epsilon", "fold-bn", "BN folded with epsilon 0 (every BN)",
           _bn_without_epsilon),
    Mutant("bn-mean-sign", "fold-bn", "the mean's sign flipped on one channel of the first BN",
           _bn_mean_sign_flipped),
    Mutant("weight-x1.001", "fold-bn", "one channel's weights of the first fold scaled by 1.001",
           _weight_scaled(1.001)),
    Mutant("weight-x1.01", "fold-bn", "one channel's weights of the first fold scaled by 1.01",
           _weight_scaled(1.01)),
    Mutant("bias-twice", "fold-bn", "the folded bias counted twice on one channel of the "
           "first fold", _bias_twice),
    Mutant("convtranspose-group-axis", "fold-bn", "ConvTranspose's group and per-group "
           "channel axes swapped when scaling (every ConvTranspose fold)",
           _conv_transpose_group_axis_swapped),
    Mutant("pad-wrong-axis", "fuse-pad-conv", "a Pad's H and W pads swapped when folded into "
           "the Conv (every fold)", _pad_on_the_wrong_axis),
    Mutant("transpose-perm-inverted", "eliminate-noops", "two Transposes merged into the "
           "inverse of their composition (every merge)", _transpose_perm_inverted),
]


# ----------------------------------------------------------------------------- models


def _model(nodes, x_shape, y_shape, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "mutant_target",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _rng(seed: int, *shape: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def conv_transpose_bn() -> onnx.ModelProto:
    """ConvTranspose(8 -> 8 channels, group 2) -> BN -> Relu, distinct BN scales."""
    n = helper.make_node
    return _model([
        n("ConvTranspose", ["x", "w"], ["t"], group=2, strides=[2, 2]),
        n("BatchNormalization", ["t", "s", "b", "m", "v"], ["bn"]),
        n("Relu", ["bn"], ["y"]),
    ], [1, 8, 6, 6], [1, 8, 13, 13], {
        "w": _rng(1, 8, 4, 3, 3), "s": _rng(2, 8, low=0.5, high=1.5), "b": _rng(3, 8),
        "m": _rng(4, 8, low=-0.2, high=0.2), "v": _rng(5, 8, low=0.5, high=1.5)})


def pad_conv() -> onnx.ModelProto:
    """Pad (one row on top, one column on the right) -> Conv on a square input."""
    n = helper.make_node
    return _model([
        n("Pad", ["x", "pads"], ["p"]),
        n("Conv", ["p", "w"], ["y"]),
    ], [1, 4, 8, 8], [1, 6, 7, 7], {
        "pads": np.array([0, 0, 1, 0, 0, 0, 0, 1], np.int64), "w": _rng(1, 6, 4, 3, 3)})


def transpose_pair() -> onnx.ModelProto:
    """Transpose [0,2,1,3] then [0,1,3,2]: together the 3-cycle [0,2,3,1], which is not
    its own inverse; equal spatial dims so the inverse keeps the shape."""
    n = helper.make_node
    return _model([
        n("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        n("Transpose", ["t"], ["u"], perm=[0, 1, 3, 2]),
        n("Relu", ["u"], ["y"]),
    ], [1, 3, 3, 3], [1, 3, 3, 3], {})


BUILT = {"conv-transpose-bn": conv_transpose_bn, "pad-conv": pad_conv,
         "transpose-pair": transpose_pair}
