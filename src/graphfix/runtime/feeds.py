"""Model inputs for numerical checks: resolving dynamic dims, seeded data, user data.

Shape resolution, in order, for every dynamic dim of every graph input:
1. the shape given for that input (`--input-shape name:1x3x224x224`);
2. a symbolic dim (`batch`) already bound by a given shape of another input, or one
   named by integer arithmetic on such names (`past_sequence_length + sequence_length`,
   as optimum's decoder exports name the attention mask's);
3. axis 0 is taken as the batch dim and set to 1;
4. otherwise the dim cannot be resolved: a `GraphfixError` names the input and the
   dim and says how to pass it.
A dim is dynamic when it has a symbolic name, no value, or a value <= 0 (some
exporters write -1).

Seeded data, per ONNX dtype (docs/inputs.md has the table):
- floats (float16/32/64, and as ml_dtypes arrays bfloat16, float8e4m3fn/e4m3fnuz/
  e5m2/e5m2fnuz, float4e2m1) ~ N(0, 1), rounded to the dtype (float4e2m1 holds
  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives);
- float8e8m0 (a scale: powers of two only, no sign, no zero): 2^k, k uniform in [-4, 4];
- integers (8 to 64 bits, and int4/uint4/int2/uint2 as ml_dtypes arrays) uniform in
  [0, 8), or [0, max] for a type whose max is below 8 (int2: {0, 1}; uint2: 0..3),
  small so that index-like inputs stay in range for most models, and below the size of
  the table an input indexes where the graph says (`values.index_bounds`);
- booleans: fair coin flips;
- strings: seeded ASCII words, 1 to 8 lowercase letters (numpy object arrays of str).
Dtypes onnxruntime takes no input of (complex64/128, float6) get none: `NoTestData`
says why (the output check is then skipped; `graphfix check` refuses).
Except (see `values` for the rules): values the user fixes (`--input-value`); small
integer inputs the graph compares with a constant take that constant (an integer
scalar with none is refused: a random rate or mode breaks most models); recurrent state
inputs (`state`, `h0`, `past_*`, `*cache*`, ...) are zeros. `model_feeds` applies all of it.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from graphfix.errors import GraphfixError
from graphfix.runtime.values import (
    InputValue,
    check_value_names,
    fixed_array,
    hints_and_bounds,
    is_small_integer,
    is_state_name,
)

DEFAULT_SEED = 0
_SHAPE = re.compile(r"^\d+(x\d+)*$")


@dataclass(frozen=True)
class InputInfo:
    """A graph input as declared: name, numpy dtype, dims (int, symbolic name, or None)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...] | None

    def dynamic_axes(self) -> list[int]:
        return [i for i, d in enumerate(self.dims or ()) if not isinstance(d, int)]


def graph_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The model's real inputs (initializers listed as inputs are not inputs)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else None
        dims = None
        if tt.HasField("shape"):
            dims = tuple(_dim(d) for d in tt.shape.dim)
        out.append(InputInfo(vi.name, dtype, dims))
    return out


