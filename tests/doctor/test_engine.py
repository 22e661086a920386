"""The doctor engine: a failing rule is reported and the others run; ordering; the verdict;
the real SSDlite model."""

from __future__ import annotations

import time
from collections import Counter

import onnx
import pytest
from doctorhelpers import model, vi
from onnx import TensorProto as TP
from onnx import helper

from graphfix.doctor import diagnose, engine
from graphfix.doctor.engine import Rule
from graphfix.errors import InternalError
from graphfix.trt import parse_target

F = TP.FLOAT


def unsupported_model():
    nodes = [helper.make_node("Hardmax", ["x"], ["h"], name="hm"),
             helper.make_node("Relu", ["h"], ["y"], name="r")]
    return model(nodes, [vi("x", F, ["N", 5])], [vi("y", F, ["N", 5])], opset=13)


def test_a_failing_rule_is_an_internal_finding_and_the_others_run(monkeypatch):
    def broken(view, target):
        raise KeyError("boom")
        yield  # pragma: no cover

    rules = engine.rules()
    monkeypatch.setattr(engine, "rules", lambda: (Rule("broken", ("x",), broken), *rules))
    found = diagnose(unsupported_model(), parse_target("8.6")).findings
    internal = [f for f in found if f.rule == "internal"]
    assert len(internal) == 1 and "the broken rule failed" in internal[0].message
    assert {"op-unsupported", "dynamic-input"} <= {f.rule for f in found}


def test_a_model_the_view_cannot_read_is_an_internal_finding(monkeypatch):
    from graphfix.doctor import view

    def broken(model):
        raise ValueError("unreadable")

    monkeypatch.setattr(view.ModelView, "of", staticmethod(broken))
    d = diagnose(unsupported_model(), parse_target("10"))
    assert [f.rule for f in d.findings] == ["internal"]
    assert "model-view rule failed" in d.findings[0].message


def test_findings_most_severe_first_and_verdict():
    d = diagnose(unsupported_model(), parse_target("8.6"))
    severities = [f.severity for f in d.findings]
    assert severities == sorted(severities, key=["error", "warn", "info"].index)
    assert d.verdict() == "TensorRT 8.6 will parse this model: no — 1 blocking node"
    assert d.fails("error") and d.fails("warn") and not d.fails("never")
    ok = diagnose(unsupported_model(), parse_target("10.16"))
    assert ok.verdict() == "TensorRT 10.16 will parse this model: yes (1 warning)"
    assert not ok.fails("error") and ok.fails("warn")


def test_json_schema_fields():
    data = diagnose(unsupported_model(), parse_target("10.12")).to_json()
    assert data["schema"] == "graphfix.doctor/1"
    assert data["target"]["matrix"] == "10.1"
    assert set(data) == {"schema", "model", "target", "parses", "verdict", "counts",
                         "node_counts", "blocking_nodes", "findings", "parser", "seconds"}
    assert set(data["findings"][0]) == {"rule", "severity", "message", "nodes", "tensors",
                                        "fact", "fix", "op"}


def test_ssdlite_nms_inside_if_and_data_dependent_outputs_once(shared_model):
    loaded = onnx.load(shared_model("ssdlite320_mobilenet_v3_large.onnx"))
    start = time.perf_counter()
    d = diagnose(loaded, parse_target(None))
    elapsed = time.perf_counter() - start
    dependent = [f for f in d.findings if f.rule == "data-dependent-shape"]
    nms = [f for f in dependent if f.op == "NonMaxSuppression"]
    assert len(nms) == 1 and " > NonMaxSuppression " in nms[0].nodes[0]
    assert nms[0].nodes[0].startswith("If '")
    assert {f.op for f in dependent} >= {"NonZero", "NonMaxSuppression"}
    per_rule_nodes = Counter((f.rule, n) for f in d.findings for n in f.nodes)
    assert max(per_rule_nodes.values()) == 1  # each node once per rule
    print(f"doctor on SSDlite: {elapsed:.2f} s")  # timings are recorded, never asserted


def test_no_rule_fails_on_the_shared_models_for_any_documented_version(shared_model):
    from graphfix.trt import documented_versions

    names = ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "digits_dev.onnx",
             "mobilenet_v3_small_bn.onnx", "ssdlite320_mobilenet_v3_large.onnx")
    for name in names:
        loaded = onnx.load(shared_model(name))
        for version in documented_versions():
            d = diagnose(loaded, parse_target(version))
            assert [f for f in d.findings if f.rule == "internal"] == [], (name, version)


def test_an_unknown_rule_name_is_an_error_not_an_empty_run():
    # a typo in only=[...] ran no rule and said "will parse: yes"
    empty = helper.make_model(helper.make_graph([], "g", [], []))
    with pytest.raises(InternalError, match="names no rule: qdk; the rules are: "):
        diagnose(empty, parse_target("10"), only=["qdk"])
