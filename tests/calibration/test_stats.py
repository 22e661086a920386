"""Streaming statistics in onnxruntime, one pass over the data: exact ranges, the fine-grid
histogram (and how far it is from an exact one), independence from batch size and order,
chunking under a memory budget, skipped tensors with reasons, progress."""

from __future__ import annotations

import numpy as np
import pytest
from gfhelpers import build_model, parse
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix import samples
from graphfix.calibration import stats as S
from graphfix.calibration.methods import METHODS as _ALL
from graphfix.errors import GraphfixError

METHODS = {m.name: m.amax for m in _ALL if m.amax is not None}

N = 30  # samples; 30 = 4*7 + 2 = 7*4 + 2, so batch sizes 4 and 7 leave a ragged last batch

ELEMENTWISE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y, int64[N, 8] i, float16[N, 8] h) {
    r = Relu(x)
    zero = Constant<value = float {0.0}>()
    z = Mul(x, zero)
    y = Add(r, z)
    i = Cast<to = 7>(x)
    h = Cast<to = 10>(x)
}
"""


def _batches(x: np.ndarray, size: int, name: str = "input") -> list[dict[str, np.ndarray]]:
    return [{name: x[k:k + size]} for k in range(0, len(x), size)]


@pytest.fixture(scope="module")
def residual():
    model = samples.conv_bn_relu_residual()
    tensors = ["input", *[n.output[0] for n in model.graph.node]]
    x = np.random.default_rng(0).standard_normal((N, 3, 32, 32)).astype(np.float32)
    return model, tensors, x


def _same(a: S.TensorStats, b: S.TensorStats) -> bool:
    return (a.min, a.max, a.amax, a.count) == (b.min, b.max, b.amax, b.count) and \
        np.array_equal(a.hist, b.hist)


def _fine_grid_histogram(values: np.ndarray, bins: int) -> np.ndarray:
    """The histogram `collect` documents, written out per element: |x| floored to the
    grid w = 2**(exp - FINE_BITS) (every |x| < 2**exp), each value at its grid cell's
    centre, binned on [0, amax]."""
    a = np.abs(values.astype(np.float64)).ravel()
    amax = a.max()
    w = 2.0 ** (np.frexp(amax)[1] - S.fine_bits(bins))
    centres = (np.floor(a / w) + 0.5) * w
    where = np.minimum(np.floor(centres * bins / amax).astype(np.int64), bins - 1)
    return np.bincount(where, minlength=bins)


def test_stats_are_the_numpy_statistics_of_all_samples():
    model = parse(ELEMENTWISE)
    x = np.random.default_rng(1).standard_normal((N, 8)).astype(np.float32)
    got = S.collect(model, ["x", "r", "y"], _batches(x, 4, "x"), bins=64)
    for name, ref in (("x", x), ("r", np.maximum(x, 0)), ("y", np.maximum(x, 0))):
        s = got[name]
        amax = float(np.abs(ref).max())
        assert (s.min, s.max, s.amax, s.count) == (float(ref.min()), float(ref.max()), amax, N * 8)
        assert np.array_equal(s.hist, _fine_grid_histogram(ref, 64))
        assert s.hist.dtype == np.int64 and s.dtype == np.float32
        np.testing.assert_allclose(s.edges, np.linspace(0, amax, 65))


def test_the_fine_grid_moves_a_value_by_at_most_a_sixteenth_of_a_bin():
    """Against np.histogram on the final range: only values within 1/16 bin of an edge
    may land in the neighbouring bin, and no method's amax moves by more than a bin."""
    model = parse(ELEMENTWISE)
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(20000), rng.standard_normal(48) * 30])
    x = x.astype(np.float32).reshape(-1, 8)
    got = S.collect(model, ["x"], _batches(x, 100, "x"))["x"]
    a = np.abs(x.astype(np.float64)).ravel()
    exact = np.histogram(a, bins=2048, range=(0.0, got.amax))[0]
    width = got.amax / 2048
    near_edge = np.abs(a / width - np.rint(a / width)) <= 1 / 16
    assert np.array_equal(got.hist, _fine_grid_histogram(x, 2048))
    moved = np.abs(got.hist - exact).sum()
    assert 0 < moved <= 2 * near_edge.sum()  # not exact; only values near an edge move
    truth = S.collect(model, ["x"], _batches(x, 100, "x"), exact=True)["x"]
    assert np.array_equal(truth.hist, exact)
    for name in ("minmax", "percentile", "mse"):  # entropy need not: see stats' docstring
        assert abs(METHODS[name](got) - METHODS[name](truth)) <= width * 1.0001, name


