"""Streaming statistics in onnxruntime: exact values, independence from batch size and
order, chunking under a memory budget, skipped tensors with reasons, progress."""

from __future__ import annotations

import numpy as np
import pytest
from gfhelpers import build_model, parse
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from graphfix import samples
from graphfix.calibration import stats as S
from graphfix.calibration.algorithms import METHODS
from graphfix.errors import GraphfixError

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


def test_stats_are_the_numpy_statistics_of_all_samples():
    model = parse(ELEMENTWISE)
    x = np.random.default_rng(1).standard_normal((N, 8)).astype(np.float32)
    got = S.collect(model, ["x", "r", "y"], _batches(x, 4, "x"), bins=64)
    for name, ref in (("x", x), ("r", np.maximum(x, 0)), ("y", np.maximum(x, 0))):
        s = got[name]
        amax = float(np.abs(ref).max())
        assert (s.min, s.max, s.amax, s.count) == (float(ref.min()), float(ref.max()), amax, N * 8)
        expected = np.histogram(np.abs(ref), bins=64, range=(0.0, amax))[0]
        assert np.array_equal(s.hist, expected)
        assert s.hist.dtype == np.int64 and s.dtype == np.float32
        np.testing.assert_allclose(s.edges, np.linspace(0, amax, 65))


def test_same_statistics_for_any_batch_size_and_order(residual):
    model, tensors, x = residual
    reference = S.collect(model, tensors, _batches(x, N))
    order = np.random.default_rng(2).permutation(N)
    for size in (1, 4, 7):
        for data in (x, x[order]):
            got = S.collect(model, tensors, _batches(data, size))
            assert list(got) == list(reference)
            for name in reference:
                assert _same(got[name], reference[name]), (size, name)
    # hence every method's scale is the same too
    shuffled = S.collect(model, tensors, _batches(x[order], 7))
    for fn in METHODS.values():
        assert [fn(shuffled[t]) for t in reference] == [fn(reference[t]) for t in reference]


def test_chunks_fit_the_budget_and_change_nothing(residual):
    model, tensors, x = residual
    data = _batches(x, 4)
    whole = S.collect(model, tensors, data)
    assert len(whole.chunks) == 1 and whole.passes == 2
    sizes = S.activation_bytes(model, list(whole), data[0])
    budget = 600_000  # two or three 262,144-byte conv activations per run
    chunked = S.collect(model, tensors, data, memory_budget=budget)
    assert len(chunked.chunks) > 1 and chunked.passes == 2 * len(chunked.chunks)
    assert sorted(t for c in chunked.chunks for t in c) == sorted(whole)
    assert all(sum(sizes[t] for t in c) <= budget for c in chunked.chunks)
    assert not chunked.notes
    for name in whole:
        assert _same(chunked[name], whole[name]), name


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
    assert len(phases) == got.passes == 4
    assert phases[0] == "pass 1/4: range (2 tensors)"
    assert phases[1] == "pass 2/4: histogram (2 tensors)"
    for phase in phases:
        done = [d for p, d, _ in calls if p == phase]
        assert done == [0, 7, 14, 21, 28, 30]
    assert {t for _, _, t in calls} == {N}
    assert got.samples == N
    assert got.summary().startswith("collected 4 tensors over 30 samples in 4 passes (2 chunks)")


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
    assert calls[-1] == ("pass 2/2: histogram (1 tensor)", 2, 0)


def test_num_samples_of_the_data_is_the_total():
    class Data(_Unsized):
        num_samples = 5

    model = parse(ELEMENTWISE)
    calls = []
    S.collect(model, ["r"], Data([{"x": np.ones((2, 8), np.float32)},
                                  {"x": np.ones((3, 8), np.float32)}]),
              progress=lambda *a: calls.append(a))
    assert calls[-1][1:] == (5, 5)


def test_range_only_collection_skips_the_histogram_pass(residual):
    model, tensors, x = residual
    full = S.collect(model, tensors, _batches(x, 4))
    ranges = S.collect(model, tensors, _batches(x, 4), histograms=False)
    assert ranges.passes == full.passes // 2
    for name in full:
        assert (ranges[name].min, ranges[name].amax) == (full[name].min, full[name].amax)
        assert not ranges[name].hist.any()


def test_data_the_model_cannot_run_on_is_named():
    """calibrate says what onnxruntime said and which input is to blame (issue 11)."""
    from vadhelpers import vad_feeds, vad_model

    bad = dict(vad_feeds(), sr=np.array(3, np.int64))  # Reshape to [0, -1]: refused
    tensors = [n.output[0] for n in vad_model().graph.node[:3]]
    with pytest.raises(GraphfixError, match=r"cannot run the model on the calibration batch that "
                       r"starts at sample 2\. .*Reshape node 'frames'.*computed from input 'sr', "
                       r"which was \[3\]"):
        S.collect(vad_model(), tensors, [vad_feeds(), bad])
