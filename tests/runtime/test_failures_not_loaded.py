"""runtime.failures on a model onnxruntime cannot load (a value_info that contradicts its
node, D9): no input is blamed and the fix is about the model; an input onnxruntime
refuses at run time is still named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import build_model, value
from onnx import TensorProto, helper

from graphfix.runtime.failures import cannot_run, explain, fails_to_load
from graphfix.runtime.session import run_model


def stale_valueinfo() -> onnx.ModelProto:
    """x -> Cast(float16) -> Identity y16 (declared float: wrong) -> Relu -> Cast(float)."""
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
             helper.make_node("Identity", ["x16"], ["y16"]),
             helper.make_node("Relu", ["y16"], ["r16"]),
             helper.make_node("Cast", ["r16"], ["out"], to=TensorProto.FLOAT)]
    return build_model(nodes, [value("x", [1, 4])], [value("out", [1, 4])], [],
                       checked=False, value_info=[value("y16", [1, 4])])


def _error(model, feeds) -> Exception:
    try:
        run_model(model, feeds)
    except Exception as err:  # onnxruntime's own types
        return err
    raise AssertionError("onnxruntime ran the model")


def test_a_model_that_does_not_load_blames_no_input():
    model = stale_valueinfo()
    feeds = {"x": np.ones([1, 4], np.float32)}
    err = _error(model, feeds)
    assert fails_to_load(model, err)
    why, fix = explain(model, feeds, err)
    assert "Type Error" in why
    assert "the model itself is at fault" in why and "no input is to blame" in why
    assert "is to blame:" not in why and "--input-value" not in fix
    assert "onnx.checker.check_model" in fix
    line = cannot_run(model, feeds, err, "seeded random inputs")
    assert line.startswith("onnxruntime cannot run the input model (it does not load): ")
    assert "input 'x'" not in line


def test_an_input_refused_at_run_time_is_still_named():
    model = build_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 4])],
                        [value("y", [1, 4])], [])
    feeds = {"x": np.ones([2, 3], np.float32)}  # the wrong shape: fails in run, not load
    err = _error(model, feeds)
    assert not fails_to_load(model, err)
    why, fix = explain(model, feeds, err)
    assert "input 'x' is to blame" in why
    assert "--input-value x=VALUE" in fix
    assert cannot_run(model, feeds, err, "seeded random inputs").startswith(
        "onnxruntime cannot run the input model on seeded random inputs: ")


def test_a_node_without_a_kernel_says_so():
    model = build_model([helper.make_node("Cast", ["x"], ["q"], to=TensorProto.FLOAT4E2M1),
                         helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
                        [value("x", [1, 4])], [value("y", [1, 4])], [], checked=False)
    model.ir_version = 11
    model.opset_import[0].version = 23
    feeds = {"x": np.ones([1, 4], np.float32)}
    try:
        run_model(model, feeds)
    except Exception as err:  # onnxruntime's own types
        why, fix = explain(model, feeds, err)
    else:
        pytest.skip("this onnxruntime runs float4 Casts on the CPU")
    assert "no input is to blame" in why
    assert fix.startswith("onnxruntime has no kernel for the node it names")
