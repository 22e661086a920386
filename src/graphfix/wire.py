"""Where each main-graph initializer's raw bytes lie in a serialized ModelProto, and the
model without them.

`io.load(weights=False)` leaves large inline initializers in the .onnx file: their raw
data stays there, referenced like external data (the file, an offset, a length;
`graphfix.weights`), so neither the load nor the proto that passes copy, export and
roll back holds those weights. protobuf does not report offsets, so this walks the
wire format (https://protobuf.dev/programming-guides/encoding/) down the one path that
matters: ModelProto.graph (field 7) -> GraphProto.initializer (5) -> TensorProto.name (8)
and raw_data (9). Anything unusual (the graph field split in two, groups, a truncated
buffer) gives None: the caller then reads the file as protobuf does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_NAME, _TENSOR_RAW = 7, 5, 8, 9
_LENGTH_DELIMITED = 2


@dataclass(frozen=True)
class RawSpan:
    """One initializer, in wire order: its index among the initializers, its name, and
    its raw data's [offset, offset + length) in the buffer (length -1: no raw_data).
    `field_start` is where the raw_data field's key begins."""

    index: int
    name: str
    offset: int
    length: int
    field_start: int = -1


def initializer_spans(buf) -> list[RawSpan] | None:
    """The main graph's initializers in order, or None where the layout is unusual."""
    found = _layout(buf)
    return None if found is None else [span for _, _, span in found[1] if span is not None]


def without_raw(buf, min_length: int) -> tuple[bytes, list[RawSpan]] | None:
    """`buf` (bytes or an mmap of a .onnx file) without the raw data of the main graph's
    initializers that hold at least `min_length` bytes of it, and where each of those
    lies in `buf`; None where the layout is unusual. Only the bytes kept are copied."""
    found = _layout(buf, min_length)
    if found is None:
        return None
    (key_start, start, end), fields = found
    parts, dropped = [], []
    for field_start, field_end, span in fields:
        if span is None or span.length < min_length:
            parts.append(buf[field_start:field_end])
            continue
        value_start = _value_start(buf, field_start)
        body = buf[value_start:span.field_start] + buf[span.offset + span.length:field_end]
        parts.append(key(_GRAPH_INITIALIZER) + encode_varint(len(body)) + body)
        dropped.append(span)
    graph = b"".join(parts)
    return buf[:key_start] + key(_MODEL_GRAPH) + encode_varint(len(graph)) + graph + \
        buf[end:], dropped


def _layout(buf, min_length: int = 0):
    """((graph key start, value start, value end), [(field start, field end, RawSpan or
    None for a field that is not an initializer)]) or None. An initializer whose whole
    message is shorter than `min_length` cannot hold that much raw data: its span is None
    too, without walking its fields (synthetic_1000's 10,000 batch-norm statistics)."""
    try:
        graphs = [(k, s, e) for k, f, w, s, e in _fields(buf, 0, len(buf))
                  if f == _MODEL_GRAPH and w == _LENGTH_DELIMITED]
        if len(graphs) != 1:  # none, or a graph merged from two fields
            return None
        fields, index = [], 0
        for key_start, field, wire, start, end in _fields(buf, *graphs[0][1:]):
            span = None
            if field == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
                if end - start >= min_length:
                    span = _tensor_span(buf, index, start, end)
                index += 1
            fields.append((key_start, end, span))
        return graphs[0], fields
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _tensor_span(buf, index: int, start: int, end: int) -> RawSpan:
    name, raw = "", (-1, -1, -1)
    for key_start, field, wire, s, e in _fields(buf, start, end):
        if wire != _LENGTH_DELIMITED:
            continue
        if field == _TENSOR_NAME:
            name = bytes(buf[s:e]).decode("utf-8")
        elif field == _TENSOR_RAW:
            if raw[0] >= 0:
                raise ValueError("raw_data given twice")  # protobuf keeps the last
            raw = (s, e - s, key_start)
    return RawSpan(index, name, *raw)


def _value_start(buf, field_start: int) -> int:
    """Where a length-delimited field's value begins (after its key and length)."""
    _, pos = _varint(buf, field_start)
    _, pos = _varint(buf, pos)
    return pos


def _varint(buf, pos: int) -> tuple[int, int]:
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


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(key start, field number, wire type, value start, value end) of each field in
    [start, end)."""
    pos = start
    while pos < end:
        key_start = pos
        key = buf[pos]  # one byte for fields 1-15, as nearly all of ONNX's are
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            after = pos + 1 if buf[pos] < 0x80 else _varint(buf, pos)[1]
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        elif wire == _LENGTH_DELIMITED:
            length = buf[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _varint(buf, pos)
            after = pos + length
        else:  # groups (3, 4) are not in ONNX's schema
            raise ValueError(f"wire type {wire}")
        if after > end:
            raise ValueError("truncated")
        yield key_start, field, wire, pos, after
        pos = after


def key(number: int) -> bytes:
    """The key of length-delimited field `number`."""
    return encode_varint(number << 3 | _LENGTH_DELIMITED)


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)
