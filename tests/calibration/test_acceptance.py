"""Issue 13's acceptance on real trained models: the default method (auto) keeps INT8 test
accuracy within 1 point of FP32 on all three digits classifiers, and with --eval the
plain methods are compared against it from one FP32 run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graphfix.calibration.runner import calibrate
from graphfix.runtime.data import open_data

MODELS = ("digits_dev", "digits_silu_dev", "digits_hswish_dev")


@pytest.mark.parametrize("name", MODELS)
def test_default_method_keeps_accuracy_within_one_point(shared_model, name):
    path, data = shared_model(f"{name}.onnx"), shared_model(f"{name}_data.npz")
    model = onnx.load(path)
    calib = open_data(data, model, data_key="calib", batch_size=50)
    test = open_data(data, model, data_key="test", batch_size=100)
    with np.load(data) as archive:
        labels = archive["test_labels"]
    result = calibrate(model, calib, eval_data=test, labels=labels)
    auto = result.outcome("auto")
    assert result.requested == ("auto",)
    assert [o.method for o in result.outcomes] == ["auto", "minmax", "percentile", "entropy",
                                                   "mse"]  # the alternates that confirm it
    a = auto.agreement
    assert a.samples == 397 and a.reference_accuracy >= 0.98
    assert a.accuracy >= a.reference_accuracy - 0.01, a
    assert a.top1_agreement is not None and a.sqnr_db > 15
    assert set(auto.chosen_by_tensor) == set(auto.amaxes) and auto.clips == []
    written = result.outcome()  # what -o gets: auto, or an alternate that beat it
    assert written.agreement.accuracy >= a.reference_accuracy - 0.01