def test_a_range_that_grows_over_the_batches_merges_exactly():
    """Batches whose max|x| grows by 2**0..2**20: the fine grid coarsens as it goes, and
    ends where one batch holding everything starts."""
    model = parse(ELEMENTWISE)
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.uniform(-1, 1, (4, 8)) * 2.0 ** k for k in range(0, 21, 4)])
    x = x.astype(np.float32)
    one = S.collect(model, ["x"], _batches(x, len(x), "x"))["x"]
    growing = S.collect(model, ["x"], _batches(x, 4, "x"))["x"]
    shrinking = S.collect(model, ["x"], _batches(x[::-1].copy(), 4, "x"))["x"]
    assert _same(one, growing) and _same(one, shrinking)
    assert np.array_equal(one.hist, _fine_grid_histogram(x, 2048))


def test_a_tensor_larger_than_a_binning_chunk_is_binned_whole(monkeypatch):
    """Values are binned CHUNK at a time into a reused buffer: with a chunk of 1000
    (a ragged last chunk, negatives truncated toward zero then folded) the histogram is
    still the per-element one, and a second, smaller tensor does not see stale keys."""
    monkeypatch.setattr(S, "CHUNK", 1000)
    model = parse(ELEMENTWISE)
    x = np.random.default_rng(8).standard_normal((N * 40 + 3, 8)).astype(np.float32)
    got = S.collect(model, ["x", "r"], _batches(x, len(x), "x"))
    assert np.array_equal(got["x"].hist, _fine_grid_histogram(x, 2048))
    assert np.array_equal(got["r"].hist, _fine_grid_histogram(np.maximum(x, 0), 2048))
    small = S.collect(model, ["x"], _batches(x[:5], 5, "x"))["x"]
    assert np.array_equal(small.hist, _fine_grid_histogram(x[:5], 2048))


def test_same_statistics_for_any_batch_size_and_order(residual):
    model, tensors, x = residual
    order = np.random.default_rng(2).permutation(N)
    for exact in (False, True):
        reference = S.collect(model, tensors, _batches(x, N), exact=exact)
        for size in (1, 4, 7):
            for data in (x, x[order]):
                got = S.collect(model, tensors, _batches(data, size), exact=exact)
                assert list(got) == list(reference)
                for name in reference:
                    assert _same(got[name], reference[name]), (size, name)
        # hence every method's scale is the same too
        shuffled = S.collect(model, tensors, _batches(x[order], 7), exact=exact)
        for fn in METHODS.values():
            assert [fn(shuffled[t]) for t in reference] == [fn(reference[t]) for t in reference]


def test_chunks_fit_the_budget_and_change_nothing(residual):
    model, tensors, x = residual
    data = _batches(x, 4)
    whole = S.collect(model, tensors, data)
    assert len(whole.chunks) == 1 and whole.passes == 1
    sizes = S.activation_bytes(model, list(whole), data[0])
    budget = 600_000  # two or three 262,144-byte conv activations per run
    chunked = S.collect(model, tensors, data, memory_budget=budget)
    assert len(chunked.chunks) > 1 and chunked.passes == len(chunked.chunks)
    assert sorted(t for c in chunked.chunks for t in c) == sorted(whole)
    assert all(sum(sizes[t] for t in c) <= budget for c in chunked.chunks)
    assert not chunked.notes
    for name in whole:  # the fused kernels differ per chunk: equal up to float rounding
        a, b = chunked[name], whole[name]
        np.testing.assert_allclose([a.min, a.max, a.amax], [b.min, b.max, b.amax], rtol=1e-5)
        assert a.count == b.count and np.abs(a.hist - b.hist).sum() <= 0.001 * b.count, name
    exact = S.collect(model, tensors, data, memory_budget=budget, exact=True)
    exact_whole = S.collect(model, tensors, data, exact=True)
    for name in whole:  # without optimizations, exactly
        assert _same(exact[name], exact_whole[name]), name


