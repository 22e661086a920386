"""Write model.onnx: a small Conv-BN-ReLU network with a residual Add (graphfix.samples).

input [batch, 3, 32, 32] -> logits [batch, 10]; three Conv -> BatchNormalization pairs,
plus an Identity and a Dropout that `cleanup` removes.
"""

from collections import Counter

import onnx

from graphfix.samples import conv_bn_relu_residual

model = conv_bn_relu_residual(seed=0, channels=8, classes=10)
onnx.save(model, "model.onnx")
ops = Counter(node.op_type for node in model.graph.node)
print(f"wrote model.onnx: {len(model.graph.node)} nodes "
      f"({', '.join(f'{op} x{n}' for op, n in sorted(ops.items()))})")