def non_tensor_inputs(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, kind) of the inputs that are not tensors: sequence, optional, map, sparse
    tensor. graphfix makes no test data for them: `refuse_non_tensors` says so."""
    inits = {t.name for t in model.graph.initializer}
    return [(vi.name, vi.type.WhichOneof("value").replace("_type", "").replace("_", " "))
            for vi in model.graph.input
            if vi.name not in inits and vi.type.WhichOneof("value") not in ("tensor_type",
                                                                             None)]


def refuse_non_tensors(model: onnx.ModelProto) -> None:
    """NoTestData for a model with a non-tensor input (`non_tensor_inputs`)."""
    odd = non_tensor_inputs(model)
    if odd:
        name, kind = odd[0]
        article = "an" if kind[0] in "aeiou" else "a"
        raise NoTestData(f"Input '{name}' is {article} {kind}, for which graphfix makes no "
                         "test data",
                         "test inputs (random or --data arrays) are tensors only",
                         "graphfix run rewrites such a model without the numerical check; "
                         "check it on the tensors inside with your own harness")


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    if d.HasField("dim_param") and d.dim_param not in ("", "?"):
        return d.dim_param
    return None  # unknown; Paddle writes "?" for every unknown dim, which names nothing


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """`name:1x3x224x224` -> ('name', (1, 3, 224, 224)). A scalar is `name:` (empty)."""
    name, sep, dims = spec.rpartition(":")
    dims = dims.strip()
    if not sep or not name or (dims and not _SHAPE.match(dims)):
        raise GraphfixError(
            f"Cannot read the input shape '{spec}'",
            "an input shape is the input's name, a colon, and its dims joined by 'x'",
            "write it like --input-shape input:1x3x224x224",
        )
    return name, tuple(int(d) for d in dims.split("x")) if dims else ()


def resolve_shapes(
    inputs: list[InputInfo],
    given: Mapping[str, tuple[int, ...]] | None = None,
    lenient: bool = False,
) -> dict[str, tuple[int, ...]]:
    """A static shape for every input (see the module docstring for the rules).

    With `lenient`, inputs that cannot be resolved are left out instead of raising.
    """
    given = dict(given or {})
    names = {i.name for i in inputs}
    for name in given:
        if name not in names:
            raise GraphfixError(
                f"A shape was given for '{name}', which is not an input of the model",
                f"its inputs are: {', '.join(sorted(names)) or 'none'}",
                "use one of those names in --input-shape",
            )
    bound: dict[str, int] = {}
    first: dict[str, tuple[str, int]] = {}  # dim name -> the input and axis that bound it
    for info in inputs:
        if info.name in given:
            _check_given(info, given[info.name])
            for axis, (d, v) in enumerate(zip(info.dims or (), given[info.name],
                                              strict=info.dims is not None)):
                if not isinstance(d, str):
                    continue
                if d in bound and bound[d] != v:
                    other, other_axis = first[d]
                    raise GraphfixError(
                        f"--input-shape gives '{d}' two sizes: {bound[d]} for '{other}' "
                        f"dim {other_axis} and {v} for '{info.name}' dim {axis}",
                        f"both dims are declared '{d}', and ONNX means one size by one "
                        "dim name (the model would broadcast one against the other, or fail)",
                        "give both the same size; if the model really takes different "
                        "sizes there, its export named the dims wrongly",
                    )
                bound.setdefault(d, v)
                first.setdefault(d, (info.name, axis))
    shapes: dict[str, tuple[int, ...]] = {}
    for info in inputs:
        if info.name in given:
            shapes[info.name] = tuple(given[info.name])
            continue
        if info.dims is None:
            if lenient:
                continue
            raise GraphfixError(
                f"Input '{info.name}' has no declared shape",
                "graphfix needs a static shape to make test data",
                f"pass --input-shape {info.name}:DIMS (e.g. {info.name}:1x3x224x224)",
            )
        try:
            shapes[info.name] = tuple(
                _resolve_dim(info, axis, d, bound) for axis, d in enumerate(info.dims)
            )
        except GraphfixError:
            if not lenient:
                raise
    return shapes


def _resolve_dim(info: InputInfo, axis: int, d: int | str | None, bound: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    if isinstance(d, str) and d in bound:
        return bound[d]
    computed = _dim_expression(d, bound) if isinstance(d, str) else None
    if computed is not None:
        return computed
    if axis == 0:
        if isinstance(d, str):
            bound[d] = 1
        return 1
    shown = "x".join(str(x) if isinstance(x, int) else "?" for x in info.dims)
    label = f"'{d}'" if isinstance(d, str) else "unnamed"
    raise GraphfixError(
        f"Input '{info.name}' dim {axis} ({label}) is dynamic and graphfix cannot choose it",
        f"only axis 0 is assumed to be a batch dim (set to 1); the input's shape is {shown}",
        f"pass --input-shape {info.name}:{_example(info)} with the size you deploy, "
        "or --no-check to skip the numerical check",
    )


_DIM_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
            ast.FloorDiv: operator.floordiv}


def _dim_expression(name: str, bound: Mapping[str, int]) -> int | None:
    """The size of a dim named by arithmetic on other dims' names, once they are bound:
    optimum's decoder exports declare the attention mask
    `[batch_size, past_sequence_length + sequence_length]`. +, -, * and // of names and
    integers, with parentheses; None for a plain name, anything else, a name not bound,
    or a result below 0."""
    try:
        tree = ast.parse(name, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.BinOp):
        return None

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPS:
            return _DIM_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Name) and node.id in bound:
            return bound[node.id]
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise ValueError(name)

    try:
        size = value(tree)
    except (ValueError, ZeroDivisionError):
        return None
    return size if size >= 0 else None


def _example(info: InputInfo) -> str:
    return "x".join(str(d) if isinstance(d, int) else ("1" if i == 0 else "N")
                    for i, d in enumerate(info.dims))


def _check_given(info: InputInfo, shape: tuple[int, ...]) -> None:
    if info.dims is None:
        return
    bad = len(shape) != len(info.dims) or any(
        isinstance(d, int) and d != v for d, v in zip(info.dims, shape, strict=True)
    )
    if bad:
        declared = "x".join(str(d) if isinstance(d, int) else "?" for d in info.dims)
        raise GraphfixError(
            f"The shape {'x'.join(map(str, shape)) or 'scalar'} given for input "
            f"'{info.name}' does not fit it",
            f"the model declares {declared} (rank {len(info.dims)}); only '?' dims may be chosen",
            f"pass --input-shape {info.name}:{_example(info)} with the '?'/N dims filled in",
        )


def random_feeds(
    inputs: list[InputInfo],
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = DEFAULT_SEED,
    fixed: Mapping[str, InputValue] | None = None,
    bounds: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded test data for every input (see the module docstring for distributions);
    inputs in `fixed` take that value, broadcast to their shape and cast; an integer
    input in `bounds` stays below its bound too. Refused before any is made: a negative
    seed, and data over MAX_TEST_BYTES in all."""
    if seed < 0:
        raise GraphfixError(f"The seed {seed} is negative", "numpy's random generator "
                            "takes seeds from 0 up", "give --seed 0 or more")
    _check_size(inputs, shapes)
    rng = np.random.default_rng(seed)
    fixed = fixed or {}
    bounds = bounds or {}
    feeds = {}
    for info in inputs:
        shape = shapes[info.name]
        dtype = info.dtype if info.dtype is not None else np.dtype(np.float32)
        kind = dtype_kind(dtype)
        if info.name in fixed:
            arr = fixed_array(info.name, fixed[info.name], info.dtype, shape)
        elif kind == "f" and is_state_name(info.name):
            arr = np.zeros(shape, dtype)
        elif dtype.name == "float8_e8m0fnu":
            arr = np.exp2(rng.integers(-4, 5, size=shape)).astype(dtype)
        elif kind == "f":
            arr = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        elif kind in "iu":
            top = min(8, int(_int_info(dtype).max) + 1, bounds.get(info.name, 8))
            arr = rng.integers(0, top, size=shape).astype(dtype)
        elif kind == "b":
            arr = np.asarray(rng.random(shape) < 0.5)  # a 0-d result is a numpy scalar
        elif kind == "O":
            arr = _words(rng, shape)
        elif kind == "c" and _ort_takes(dtype):
            arr = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        else:
            raise NoTestData(
                f"Input '{info.name}' has dtype {dtype.name}, which onnxruntime takes "
                "no input of",
                "graphfix makes seeded data for float, integer, boolean and string "
                "inputs of every width onnxruntime runs (docs/inputs.md), and "
                f"onnxruntime has no {dtype.name} tensors",
                "graphfix run rewrites the model without the numerical check; to check it, "
                f"change '{info.name}' to a dtype onnxruntime runs",
            )
        feeds[info.name] = arr
    return feeds


