import onnx
from gfhelpers import feeds_for

from graphfix import samples
from graphfix.runtime.session import run_model


def test_sample_is_valid_deterministic_and_has_a_dynamic_batch():
    a, b = samples.conv_bn_relu_residual(), samples.conv_bn_relu_residual()
    assert a.SerializeToString() == b.SerializeToString()
    onnx.checker.check_model(a, full_check=True)
    onnx.shape_inference.infer_shapes(a, strict_mode=True)
    ops = [n.op_type for n in a.graph.node]
    assert ops.count("BatchNormalization") == 3 and "Add" in ops
    assert a.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 3):
        (logits,) = run_model(a, feeds_for(a, input=(batch, 3, 32, 32))).values()
        assert logits.shape == (batch, 10)


def test_samples_registry_builds_every_sample():
    for name, build in samples.SAMPLES.items():
        assert build().graph.node, name
