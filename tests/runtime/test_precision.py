"""Outputs cast up from float16 are judged with float16's bound (runtime.precision): a
float16 converter's keep_io_types model computes in float16 and Casts its outputs to
float32, and a rewrite that rounds one float16 step differently is correct there."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix.runtime.outputs import OutputCheck
from graphfix.runtime.precision import narrow_outputs

SHAPE = [4, 64]


def _model(middle: list[onnx.NodeProto], inits=(), tail_in_float32=False) -> onnx.ModelProto:
    """x (float32) -> Cast to float16 -> `middle` (h -> m) -> Cast to float32 -> Reshape -> y;
    with `tail_in_float32`, a float32 Tanh after the Cast up (the output is then a float32
    computation)."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TP.FLOAT16), *middle,
             helper.make_node("Cast", ["m"], ["up"], to=TP.FLOAT)]
    if tail_in_float32:
        nodes.append(helper.make_node("Tanh", ["up"], ["t"]))
    nodes.append(helper.make_node("Reshape", ["t" if tail_in_float32 else "up", "shape"], ["y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TP.FLOAT, [SHAPE[0] * SHAPE[1]])],
        [numpy_helper.from_array(np.array([-1], np.int64), "shape"), *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _half(name: str, value: float):
    return numpy_helper.from_array(np.array(value, np.float16), name)


def _scaled(op: str, value: float, **kw) -> onnx.ModelProto:
    """h * 0.1 (Mul) or h / 10 (Div), then Tanh, in float16: the two round differently."""
    return _model([helper.make_node(op, ["h", "k"], ["s"]), helper.make_node("Tanh", ["s"], ["m"])],
                  [_half("k", value)], **kw)


def test_an_output_cast_up_from_float16_through_a_reshape_is_narrow():
    assert narrow_outputs(_scaled("Mul", 0.1)) == {"y": "float16"}


def test_an_output_computed_in_float32_after_the_cast_is_not():
    assert narrow_outputs(_scaled("Mul", 0.1, tail_in_float32=True)) == {}


def test_the_source_type_is_followed_through_where_to_its_data_input():
    cond = numpy_helper.from_array(np.array(True), "cond")
    model = _model([helper.make_node("Where", ["cond", "h", "h"], ["m"])], [cond])
    assert narrow_outputs(model) == {"y": "float16"}
    # a Cast up from float32 data is not narrow
    model.graph.node[0].attribute[0].i = TP.FLOAT
    assert narrow_outputs(model) == {}


def test_a_float16_rounding_change_passes_where_the_output_is_float16_data_only():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    for tail, should_pass in ((False, True), (True, False)):
        original = _scaled("Mul", 0.1, tail_in_float32=tail)
        check = OutputCheck.prepare(original, {"x": tuple(SHAPE)})
        check.feeds["x"] = x
        check._run_original(original)
        outcome = check.verify(_scaled("Div", 10.0, tail_in_float32=tail))
        assert outcome.ok is should_pass, (tail, outcome.describe())
        error = outcome.diffs[0].max_abs / float(np.abs(check.reference["y"]).max())
        assert 1e-4 < error < 1e-2  # float16 units, under float16's bound, over float32's


def test_an_output_joined_with_float32_values_is_not():
    model = _scaled("Mul", 0.1)
    graph = model.graph
    cast_up = next(n for n in graph.node if n.output[0] == "up")
    cast_up.output[0] = "up16"
    graph.node.append(helper.make_node("Concat", ["up16", "x"], ["up"], axis=1))
    graph.node.sort(key=lambda n: n.output[0] == "y")  # the Reshape last
    assert narrow_outputs(model) == {}
