"""fold-constants' numpy evaluation against onnxruntime, bit for bit, and what it declines."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphfix.passes._fold_numpy import MAX_ELEMENTS, evaluate

OPSET = 17
I64, I32, F32, F64, B = np.int64, np.int32, np.float32, np.float64, np.bool_


def _model(op: str, inputs: list, attrs: dict, opset: int, out) -> onnx.ModelProto:
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names, inputs, strict=True)
             if v is not None]
    node = helper.make_node(op, names, ["out"], **attrs)
    graph = helper.make_graph([node], "g", [], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _ort(op: str, inputs: list, attrs: dict, opset: int) -> np.ndarray:
    """The node's output from onnxruntime (graph optimizations off); the model with that
    output's type passes onnx.checker (a case onnxruntime ran by accident would test
    nothing real)."""
    model = _model(op, inputs, attrs, opset, helper.make_empty_tensor_value_info("out"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    value = session.run(["out"], {})[0]
    typed = helper.make_tensor_value_info(
        "out", helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
    onnx.checker.check_model(_model(op, inputs, attrs, opset, typed), full_check=True)
    return value


def _numpy(op: str, inputs: list, attrs: dict):
    tensors = [gs.Constant(f"in{i}", np.asarray(v)) if v is not None else gs.Variable.empty()
               for i, v in enumerate(inputs)]
    gs_attrs = {k: (gs.Constant("value", numpy_helper.to_array(v))
                    if isinstance(v, TensorProto) else v) for k, v in attrs.items()}
    node = gs.Node(op, attrs=gs_attrs, inputs=tensors, outputs=[gs.Variable("out")])
    return evaluate(node)


def _ints(shape, low=-20, high=20, dtype=I64, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)


def _floats(shape, dtype=F32, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 7).astype(dtype)


EXACT = [
    ("Add", [_ints((3, 4)), _ints((4,), seed=1)], {}),
    ("Add", [np.array([2**62], I64), np.array([2**62], I64)], {}),  # wraps in both
    ("Sub", [_ints((2, 3), dtype=I32), _ints((2, 1), dtype=I32, seed=1)], {}),
    ("Mul", [_floats((3, 4)), _floats((3, 4), seed=1)], {}),
    ("Mul", [_ints((5,)), np.array(3, I64)], {}),
    ("Add", [_floats((4,), F64), _floats((4,), F64, seed=2)], {}),
    ("Div", [_ints((40,)), _ints((40,), 1, 7, seed=1)], {}),
    ("Div", [_ints((40,)), -_ints((40,), 1, 7, seed=1)], {}),
    ("Div", [_floats((6,)), _floats((6,), seed=3)], {}),
    ("Div", [np.array([1.0, -1.0, 0.0], F32), np.zeros(3, F32)], {}),  # inf, -inf, nan
    ("Mod", [_ints((40,)), _ints((40,), 1, 7, seed=1)], {}),
    ("Mod", [_ints((40,)), -_ints((40,), 1, 7, seed=1)], {}),
    ("Mod", [_ints((40,)), -_ints((40,), 1, 7, seed=1)], {"fmod": 1}),
    ("Mod", [_floats((8,)), _floats((8,), seed=4)], {"fmod": 1}),
    ("Neg", [_ints((5,), dtype=I32)], {}),
    ("Abs", [_ints((5,))], {}),
    ("Min", [_ints((3, 1)), _ints((1, 4), seed=1), _ints((4,), seed=2)], {}),
    ("Max", [_ints((3, 4)), _ints((4,), seed=1)], {}),
    ("Equal", [_ints((6,), 0, 3), _ints((6,), 0, 3, seed=1)], {}),
    ("Equal", [np.array([1.0, np.nan], F32), np.array([1.0, np.nan], F32)], {}),
    ("Less", [_floats((5,)), _floats((5,), seed=1)], {}),
    ("GreaterOrEqual", [_ints((5,)), _ints((5,), seed=1)], {}),
    ("Not", [np.array([True, False])], {}),
    ("And", [np.array([True, False, True]), np.array([True, True, False])], {}),
    ("Xor", [np.array([[True], [False]]), np.array([True, False])], {}),
    ("Where", [np.array([True, False, True]), _floats((3,)), _floats((2, 3), seed=1)], {}),
    ("Where", [np.array([[True], [False]]), _ints((3,)), np.array(7, I64)], {}),
    ("Cast", [_ints((5,))], {"to": TensorProto.FLOAT}),
    ("Cast", [np.array([2**53 + 1, -(2**40) - 3], I64)], {"to": TensorProto.FLOAT}),
    ("Cast", [_floats((9,))], {"to": TensorProto.INT64}),
    ("Cast", [_floats((9,), F64)], {"to": TensorProto.INT32}),
    ("Cast", [_floats((9,), F64)], {"to": TensorProto.FLOAT}),
    ("Cast", [_ints((5,))], {"to": TensorProto.BOOL}),
    ("Cast", [np.array([True, False])], {"to": TensorProto.INT64}),
    ("Cast", [_ints((5,), dtype=I32)], {"to": TensorProto.INT64}),
    ("Cast", [np.array([300, -129], I64)], {"to": TensorProto.INT8}),
    ("Unsqueeze", [_ints((3,)), np.array([0, -1], I64)], {}),
    ("Unsqueeze", [np.array(5, I64), np.array([0], I64)], {}),
    ("Squeeze", [_ints((1, 3, 1)), np.array([-1], I64)], {}),
    ("Squeeze", [_ints((1, 3, 1))], {}),
    ("Concat", [_ints((2,)), _ints((3,), seed=1), _ints((0,))], {"axis": 0}),
    ("Concat", [_floats((2, 2)), _floats((2, 1), seed=1)], {"axis": -1}),
    ("Gather", [_ints((6,)), np.array([0, -1, 2], I64)], {"axis": 0}),
    ("Gather", [_floats((3, 4)), np.array(1, I64)], {"axis": 1}),
    ("Gather", [_ints((4,)), np.array([[1, -2]], I32)], {}),
    ("Slice", [_ints((10,)), np.array([2], I64), np.array([-1], I64)], {}),
    ("Slice", [_ints((10,)), np.array([-1], I64), np.array([-2**63], I64), np.array([0], I64),
               np.array([-1], I64)], {}),
    ("Slice", [_ints((10,)), np.array([-100], I64), np.array([-200], I64), np.array([0], I64),
               np.array([-1], I64)], {}),
    ("Slice", [_ints((10,)), np.array([100], I64), np.array([3], I64), np.array([0], I64),
               np.array([-2], I64)], {}),
    ("Slice", [_floats((4, 6)), np.array([1, 5], I64), np.array([3, 2**63 - 1], I64),
               np.array([0, 1], I64), np.array([1, 2], I64)], {}),
    ("Slice", [_ints((0,)), np.array([0], I64), np.array([5], I64)], {}),
    ("Reshape", [_ints((2, 6)), np.array([0, -1, 2], I64)], {}),
    ("Reshape", [_floats((4,)), np.array([2, 2], I64)], {}),
    ("Expand", [_ints((3, 1)), np.array([2, 1, 4], I64)], {}),
    ("Expand", [_floats((1,)), np.array([3], I64)], {}),
    ("Transpose", [_ints((2, 3, 4))], {"perm": [2, 0, 1]}),
    ("Transpose", [_floats((2, 3))], {}),
    ("Identity", [_floats((3,))], {}),
    ("Shape", [_floats((2, 3, 4))], {}),
    ("Shape", [_floats((2, 3, 4))], {"start": -2}),
    ("Shape", [_floats((2, 3, 4))], {"start": 1, "end": -1}),
    ("Size", [_floats((2, 3, 4))], {}),
    ("ConstantOfShape", [np.array([2, 3], I64)], {}),
    ("ConstantOfShape", [np.array([4], I64)],
     {"value": numpy_helper.from_array(np.array([7], I64))}),
    ("ConstantOfShape", [np.array([], I64)],
     {"value": numpy_helper.from_array(np.array([1.5], F32))}),
    ("Range", [np.array(0, I64), np.array(10, I64), np.array(3, I64)], {}),
    ("Range", [np.array(5, I32), np.array(-7, I32), np.array(-2, I32)], {}),
    ("Range", [np.array(5, I64), np.array(1, I64), np.array(1, I64)], {}),
    ("ScatterND", [_floats((4, 3)), np.array([[2], [0]], I64), _floats((2, 3), seed=1)], {}),
    ("ScatterND", [_ints((2, 3)), np.array([[1, -1]], I64), np.array([99], I64)], {}),
    ("Sqrt", [np.abs(_floats((64,)))], {}),
    ("Sqrt", [np.array([0.0, -0.0, np.inf, 2.0, 1e-40], F32)], {}),  # -0, inf, subnormal
    ("Sqrt", [np.abs(_floats((16,), F64))], {}),
    ("Floor", [_floats((32,))], {}),
    ("Ceil", [np.array([-0.5, -0.0, 0.5, 2.0, -np.inf, 1e30], F32)], {}),
    ("Round", [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999998, -0.0], F32)], {}),
    ("Round", [_floats((32,), F64)], {}),
    ("Neg", [np.array([0.0, -0.0, 1.5, -np.inf], F32)], {}),
    ("Abs", [np.array([-0.0, -3.25, np.inf], F64)], {}),
    ("ReduceMax", [np.array([[3.0], [-1.0]], F32)], {}),
    ("ReduceMax", [_floats((3, 4, 5))], {"axes": [-1, 0], "keepdims": 0}),
    ("ReduceMin", [_ints((3, 4))], {"axes": [1]}),
    ("ReduceMin", [np.array([0.0, 2.0, 1.0], F32)], {"keepdims": 0}),
    ("Tile", [_ints((2, 3)), np.array([2, 1], I64)], {}),
    ("Tile", [_floats((3,)), np.array([0], I64)], {}),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), EXACT,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(EXACT)])
def test_same_bits_as_onnxruntime(op, inputs, attrs):
    expected = _ort(op, inputs, attrs, OPSET)
    got = _numpy(op, inputs, attrs)
    assert got is not None, f"{op} declined"
    (value,) = got
    assert value.dtype == expected.dtype and value.shape == expected.shape
    assert value.tobytes() == expected.tobytes()


def test_random_integer_arithmetic_matches():
    rng = np.random.default_rng(7)
    for op in ("Add", "Sub", "Mul", "Div", "Mod"):
        for dtype in (I64, I32):
            a = rng.integers(-1000, 1000, 64).astype(dtype)
            b = rng.integers(-9, 10, 64).astype(dtype)
            b[b == 0] = 3
            attrs_list = [{}, {"fmod": 1}] if op == "Mod" else [{}]
            for attrs in attrs_list:
                expected = _ort(op, [a, b], attrs, OPSET)
                (got,) = _numpy(op, [a, b], attrs)
                assert got.tobytes() == expected.tobytes(), (op, dtype, attrs)


def test_opset_18_reductions_take_axes_as_an_input():
    x = _floats((3, 4, 5))
    for op, inputs, attrs in [("ReduceMax", [x, np.array([1], I64)], {}),
                              ("ReduceMin", [x, np.array([0, 2], I64)], {"keepdims": 0}),
                              ("ReduceMax", [x], {}),
                              ("ReduceMin", [x, np.array([], I64)], {"noop_with_empty_axes": 1})]:
        expected = _ort(op, inputs, attrs, 18)
        (got,) = _numpy(op, inputs, attrs)
        assert got.shape == expected.shape and got.tobytes() == expected.tobytes(), (op, attrs)


def test_older_opset_attribute_forms():
    """Unsqueeze/Squeeze with an `axes` attribute (opset < 13), Slice with attributes
    (opset < 10)."""
    x = _ints((1, 3))
    cases = [("Unsqueeze", [x], {"axes": [0, 3]}, 11), ("Squeeze", [x], {"axes": [0]}, 11),
             ("Slice", [_ints((5, 4))], {"starts": [1, -3], "ends": [100, -1], "axes": [0, 1]},
              9)]
    for op, inputs, attrs, opset in cases:
        expected = _ort(op, inputs, attrs, opset)
        (got,) = _numpy(op, inputs, attrs)
        assert got.tobytes() == expected.tobytes() and got.shape == expected.shape


DECLINED = [
    ("Pow", [_floats((3,)), np.array(2.0, F32)], {}),  # not in the table
    ("Add", [_floats((3,), np.float16), _floats((3,), np.float16)], {}),  # float16 rounding
    ("Div", [_ints((3,)), np.array([1, 0, 2], I64)], {}),  # integer division by zero
    ("Div", [np.array([-(2**63)], I64), np.array([-1], I64)], {}),  # traps in C++
    ("Mod", [_floats((3,)), _floats((3,), seed=1)], {}),  # float Mod needs fmod=1
    ("Cast", [np.array([np.nan], F32)], {"to": TensorProto.INT64}),
    ("Cast", [np.array([3e9], F32)], {"to": TensorProto.INT32}),  # out of range
    ("Cast", [np.array([2.0**63], F64)], {"to": TensorProto.INT64}),
    ("Cast", [_floats((3,))], {"to": TensorProto.FLOAT16}),
    ("Cast", [_floats((3,))], {"to": TensorProto.BOOL}),
    ("ScatterND", [_floats((4,)), np.array([[1], [1]], I64), _floats((2,), seed=1)], {}),
    ("ScatterND", [_floats((4,)), np.array([[1]], I64), _floats((1,), seed=1)],
     {"reduction": "add"}),
    ("Add", [np.array([True]), np.array([False])], {}),  # not a number type for ONNX
    ("Min", [_floats((3,)), _floats((3,), seed=1)], {}),  # NaN handling is the kernel's
    ("Add", [np.zeros(MAX_ELEMENTS + 1, F32), np.zeros(1, F32)], {}),  # too large
    ("Expand", [np.zeros(1, F32), np.array([MAX_ELEMENTS + 1], I64)], {}),
    ("ConstantOfShape", [np.array([MAX_ELEMENTS, 2], I64)], {}),
    ("Range", [np.array(0, I64), np.array(10**9, I64), np.array(1, I64)], {}),
    ("Range", [np.array(0.0, F32), np.array(3.0, F32), np.array(0.5, F32)], {}),
    ("Reshape", [_ints((6,)), np.array([4, -1], I64)], {}),  # invalid: onnxruntime's error
    ("Sqrt", [np.array([4.0, -1.0], F32)], {}),  # NaN out: its sign is the kernel's
    ("Sqrt", [_ints((3,), 0, 9)], {}),  # not a float op
    ("Floor", [np.array([np.nan], F32)], {}),
    ("Floor", [_floats((3,), np.float16)], {}),
    ("ReduceMax", [np.array([1.0, np.nan], F32)], {}),
    ("ReduceMin", [np.array([-0.0, 0.0, 1.0], F32)], {}),  # onnxruntime -0.0, numpy 0.0
    ("ReduceMax", [np.zeros((0, 3), F32)], {"axes": [0]}),  # empty: the kernel's identity
    ("ReduceMin", [_floats((2, 3))], {"axes": [0, 0]}),
    ("Tile", [_ints((2, 3)), np.array([2], I64)], {}),  # one repeat for two axes
    ("Tile", [_ints((4,)), np.array([MAX_ELEMENTS], I64)], {}),  # too large
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), DECLINED,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(DECLINED)])
def test_declines_what_it_cannot_compute_exactly(op, inputs, attrs):
    assert _numpy(op, inputs, attrs) is None


def test_declines_variables_other_domains_and_wrong_declared_types():
    x = gs.Variable("x", dtype=np.int64, shape=[3])
    assert evaluate(gs.Node("Neg", inputs=[x], outputs=[gs.Variable("y")])) is None
    c = gs.Constant("c", _ints((3,)))
    custom = gs.Node("Neg", domain="com.example", inputs=[c], outputs=[gs.Variable("y")])
    assert evaluate(custom) is None
    # the graph says float32: a rule's int64 result must not be taken
    wrong = gs.Node("Neg", inputs=[c], outputs=[gs.Variable("y", dtype=np.float32)])
    assert evaluate(wrong) is None
    right = gs.Node("Neg", inputs=[c], outputs=[gs.Variable("y", dtype=np.int64)])
    assert evaluate(right)[0].tolist() == (-_ints((3,))).tolist()


def test_shape_of_a_large_constant_reads_no_values():
    big = gs.Constant("w", np.zeros((MAX_ELEMENTS, 4), F32))
    node = gs.Node("Shape", inputs=[big], outputs=[gs.Variable("s")])
    assert evaluate(node)[0].tolist() == [MAX_ELEMENTS, 4]
    assert evaluate(gs.Node("Neg", inputs=[big], outputs=[gs.Variable("n")])) is None
