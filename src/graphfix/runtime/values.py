"""Values an input must take: what the graph says about it, and what the user fixes.

Random numbers suit most inputs, but not all. Four kinds get other values:

- Values the user fixes (`--input-value sr=16000`, `input_values=` in the API): the
  number, or the comma-separated numbers of a 1-D value, broadcast to the input's shape
  and cast to its dtype.
- Small integer inputs (rank 0, or at most 4 elements), often modes or rates
  (a sample rate `sr` the graph compares with 16000): the nodes that read the input,
  followed through Cast/Squeeze/Unsqueeze/Reshape/Identity/Flatten chains and into
  subgraphs, are searched for an Equal/Greater/Less/GreaterOrEqual/LessOrEqual/Where/
  Mod/Div whose other operand is a constant (an initializer or a Constant node, also
  through those chains). The first element of the first such constant is the value:
  Equal's first (in node order), else the other ops' first (a zero is skipped for
  Div/Mod). An integer scalar for which nothing is found gets no guess: the check
  refuses it (see `feeds`), since a random rate or mode breaks most models.
- Integer inputs that index a constant table (`index_bounds`): the indices of a Gather or
  GatherElements (or onnxruntime's EmbedLayerNormalization) whose data is a constant (an
  initializer, also one in an external data file, or a Constant node; through Identity,
  Cast, QuantizeLinear and DequantizeLinear), followed through the same
  pass-through chains as above. Their random values stay below the size of the axis they
  index, the smallest over every such use: BERT's `token_type_ids` index a table of 2
  rows, and the [0, 8) of other integers (`feeds`) would fail its Gather.
- Recurrent state (float inputs named like `state`, `h`, `c`, `h0`, `c0`, `hx`, `cx`,
  `hidden`, `cell`, `past*`, `*_state`, `*cache*`) starts at zeros, as a first call
  does. The rule, on the lower-cased name split at non-alphanumerics into tokens:
  a token is state/states/hidden/cell/h0/c0/hx/cx, or the whole name is h or c,
  or the name starts with "past", or contains "cache". Exception: `hidden_states`
  (tokens hidden + states, the transformer convention) is an activation, not a
  carried state, and stays random.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from graphfix.errors import GraphfixError
from graphfix.graph.protos import all_nodes, graph_protos

PASS_THROUGH = {"Cast", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Flatten"}
COMPARING = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Mod",
             "Div")
INDEXING = {"Gather": ((1, 0),), "GatherElements": ((1, 0),),
            # onnxruntime's fused BERT embedding: input_ids, segment_ids, position_ids
            "EmbedLayerNormalization": ((0, 2), (1, 4), (8, 3))}
"""op -> (input holding indices, input holding the table they index on axis 0 (Gather,
GatherElements: on their `axis`))."""
SHAPE_KEEPING = {"Identity", "Cast", "DequantizeLinear", "QuantizeLinear"}
"""Ops whose output has input 0's shape: a constant table read through them (a quantized
model's embedding: int8 weights, then DequantizeLinear) keeps its dims."""
SMALL = 4  # elements: an integer input this small may be a mode or rate, not data
_STATE_TOKENS = {"state", "states", "hidden", "cell", "h0", "c0", "hx", "cx"}

InputValue = float | int | Sequence[float | int] | np.ndarray


def is_state_name(name: str) -> bool:
    """Whether a float input named `name` is recurrent state (module docstring: the rule)."""
    low = name.lower()
    tokens = [t for t in re.split(r"[^a-z0-9]+", low) if t]
    if "hidden" in tokens and "states" in tokens:
        return False
    return (low in ("h", "c") or bool(_STATE_TOKENS.intersection(tokens))
            or low.startswith("past") or "cache" in low)


def is_small_integer(dtype: np.dtype | None, shape: tuple[int, ...]) -> bool:
    return dtype is not None and dtype.kind in "iu" and (
        len(shape) == 0 or int(np.prod(shape)) <= SMALL)


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name in ("value_int", "value_ints", "value_float", "value_floats"):
            return np.asarray(onnx.helper.get_attribute_value(attr))
    return None


