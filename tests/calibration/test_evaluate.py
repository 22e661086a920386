"""The comparison behind --eval and --method all: one FP32 run shared by every candidate,
SQNR over the outputs, top-1 only for classifiers, constant outputs named, and the
recommendation ranked by accuracy then SQNR (never by top-1 on a dense output)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gfhelpers import parse

from graphfix.calibration import evaluate, runner
from graphfix.calibration.evaluate import Agreement

DENSE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 1, 4, 4] x) => (float[N, 1, 4, 4] y) {
    k = Constant<value = float {%s}>()
    y = Mul(x, k)
}
"""
TWO_HEADS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3] x) => (float[N, 3] logits, float[N, 3] zero) {
    k = Constant<value = float {%s}>()
    logits = Mul(x, k)
    nought = Constant<value = float {0.0}>()
    zero = Mul(x, nought)
}
"""


def _batches(shape, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def test_the_reference_runs_once_per_batch_for_all_candidates(monkeypatch):
    reference = parse(DENSE % "1.0")
    runs = []

    class Counting:
        def __init__(self, session, label):
            self.session, self.label = session, label

        def get_outputs(self):
            return self.session.get_outputs()

        def run(self, names, feeds):
            runs.append(self.label)
            return self.session.run(names, feeds)

    made = []
    original = evaluate.make_session

    def counting(model, providers):
        made.append(model)
        return Counting(original(model, providers), len(made) - 1)

    monkeypatch.setattr(evaluate, "make_session", counting)
    candidates = {f"c{i}": parse(DENSE % f"{1 + 0.01 * i}") for i in range(3)}
    got = evaluate.compare_many(reference, candidates, _batches((2, 1, 4, 4)))
    assert runs.count(0) == 4  # the FP32 model: once per batch, not once per candidate
    assert [runs.count(i) for i in (1, 2, 3)] == [4, 4, 4]
    assert got["c0"].sqnr_db == float("inf")
    assert got["c1"].sqnr_db == pytest.approx(40.0) and got["c2"].sqnr_db == pytest.approx(
        20 * np.log10(1 / 0.02))
    assert all(a.top1_agreement is None for a in got.values())  # dense: no top-1


def test_a_constant_output_is_named_and_left_out_of_the_sqnr():
    reference = parse(TWO_HEADS % "1.0")
    got = evaluate.compare(reference, parse(TWO_HEADS % "1.1"), _batches((2, 3)))
    assert got.constant_outputs == ["zero"]
    assert got.sqnr_db == pytest.approx(20.0)  # logits alone
    assert got.top1_agreement == 1.0  # [N, 3] is a classifier's output


def _outcome(method, sqnr, top1=None, accuracy=None):
    agreement = Agreement(40, sqnr, top1, accuracy, 0.99 if accuracy is not None else None)
    return runner.MethodOutcome(method, {}, onnx.ModelProto(), 0.0, agreement)


def test_the_recommendation_ranks_by_output_sqnr_not_top1():
    """Issue 13: on a text detector's probability map, entropy was recommended for its
    top-1 agreement at 0.0 dB."""
    outcomes = [_outcome("entropy", 0.0, top1=1.0), _outcome("minmax", 24.0, top1=0.8),
                _outcome("percentile", 26.0, top1=0.7)]
    assert runner._recommend(outcomes) == "percentile"


def test_within_the_margins_the_first_asked_wins_and_accuracy_comes_first():
    assert runner._recommend([_outcome("auto", 25.5), _outcome("mse", 26.0)]) == "auto"
    assert runner._recommend([_outcome("auto", 24.0), _outcome("mse", 26.0)]) == "mse"
    with_labels = [_outcome("auto", 30.0, accuracy=0.97), _outcome("mse", 20.0, accuracy=0.99)]
    assert runner._recommend(with_labels) == "mse"
    assert runner._recommend([_outcome("auto", float("nan")), _outcome("mse", 3.0)]) == "mse"
    assert runner._recommend([_outcome("auto", float("nan"))]) == "auto"


DETECTOR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[3, 4] image) => (float[M, 4] boxes) {
    k = Constant<value = float {%s}>()
    scaled = Mul(image, k)
    zero = Constant<value = int64 {0}>()
    score = Gather<axis = 1>(scaled, zero)
    half = Constant<value = float {0.5}>()
    keep = Greater(score, half)
    boxes = Compress<axis = 0>(scaled, keep)
}
"""


def test_a_model_without_a_batch_axis_counts_samples_not_detections(tmp_path):
    """torchvision's detectors: image [3, H, W] in, [detections, 4] out. Samples were
    counted as output rows (300 for one image) and top-1 taken over box coordinates;
    an INT8 model keeping another number of rows crashed the SQNR."""
    from graphfix.runtime.data import open_data

    reference = parse(DETECTOR % "1.0")
    images = np.random.default_rng(3).standard_normal((4, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", image=images)
    data = open_data(tmp_path / "d.npz", reference)
    kept = [int(np.sum(i[:, 0] > 0.5)) != int(np.sum(1.5 * i[:, 0] > 0.5)) for i in images]
    assert any(kept)  # some image keeps another number of boxes in the candidate
    got = evaluate.compare(reference, parse(DETECTOR % "1.5"), data)
    assert got.samples == 4 and got.top1_agreement is None
    assert np.isfinite(got.sqnr_db) and got.sqnr_db < 20
