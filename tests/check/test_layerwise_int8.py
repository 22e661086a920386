"""FP32 vs the Q/DQ INT8 model of digits_dev (from graphfix.calibration): the per-layer
SQNR table, the ranked origins, and the nodes to keep in float."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from graphfix.calibration import qdq
from graphfix.calibration.runner import calibrate
from graphfix.check.layerwise import compare_layerwise
from graphfix.runtime.data import open_data


@pytest.fixture(scope="module")
def digits():
    from conftest import SHARED_MODELS

    model_path = SHARED_MODELS / "digits_dev.onnx"
    data_path = SHARED_MODELS / "digits_dev_data.npz"
    if not model_path.exists():
        pytest.skip("../shared/models is not available")
    model = onnx.load(model_path)
    result = calibrate(model, open_data(data_path, model, data_key="calib", batch_size=50),
                       ("entropy",))
    with np.load(data_path) as archive:
        test = archive["test"]
    feeds = [{"input": test[i * 4:(i + 1) * 4]} for i in range(3)]  # 3 samples of 4 images
    return result.fp32, result.outcome().model, feeds


def test_int8_gives_a_per_layer_sqnr_table(digits):
    fp32, int8, feeds = digits
    report = compare_layerwise(fp32, int8, feeds)
    assert report.mode == "sqnr" and report.samples == 3
    convs = [n.output[0] for n in fp32.graph.node if n.op_type in ("Conv", "Gemm")]
    by = {t.name: t for t in report.tensors}
    for name in convs:  # every quantized layer is compared under its float name
        t = by[name]
        assert t.status == "compared" and t.quantized and np.isfinite(t.sqnr_db), t
        assert t.ok == (t.sqnr_db >= 20.0)
    assert by["input"].sqnr_db == float("inf") and not by["input"].quantized
    table = report.sensitivity()
    assert table and all(t.quantized for t in table)
    assert [t.sqnr_db for t in table] == sorted(t.sqnr_db for t in table)
    assert not any("DequantizeLinear" in t.name for t in report.tensors)


def test_int8_origins_are_ranked_and_suggested_for_exclusion(digits):
    fp32, int8, feeds = digits
    report = compare_layerwise(fp32, int8, feeds, sqnr_threshold=40.0)
    assert len(report.origins) >= 2
    amps = [o.amplification for o in report.origins]
    assert amps == sorted(amps, reverse=True) and min(amps) >= 10
    by = {t.name: t for t in report.tensors}
    assert all(by[o.name].ok is False for o in report.origins)
    top = report.origins[0]  # the first quantized conv: its input is exact
    assert top.node == "Conv '/0/Conv'" and top.input_error == 0
    assert report.first_divergence.name == top.name
    for o in report.origins:
        assert o.error == pytest.approx(10 ** (-by[o.name].sqnr_db / 10), rel=1e-9)
    names = report.exclude_nodes
    assert names[0] == "/0/Conv"
    qdq.plan(fp32, exclude_nodes=names)  # names calibrate accepts
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["mode"] == "sqnr" and data["exclude_nodes"] == names
    assert data["sensitivity"] == [t.name for t in report.sensitivity()]


def test_int8_chunked_equals_unchunked(digits):
    fp32, int8, feeds = digits
    whole = compare_layerwise(fp32, int8, feeds)
    chunked = compare_layerwise(fp32, int8, feeds, memory_budget=20_000)
    assert chunked.chunks > 1
    assert chunked.tensors == whole.tensors and chunked.origins == whole.origins


def test_fp32_against_itself_is_exact_in_sqnr_mode(digits):
    fp32, _, feeds = digits
    report = compare_layerwise(fp32, fp32, feeds[:1], mode="sqnr")
    assert report.outputs_ok and report.origins == [] and report.first_divergence is None
    assert all(t.sqnr_db == float("inf") for t in report.tensors)
