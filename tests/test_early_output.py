"""`graphfix.api.run` stages the output model while the run's last output check runs it
(`_EarlyOutput`): the same file as staging it afterwards, and withdrawn when the check
fails and the run returns another model."""

from __future__ import annotations

import onnx
import pytest
from gfhelpers import ops

from graphfix import api, provenance
from graphfix.passes import registry
from graphfix.passes.base import NoOptions, Pass, PassResult
from graphfix.samples import conv_bn_relu_residual


@pytest.fixture
def taken(monkeypatch):
    """What each run's `_EarlyOutput.take` returned (None: the output staged afterwards)."""
    seen: list[str | None] = []
    original = api._EarlyOutput.take

    def take(self, model):
        seen.append(original(self, model))
        return seen[-1]

    monkeypatch.setattr(api._EarlyOutput, "take", take)
    return seen


def _written(tmp_path, name: str, passes: str, model: onnx.ModelProto) -> bytes:
    src, out = tmp_path / f"{name}.in.onnx", tmp_path / f"{name}.onnx"
    onnx.save(model, src)
    api.run(src, passes=passes, output=out, keep_weights=False)
    return out.read_bytes()


def test_the_early_file_is_the_file_staged_after_the_run(tmp_path, taken, monkeypatch):
    model = conv_bn_relu_residual()
    early = _written(tmp_path, "early", "fold-bn,cleanup", model)
    assert taken and taken[-1] is not None  # written while the check ran
    monkeypatch.setattr(api, "_EarlyOutput", lambda *a, **k: None)
    late = _written(tmp_path, "late", "fold-bn,cleanup", model)
    assert early == late
    written = onnx.load_from_string(early)
    assert "BatchNormalization" not in ops(written)
    assert provenance.read(written)[1]  # the removed BN outputs, as staged afterwards
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "early.in.onnx", "early.onnx", "late.in.onnx", "late.onnx"]


class BreaksNumbers(Pass):
    """Turns Relu into Neg: the batched check fails, the run repeats, checking each pass,
    and rolls this one back."""

    name = "breaks-numbers"
    summary = "test only"
    Options = NoOptions

    def run(self, graph, ctx):
        for node in graph.nodes:
            if node.op == "Relu":
                node.op = "Neg"
        return PassResult(changed=True, counts={"broke": 1})


def test_a_failed_last_check_withdraws_the_early_file(tmp_path, taken, monkeypatch):
    monkeypatch.setitem(registry.REGISTRY, BreaksNumbers.name, BreaksNumbers)
    model = conv_bn_relu_residual()
    data = _written(tmp_path, "m", "fold-bn,breaks-numbers", model)
    assert taken == [None]  # the early file held the broken model
    written = onnx.load_from_string(data)
    assert "Relu" in ops(written) and "Neg" not in ops(written)
    assert "BatchNormalization" not in ops(written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.in.onnx", "m.onnx"]


def test_an_in_memory_model_is_staged_after_the_run(tmp_path, taken):
    """Its weights are inline: an early copy would copy them all."""
    out = tmp_path / "m.onnx"
    api.run(conv_bn_relu_residual(), passes="fold-bn", output=out)
    assert taken == []
    assert "BatchNormalization" not in ops(onnx.load(out))
