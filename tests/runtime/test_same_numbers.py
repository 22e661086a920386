"""`graphfix run` and `graphfix check` report the same numbers for the same pair of models:
both measure with `runtime.measure` on the same seeded inputs."""

from __future__ import annotations

import pytest

import graphfix
from graphfix import provenance
from graphfix.check.layerwise import compare_layerwise
from graphfix.check.samples import check_samples
from graphfix.runtime.feeds import graph_inputs, resolve_shapes
from graphfix.runtime.outputs import OutputCheck
from graphfix.samples import deep_resnet


@pytest.mark.parametrize("seed", [0, 3])
def test_run_and_check_agree_on_the_outputs(seed):
    model = deep_resnet(seed=seed)
    shape = {"input": (2, 3, 16, 16)}
    result = graphfix.run(model, passes="fold-bn", seed=seed, input_shapes=shape)
    (record,) = result.report.passes
    per_pass = OutputCheck.prepare(model, resolve_shapes(graph_inputs(model), shape), seed=seed)
    (diff,) = per_pass.verify(result.model).diffs

    samples = check_samples(model, None, None, {"input": (2, 3, 16, 16)}, 1, seed)
    renamed, removed = provenance.read(result.model)
    row = compare_layerwise(model, result.model, samples, renamed=renamed,
                            removed=removed).tensor("logits")

    assert record.max_abs_error == diff.max_abs == row.max_abs > 0
    assert diff.sqnr_db == row.sqnr_db
    assert diff.ok and row.ok
    assert f"{diff.max_abs:.2g}" in record.check and f"{diff.scaled:.2g}" in record.check