def test_a_tensor_over_the_budget_runs_alone(residual):
    model, tensors, x = residual
    got = S.collect(model, ["stem.conv", "pool", "logits"], _batches(x, 4), memory_budget=10_000)
    assert got.chunks == [["stem.conv"], ["pool", "logits"]]
    assert got.notes == ["'stem.conv' needs about 262,144 bytes per batch, more than the "
                         "memory budget of 10,000: it runs alone"]


def test_activation_bytes_from_shape_inference(residual):
    model, _, x = residual
    sizes = S.activation_bytes(model, ["input", "stem.conv", "pool", "logits"], {"input": x[:4]})
    assert sizes == {"input": 4 * 3 * 32 * 32 * 4, "stem.conv": 4 * 16 * 32 * 32 * 4,
                     "pool": 4 * 16 * 4, "logits": 4 * 10 * 4}


def test_activation_bytes_guesses_high_for_data_dependent_shapes():
    model = _nonzero_model()  # NonZero: int64[2, nnz], nnz known only when it runs
    sizes = S.activation_bytes(model, ["x", "idx", "y"], {"x": np.ones((4, 8), np.float32)})
    assert sizes == {"x": 128, "idx": 128, "y": 4}  # idx: the largest known size, x's


def _nonzero_model():
    nodes = [helper.make_node("NonZero", ["x"], ["idx"]),
             helper.make_node("Cast", ["idx"], ["idxf"], to=TP.FLOAT),
             helper.make_node("ReduceSum", ["idxf"], ["y"], keepdims=0)]
    return build_model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
                       [helper.make_tensor_value_info("y", TP.FLOAT, None)], [])


def test_non_float_subgraph_and_weight_tensors_are_skipped_with_reasons():
    then_out = helper.make_tensor_value_info("t", TP.FLOAT, [2])
    else_out = helper.make_tensor_value_info("e", TP.FLOAT, [2])
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [then_out])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [else_out])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Mul", ["y", "w"], ["out"])]
    inits = [numpy_helper.from_array(np.float32(0.0), "zero"),
             numpy_helper.from_array(np.float32([2.0, 3.0]), "w")]
    model = build_model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                        [helper.make_tensor_value_info("out", TP.FLOAT, [2])], inits)
    data = [{"x": np.float32([1.0, -4.0])}, {"x": np.float32([3.0, 2.0])}]
    got = S.collect(model, ["x", "c", "t", "w", "y", "out"], data)
    assert list(got) == ["x", "y", "out"]
    assert got["out"].amax == 12.0 and got["x"].count == 4  # [2, 12] and [-6, -6]
    assert set(got.skipped) == {"c", "t", "w"}
    assert "not a float tensor (TensorProto.BOOL)" in got.skipped["c"]
    assert "If/Loop/Scan body" in got.skipped["t"]
    assert "initializer" in got.skipped["w"]


def test_unknown_tensor_names_are_an_error():
    model = parse(ELEMENTWISE)
    data = [{"x": np.ones((2, 8), np.float32)}]
    with pytest.raises(GraphfixError, match="not in the model: 'nope'"):
        S.collect(model, ["r", "nope"], data)


def test_empty_data_is_an_error():
    with pytest.raises(GraphfixError, match="calibration data is empty"):
        S.collect(parse(ELEMENTWISE), ["r"], [])


