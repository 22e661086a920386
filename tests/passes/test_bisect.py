"""Bisect: the first rewrite of a run that breaks the numbers, found by binary search."""

from __future__ import annotations

import pytest
from gfhelpers import assert_same_outputs, feeds_for, parse
from test_rewrite_budget import MODEL, NegAsMul, ReluAsMax, op_by_output, run_with

from graphfix import api, samples
from graphfix.errors import GraphfixError
from graphfix.passes import fold_bn
from graphfix.passes.base import RewriteBudget
from graphfix.passes.bisect import ProbeOutcome, bisect_rewrites
from graphfix.report import NUMBERS, ROLLED_BACK


def wrong_at(n: int) -> ReluAsMax:
    pass_ = ReluAsMax()
    pass_.wrong = n
    return pass_


def probe_for(model, *passes):
    def probe(limit):
        return run_with(model, RewriteBudget(limit if limit is not None else 10**9), *passes)
    return probe


def test_bisect_names_the_third_rewrite_and_keeps_the_two_before_it():
    model = parse(MODEL)
    seen = []
    found = bisect_rewrites(probe_for(model, wrong_at(3), NegAsMul()), seen.append)
    assert str(found.culprit) == "rewrite #3 (relu-as-max: Relu 'r3')"
    assert found.total == 7  # 5 Relus, then 2 Negs after relu-as-max was rolled back
    assert found.message.startswith("outputs differ: y:")
    assert found.describe() == f"{found.culprit} breaks the numbers: {found.message}"
    assert found.applied == 2
    assert op_by_output(found.model) == {"r1": "Max", "n": "Neg", "r2": "Max", "s": "Sin",
                                         "r3": "Relu", "c": "Cos", "r4": "Relu", "t": "Neg",
                                         "r5": "Relu", "y": "Sum"}
    assert_same_outputs(model, found.model, feeds_for(model))
    # One unlimited run, then 7 -> 3 (broken), 1, 2 (good) by binary search.
    assert seen == found.probes == [ProbeOutcome(None, True), ProbeOutcome(3, True),
                                    ProbeOutcome(1, False), ProbeOutcome(2, False)]
    data = found.to_json()
    assert data["culprit"] == {"index": 3, "spec": "relu-as-max", "label": "Relu 'r3'",
                               "step": 0}
    assert data["applied"] == 2 and data["rewrites"] == 7


def test_the_first_rewrite_is_found_with_a_probe_of_none():
    model = parse(MODEL)
    found = bisect_rewrites(probe_for(model, wrong_at(1)))
    assert found.culprit.index == 1 and found.applied == 0
    assert op_by_output(found.model)["r1"] == "Relu"
    assert found.probes[-1] == ProbeOutcome(0, False)


def test_without_a_breaking_rewrite_the_full_run_is_the_answer():
    model = parse(MODEL)
    found = bisect_rewrites(probe_for(model, wrong_at(0), NegAsMul()))
    assert found.culprit is None and found.total == 7 and found.applied == 7
    assert found.describe().startswith("no rewrite breaks the numbers: all 7 rewrites")
    assert set(op_by_output(found.model).values()) == {"Max", "Mul", "Sin", "Cos", "Sum"}
    assert found.probes == [ProbeOutcome(None, False)]


def test_bisect_names_the_batchnorm_whose_fold_is_wrong(monkeypatch):
    model = samples.conv_bn_relu_residual()
    bns = [n.name for n in model.graph.node if n.op_type == "BatchNormalization"]
    right = fold_bn._fold_conv

    def corrupt(node, bn, affine):
        plan = right(node, bn, affine)
        if bn.name == bns[1]:
            plan.bias = plan.bias + 0.5  # wrong for this BatchNormalization only
        return plan

    monkeypatch.setitem(fold_bn._FOLDERS, "Conv", corrupt)
    full = api.run(model, "cleanup,fold-bn")
    assert [(r.status, r.rollback_cause) for r in full.report.passes][1] == (ROLLED_BACK, NUMBERS)
    found = api.bisect(model, "cleanup,fold-bn")
    assert str(found.culprit) == (
        f"rewrite #3 (fold-bn: BatchNormalization '{bns[1]}' into Conv 'block.0.conv')")
    assert "outputs differ: logits" in found.message
    kept = [n.name for n in found.model.graph.node if n.op_type == "BatchNormalization"]
    assert kept == bns[1:]  # cleanup (#1) and the first fold (#2) only
    feeds = feeds_for(model, input=(1, 3, 32, 32))
    assert_same_outputs(model, found.model, feeds, rtol=1e-4, atol=1e-5)


def test_bisect_needs_the_check():
    with pytest.raises(GraphfixError, match="without the output check"):
        api.bisect(samples.conv_bn_relu_residual(), "cleanup,fold-bn", check=False)
    with pytest.raises(GraphfixError, match="--max-rewrites and --bisect"):
        api.bisect(samples.conv_bn_relu_residual(), "cleanup", max_rewrites=3)


def test_bisect_refuses_an_output_onto_a_rules_file_it_reads(tmp_path):
    """bisect claims its outputs against every file it reads, --plugin-rules included,
    as run does (one list of inputs for both)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: []\n")
    before = rules.read_bytes()
    with pytest.raises(GraphfixError, match="--plugin-rules"):
        api.bisect(samples.conv_bn_relu_residual(), "cleanup", output=rules,
                   plugin_rules=[rules])
    assert rules.read_bytes() == before
