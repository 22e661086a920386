"""calibrate refuses a model where no tensor can be calibrated (a float16 model, no
weighted op, every weighted op excluded), before the statistics pass; a model where only
some ops are float16 is calibrated as before."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import build_model, init, seeded, spy, value
from onnx import TensorProto, helper

from graphfix.calibration import qdq, stats
from graphfix.calibration.runner import calibrate
from graphfix.errors import GraphfixError

F16 = TensorProto.FLOAT16


def fp16_conv() -> onnx.ModelProto:
    """x[1,3,8,8] float16 -> Conv(W float16) -> Relu -> y: a model exported in half."""
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return build_model(nodes, [value("x", [1, 3, 8, 8], F16)], [value("y", None, F16)],
                       [init("W", seeded([4, 3, 3, 3], np.float16))])


def mixed() -> onnx.ModelProto:
    """x[1,8] -> MatMul(W1 float32) -> Cast(float16) -> MatMul(W2 float16) -> y float16."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm32"),
             helper.make_node("Cast", ["h"], ["h16"], name="cast", to=F16),
             helper.make_node("MatMul", ["h16", "W2"], ["y"], name="mm16")]
    return build_model(nodes, [value("x", [1, 8])], [value("y", None, F16)],
                       [init("W1", seeded([8, 8])), init("W2", seeded([8, 4], np.float16, 1))])


def samples(name: str, shape, dtype) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{name: rng.standard_normal(shape).astype(dtype)} for _ in range(4)]


def test_float16_model_is_refused_before_the_statistics_pass(monkeypatch):
    seen = spy(monkeypatch, stats, "collect", lambda *a, **k: a[1])
    with pytest.raises(GraphfixError) as err:
        calibrate(fp16_conv(), samples("x", [1, 3, 8, 8], np.float16), ("minmax",))
    assert seen == []  # no statistics were collected
    assert "no tensor of the model can be calibrated" in err.value.what
    assert "computes in float16" in err.value.why
    assert "FP32 model" in err.value.fix


def test_model_with_only_some_float16_ops_still_calibrates():
    result = calibrate(mixed(), samples("x", [1, 8], np.float32), ("minmax",))
    model = result.outcome().model
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 1 and "DequantizeLinear" in ops
    assert result.plan.activations == ("x",)
    assert any("mm16" in note and "float16" in note for note in result.notes)
    onnx.checker.check_model(model, full_check=True)


def test_every_weighted_op_excluded_says_so():
    with pytest.raises(GraphfixError) as err:
        calibrate(mixed(), samples("x", [1, 8], np.float32), ("minmax",),
                  exclude_nodes=["mm32"])
    assert "none of its 2" in err.value.why
    assert "excluded by name" in err.value.why and "float16" in err.value.why
    assert "--exclude-nodes" in err.value.fix


def test_model_without_weighted_ops_says_so():
    model = build_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 4])],
                        [value("y", None)], [])
    plan = qdq.plan(model)
    with pytest.raises(GraphfixError) as err:
        qdq.require_activations(plan, model)
    assert "has no Conv/ConvTranspose/Gemm/MatMul node" in err.value.why


def test_a_plan_with_activations_is_accepted():
    model = mixed()
    qdq.require_activations(qdq.plan(model), model)  # raises nothing
