"""Inputs a model accepts: constant-derived values, state zeros, --input-value, blame."""

import numpy as np
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime.failures import culprit, explain
from graphfix.runtime.feeds import graph_inputs, model_feeds, random_feeds
from graphfix.runtime.session import run_model
from graphfix.runtime.values import (
    constant_hints,
    fixed_array,
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
