"""A training-mode Dropout draws its mask anew on every onnxruntime run: what follows it
is not judged, by `graphfix run`'s check or by `graphfix check`, and both say why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import parse

import graphfix
from graphfix.check.layerwise import compare_layerwise
from graphfix.check.status import TensorStatus
from graphfix.runtime import outputs
from graphfix.runtime.randomness import FIX, random_sources

WHY = ("it follows Dropout 'drop' in training mode, whose mask onnxruntime draws anew on "
       "every run")


def model(mode: str = "bool t = {1}", ratio: str = "float r = {0.5}") -> onnx.ModelProto:
    """Conv -> Dropout (training mode `mode`, ratio `ratio`) -> Relu, beside a branch
    that does not follow it."""
    m = parse('<ir_version: 8, opset_import: ["" : 17]>' + f"""
    g (float[1,3,6,6] x) => (float[1,4,6,6] y, float[1,3,6,6] z)
      <float[4,3,3,3] w = {{{', '.join(['0.1'] * 108)}}}, {ratio}, {mode}> {{
        c = Conv <pads = [1, 1, 1, 1]> (x, w)
        d = Dropout(c, r, t)
        y = Relu(d)
        z = Sigmoid(x)
    }}""")
    next(n for n in m.graph.node if n.op_type == "Dropout").name = "drop"
    return m


@pytest.mark.parametrize("mode, ratio, random", [
    ("bool t = {1}", "float r = {0.5}", True),
    ("bool t = {0}", "float r = {0.5}", False),  # inference: the identity
    ("bool t = {1}", "float r = {0.0}", False),  # keeps everything
])
def test_training_dropouts_are_the_random_sources(mode, ratio, random):
    assert random_sources(model(mode, ratio)) == ({"d": WHY} if random else {})


def test_run_does_not_judge_outputs_that_follow_it():
    """Probe 4: the check blamed onnxruntime's optimizations for the difference."""
    check = outputs.OutputCheck.prepare(model(), {"x": (1, 3, 6, 6)})
    assert check.unstable == {"y": f"random on every run: {WHY}; {FIX}"}
    report = graphfix.run(model(), passes="fold-constants").report
    assert all(p.status != "rolled back" for p in report.passes)
    assert list(report.check.unjudged) == ["y"]


def test_check_of_a_model_against_itself_passes_and_says_why():
    """Probe 4: `graphfix check M M` said FAILED (a "new" difference at the Dropout)."""
    m = model()
    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 3, 6, 6), np.float32)}]
    report = compare_layerwise(m, m, feeds)
    assert report.passed
    statuses = {t.name: t.status for t in report.tensors}
    assert statuses["d"] == statuses["y"] == TensorStatus.RANDOM
    assert statuses["z"] == TensorStatus.COMPARED
    assert any("Dropout in training mode" in n and FIX in n for n in report.notes)