MAX_TEST_BYTES = 8 * 2**30
"""The most test data graphfix makes for one run of a model (8 GiB): a shape past it is
a typo or a declared-but-absurd dim, and making it would exhaust memory."""


def _check_size(inputs: list[InputInfo], shapes: Mapping[str, tuple[int, ...]]) -> None:
    sizes = {}
    for info in inputs:
        dtype = info.dtype if info.dtype is not None else np.dtype(np.float32)
        sizes[info.name] = math.prod(shapes[info.name]) * max(dtype.itemsize, 1)
    if sum(sizes.values()) <= MAX_TEST_BYTES:
        return
    name = max(sizes, key=sizes.__getitem__)
    shape = "x".join(map(str, shapes[name]))
    raise GraphfixError(
        f"Test data for input '{name}' of shape {shape} would take {sizes[name]:.3g} bytes",
        f"graphfix makes at most {MAX_TEST_BYTES // 2**30} GiB of test inputs for one run; "
        "a shape this large is a typo or a dim the model declares but cannot mean",
        f"give a smaller shape with --input-shape {name}:DIMS (or in fix-shapes), or "
        "real inputs with --data")


class NoTestData(GraphfixError):
    """An input of a dtype onnxruntime takes no input of: there is no data to check with."""


def dtype_kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with ml_dtypes' types (kind 'V' to numpy) as what they are:
    'f' for bfloat16/float8/float4, 'i'/'u' for int4/uint4/int2/uint2; 'V' for a
    dtype onnxruntime takes no tensor of (float6: ml_dtypes has it, onnxruntime not)."""
    if dtype.kind != "V":
        return dtype.kind
    if not _ort_takes(dtype):
        return "V"
    try:
        return "i" if int(_int_info(dtype).min) < 0 else "u"
    except ValueError:
        return "f"


def _int_info(dtype: np.dtype):
    import ml_dtypes

    return ml_dtypes.iinfo(dtype) if dtype.kind == "V" else np.iinfo(dtype)


@functools.cache
def _ort_takes(dtype: np.dtype) -> bool:
    """Whether onnxruntime makes tensors of this dtype (asked without a session)."""
    import onnxruntime as ort

    try:
        ort.OrtValue.ortvalue_from_shape_and_type([1], helper.np_dtype_to_tensor_dtype(dtype))
    except Exception:  # onnxruntime: "tensor type 27 is not supported"; onnx: KeyError
        return False
    return True


WORD_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Seeded ASCII words, 1 to 8 lowercase letters each, as an object array of str."""
    size = int(np.prod(shape, dtype=np.int64))
    lengths = rng.integers(1, 9, size=size)
    letters = rng.integers(0, len(WORD_LETTERS), size=int(lengths.sum()))
    chars = np.array(list(WORD_LETTERS))[letters]
    ends = np.cumsum(lengths)
    words = ["".join(chars[end - n:end]) for n, end in zip(lengths, ends, strict=True)]
    out = np.empty(size, dtype=object)
    out[:] = words
    return out.reshape(shape)