def test_all_zero_int_and_half_tensors():
    model = parse(ELEMENTWISE)
    x = np.random.default_rng(3).standard_normal((N, 8)).astype(np.float32)
    got = S.collect(model, ["z", "i", "h"], _batches(x, 8, "x"), bins=16)
    assert got["z"].amax == 0.0 and got["z"].hist[0] == N * 8 == got["z"].hist.sum()
    assert "i" in got.skipped and "INT64" in got.skipped["i"]
    h = got["h"]
    assert h.dtype == np.float16
    assert h.amax == float(np.abs(x.astype(np.float16)).max())
    assert h.hist.sum() == N * 8


def test_non_finite_values_are_counted_and_left_out():
    model = parse(ELEMENTWISE)
    x = np.ones((4, 8), np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -5.0
    got = S.collect(model, ["x", "r"], _batches(x, 2, "x"), bins=8)
    assert got["x"].nonfinite == 2 and got["x"].count == 30
    assert (got["x"].min, got["x"].max, got["x"].amax) == (-5.0, 1.0, 5.0)
    assert got["x"].hist.sum() == 30
    assert got["r"].nonfinite == 2 and got["r"].amax == 1.0


def test_progress_over_samples_and_passes(residual):
    model, tensors, x = residual
    calls = []
    got = S.collect(model, tensors[:4], _batches(x, 7), memory_budget=1_000_000,
                    progress=lambda *a: calls.append(a))
    phases = list(dict.fromkeys(phase for phase, _, _ in calls))
    assert len(phases) == got.passes == 2
    assert phases == ["pass 1/2: statistics (2 tensors)", "pass 2/2: statistics (2 tensors)"]
    exact = S.collect(model, tensors[:4], _batches(x, 7), memory_budget=1_000_000, exact=True,
                      progress=lambda *a: calls.append(a))
    phases = list(dict.fromkeys(phase for phase, _, _ in calls))[2:]
    assert len(phases) == exact.passes == 4
    assert phases[:2] == ["pass 1/4: range (2 tensors)", "pass 2/4: histogram (2 tensors)"]
    for phase in phases:
        done = [d for p, d, _ in calls if p == phase]
        assert done == [0, 7, 14, 21, 28, 30]
    assert {t for _, _, t in calls} == {N}
    assert got.samples == N
    assert got.summary().startswith("collected 4 tensors over 30 samples in 2 passes (2 chunks)")


class _Unsized:
    """Re-iterable data that cannot tell its size: progress totals are 0."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_progress_total_is_zero_when_unknown():
    model = parse(ELEMENTWISE)
    calls = []
    S.collect(model, ["r"], _Unsized([{"x": np.ones((2, 8), np.float32)}]),
              progress=lambda *a: calls.append(a))
    assert calls[-1] == ("statistics (1 tensor)", 2, 0)


def test_num_samples_of_the_data_is_the_total():
    class Data(_Unsized):
        num_samples = 5

    model = parse(ELEMENTWISE)
    calls = []
    S.collect(model, ["r"], Data([{"x": np.ones((2, 8), np.float32)},
                                  {"x": np.ones((3, 8), np.float32)}]),
              progress=lambda *a: calls.append(a))
    assert calls[-1][1:] == (5, 5)


def test_range_only_collection_skips_the_histogram(residual):
    model, tensors, x = residual
    full = S.collect(model, tensors, _batches(x, 4))
    ranges = S.collect(model, tensors, _batches(x, 4), histograms=False)
    assert ranges.passes == full.passes == 1
    for name in full:
        assert (ranges[name].min, ranges[name].amax) == (full[name].min, full[name].amax)
        assert not ranges[name].hist.any() and full[name].hist.sum() == full[name].count


def test_data_the_model_cannot_run_on_is_named():
    """calibrate says what onnxruntime said and which input is to blame (issue 11)."""
    from vadhelpers import vad_feeds, vad_model

    bad = dict(vad_feeds(), sr=np.array(3, np.int64))  # Reshape to [0, -1]: refused
    tensors = [n.output[0] for n in vad_model().graph.node[:3]]
    with pytest.raises(GraphfixError, match=r"cannot run the model on the calibration batch that "
                       r"starts at sample 2\. .*Reshape node 'frames'.*computed from input 'sr', "
                       r"which was \[3\]"):
        S.collect(vad_model(), tensors, [vad_feeds(), bad])