class _Graph:
    """Every node of a model (subgraphs included), its constants, and who reads what."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.nodes = list(all_nodes(model.graph))
        self.consts: dict[str, np.ndarray] = {}  # Constant nodes', and initializers read
        self.dims: dict[str, tuple[int, ...]] = {}  # every constant's shape, read or not
        # initializers are read when asked for (a model's weights are most of its bytes)
        self.inits: dict[str, onnx.TensorProto] = {}
        for init in (t for g in graph_protos(model.graph) for t in g.initializer):
            self.dims[init.name] = tuple(init.dims)
            if init.data_location != onnx.TensorProto.EXTERNAL:
                self.inits[init.name] = init
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                value = _constant_node_value(node)
                if value is not None:
                    self.consts[node.output[0]] = value
                    self.dims[node.output[0]] = value.shape
            for out in node.output:
                self.producer[out] = node
            for name in dict.fromkeys(node.input):  # subgraph nodes list outer names too
                self.readers.setdefault(name, []).append(node)

    def constant(self, name: str, depth: int = 0) -> np.ndarray | None:
        """The value of `name` when it is a constant (through pass-through ops)."""
        if name in self.consts:
            return self.consts[name]
        if name in self.inits:
            self.consts[name] = numpy_helper.to_array(self.inits[name])
            return self.consts[name]
        node = self.producer.get(name)
        if node is None or node.op_type not in PASS_THROUGH or depth > 8 or not node.input:
            return None
        return self.constant(node.input[0], depth + 1)

    def constant_dims(self, name: str) -> tuple[int, ...] | None:
        """The shape of `name` when it is a constant (through `SHAPE_KEEPING` ops), read or
        not: an initializer in an external data file has its dims in the model."""
        for _ in range(8):
            if name in self.dims:
                return self.dims[name]
            node = self.producer.get(name)
            if node is None or node.op_type not in SHAPE_KEEPING or not node.input:
                return None
            name = node.input[0]
        return None

    def derived(self, name: str) -> list[str]:
        """`name` and what pass-through ops make of it, in breadth-first order."""
        seen, queue = [name], [name]
        while queue:
            current = queue.pop(0)
            for node in self.readers.get(current, []):
                if node.op_type in PASS_THROUGH and node.input and node.input[0] == current:
                    for out in node.output:
                        if out and out not in seen:
                            seen.append(out)
                            queue.append(out)
        return seen


def constant_hints(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, float]:
    """For each input in `names`, the value the model's constants suggest (see the module
    docstring); inputs with no suggestion are left out."""
    return _hints(_Graph(model), names)


def index_bounds(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, int]:
    """For each input in `names` whose values index a constant table (the module
    docstring), the size of the smallest axis it indexes; inputs that index none are
    left out, and so are tables with an empty axis (nothing to draw from)."""
    return _bounds(_Graph(model), names)


def hints_and_bounds(model: onnx.ModelProto, hinted: Sequence[str], bounded: Sequence[str]
                     ) -> tuple[dict[str, float], dict[str, int]]:
    """`constant_hints` of `hinted` and `index_bounds` of `bounded`, from one walk of the
    model (none when both are empty)."""
    if not hinted and not bounded:
        return {}, {}
    graph = _Graph(model)
    return _hints(graph, hinted), _bounds(graph, bounded)


def _hints(graph: _Graph, names: Sequence[str]) -> dict[str, float]:
    hints: dict[str, float] = {}
    for name in names:
        tensors = graph.derived(name)
        found: dict[str, list[float]] = {}
        for node in graph.nodes:
            if node.op_type not in COMPARING:
                continue
            reads = [i for i, x in enumerate(node.input) if x in tensors]
            if not reads:
                continue
            for i, other in enumerate(node.input):
                if i in reads or not other or (node.op_type == "Where" and i == 0):
                    continue
                value = graph.constant(other)
                if value is None or value.size == 0 or value.dtype.kind not in "iuf":
                    continue
                first = value.reshape(-1)[0].item()
                if node.op_type in ("Div", "Mod") and first == 0:
                    continue
                found.setdefault("eq" if node.op_type == "Equal" else "other", []).append(first)
        picks = found.get("eq") or found.get("other")
        if picks:
            hints[name] = picks[0]
    return hints


def _bounds(graph: _Graph, names: Sequence[str]) -> dict[str, int]:
    bounds: dict[str, int] = {}
    for name in names:
        for tensor in graph.derived(name):
            for node in graph.readers.get(tensor, ()):
                size = _indexed_size(graph, node, tensor)
                if size:
                    bounds[name] = min(bounds.get(name, size), size)
    return bounds


def _indexed_size(graph: _Graph, node: onnx.NodeProto, tensor: str) -> int | None:
    """The size of the axis `node` indexes where it is a Gather or GatherElements (or
    onnxruntime's EmbedLayerNormalization) whose indices are `tensor` and whose table is a
    constant; else None (0 for an empty axis)."""
    if node.domain not in ("", "ai.onnx", "com.microsoft"):
        return None
    for where, table in INDEXING.get(node.op_type, ()):
        if len(node.input) <= max(where, table) or node.input[where] != tensor:
            continue
        dims = graph.constant_dims(node.input[table])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if dims and -len(dims) <= axis < len(dims):
            return max(dims[axis], 0)
    return None


def parse_input_value(spec: str) -> tuple[str, list[float | int]]:
    """`sr=16000` -> ('sr', [16000]); `ids=1,2,3` -> ('ids', [1, 2, 3])."""
    name, sep, text = spec.partition("=")
    name = name.strip()
    try:
        if not sep or not name or not text.strip():
            raise ValueError("no NAME=VALUE")
        values = [_number(part) for part in text.split(",")]
    except ValueError:
        raise GraphfixError(
            f"Cannot read the input value '{spec}'",
            "an input value is the input's name, '=', and a number or comma-separated "
            "numbers (for a 1-D input)",
            "write it like --input-value sr=16000 or --input-value ids=1,2,3",
        ) from None
    return name, values


def _number(text: str) -> float | int:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def fixed_array(name: str, value: InputValue, dtype: np.dtype | None,
                shape: tuple[int, ...] | None) -> np.ndarray:
    """`value` broadcast to `shape` and cast to `dtype`; GraphfixError when it cannot be."""
    try:
        arr = np.asarray(value)
        if arr.dtype.kind not in "iufb":
            raise ValueError(f"it holds {arr.dtype} values, not numbers")
        if arr.ndim == 1 and arr.size == 1:
            arr = arr.reshape(())
        if shape is not None:
            arr = np.broadcast_to(arr, shape)
        return np.array(arr, dtype=dtype or arr.dtype)
    except (ValueError, TypeError) as err:
        shown = "x".join(map(str, shape)) if shape else "scalar"
        raise GraphfixError(
            f"The value given for input '{name}' does not fit it",
            f"the input is {dtype}[{shown}]; numpy says: {err}",
            f"give one number, or as many comma-separated numbers as '{name}' has elements "
            "on its last axis",
        ) from None


def check_value_names(values: Mapping[str, object], names: Sequence[str]) -> None:
    for name in values:
        if name not in names:
            raise GraphfixError(
                f"A value was given for '{name}', which is not an input of the model",
                f"its inputs are: {', '.join(sorted(names)) or 'none'}",
                "use one of those names in --input-value",
            )


def with_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                values: Mapping[str, InputValue] | None) -> dict[str, np.ndarray]:
    """`feeds` (read from --data) with the inputs `values` fixes (--input-value) replaced,
    each broadcast to the data's shape and cast to its dtype; names checked first."""
    if values:
        inits = {t.name for t in model.graph.initializer}
        check_value_names(values, [i.name for i in model.graph.input if i.name not in inits])
        feeds.update({k: fixed_array(k, v, feeds[k].dtype, feeds[k].shape)
                      for k, v in values.items()})
    return feeds