def model_feeds(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = DEFAULT_SEED,
    values: Mapping[str, InputValue] | None = None,
) -> dict[str, np.ndarray]:
    """`random_feeds` for `model`'s inputs with the values the model accepts: `values`
    (the user's), then its constants' for small integer inputs, and integer inputs below
    the size of the table they index (see `values`)."""
    inputs = graph_inputs(model)
    values = dict(values or {})
    check_value_names(values, [i.name for i in inputs])
    small = [i.name for i in inputs if i.name not in values
             and is_small_integer(i.dtype, shapes.get(i.name, ()))]
    integers = [i.name for i in inputs if i.name not in values
                and i.dtype is not None and dtype_kind(i.dtype) in "iu"]
    hints, bounds = hints_and_bounds(model, small, integers)
    fixed: dict[str, InputValue] = dict(hints)
    for info in inputs:
        if info.name in small and info.name not in fixed and shapes.get(info.name) == ():
            raise GraphfixError(
                f"Input '{info.name}' is an integer scalar, and graphfix cannot tell which "
                "values the model accepts",
                "a random integer breaks a model whose scalar input is a rate or a mode "
                f"(e.g. a sample rate it compares with 16000), and nothing in the graph "
                f"compares '{info.name}' with a constant",
                f"pass --input-value {info.name}=VALUE with a value it takes in use (a "
                "sample rate: 16000; a diffusion UNet's timestep: 500), or real "
                "inputs with --data",
            )
    fixed.update(values)
    return random_feeds(inputs, shapes, seed, fixed, bounds)  # `fixed` comes before bounds
