"""Small built-in models, made in code: the demo and the tests use them.

Every sample is deterministic (seeded weights), opset 17, IR version 8 (which
every onnxruntime release graphfix supports can load), and valid under
`onnx.checker` and strict shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class _Builder:
    """Collects nodes and seeded initializers for one sample."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], scale: float = 0.3) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def conv_bn(self, x: str, name: str, cin: int, cout: int, relu: bool = True,
                gain: tuple[float, float] = (0.5, 1.5)) -> str:
        w = self.weight(f"{name}.weight", (cout, cin, 3, 3), scale=1.0 / np.sqrt(cin * 9))
        y = self.node("Conv", [x, w], f"{name}.conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
        stats = [
            self.const(f"{name}.bn.{k}", v.astype(np.float32))
            for k, v in (
                ("scale", self.rng.uniform(*gain, cout)),
                ("bias", self.rng.uniform(-0.2, 0.2, cout)),
                ("mean", self.rng.uniform(-0.1, 0.1, cout)),
                ("var", self.rng.uniform(0.5, 1.5, cout)),
            )
        ]
        y = self.node("BatchNormalization", [y, *stats], f"{name}.bn", epsilon=1e-5)
        return self.node("Relu", [y], f"{name}.relu") if relu else y


def conv_bn_relu_residual(seed: int = 0, channels: int = 16, classes: int = 10) -> onnx.ModelProto:
    """A Conv-BN-ReLU network with a residual Add, a dynamic batch dim, and a few
    things for cleanup and constant folding to remove (an Identity, a Dropout, a
    reshape target computed from constants).

    input [batch, 3, 32, 32] -> logits [batch, classes]
    """
    b = _Builder(seed)
    x = b.conv_bn("input", "stem", 3, channels)
    y = b.conv_bn(x, "block.0", channels, channels)
    y = b.node("Identity", [y], "block.0.identity")
    y = b.conv_bn(y, "block.1", channels, channels, relu=False)
    y = b.node("Add", [x, y], "block.add")
    y = b.node("Relu", [y], "block.relu")
    y = b.node("GlobalAveragePool", [y], "pool")
    shape = b.node(
        "Concat", [b.const("shape.batch", np.array([-1], np.int64)),
                   b.const("shape.features", np.array([channels], np.int64))],
        "shape", axis=0,
    )
    y = b.node("Reshape", [y, shape], "flatten")
    y = b.node("Dropout", [y], "dropout")
    w = b.weight("fc.weight", (classes, channels), scale=1.0 / np.sqrt(channels))
    bias = b.weight("fc.bias", (classes,), scale=0.1)
    b.node("Gemm", [y, w, bias], "logits", transB=1)
    graph = helper.make_graph(
        b.nodes,
        "conv_bn_relu_residual",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        b.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="graphfix.samples",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def deep_resnet(blocks: int = 50, seed: int = 0, channels: int = 16,
                size: int = 16, classes: int = 1000) -> onnx.ModelProto:
    """A deep residual network for the numerical check: a stem Conv-BN-ReLU, then
    `blocks` blocks x = x + ReLU(BN(Conv(x))) with random BatchNorm statistics, then
    GlobalAveragePool and a Gemm. Activations grow along the residual stream, so the
    logits reach the hundreds and fp32 reassociation (a folded BatchNorm) moves them by
    ~1e-5 in absolute terms: what an elementwise relative tolerance mistakes for a bug.

    input [batch, 3, size, size] -> logits [batch, classes]
    """
    b = _Builder(seed)
    x = b.conv_bn("input", "stem", 3, channels)
    for i in range(blocks):
        y = b.conv_bn(x, f"block.{i}", channels, channels, gain=(0.1, 0.4))
        x = b.node("Add", [x, y], f"block.{i}.add")
    y = b.node("GlobalAveragePool", [x], "pool")
    y = b.node("Flatten", [y], "flatten")
    w = b.weight("fc.weight", (classes, channels), scale=1.0 / np.sqrt(channels))
    b.node("Gemm", [y, w, b.weight("fc.bias", (classes,), scale=0.1)], "logits", transB=1)
    graph = helper.make_graph(
        b.nodes, "deep_resnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION, producer_name="graphfix.samples")
    onnx.checker.check_model(model, full_check=True)
    return model


SAMPLES = {"conv-bn-relu-residual": conv_bn_relu_residual, "deep-resnet": deep_resnet}
