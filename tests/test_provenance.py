"""graphfix run records which pass removed each tensor (and the renames) in its report and
in the output model's metadata, for `graphfix check`."""

from __future__ import annotations

import onnx

from graphfix import provenance, samples
from graphfix.api import run


def test_fold_bn_removals_are_recorded_in_report_and_model():
    model = samples.conv_bn_relu_residual()
    result = run(model, passes="cleanup,fold-bn", check=False)
    removed = result.report.removed
    bn_inputs = {n.output[0] for n in model.graph.node if n.op_type == "Conv"}
    assert bn_inputs and all(removed.get(t) == "fold-bn" for t in bn_inputs)
    assert {v for v in removed.values()} == {"cleanup", "fold-bn"}
    renamed, stored = provenance.read(result.model)
    assert stored == removed and renamed == result.report.renamed
    assert provenance.read(model) == ({}, {})  # the input model is untouched


def test_a_model_without_changes_gets_no_entry_and_attach_replaces():
    model = samples.conv_bn_relu_residual()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    provenance.attach(copy, {"a": "b"}, {})
    provenance.attach(copy, {}, {"x": "fold-bn"})
    assert provenance.read(copy) == ({}, {"x": "fold-bn"})
    assert [p.key for p in copy.metadata_props].count(provenance.KEY) == 1
