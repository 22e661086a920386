"""The original's run in the background (`OutputCheck.prepare(background=True)`) works on
a copy of the model made before its thread starts: the caller's passes read (and may
change) the model meanwhile, and no protobuf message is shared between the threads."""

from __future__ import annotations

import threading

import numpy as np
import onnx
from gfhelpers import parse
from onnx import numpy_helper

from graphfix.runtime import outputs

MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[2,3] x) => (float[2,3] y) <float[3] w = {1.0, 2.0, 3.0}> {
    y = Add(x, w)
}"""


def test_the_original_runs_the_model_as_it_was_when_the_check_was_prepared(monkeypatch):
    real, go, ran = outputs.run_checkable, threading.Event(), []

    def held(m, feeds, providers=("cpu",), basic=False, extra_outputs=(), run_options=None):
        assert go.wait(30), "the test never let the original run"
        ran.append(m)
        return real(m, feeds, providers, basic, extra_outputs, run_options)

    monkeypatch.setattr(outputs, "run_checkable", held)
    model = parse(MODEL)
    check = outputs.OutputCheck.prepare(model, {"x": (2, 3)}, background=True)
    # what a pass may do to the caller's model while the original has not run yet
    model.graph.initializer[0].CopyFrom(
        numpy_helper.from_array(np.array([7.0, 8.0, 9.0], np.float32), "w"))
    del model.graph.node[:]
    go.set()
    (y,) = check.reference.values()
    np.testing.assert_array_equal(y, check.feeds["x"] + np.array([1, 2, 3], np.float32))
    (copy,) = ran
    assert copy is not model and len(copy.graph.node) == 1
    onnx.checker.check_model(copy)
