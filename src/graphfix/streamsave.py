"""Writing a model whose large weights are deferred (`graphfix.weights`) without reading
them all into memory: the file is written field by field, each deferred weight copied
from its file in chunks where its raw_data goes.

protobuf writes a message's known fields in field-number order, so a ModelProto is
    [fields 1-6] [7: graph] [fields 8-]
and its GraphProto, and each TensorProto, split the same way around the field that
holds the weights (GraphProto.initializer = 5, TensorProto.raw_data = 9). The lengths
before each part are known from the references without reading the data. The bytes
written are those `SerializeToString` gives for the materialized model
(tests/io/test_streamsave.py compares them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

from onnx import GraphProto, ModelProto, TensorProto

from graphfix import weights
from graphfix.wire import encode_varint, key

_CHUNK = 1 << 24
_MODEL_GRAPH, _GRAPH_INIT, _TENSOR_RAW = 7, 5, 9
_LIMIT = 2**31 - 1


def streamable(model: ModelProto) -> bool:
    """Whether `write` can save `model`: deferred tensors only among the main graph's
    initializers (a pass may have moved one into a node or subgraph), and under the 2 GB
    protobuf limit."""
    in_main = sum(weights.is_deferred(t) for t in model.graph.initializer)
    if in_main != len(weights.deferred(model)):
        return False
    inline = sum(weights.tensor_nbytes(t) or 0 for t in model.graph.initializer
                 if t.HasField("raw_data"))
    return inline + weights.deferred_bytes(model) < _LIMIT - (64 << 20)


def size(model: ModelProto) -> int:
    """Bytes `write` writes (without serializing the weights)."""
    return sum(len(piece) if isinstance(piece, bytes) else piece[1]
               for piece in _pieces(model))


def write(model: ModelProto, f: BinaryIO, ir_version: int | None = None) -> None:
    """Write `model` (`streamable`) to `f`, with `ir_version` if given; deferred weights
    are copied from their files (`_Copier`)."""
    with _Copier(f) as copier:
        for piece in _pieces(model, ir_version):
            if isinstance(piece, bytes):
                f.write(piece)
            else:
                copier.copy(*piece)


class _Copier:
    """Copies deferred weights into the output, each source file opened once. Where `f`
    is a file, the kernel copies (`os.copy_file_range`: no trip through Python's memory;
    vit_b_32's 336 MB: 0.28-0.48 s -> 0.18-0.19 s); where it cannot (another file
    system, an old kernel, not Linux, `f` in memory) the bytes are read in chunks."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sources: dict[str, BinaryIO] = {}
        try:
            self.fd = f.fileno() if hasattr(os, "copy_file_range") else None
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: a buffer
            self.fd = None

    def __enter__(self) -> _Copier:
        return self

    def __exit__(self, *exc) -> None:
        for src in self.sources.values():
            src.close()

    def copy(self, tensor: TensorProto, length: int) -> None:
        path = weights.data_file(tensor)
        src = self.sources.get(path)
        if src is None:
            src = self.sources[path] = weights.open_data(tensor)
        offset = int(weights.reference(tensor).get("offset", "0"))
        done = self._kernel_copy(tensor, src, offset, length) if self.fd is not None else 0
        src.seek(offset + done)
        while done < length:
            chunk = src.read(min(_CHUNK, length - done))
            if not chunk:
                raise weights.short_read(tensor)
            self.f.write(chunk)
            done += len(chunk)

    def _kernel_copy(self, tensor: TensorProto, src: BinaryIO, offset: int, length: int
                     ) -> int:
        """Bytes copied by the kernel (all of them, or as many as it did before it
        refused: the rest, and every later weight, go through memory)."""
        self.f.flush()  # the kernel writes at the file's position, after what is buffered
        done = 0
        try:
            while done < length:
                n = os.copy_file_range(src.fileno(), self.fd, length - done, offset + done)
                if n == 0:
                    raise weights.short_read(tensor)
                done += n
        except OSError:
            self.fd = None
        return done


def _pieces(model: ModelProto, ir_version: int | None = None
            ) -> Iterator[bytes | tuple[TensorProto, int]]:
    """The file as bytes and (deferred tensor, its raw length) placeholders."""
    head, tail = _split(model, _MODEL_GRAPH, "graph", ir_version)
    graph = list(_graph_pieces(model.graph))
    yield head
    yield key(_MODEL_GRAPH) + encode_varint(_length(graph))
    yield from graph
    yield tail


def _graph_pieces(graph: GraphProto) -> Iterator[bytes | tuple[TensorProto, int]]:
    head, tail = _split(graph, _GRAPH_INIT, "initializer")
    yield head
    for tensor in graph.initializer:
        if not weights.is_deferred(tensor):
            body = tensor.SerializeToString()
            yield key(_GRAPH_INIT) + encode_varint(len(body)) + body
            continue
        length = int(weights.reference(tensor)["length"])
        plain = TensorProto()
        plain.CopyFrom(tensor)
        del plain.external_data[:]
        plain.ClearField("data_location")
        before, after = _split(plain, _TENSOR_RAW, "raw_data")
        raw_head = key(_TENSOR_RAW) + encode_varint(length)
        yield key(_GRAPH_INIT) + encode_varint(len(before) + len(raw_head) + length + len(after))
        yield before + raw_head
        yield (tensor, length)
        yield after
    yield tail


def _split(message, number: int, name: str, ir_version: int | None = None
           ) -> tuple[bytes, bytes]:
    """The serialized fields of `message` numbered below `number`, and above it; field
    `name` (= `number`, the big one) is never copied. `ir_version` replaces a
    ModelProto's."""
    below, above = type(message)(), type(message)()
    for field, value in message.ListFields():
        if field.number == number:
            continue
        target = below if field.number < number else above
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
    if ir_version is not None:
        below.ir_version = ir_version  # field 1: always below the graph
    return below.SerializeToString(), above.SerializeToString()


def _length(pieces: list[bytes | tuple[TensorProto, int]]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p[1] for p in pieces)
