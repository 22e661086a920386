"""Write model.onnx: a batched matrix product written as Einsum with an ellipsis.

    out = Relu(Einsum('...ij,...jk->...ik', x, w))     x [2, 6, 8], w [2, 8, 8]

PyTorch exports `torch.einsum` and some attention code this way. TensorRT 8.6's ONNX
parser does not take an ellipsis in an Einsum equation; TensorRT 10's does.
"""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
w = numpy_helper.from_array((rng.standard_normal((2, 8, 8)) / np.sqrt(8)).astype(np.float32),
                            "w")
nodes = [
    helper.make_node("Einsum", ["x", "w"], ["y"], equation="...ij,...jk->...ik",
                     name="einsum"),
    helper.make_node("Relu", ["y"], ["out"], name="relu"),
]
graph = helper.make_graph(
    nodes, "einsum_ellipsis",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 6, 8])],
    [w],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model, full_check=True)
onnx.save(model, "model.onnx")
print("wrote model.onnx: Einsum '...ij,...jk->...ik' -> Relu")
