"""IR-3 models (opset <= 8, every initializer also a graph input: old exports and the
classic ONNX Model Zoo "-7" models) go through run and run --trt like any other."""

from __future__ import annotations

import numpy as np
import onnx
from gfhelpers import assert_same_outputs
from onnx import TensorProto, helper, numpy_helper

import graphfix
from graphfix.report import APPLIED, ROLLED_BACK


def _ir3_conv_bn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
               "scale": (rng.random(4) + 0.5).astype(np.float32),
               "bias": rng.standard_normal(4).astype(np.float32),
               "mean": rng.standard_normal(4).astype(np.float32),
               "var": (rng.random(4) + 0.5).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape))
        for name, v in weights.items()]
    graph = helper.make_graph(nodes, "ir3", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [1, 4, 8, 8])],
                              [numpy_helper.from_array(v, name) for name, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_bn_folds_in_an_ir3_model_and_the_output_is_ir4():
    """Probe 4: fold-bn and dedup-constants were rolled back ("initializer but not in
    graph input"): graphfix holds weights as constants, which IR 3 must also list as
    inputs. The output is IR 4, where that rule is gone."""
    source = _ir3_conv_bn()
    result = graphfix.run(source)
    statuses = {p.spec: p.status for p in result.report.passes if p.status != "unchanged"}
    assert ROLLED_BACK not in statuses.values()
    assert statuses["fold-bn"] == APPLIED
    out = result.model
    assert [n.op_type for n in out.graph.node] == ["Conv", "Relu"]
    assert out.ir_version == 4 and [i.name for i in out.graph.input] == ["x"]
    onnx.checker.check_model(out, full_check=True)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8), np.float32)}
    assert_same_outputs(source, out, feeds)
    assert source.ir_version == 3 and len(source.graph.input) == 6  # not modified


def test_an_ir3_model_is_converted_to_an_opset_tensorrt_10_parses():
    """The version converter found the IR-3 graph's initializers undefined."""
    result = graphfix.run(_ir3_conv_bn(), trt="10")
    out = result.model
    assert out.opset_import[0].version == 9 and out.ir_version == 4
    assert result.diagnosis.parses()
    onnx.checker.check_model(out, full_check=True)
