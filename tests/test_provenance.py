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


def test_compose_chains_renames_and_keeps_earlier_removals():
    earlier = ({"a": "b", "k": "k2"}, {"bn": "fold-bn"})
    renamed, removed = provenance.compose(earlier, {"b": "c", "n": "n2"}, {"k2": "cleanup",
                                                                          "x": "cleanup"})
    assert renamed == {"a": "c", "n": "n2"}  # a -> b -> c; n was not renamed before
    assert removed == {"bn": "fold-bn", "k": "cleanup", "x": "cleanup"}
    assert provenance.compose(({}, {}), {"p": "q"}, {"r": "s"}) == ({"p": "q"}, {"r": "s"})


def test_a_second_run_keeps_what_the_first_merged(tmp_path):
    import json

    from typer.testing import CliRunner

    from graphfix.cli.app import app

    a = samples.conv_bn_relu_residual()
    b = run(a, passes="fold-bn").model
    c = run(b, passes="cleanup").model
    bn_inputs = {n.output[0] for n in a.graph.node if n.op_type == "Conv"}
    identity = next(n.output[0] for n in a.graph.node if n.op_type == "Identity")
    _, removed = provenance.read(c)
    assert {t: removed[t] for t in bn_inputs} == dict.fromkeys(bn_inputs, "fold-bn")
    assert removed[identity] == "cleanup"
    for name, model in (("a", a), ("c", c)):
        onnx.save(model, tmp_path / f"{name}.onnx")
    out = CliRunner().invoke(app, ["check", str(tmp_path / "a.onnx"), str(tmp_path / "c.onnx"),
                                   "--json"])
    assert out.exit_code == 0, out.output
    status = {t["name"]: (t["status"], t["detail"]) for t in json.loads(out.stdout)["tensors"]}
    assert {t: status[t] for t in bn_inputs} == dict.fromkeys(bn_inputs, ("merged", "fold-bn"))
    assert status[identity] == ("merged", "cleanup")
