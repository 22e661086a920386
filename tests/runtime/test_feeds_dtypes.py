"""Seeded test data for every ONNX dtype, and models with such inputs through `run`."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import graphfix
from graphfix.errors import GraphfixError
from graphfix.runtime.feeds import InputInfo, NoTestData, random_feeds
from graphfix.runtime.session import run_model

NUMPY = ["FLOAT", "DOUBLE", "FLOAT16", "INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32",
         "INT64", "UINT64", "BOOL"]
EXTENSION = ["BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
             "FLOAT8E8M0", "INT4", "UINT4", "INT2", "UINT2"]
NO_INPUT = ["COMPLEX64", "COMPLEX128", "FLOAT6E2M3", "FLOAT6E3M2"]  # onnxruntime has none


def _cast_model(elem: int, shape=(2, 3)) -> onnx.ModelProto:
    """x -> Cast(float) -> Identity -> Identity: eliminate-noops removes one Identity.
    STRING has no Cast to float in onnxruntime: Identity only."""
    first = (h.make_node("Identity", ["x"], ["c"]) if elem == T.STRING
             else h.make_node("Cast", ["x"], ["c"], to=T.FLOAT))
    out = T.STRING if elem == T.STRING else T.FLOAT
    nodes = [first, h.make_node("Identity", ["c"], ["i"]), h.make_node("Identity", ["i"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", elem, list(shape))],
                     [h.make_tensor_value_info("y", out, list(shape))])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 25)], ir_version=11)


def _feeds(elem: int, shape=(64,), seed=0) -> np.ndarray:
    info = InputInfo("x", np.dtype(h.tensor_dtype_to_np_dtype(elem)), shape)
    return random_feeds([info], {"x": shape}, seed)["x"]


@pytest.mark.parametrize("name", NUMPY + EXTENSION + ["STRING"])
def test_run_checks_a_model_with_an_input_of_every_dtype_onnxruntime_runs(name):
    result = graphfix.run(_cast_model(getattr(T, name)), passes="eliminate-noops")
    check = result.report.check
    assert check.enabled, check.skipped_reason
    assert result.report.passes[0].status == "applied"
    assert result.report.passes[0].check.startswith("passed")
    assert len(result.model.graph.node) < 3  # rewritten: Identity nodes gone
    dtype = np.dtype(h.tensor_dtype_to_np_dtype(getattr(T, name)))
    assert check.inputs == {"x": f"{dtype}[2x3]"}


@pytest.mark.parametrize("name", NO_INPUT)
def test_an_input_onnxruntime_takes_no_tensor_of_skips_the_check_with_why(name):
    result = graphfix.run(_cast_model(getattr(T, name)), passes="eliminate-noops")
    assert not result.report.check.enabled
    assert "which onnxruntime takes no input of" in result.report.check.skipped_reason
    assert len(result.model.graph.node) < 3  # the rewrite still ran
    with pytest.raises(NoTestData, match="Input 'x' has dtype") as info:
        _feeds(getattr(T, name))
    assert isinstance(info.value, GraphfixError)  # graphfix check: exit 2, with the why


def test_float4_inputs_get_data_and_the_check_says_what_onnxruntime_said():
    """onnxruntime 1.2x makes float4e2m1 tensors but runs no node on them on the CPU:
    the check is skipped with its reason (or, on an onnxruntime that runs them, passes)."""
    result = graphfix.run(_cast_model(T.FLOAT4E2M1), passes="eliminate-noops")
    check = result.report.check
    assert len(result.model.graph.node) < 3
    assert check.enabled or "onnxruntime cannot run the input model" in check.skipped_reason
    values = _feeds(T.FLOAT4E2M1).astype(np.float32)
    assert set(np.abs(values)) <= {0, 0.5, 1, 1.5, 2, 3, 4, 6} and values.min() < 0


@pytest.mark.parametrize("name", EXTENSION + ["FLOAT4E2M1"])
def test_extension_dtype_data_is_seeded(name):
    a, b, c = _feeds(getattr(T, name)), _feeds(getattr(T, name)), _feeds(getattr(T, name), seed=1)
    assert a.dtype == np.dtype(h.tensor_dtype_to_np_dtype(getattr(T, name)))
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()


def test_each_dtype_gets_the_documented_values():
    bf16 = _feeds(T.BFLOAT16, (4096,)).astype(np.float32)
    assert abs(bf16.mean()) < 0.1 and 0.9 < bf16.std() < 1.1  # N(0, 1)
    e8m0 = _feeds(T.FLOAT8E8M0, (512,)).astype(np.float32)
    assert set(np.log2(e8m0).tolist()) == set(range(-4, 5))  # 2^k, k in [-4, 4]
    assert set(_feeds(T.INT4, (512,)).astype(np.int8).tolist()) == set(range(8))
    assert set(_feeds(T.UINT4, (512,)).astype(np.int8).tolist()) == set(range(8))
    assert set(_feeds(T.INT2, (512,)).astype(np.int8).tolist()) == {0, 1}
    assert set(_feeds(T.UINT2, (512,)).astype(np.int8).tolist()) == {0, 1, 2, 3}
    words = _feeds(T.STRING, (256,))
    assert words.dtype == object and all(isinstance(w, str) for w in words)
    assert {len(w) for w in words} == set(range(1, 9))
    assert set("".join(words)) <= set("abcdefghijklmnopqrstuvwxyz")
    assert list(_feeds(T.STRING, (256,))) == list(words)


@pytest.mark.parametrize(("name", "values"), [
    ("BFLOAT16", [-2.5, 0.0, 1.0, 3.140625, -1e30]),
    ("FLOAT8E4M3FN", [-448.0, -1.5, 0.0, 0.25, 240.0]),
    ("FLOAT8E5M2", [-57344.0, -1.5, 0.0, 0.25, 3.0]),
    ("FLOAT8E8M0", [0.125, 1.0, 2.0, 1024.0, 0.5]),
    ("INT4", [-8, -1, 0, 5, 7]),       # an odd count: the last byte holds one element
    ("UINT4", [0, 1, 9, 15, 3]),
    ("INT2", [-2, -1, 0, 1, 1]),       # five: a byte of four and a byte of one
    ("UINT2", [0, 1, 2, 3, 2]),
])
def test_onnxruntime_reads_extension_dtypes_as_given(name, values):
    elem = getattr(T, name)
    arr = np.array(values, np.float32).astype(h.tensor_dtype_to_np_dtype(elem))
    out = run_model(_cast_model(elem, (5,)), {"x": arr})["y"]
    np.testing.assert_array_equal(out, arr.astype(np.float32))
    assert arr.dtype == np.dtype(getattr(ml_dtypes, arr.dtype.name))
