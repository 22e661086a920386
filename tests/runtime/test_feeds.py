import numpy as np
import pytest
from gfhelpers import parse

from graphfix.errors import GraphfixError
from graphfix.runtime.feeds import (
    graph_inputs,
    parse_input_shape,
    random_feeds,
    resolve_shapes,
)
from graphfix.runtime.outputs import OutputCheck

MODEL = '<ir_version: 8, opset_import: ["" : 17]>' + """
g (float[batch,3,H,W] img, int64[batch,T] ids, bool[batch] flag) => (float[batch,3,H,W] y) {
    y = Relu(img)
}"""


def test_parse_input_shape():
    assert parse_input_shape("x:1x3x224x224") == ("x", (1, 3, 224, 224))
    assert parse_input_shape("input.1:2x3") == ("input.1", (2, 3))
    assert parse_input_shape("scalar:") == ("scalar", ())
    assert parse_input_shape("tf/x:0:1x2") == ("tf/x:0", (1, 2))


@pytest.mark.parametrize("spec", ["x", "x:1xN", ":1x2", "x:1,2"])
def test_bad_input_shape_says_how_to_write_it(spec):
    with pytest.raises(GraphfixError, match="--input-shape input:1x3x224x224"):
        parse_input_shape(spec)


def test_axis_zero_defaults_to_one_other_dims_must_be_given():
    inputs = graph_inputs(parse(MODEL))
    with pytest.raises(GraphfixError) as info:
        resolve_shapes(inputs)
    msg = str(info.value)
    assert "Input 'img' dim 2 ('H')" in msg and "--input-shape img:1x3xNxN" in msg


def test_given_shape_binds_symbolic_dims_of_other_inputs():
    inputs = graph_inputs(parse(MODEL))
    shapes = resolve_shapes(inputs, {"img": (4, 3, 8, 8), "ids": (4, 7)})
    assert shapes == {"img": (4, 3, 8, 8), "ids": (4, 7), "flag": (4,)}


def test_two_sizes_for_one_dim_name_are_a_usage_error():
    """Probe 4: a DistilBERT run with input_ids:1x16 and attention_mask:1x12 (both
    [batch, seq]) skipped its check with advice that missed the mistake."""
    inputs = graph_inputs(parse(MODEL))
    with pytest.raises(GraphfixError) as info:
        resolve_shapes(inputs, {"img": (4, 3, 8, 8), "ids": (2, 7)})
    assert str(info.value).startswith(
        "--input-shape gives 'batch' two sizes: 4 for 'img' dim 0 and 2 for 'ids' dim 0.")
    assert "Give both the same size" in str(info.value)


def test_lenient_resolution_leaves_out_what_it_cannot_resolve():
    inputs = graph_inputs(parse(MODEL))
    assert resolve_shapes(inputs, lenient=True) == {"flag": (1,)}


def test_given_shape_must_fit_static_dims():
    inputs = graph_inputs(parse(MODEL))
    with pytest.raises(GraphfixError, match="does not fit"):
        resolve_shapes(inputs, {"img": (1, 4, 8, 8), "ids": (1, 2)})


def test_unknown_input_name():
    inputs = graph_inputs(parse(MODEL))
    with pytest.raises(GraphfixError, match="not an input of the model"):
        resolve_shapes(inputs, {"image": (1, 3, 8, 8)})


def test_random_feeds_are_seeded_and_typed():
    inputs = graph_inputs(parse(MODEL))
    shapes = resolve_shapes(inputs, {"img": (2, 3, 4, 4), "ids": (2, 5)})
    a, b = random_feeds(inputs, shapes, 0), random_feeds(inputs, shapes, 0)
    c = random_feeds(inputs, shapes, 1)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["img"], c["img"])
    assert a["img"].dtype == np.float32 and a["ids"].dtype == np.int64
    assert a["flag"].dtype == bool and a["ids"].min() >= 0 and a["ids"].max() < 8


def test_initializers_listed_as_inputs_are_not_inputs():
    model = parse('<ir_version: 3, opset_import: ["" : 9]>' + """
    g (float[2] x, float[2] w) => (float[2] y) <float[2] w = {1.0, 2.0}> { y = Add(x, w) }""")
    assert [i.name for i in graph_inputs(model)] == ["x"]


def test_check_data_is_read_like_calibrate_data(tmp_path):
    """`OutputCheck.prepare` reads --data with `open_data` (load_feeds is gone): float64
    is cast, names and shapes are checked, the first file's stack is one run."""
    model = parse(MODEL)
    good = {"img": np.ones((2, 3, 2, 2)), "ids": np.zeros((2, 4), np.int64),
            "flag": np.zeros(2, bool)}  # img is float64: cast, as calibrate casts it
    np.savez(tmp_path / "good.npz", **good)
    check = OutputCheck.prepare(model, {}, data=tmp_path / "good.npz")
    assert check.feeds["img"].dtype == np.float32 and check.feeds["img"].shape == (2, 3, 2, 2)
    assert check.enabled and check.seed is None
    np.savez(tmp_path / "missing.npz", img=good["img"])
    with pytest.raises(GraphfixError, match="none named 'ids', 'flag'"):
        OutputCheck.prepare(model, {}, data=tmp_path / "missing.npz")
    np.savez(tmp_path / "dtype.npz", **{**good, "ids": good["ids"].astype(np.float32)})
    with pytest.raises(GraphfixError, match="is float32, but the model's input is int64"):
        OutputCheck.prepare(model, {}, data=tmp_path / "dtype.npz")
    np.savez(tmp_path / "shape.npz", **{**good, "img": np.zeros((1, 4, 2, 2), np.float32)})
    with pytest.raises(GraphfixError, match="does not fit"):
        OutputCheck.prepare(model, {}, data=tmp_path / "shape.npz")
    with pytest.raises(GraphfixError, match="does not exist"):
        OutputCheck.prepare(model, {}, data=tmp_path / "nope.npz")


def _decoder_inputs():
    from onnx import TensorProto, helper

    return [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                          ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT,
                                          ["batch_size", 4, "past_sequence_length", 32]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                          ["batch_size", "past_sequence_length + sequence_length"])]


def test_a_dim_named_by_arithmetic_on_bound_names_is_computed():
    """optimum's decoder-with-past exports: the mask covers the past and the new tokens."""
    from onnx import helper

    graph = helper.make_graph([], "g", _decoder_inputs(), [])
    inputs = graph_inputs(helper.make_model(graph))
    shapes = resolve_shapes(inputs, {"input_ids": (1, 4), "past_key_values.0.key": (1, 4, 6, 32)})
    assert shapes["attention_mask"] == (1, 10)
    mask_only = graph_inputs(helper.make_model(helper.make_graph([], "g", _decoder_inputs()[2:],
                                                                 [])))
    with pytest.raises(GraphfixError, match="'past_sequence_length \\+ sequence_length'"):
        resolve_shapes(mask_only)  # nothing binds the names: asked for, as any dim


@pytest.mark.parametrize(("name", "size"), [
    ("a * 2 + 1", 7), ("(a - 1) // 2", 1), ("a + b", None), ("a / 2", None),
    ("a", None), ("-a", None), ("__import__('os').sep", None), ("a - 5", None),
])
def test_dim_expressions_take_only_integer_arithmetic_on_bound_names(name, size):
    from graphfix.runtime.feeds import _dim_expression

    assert _dim_expression(name, {"a": 3}) == size
