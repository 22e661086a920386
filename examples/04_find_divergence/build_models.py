"""Write model.onnx, a residual network of 6 blocks (graphfix.samples.deep_resnet), and
broken.onnx, the same model with the weights of one output channel of the Conv in
block 3 scaled by 1.1: the kind of damage a bad weight edit, a wrong transpose or a
faulty converter does in the middle of a network, invisible in the graph's structure.
"""

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.samples import deep_resnet

model = deep_resnet(blocks=6, seed=0, channels=8, size=16, classes=10)
onnx.save(model, "model.onnx")

broken = onnx.ModelProto()
broken.CopyFrom(model)
for init in broken.graph.initializer:
    if init.name == "block.3.weight":
        weight = numpy_helper.to_array(init).copy()
        weight[0] *= np.float32(1.1)
        init.CopyFrom(numpy_helper.from_array(weight, init.name))
onnx.save(broken, "broken.onnx")
print(f"wrote model.onnx and broken.onnx ({len(model.graph.node)} nodes each; "
      "block.3.weight differs)")
