"""A voice-activity-detector-like model (Silero VAD style) that random inputs break.

Inputs: `input` float [1, 512] audio, `state` float [2, 1, 128] recurrent state, `sr`
int64 scalar sample rate (8000 or 16000). The graph:
- If(Equal(sr, 16000)): the then-branch scales the audio by 2, the else-branch passes it;
- Reshape(audio, [Div(sr, 8000), -1]) with allowzero=1: sr = 16000 gives [2, 256],
  8000 gives [1, 512], a random sr in [0, 8) gives [0, -1], which onnxruntime refuses;
- outputs: `output` (the mean of each row, [rows]) and `stateN` (state + 1).
With `constants=False`, sr reaches the graph only through Cast and Mul (no constant to
compare with), so nothing tells graphfix which value it takes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _branch(name: str, scale: float) -> onnx.GraphProto:
    k = numpy_helper.from_array(np.array(scale, np.float32), f"{name}_k")
    return helper.make_graph(
        [helper.make_node("Mul", ["input", f"{name}_k"], [f"{name}_out"], name=f"{name}_mul")],
        name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [1, 512])],
        [k])


def vad_model(constants: bool = True) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 512]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 128]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["rows"]),
               helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, 1, 128])]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    state = helper.make_node("Add", ["state", "one"], ["stateN"], name="state_add")
    if constants:
        inits += [numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
                  numpy_helper.from_array(np.array(8000, np.int64), "sr8k")]
        nodes = [
            helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="is16k"),
            helper.make_node("If", ["is16k"], ["audio"], name="pick",
                             then_branch=_branch("then", 2.0), else_branch=_branch("else", 1.0)),
            helper.make_node("Div", ["sr", "sr8k"], ["rows"], name="rows"),
            helper.make_node("Unsqueeze", ["rows", "axis0"], ["rows1"], name="rows1"),
            helper.make_node("Concat", ["rows1", "minus1"], ["shape"], axis=0, name="shape"),
            helper.make_node("Reshape", ["audio", "shape"], ["frames"], allowzero=1,
                             name="frames"),
            helper.make_node("ReduceMean", ["frames"], ["output"], axes=[1], keepdims=0,
                             name="mean"),
            state,
        ]
    else:
        nodes = [
            helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT, name="srf"),
            helper.make_node("Mul", ["input", "srf"], ["scaled"], name="scale"),
            helper.make_node("ReduceMean", ["scaled"], ["output"], axes=[1], keepdims=0,
                             name="mean"),
            state,
        ]
    graph = helper.make_graph(nodes, "vad", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def vad_feeds(sr: int = 16000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"input": rng.standard_normal((1, 512)).astype(np.float32),
            "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(sr, np.int64)}
