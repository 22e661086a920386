"""TensorRT ONNX-parser error messages: read them, tie them to nodes, and (where
tensorrt is installed) produce them.

The parser words its errors differently across releases (real examples, with their
sources, are in tests/trt/parser_messages.py):

- TensorRT 10.x, `str(parser.get_error(i))`:
  `In node 5 with name: /m/Foo and operator: NonZero (checkFoo): INVALID_NODE: ...`
- TensorRT 7.x-8.x, the same call:
  `In node 23 (importTopK): UNSUPPORTED_NODE: Assertion failed: ...`
- the C++ log lines trtexec prints, every release:
  `ERROR: builtin_op_importers.cpp:4643 In function importFallbackPluginImporter:`
  `[8] Assertion failed: ...` (the bracketed number is the ErrorCode value),
  `ERROR: ModelImporter.cpp:180 In function parseGraph:` `[6] Invalid Node - Mul_446`,
  and `While parsing node number 1026 [SplitToSequence -> "1661"]:`.

Parsing is plain string work; only `run_trt_parser` touches tensorrt, lazily.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import onnx

from graphfix.errors import GraphfixError
from graphfix.graph.protos import proto_label, walk_protos
from graphfix.trt._data import operators_data

# nvonnxparser::ErrorCode, in value order (NvOnnxParser.h, TensorRT 8.x-11.x).
ERROR_CODES = (
    "SUCCESS", "INTERNAL_ERROR", "MEM_ALLOC_FAILED", "MODEL_DESERIALIZE_FAILED",
    "INVALID_VALUE", "INVALID_GRAPH", "INVALID_NODE", "UNSUPPORTED_GRAPH",
    "UNSUPPORTED_NODE", "UNSUPPORTED_NODE_ATTR", "UNSUPPORTED_NODE_INPUT",
    "UNSUPPORTED_NODE_DATATYPE", "UNSUPPORTED_NODE_DYNAMIC", "UNSUPPORTED_NODE_SHAPE",
    "REFIT_FAILED",
)

_NEW = re.compile(r"In node (-?\d+) with name: (.*?) and operator: (\S*) \((\w*)\): "
                  r"([A-Z_]+): (.*)", re.DOTALL)
_OLD = re.compile(r"In node (-?\d+) \((\w*)\): ([A-Z_]+): (.*)", re.DOTALL)
_LOG = re.compile(r"(?:^|\s)(?:ERROR: )?[^\s:]+:\d+ In function (\w+):\s*\[(\d+)\] (.*)",
                  re.DOTALL)
_WHILE = re.compile(r"While parsing node number (-?\d+) \[([^\s\]]+)(?: -> \"(.*?)\")?\]")
_INVALID_NODE = re.compile(r"Invalid Node - (\S+)")
_OP_NAMED = re.compile(r"(?:No importer registered for op|No checker registered for op|"
                       r"could not find plugin|Cannot find plugin): ([A-Za-z0-9_]+)")
_IMPORTER = re.compile(r"(?:import|check)([A-Z]\w*)")


@dataclass(frozen=True)
class ParserError:
    """One parser error, as far as its text tells.

    `node_index` is the parser's node number (None when it names none or says -1);
    TensorRT counts nodes of the graph being parsed, which is the top-level graph
    unless the node sits in a subgraph or local function. `op_type` is stated by
    10.x messages and by log lines; for 8.x it is derived from the importer's name
    ("importTopK" -> "TopK") only when that is an op of the operator tables.
    """

    message: str  # the raw message
    node_index: int | None
    node_name: str | None
    op_type: str | None
    code: str | None  # "UNSUPPORTED_NODE", "INVALID_NODE", ... when the message has one
    function: str | None = None  # the parser function: "importTopK", "parseGraph", ...
    output: str | None = None  # the node's first output, from "While parsing node number"
    description: str = ""  # the parser's own words after the code, stripped


def parse_error_message(message: str) -> ParserError:
    """Read one parser message (any of the formats above, with or without a log prefix
    such as `[E] [TRT] ModelImporter.cpp:726: `). Never raises: fields it cannot find
    are None."""
    index = name = op = code = function = output = None
    description = ""
    if match := _NEW.search(message):
        index, name, op, function, code, description = match.groups()
    elif match := _OLD.search(message):
        index, function, code, description = match.groups()
    elif match := _LOG.search(message):
        function, number, description = match.groups()
        code = ERROR_CODES[int(number)] if int(number) < len(ERROR_CODES) else None
    if match := _WHILE.search(message):
        index = index if index is not None else match.group(1)
        op = op or match.group(2)
        output = match.group(3)
    if not name and (match := _INVALID_NODE.search(message)):
        name = match.group(1)
    if not op and (match := _OP_NAMED.search(message)):
        op = match.group(1)
    if not op and function and (match := _IMPORTER.fullmatch(function)):
        op = match.group(1) if match.group(1) in _known_ops() else None
    number = int(index) if index is not None else None
    return ParserError(
        message=message,
        node_index=number if number is not None and number >= 0 else None,
        node_name=name or None,
        op_type=op or None,
        code=code or None,
        function=function or None,
        output=output or None,
        description=description.strip(),
    )


def map_errors_to_nodes(
    messages: list[str], model: onnx.ModelProto
) -> list[tuple[ParserError, str | None]]:
    """Each message with the label of the node it is about, in doctor's form
    (`Op 'name'`, prefixed by the subgraph path for nodes in If/Loop/Scan bodies and
    by `function 'f'` for nodes of local functions).

    A node is found by the name in the message, else by its output tensor, else by
    its index in the top-level graph (`model.graph.node`), the index being trusted only
    when the message names no node and its op, if given, matches that node's. None
    when nothing matches. Node names need not be unique in ONNX; the first wins.
    """
    names, outputs = _node_labels(model)
    top = list(model.graph.node)
    mapped: list[tuple[ParserError, str | None]] = []
    for message in messages:
        error = parse_error_message(message)
        label = None
        if error.node_name is not None:
            label = names.get(error.node_name)
        if label is None and error.output is not None:
            label = outputs.get(error.output)
        if label is None and error.node_name is None and error.node_index is not None:
            if error.node_index < len(top):
                node = top[error.node_index]
                if error.op_type is None or node.op_type == error.op_type:
                    label = proto_label(node)
        mapped.append((error, label))
    return mapped


def run_trt_parser(model_path: str) -> list[str] | None:
    """Parse the model with the installed TensorRT's ONNX parser; its error messages
    (`str()` of each parser error; empty list = parsed), or None when `tensorrt` is
    not importable. Its logger output is swallowed, not printed.

    Needs tensorrt and a GPU, so it is not run in graphfix's CI, which has neither;
    its message format is the one `parse_error_message` reads.
    """
    try:
        import tensorrt as trt  # lazy on purpose: tensorrt is optional and heavy
    except Exception:  # a missing or broken tensorrt both mean "cannot run"
        return None
    path = Path(model_path)
    if not path.is_file():
        raise GraphfixError(f"Cannot parse '{path}' with TensorRT", "the file does not exist",
                            "check the path")

    class _Quiet(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg) -> None:  # the library never prints
            pass

    try:
        logger = _Quiet()
        builder = trt.Builder(logger)
        explicit = getattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH", None)
        old = int(str(trt.__version__).split(".")[0]) < 10
        network = builder.create_network(1 << int(explicit) if old and explicit is not None else 0)
        parser = trt.OnnxParser(network, logger)
        parsed = parser.parse_from_file(str(path))
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    except Exception as exc:  # no GPU, no CUDA driver, ...
        raise GraphfixError(
            "TensorRT is installed but could not start its ONNX parser", str(exc),
            "check that a GPU and a matching CUDA driver are visible to this process",
        ) from exc
    if not parsed and not errors:
        errors = ["the TensorRT ONNX parser failed without an error message"]
    return errors


def _node_labels(model: onnx.ModelProto) -> tuple[dict[str, str], dict[str, str]]:
    """name -> label and output tensor -> label, over every graph and local function."""
    names: dict[str, str] = {}
    outputs: dict[str, str] = {}
    walks = [walk_protos(model.graph)]
    walks += [walk_protos(f, (f"function '{f.name}'",)) for f in model.functions]
    for walk in walks:
        for node, path, _ in walk:
            label = proto_label(node, path)
            if node.name:
                names.setdefault(node.name, label)
            for out in node.output:
                if out:
                    outputs.setdefault(out, label)
    return names, outputs


@cache
def _known_ops() -> frozenset[str]:
    return frozenset(operators_data()["support_by_op"])
