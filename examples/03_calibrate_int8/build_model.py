"""Write model.onnx: a small FP32 classifier (graphfix.samples.conv_bn_relu_residual).

input [batch, 3, 32, 32] -> logits [batch, 10]: Conv-BN-ReLU blocks, a residual Add,
GlobalAveragePool and a Gemm.
"""

import onnx

from graphfix.samples import conv_bn_relu_residual

onnx.save(conv_bn_relu_residual(seed=1, channels=8, classes=10), "model.onnx")
print("wrote model.onnx")
