"""Bad clips: the warning that TensorRT-style entropy clipped a tensor, and auto avoiding it.

The distribution is issue 13's: HardSwish outputs, most of the mass in [-0.375, 0.5]
(folded onto [0, 0.5] in the |x| histogram) and a sparse tail to ~7.
"""

from __future__ import annotations

import numpy as np
import pytest
from calhelpers import stats_of_array

from graphfix.calibration import algorithms as A
from graphfix.calibration import clipping, methods


def _hardswish_like(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(-0.8, 0.9, 200_000), rng.uniform(1.0, 7.0, 400)])
    return (x * np.clip(x + 3, 0, 6) / 6).astype(np.float32)


@pytest.fixture(scope="module")
def hardswish():
    values = _hardswish_like()
    stats = {"hs": stats_of_array(values, name="hs")}
    options = methods.options_for({})
    return values, stats, methods.plain_ranges(stats, options)


def test_the_distribution_is_the_issues(hardswish):
    values, _, _ = hardswish
    assert values.min() == pytest.approx(-0.375, abs=1e-3) and 6.5 < values.max() < 7.0
    assert np.mean((values > -0.375) & (values < 0.5)) > 0.9
    assert np.sum(values > 3) < 0.002 * values.size  # the tail is sparse


def test_entropy_clips_far_below_the_tail_and_is_reported(hardswish):
    _, stats, plain = hardswish
    s = stats["hs"]
    entropy = plain["entropy"].amaxes["hs"]
    assert entropy < 0.3 * s.amax  # TensorRT's KL search throws most of the range away
    (clip,) = clipping.find(stats, plain["entropy"], plain, {"hs": ["Conv_7", "Add_3"]})
    assert (clip.tensor, clip.method, clip.amax, clip.observed) == ("hs", "entropy", entropy,
                                                                    s.amax)
    sqnr = {m: A.quantization_sqnr(s, [r.amaxes["hs"]])[0] for m, r in plain.items()}
    assert clip.best_method == max(sqnr, key=sqnr.get)
    assert clip.lost_db == pytest.approx(max(sqnr.values()) - sqnr["entropy"]) and \
        clip.lost_db > 15
    text = clip.message()
    for part in ("'hs'", "entropy clips at", f"{clip.lost_db:.1f} dB below", "--method auto",
                 "--exclude-nodes Conv_7,Add_3"):
        assert part in text, part
    assert clip.to_json()["exclude_nodes"] == ["Conv_7", "Add_3"]
    assert clip.to_json()["lost_db"] == round(clip.lost_db, 2)


def test_auto_keeps_the_sqnr_within_a_db_of_the_best_method(hardswish):
    _, stats, plain = hardswish
    s = stats["hs"]
    auto = methods.choose(stats, plain)
    best = max(A.quantization_sqnr(s, [r.amaxes["hs"] for r in plain.values()]))
    assert A.quantization_sqnr(s, [auto.amaxes["hs"]])[0] >= best - 1.0
    assert auto.amaxes["hs"] > 0.9 * s.amax and auto.chosen["hs"] != "entropy"
    assert clipping.find(stats, auto, plain, {}) == []


def test_the_threshold_is_one_bit():
    """A tensor losing less than 6.02 dB is not listed; the same tensor is at a lower
    threshold (so the threshold, not the data, decides)."""
    rng = np.random.default_rng(1)
    s = stats_of_array(np.maximum(rng.standard_normal(100_000), 0).astype(np.float32), name="r")
    plain = methods.plain_ranges({"r": s}, methods.options_for({}))
    best = max(A.quantization_sqnr(s, [r.amaxes["r"] for r in plain.values()]))
    lost = best - A.quantization_sqnr(s, [plain["minmax"].amaxes["r"]])[0]
    assert 0 < lost < clipping.LOSS_DB == pytest.approx(20 * np.log10(2), abs=1e-3)
    assert clipping.find({"r": s}, plain["minmax"], plain, {}) == []
    (clip,) = clipping.find({"r": s}, plain["minmax"], plain, {}, threshold_db=lost / 2)
    assert "keeps the whole range" in clip.message()


def test_all_zero_tensors_are_never_listed():
    from calhelpers import stats_of_counts

    s = stats_of_counts([7, 0, 0], amax=0.0, name="z")
    plain = methods.plain_ranges({"z": s}, methods.options_for({}))
    assert clipping.find({"z": s}, plain["entropy"], plain, {}) == []
