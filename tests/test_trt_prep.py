"""Acceptance of the trt-prep preset on real models and the built-in samples."""

from collections import Counter

import pytest

import graphfix
from graphfix import samples
from graphfix.explain import explain
from graphfix.report import ROLLED_BACK

STANDARD = ("", "ai.onnx")

CASES = [
    ("mobilenet_v3_small_bn.onnx", {}),
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}),
    ("digits_dev.onnx", {}),
    ("ssdlite320_mobilenet_v3_large.onnx", {}),
]


def all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from all_nodes(attr.g)
            for g in attr.graphs:
                yield from all_nodes(g)


def nonstandard(model):
    return Counter((n.domain, n.op_type) for n in all_nodes(model.graph)
                   if n.domain not in STANDARD)


def check_trt_prep(model, shapes):
    source = graphfix.load(model) if not hasattr(model, "graph") else model
    result = graphfix.run(source, passes="trt-prep", input_shapes=shapes)
    report = result.report
    assert report.check.enabled, report.check.skipped_reason
    rolled = [(r.spec, r.rollback_reason) for r in report.passes if r.status == ROLLED_BACK]
    assert not rolled
    # its checks were batched and held (a pass that annotates shapes undeclared, or a
    # deferred check that fails, would make the run repeat itself)
    assert not [n for n in report.verify_notes if "the run was repeated" in n]
    assert 1 <= report.rounds["trt-prep"] <= 4
    assert not nonstandard(result.model) - nonstandard(source), "no pass emits a custom op"
    assert len(explain(result.model).broken()) <= len(explain(source).broken())
    return result


@pytest.mark.parametrize("name, shapes", CASES)
def test_trt_prep_on_shared_models_passes_every_check(shared_model, name, shapes):
    result = check_trt_prep(shared_model(name), shapes)
    ops = Counter(n.op_type for n in all_nodes(result.model.graph))
    if name.startswith("mobilenet"):
        assert ops["BatchNormalization"] == ops["Identity"] == ops["Dropout"] == 0


@pytest.mark.parametrize("name", sorted(samples.SAMPLES))
def test_trt_prep_on_samples(name):
    result = check_trt_prep(samples.SAMPLES[name](), {})
    assert "BatchNormalization" not in {n.op_type for n in result.model.graph.node}
