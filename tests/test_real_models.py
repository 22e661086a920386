"""The default pipeline on real exported models from ../shared/models."""

import pytest

import graphfix
from graphfix.report import ROLLED_BACK


@pytest.mark.parametrize("name, shapes", [
    ("mobilenet_v3_small_bn.onnx", {}),
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}),
    ("digits_dev.onnx", {}),
])
def test_default_pipeline_folds_every_batchnorm_and_passes_the_check(shared_model, name, shapes):
    result = graphfix.run(shared_model(name), input_shapes=shapes)
    report = result.report
    assert report.check.enabled, report.check.skipped_reason
    assert not [r for r in report.passes if r.status == ROLLED_BACK], [
        r.rollback_reason for r in report.passes]
    ops = [n.op_type for n in result.model.graph.node]
    assert "BatchNormalization" not in ops
    assert "Identity" not in ops and "Dropout" not in ops
    fold = next(r for r in report.passes if r.spec == "fold-bn")
    assert fold.status == "applied" and fold.check.startswith("passed")
    assert sum(fold.counts.values()) > 0


def test_ppocr_needs_its_spatial_dims(shared_model):
    with pytest.raises(graphfix.GraphfixError, match="Input 'x' dim 2"):
        graphfix.run(shared_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"))
