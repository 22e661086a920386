"""`graphfix check --trt`: TensorRT engine vs ONNX, against stand-ins (trt_fakes).

There is no TensorRT here. These tests pin down what graphfix asks of polygraphy and
TensorRT, and how the comparison treats an engine's tensors. They do not show that a
real engine behaves like the fakes (docs/check.md says so).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnx
import pytest
import trt_fakes
from onnx import numpy_helper
from test_layerwise import chain, copy, perturb, samples
from test_layerwise_subgraphs import if_model, mixed_feeds, perturb_branch_weight
from typer.testing import CliRunner

from graphfix.check.engine import (
    FUSED,
    NOT_DEBUG,
    NOT_MARKED,
    EngineSpec,
    TrtEngine,
    input_profile,
    layer_names,
    layer_tensors,
    open_engine,
)
from graphfix.check.layerwise import compare_layerwise, tensor_names
from graphfix.check.status import TensorStatus
from graphfix.cli.app import app
from graphfix.errors import GraphfixError
from graphfix.runtime.tolerances import ENGINE_FP32

cli = CliRunner()


def _save(tmp_path, name, model):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _open(path, model, log_feeds, **spec):
    return open_engine(EngineSpec(path, **spec), tensor_names(model), log_feeds)


# ------------------------------------------------------------------ building


def test_build_marks_only_the_tensors_that_survive_fusion(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    ref = chain(3)
    engine = _open(_save(tmp_path, "m.onnx", ref), ref, samples(ref, 2))
    # the first build shows conv+relu fused: c1..c3 are gone, r1, r2 survive (r3 and x
    # are engine I/O); the rebuild marks exactly r1, r2
    assert log.builds == [(), ("r1", "r2")]
    assert engine.exposed == frozenset({"x", "r1", "r2", "r3"})
    assert engine.absent == FUSED and not engine.sqnr_by_default
    assert log.configs[0]["tf32"] is False
    assert log.configs[0]["profiling_verbosity"] == "detailed"
    assert "fp16" not in log.configs[0] and "int8" not in log.configs[0]
    assert engine.notes[0].startswith("2 of the 5 intermediate tensors survived")
    runner = log.runners[-1]
    assert runner.is_active and runner.engine.marked == ("r1", "r2")
    engine.close()
    assert not runner.is_active


def test_build_options_precision_profile_workspace_and_qdq(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    ref = chain(2)
    path = _save(tmp_path, "m.onnx", ref)
    feeds = [{"x": np.zeros((1, 4, 8, 8), np.float32)}, {"x": np.zeros((3, 4, 8, 8), np.float32)}]
    engine = open_engine(EngineSpec(path, "fp16", workspace=1 << 30), ["r1"], feeds,
                         has_qdq=True)
    options = log.configs[0]
    assert options["fp16"] is True and options["int8"] is True  # Q/DQ needs INT8 (<= 10.x)
    assert options["memory_pool_limits"] == {"workspace": 1 << 30}
    (profile,) = options["profiles"]
    assert tuple(profile["x"].min) == (1, 4, 8, 8) and tuple(profile["x"].max) == (3, 4, 8, 8)
    assert engine.sqnr_by_default  # reduced precision: judged by SQNR


def test_strongly_typed_tensorrt_refuses_precision_flags(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch, version="11.1.0", weakly_typed=False)
    ref = chain(2)
    path = _save(tmp_path, "m.onnx", ref)
    with pytest.raises(GraphfixError) as err:
        _open(path, ref, samples(ref, 1), precision="fp16")
    assert "no fp16 builder flag" in err.value.what and "strongly typed" in err.value.why
    assert log.builds == []
    engine = open_engine(EngineSpec(path), tensor_names(ref), samples(ref, 1), has_qdq=True)
    assert "int8" not in log.configs[-1]  # TensorRT 11 reads Q/DQ without a flag
    engine.close()


def test_a_rebuild_that_changes_the_layers_is_noted(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    log.layers_change = True
    ref = chain(3)
    engine = _open(_save(tmp_path, "m.onnx", ref), ref, samples(ref, 1))
    assert any("changed the engine's layers (3 layers before, 4 after)" in n
               for n in engine.notes)


def test_unknown_precision_and_missing_file(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(1)
    with pytest.raises(GraphfixError, match="Unknown TensorRT precision 'fp64'"):
        _open(_save(tmp_path, "m.onnx", ref), ref, samples(ref, 1), precision="fp64")
    with pytest.raises(GraphfixError, match="does not exist"):
        _open(tmp_path / "gone.engine", ref, samples(ref, 1))


def test_without_tensorrt_the_error_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    ref = chain(1)
    with pytest.raises(GraphfixError) as err:
        _open(_save(tmp_path, "m.onnx", ref), ref, samples(ref, 1))
    assert "tensorrt is not installed" in err.value.what


# ------------------------------------------------------------------ engine files


def _engine_file(tmp_path, onnx_path, debug):
    path = tmp_path / "model.engine"
    path.write_text(json.dumps({"onnx": str(onnx_path), "debug": list(debug)}))
    return path


def test_engine_file_exposes_outputs_and_its_debug_tensors(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    ref = chain(3)
    path = _engine_file(tmp_path, _save(tmp_path, "m.onnx", ref), ["c2", "r1"])
    engine = _open(path, ref, samples(ref, 1))
    assert log.builds == [] and log.configs == []  # used as built
    assert engine.exposed == frozenset({"x", "r3", "c2", "r1"})
    assert engine.absent == NOT_DEBUG and engine.sqnr_by_default
    report = compare_layerwise(ref, ref, samples(ref, 2), engine=engine)
    assert report.runtime == "tensorrt" and report.mode == "sqnr"
    assert {t.name for t in report.tensors if t.status == "compared"} == {"x", "c2", "r1", "r3"}
    assert report.tensor("c1").status == NOT_DEBUG
    assert report.passed


def test_engine_file_without_debug_tensors_says_only_outputs_compare(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(2)
    engine = _open(_engine_file(tmp_path, _save(tmp_path, "m.onnx", ref), []), ref,
                   samples(ref, 1))
    assert "no debug tensors that the reference also has" in engine.notes[0]


# ------------------------------------------------------------------ comparing


def test_engine_of_a_perturbed_model_names_the_fused_layer(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(6)
    bad = perturb(ref, "w4")
    engine = _open(_save(tmp_path, "bad.onnx", bad), bad, samples(ref))
    try:
        report = compare_layerwise(ref, bad, samples(ref), engine=engine)
    finally:
        engine.close()
    assert report.mode == "strict" and not report.passed
    assert report.tensor("c4").status == FUSED  # conv4 + relu4 is one TensorRT layer
    first = report.first_divergence
    assert (first.name, first.node) == ("r4", "Relu 'relu4'")
    assert [o.node for o in report.origins] == ["Relu 'relu4'"]
    assert report.origins[0].input_error == 0.0  # looked through c4 to r3, which agrees
    assert "intermediate tensors survived TensorRT's fusions" in report.notes[0]


def test_engine_strict_mode_uses_the_engine_tolerance(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(3)
    # w3 scaled by 1 + 3e-4 moves c3 and r3 by 3e-4 relative, element by element:
    # beyond fp32's rtol 1e-4, within ENGINE_FP32's 1e-3
    slight = copy(ref)
    w3 = next(t for t in slight.graph.initializer if t.name == "w3")
    w3.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w3) * np.float32(1 + 3e-4), "w3"))
    feeds = samples(ref)
    engine = _open(_save(tmp_path, "slight.onnx", slight), slight, feeds)
    report = compare_layerwise(ref, slight, feeds, engine=engine)
    worst = report.tensor("r3").max_rel
    assert 1e-4 < worst < ENGINE_FP32.rtol, worst
    assert report.passed
    assert not compare_layerwise(ref, slight, feeds).passed  # onnxruntime: fp32 tolerances
    engine.close()


def test_engine_results_are_the_same_chunked(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    ref = chain(6)
    bad = perturb(ref, "w2")
    feeds = samples(ref)
    engine = _open(_save(tmp_path, "bad.onnx", bad), bad, feeds)
    whole = compare_layerwise(ref, bad, feeds, engine=engine)
    runs_whole = log.runners[-1].runs
    chunked = compare_layerwise(ref, bad, feeds, engine=engine, memory_budget=2048)
    assert chunked.chunks > whole.chunks
    assert log.runners[-1].runs > runs_whole
    for a, b in zip(whole.tensors, chunked.tensors, strict=True):
        assert (a.name, a.status, a.ok, a.worst_sample) == (b.name, b.status, b.ok, b.worst_sample)
        assert a.max_abs == b.max_abs and (a.sqnr_db == b.sqnr_db or math.isinf(a.sqnr_db))
    engine.close()


def test_a_debug_tensor_the_engine_does_not_return_is_not_comparable(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(3)
    engine = _open(_save(tmp_path, "m.onnx", ref), ref, samples(ref, 1))
    real_infer = engine.runner.infer
    engine.runner.infer = lambda feeds: {k: v for k, v in real_infer(feeds).items() if k != "r1"}
    report = compare_layerwise(ref, ref, samples(ref, 1), engine=engine)
    r1 = report.tensor("r1")
    assert (r1.status, r1.detail) == (TensorStatus.NOT_COMPARABLE,
                                      "the engine returned no value")
    assert report.tensor("r2").status == "compared" and report.passed


def test_if_branch_tensors_are_not_marked_and_say_so(tmp_path, monkeypatch):
    log = trt_fakes.install(monkeypatch)
    ref = if_model()
    bad = perturb_branch_weight(ref)
    engine = _open(_save(tmp_path, "bad.onnx", bad), bad, mixed_feeds())
    assert not any(name in ("ta", "tb", "tc", "t_out") for name in log.builds[-1])
    report = compare_layerwise(ref, bad, mixed_feeds(), engine=engine)
    engine.close()
    # the branch's tensors were never asked for; conv1 + relu1 fused c1
    assert report.tensor("tc").status == NOT_MARKED
    assert report.tensor("c1").status == FUSED
    # the error shows first at the If's output, which the engine keeps
    assert report.first_divergence.name == "y" and not report.passed


def test_inputs_are_cast_to_the_engine_input_type():
    class Runner:
        def get_input_metadata(self):
            raise RuntimeError

        def infer(self, feeds):
            self.seen = feeds
            return {"y": feeds["ids"]}

    runner = Runner()
    engine = TrtEngine(runner, frozenset({"y"}), FUSED, input_dtypes={"ids": np.dtype("int32")})
    out = engine.infer({"ids": np.array([1, 2], np.int64)})
    assert runner.seen["ids"].dtype == np.int32 and out["y"].tolist() == [1, 2]
    with pytest.raises(GraphfixError, match="cannot"):
        engine.infer({"ids": np.array([2**40], np.int64)})


# ------------------------------------------------------------------ helpers


def test_layer_tensors_reads_inspector_json_and_refuses_names_only():
    info = {"Layers": [
        {"Name": "conv1 + relu1", "Inputs": [{"Name": "x", "Format/Datatype": "Float"}],
         "Outputs": [{"Name": "r1"}]},
        {"Name": "pool", "Inputs": [{"Name": "r1"}], "Outputs": [{"Name": "y"}]},
    ], "Bindings": ["x", "y"]}
    assert layer_tensors(info) == {"x", "r1", "y"}
    assert layer_names(info) == ["conv1 + relu1", "pool"]
    with pytest.raises(GraphfixError, match="no layer details"):
        layer_tensors({"Layers": ["conv1 + relu1", "pool"]})  # LAYER_NAMES_ONLY


def test_input_profile_spans_the_samples():
    prof = input_profile([{"x": np.zeros((1, 3, 8))}, {"x": np.zeros((2, 3, 4))}])
    assert prof == {"x": ((1, 3, 4), (2, 3, 8))}
    with pytest.raises(GraphfixError, match="different ranks"):
        input_profile([{"x": np.zeros((1, 3))}, {"x": np.zeros((1, 3, 1))}])


# ------------------------------------------------------------------ command line


def test_cli_trt_finds_the_perturbed_layer_and_reports_json(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(6)
    ref_path = _save(tmp_path, "ref.onnx", ref)
    bad_path = _save(tmp_path, "bad.onnx", perturb(ref, "w4"))
    out = cli.invoke(app, ["check", str(ref_path), str(bad_path), "--trt-engine", "--json"])
    assert out.exit_code == 1, out.output
    data = json.loads(out.stdout)
    assert data["runtime"] == "tensorrt" and data["first_divergence"]["name"] == "r4"
    fused = {t["name"] for t in data["tensors"] if t["status"] == FUSED}
    assert fused == {f"c{i}" for i in range(1, 7)}

    same = cli.invoke(app, ["check", str(ref_path), "--trt-engine"])  # REFERENCE built
    assert same.exit_code == 0, same.output
    text = " ".join(same.stdout.split())
    assert "strict mode (tensorrt)" in text and "6 fused by TensorRT" in text
    assert "check passed" in text


def test_cli_engine_file_is_given_with_engine(tmp_path, monkeypatch):
    trt_fakes.install(monkeypatch)
    ref = chain(2)
    ref_path = _save(tmp_path, "ref.onnx", ref)
    engine = _engine_file(tmp_path, ref_path, ["r1"])
    out = cli.invoke(app, ["check", str(ref_path), "--engine", str(engine), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["runtime"] == "tensorrt" and data["mode"] == "sqnr"
    positional = cli.invoke(app, ["check", str(ref_path), str(engine)])
    assert positional.exit_code == 2 and "is a TensorRT engine" in positional.output


def test_cli_without_tensorrt_or_candidate_exits_2(tmp_path, monkeypatch):
    ref_path = _save(tmp_path, "ref.onnx", chain(1))
    before = ref_path.read_bytes()
    missing = cli.invoke(app, ["check", str(ref_path)])
    assert missing.exit_code == 2 and "No model to check" in missing.output
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    out = cli.invoke(app, ["check", str(ref_path), "--trt-engine"])
    assert out.exit_code == 2 and "tensorrt is not installed" in out.output
    gone = cli.invoke(app, ["check", str(ref_path), "--engine", str(tmp_path / "gone.plan")])
    assert gone.exit_code == 2 and "gone.plan does not exist" in gone.output
    assert ref_path.read_bytes() == before
