"""Inputs a model accepts: constant-derived values, state zeros, --input-value, blame."""

import numpy as np
import onnx
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime.failures import culprit, explain
from graphfix.runtime.feeds import graph_inputs, model_feeds, random_feeds
from graphfix.runtime.session import run_model
from graphfix.runtime.values import (
    constant_hints,
    fixed_array,
    index_bounds,
    is_state_name,
    parse_input_value,
)
from vadhelpers import vad_feeds, vad_model

VAD_SHAPES = {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'


def test_vad_random_feeds_take_the_compared_rate_and_zero_state():
    model = vad_model()
    feeds = model_feeds(model, VAD_SHAPES, seed=5)
    assert feeds["sr"].dtype == np.int64 and feeds["sr"].shape == () and feeds["sr"] == 16000
    assert feeds["state"].dtype == np.float32 and not feeds["state"].any()
    assert feeds["input"].std() > 0.5  # the audio stays N(0, 1)
    again = model_feeds(model, VAD_SHAPES, seed=5)
    np.testing.assert_array_equal(feeds["input"], again["input"])
    assert set(run_model(model, feeds)) == {"output", "stateN"}  # and the model runs


def test_a_scalar_nothing_compares_is_refused_naming_it():
    with pytest.raises(GraphfixError) as info:
        model_feeds(vad_model(constants=False), VAD_SHAPES)
    msg = str(info.value)
    assert "Input 'sr' is an integer scalar" in msg
    assert "--input-value sr=VALUE" in msg and "--data" in msg


def test_input_values_fix_inputs_broadcast_and_cast():
    feeds = model_feeds(vad_model(constants=False), VAD_SHAPES,
                        values={"sr": [8000], "input": 0.5})
    assert feeds["sr"].dtype == np.int64 and feeds["sr"] == 8000
    assert feeds["input"].dtype == np.float32 and (feeds["input"] == 0.5).all()
    with pytest.raises(GraphfixError, match="'rate', which is not an input.*sr, state"):
        model_feeds(vad_model(), VAD_SHAPES, values={"rate": 8000})
    with pytest.raises(GraphfixError, match="does not fit"):
        model_feeds(vad_model(), VAD_SHAPES, values={"state": [1, 2, 3]})


@pytest.mark.parametrize("spec, parsed", [("sr=16000", ("sr", [16000])),
                                          ("ids=1,2,3", ("ids", [1, 2, 3])),
                                          ("tf/x:0=0.5", ("tf/x:0", [0.5]))])
def test_parse_input_value(spec, parsed):
    assert parse_input_value(spec) == parsed


@pytest.mark.parametrize("spec", ["sr", "sr=", "=3", "sr=abc", "sr=1,,2"])
def test_bad_input_value_says_how_to_write_it(spec):
    with pytest.raises(GraphfixError, match="--input-value sr=16000"):
        parse_input_value(spec)


def test_fixed_array_takes_a_1d_value_for_a_1d_input():
    arr = fixed_array("ids", [1, 2, 3], np.dtype(np.int32), (3,))
    assert arr.dtype == np.int32 and arr.tolist() == [1, 2, 3]


@pytest.mark.parametrize("name", ["state", "h", "c", "h0", "c0", "hidden", "cell", "hx",
                                  "past_key_values.0.key", "lstm_state", "kv_cache",
                                  "in_states", "decoder/cell_0"])
def test_state_like_names(name):
    assert is_state_name(name)


@pytest.mark.parametrize("name", ["input", "images", "hidden_states", "hc", "ch", "x",
                                  "encoder_hidden_states", "chunk"])
def test_not_state_like_names(name):
    assert not is_state_name(name)


def test_state_zeros_only_for_floats():
    model = parse(HEAD + """
    g (float[2] state, int64[2] h, float[2] x) => (float[2] y) { y = Add(state, x) }""")
    feeds = random_feeds(graph_inputs(model), {"state": (2,), "h": (2,), "x": (2,)}, 0)
    assert not feeds["state"].any() and feeds["x"].any()
    assert feeds["h"].dtype == np.int64  # an integer h is not state: random as before


def test_hints_follow_casts_into_subgraphs_and_skip_a_zero_divisor():
    model = parse(HEAD + """
    g (int64 mode, bool flag, float[2] x) => (float[2] y) {
        m = Cast<to = 1>(mode)
        y = If(flag) <
            then_branch = t () => (float[2] a) {
                four = Constant<value = float {4.0}>()
                eq = Equal(m, four)
                a = Where(eq, x, x)
            },
            else_branch = e () => (float[2] b) { b = Identity(x) }
        >
    }""")
    assert constant_hints(model, ["mode"]) == {"mode": 4.0}
    feeds = model_feeds(model, {"mode": (), "flag": (), "x": (2,)})
    assert feeds["mode"].dtype == np.int64 and feeds["mode"] == 4
    divided = parse(HEAD + """
    g (int64 k, float[2] x) => (float[2] y) <int64 zero = {0}, int64 three = {3}> {
        a = Div(k, zero)
        b = Mod(k, three)
        y = Identity(x)
    }""")
    assert constant_hints(divided, ["k"]) == {"k": 3}


def test_equal_constants_come_before_other_comparisons():
    model = parse(HEAD + """
    g (int64 n, float[2] x) => (float[2] y) <int64 big = {9}, int64 want = {7}> {
        g1 = Greater(n, big)
        e1 = Equal(n, want)
        y = Identity(x)
    }""")
    assert constant_hints(model, ["n"]) == {"n": 7}


def test_the_failing_input_is_named():
    model = vad_model()
    feeds = vad_feeds(sr=3)
    with pytest.raises(Exception) as info:
        run_model(model, feeds)
    assert culprit(model, feeds, info.value) == ("Reshape node 'frames'", "sr")
    why, fix = explain(model, feeds, info.value)
    assert "running Reshape node 'frames': The input tensor cannot be reshaped" in why
    assert "computed from input 'sr', which was [3]" in why
    assert "onnxruntime_src" not in why  # no source locations
    assert "--input-value sr=VALUE" in fix and "--data" in fix


EMBED = parse(HEAD + """
g (int64[2, 6] ids, int32[2, 6] types, int64[2, 6] other, float[2, 6] x) => (float[2, 6, 4] y,
                                                                         float[2, 6] z)
  <float[10, 4] words = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3,
                         1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7,
                         2.8, 2.9, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5, 3.6, 3.7, 3.8, 3.9},
   float[2, 4] kinds = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}> {
    w = Gather(words, ids)
    t64 = Cast<to = 7>(types)
    table = Identity(kinds)
    k = Gather<axis = 0>(table, t64)
    y = Add(w, k)
    o = Cast<to = 1>(other)
    z = Add(o, x)
}""")
EMBED_SHAPES = {"ids": (2, 6), "types": (2, 6), "other": (2, 6), "x": (2, 6)}


def test_index_bounds_follow_casts_to_the_table_each_input_indexes():
    assert index_bounds(EMBED, ["ids", "types", "other"]) == {"ids": 10, "types": 2}


def test_inputs_that_index_a_small_table_stay_in_it_and_the_model_runs():
    inputs = graph_inputs(EMBED)
    for seed in range(3):
        feeds = model_feeds(EMBED, EMBED_SHAPES, seed)
        assert feeds["types"].dtype == np.int32 and set(np.unique(feeds["types"])) == {0, 1}
        assert feeds["ids"].max() >= 2  # [0, 8) is within its 10 rows: unchanged
        assert feeds["other"].max() >= 2  # indexes nothing: [0, 8) as before
        np.testing.assert_array_equal(feeds["ids"], random_feeds(inputs, EMBED_SHAPES,
                                                                 seed)["ids"])
        run_model(EMBED, feeds)
    with pytest.raises(Exception, match="out of data bounds"):  # what the bound prevents
        run_model(EMBED, random_feeds(inputs, EMBED_SHAPES, 0))


def test_index_bounds_read_dims_of_external_tables_and_axes():
    model = parse(HEAD + """
    g (int64[3] i, int64[2, 3] j) => (float[3, 2] y, float[2, 3] z)
      <float[4, 2] big = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0},
       float[2, 3] small = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0}> {
        y = Gather<axis = 0>(big, i)
        z = GatherElements<axis = 1>(small, j)
    }""")
    big = next(t for t in model.graph.initializer if t.name == "big")
    big.ClearField("float_data")
    big.data_location = onnx.TensorProto.EXTERNAL  # only its dims are in the model
    big.external_data.add(key="location", value="absent.bin")
    assert index_bounds(model, ["i", "j"]) == {"i": 4, "j": 3}
    indices_as_data = parse(HEAD + """
    g (int64[3] i) => (int64[2] y) <int64[2] pick = {0, 1}> { y = Gather(i, pick) }""")
    assert index_bounds(indices_as_data, ["i"]) == {}  # `i` is the table, not an index


def test_index_bounds_see_onnxruntimes_fused_bert_embedding():
    """EmbedLayerNormalization (onnxruntime's transformer optimizer) looks input_ids up in
    its word table (input 2), segment ids in its segment table (4), position ids in its
    position table (3): a 2-row segment table fails [0, 8) as a Gather's would."""
    model = parse('<ir_version: 8, opset_import: ["" : 14, "com.microsoft" : 1]>' + """
    g (int64[2, 4] ids, int64[2, 4] seg, int64[1, 4] pos) => (float[2, 4, 2] y)
      <float[9, 2] word = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.0, 2.0,
                           3.0, 4.0, 5.0, 6.0, 7.0, 8.0},
       float[5, 2] position = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0},
       float[2, 2] segment = {0.0, 1.0, 2.0, 3.0},
       float[2] gamma = {1.0, 1.0}, float[2] beta = {0.0, 0.0}> {
        ids32 = Cast<to = 6>(ids)
        seg32 = Cast<to = 6>(seg)
        pos32 = Cast<to = 6>(pos)
        y, mask_index = com.microsoft.EmbedLayerNormalization(ids32, seg32, word, position,
                                                              segment, gamma, beta, , pos32)
    }""")
    assert index_bounds(model, ["ids", "seg", "pos"]) == {"ids": 9, "seg": 2, "pos": 5}
    feeds = model_feeds(model, {"ids": (2, 4), "seg": (2, 4), "pos": (1, 4)}, seed=0)
    assert feeds["seg"].max() <= 1 and feeds["pos"].max() <= 4
    run_model(model, feeds)


def test_index_bounds_see_a_quantized_table_through_its_dequantize():
    """onnxruntime's QDQ quantization of BERT: the 2-row token type table is int8 weights
    then DequantizeLinear; [0, 8) overran it and the check could not run."""
    model = parse(HEAD + """
    g (int64[2, 3] types) => (float[2, 3, 2] y)
      <int8[2, 2] q = {1, 2, 3, 4}, float scale = {0.5}, int8 zero = {0}> {
        table = DequantizeLinear(q, scale, zero)
        y = Gather(table, types)
    }""")
    assert index_bounds(model, ["types"]) == {"types": 2}
    run_model(model, model_feeds(model, {"types": (2, 3)}, seed=0))
