"""Where each main-graph initializer's raw bytes lie in a serialized ModelProto.

`io.load(weights=False)` defers large inline initializers to the model file itself:
their raw data stays in the .onnx file, referenced like external data (the file, an
offset, a length; `graphfix.weights`), so the proto that passes copy, export and roll
back holds no weights. protobuf does not report offsets, so this walks the wire format
(https://protobuf.dev/programming-guides/encoding/) down the one path that matters:
ModelProto.graph (field 7) -> GraphProto.initializer (5) -> TensorProto.name (8) and
raw_data (9). Anything unusual (the graph field split in two, groups, a truncated
buffer) returns None: the caller then leaves the weights in the proto.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_NAME, _TENSOR_RAW = 7, 5, 8, 9
_LENGTH_DELIMITED = 2


@dataclass(frozen=True)
class RawSpan:
    """One initializer, in wire order: its name and its raw data's [offset, offset +
    length) in the buffer (length -1: it has no raw_data field)."""

    name: str
    offset: int
    length: int


def initializer_spans(buf: bytes) -> list[RawSpan] | None:
    """The main graph's initializers in order, or None where the layout is unusual."""
    try:
        graphs = [(s, e) for f, w, s, e in _fields(buf, 0, len(buf))
                  if f == _MODEL_GRAPH and w == _LENGTH_DELIMITED]
        if len(graphs) != 1:  # none, or a graph merged from two fields
            return None
        spans = []
        for field, wire, start, end in _fields(buf, *graphs[0]):
            if field == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
                spans.append(_tensor_span(buf, start, end))
        return spans
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _tensor_span(buf: bytes, start: int, end: int) -> RawSpan:
    name, raw = "", (-1, -1)
    for field, wire, s, e in _fields(buf, start, end):
        if wire != _LENGTH_DELIMITED:
            continue
        if field == _TENSOR_NAME:
            name = bytes(buf[s:e]).decode("utf-8")
        elif field == _TENSOR_RAW:
            if raw[0] >= 0:
                raise ValueError("raw_data given twice")  # protobuf keeps the last
            raw = (s, e - s)
    return RawSpan(name, *raw)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) of each field in [start, end)."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, after = _varint(buf, pos)
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        elif wire == _LENGTH_DELIMITED:
            length, pos = _varint(buf, pos)
            after = pos + length
        else:  # groups (3, 4) are not in ONNX's schema
            raise ValueError(f"wire type {wire}")
        if after > end:
            raise ValueError("truncated")
        yield field, wire, pos, after
        pos = after
