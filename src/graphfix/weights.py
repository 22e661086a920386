"""Weights left in their external-data file until something reads them.

`io.load(path, weights=False)` checks every external-data reference as a full load
does, reads the small tensors (shape constants and the like: at most `SMALL_ELEMENTS`
elements, what `graph.skeleton` keeps for shape inference), and leaves the large
main-graph initializers where they are: in their external-data file, or, for weights
stored inside the .onnx file, in the .onnx file itself (`defer_in_file`: the model file
is then their "external" file, at the offset `graphfix.wire` finds). Such a tensor
is *deferred*: it keeps
`data_location` EXTERNAL and its `location`/`offset`/`length` entries, plus a
`basepath` entry (a key onnx's external-data helper defines) naming the directory the
model was loaded from. Its proto costs a few bytes, so copying, exporting or rolling
back a model with deferred weights costs nothing per weight, and a doctor run reads no
weights at all.

Whatever needs a deferred tensor's values reads them here:

- `to_array(tensor)`: the values of any tensor (deferred or not), read from the file
  each time, never stored in the proto;
- `graph.to_graph` gives deferred initializers onnx-graphsurgeon values that read
  through `to_array`, so passes see the weights (`graph.constant_value`), and export
  keeps the reference (a pass that replaces a weight makes a new, inline one);
- `session_bytes(model, options)`: the model for onnxruntime without the `basepath`
  entries, with `options` pointing onnxruntime at the weights' directory (it maps the
  file and reads what it runs), and the weights of any other directory handed over as
  memory maps of their files (`mapped`) (`runtime.session.make_session`);
- `materialize(model)` / `materialized(model)`: the weights read into the proto (or a
  copy), for a caller that wants the weights in memory; `io.save` does not need it: it
  copies deferred weights from their files as it writes (`graphfix.streamsave`).

A deferred tensor's file must stay in place while the model is in use.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Iterable

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, numpy_helper

from graphfix.errors import GraphfixError

SMALL_ELEMENTS = 1024
"""Initializers of at most this many elements are read even when weights are deferred:
shape inference (`graph.skeleton`) and doctor's rules read such constants."""
BASE_KEY = "basepath"
"""The external-data key that marks a deferred tensor and names its directory."""
_ORT_FOLDER = "session.model_external_initializers_file_folder_path"
"""onnxruntime's session option: where a model loaded from bytes finds external data."""
_PLAIN = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
                    TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
                    TensorProto.UINT64, TensorProto.BOOL})
"""Types whose raw data is numpy's own little-endian layout (read with np.fromfile)."""
_RAW_DTYPES = {t: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t)).newbyteorder("<")
               for t in _PLAIN}
PACKED_BITS = {getattr(TensorProto, name): bits for name, bits in (
    ("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
    ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, name)}
"""Bits per element of the types ONNX packs below a byte (onnx >= 1.20 has INT2/FLOAT6)."""
_A = AttributeProto
_RARE_HOLDERS = frozenset({_A.UNDEFINED, _A.TENSORS, _A.SPARSE_TENSOR, _A.SPARSE_TENSORS,
                           _A.GRAPHS})


def tensor_nbytes(tensor: TensorProto) -> int | None:
    """Bytes of the tensor's raw data by its shape and type; None where that is unknown
    (strings, segments, a type numpy has no dtype for)."""
    data_type = tensor.data_type
    if data_type == TensorProto.STRING or tensor.HasField("segment"):
        return None
    bits = _bits(data_type)
    return None if bits is None else (math.prod(tensor.dims) * bits + 7) // 8


@functools.cache
def _bits(data_type: int) -> int | None:
    """Bits per element of an ONNX data type; None where numpy has no dtype for it (once
    per type: synthetic_1000's load asks for 12,000 tensors)."""
    try:
        return PACKED_BITS.get(data_type) or 8 * onnx.helper.tensor_dtype_to_np_dtype(
            data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None


# --- deferring (io.load) -----------------------------------------------------------------

def deferrable(model: onnx.ModelProto) -> list[TensorProto]:
    """The tensors `io.load(weights=False)` leaves in their file: external main-graph
    initializers of more than `SMALL_ELEMENTS` elements."""
    return [t for t in model.graph.initializer
            if t.data_location == TensorProto.EXTERNAL and math.prod(t.dims) > SMALL_ELEMENTS]


def defer(tensor: TensorProto, base_dir: str) -> None:
    """Mark an external tensor as deferred, its file relative to `base_dir` (absolute)."""
    forget_dir(tensor)
    entry = tensor.external_data.add()
    entry.key, entry.value = BASE_KEY, base_dir


IN_FILE_MIN_BYTES = 8 * SMALL_ELEMENTS + 1
"""Inline initializers with at least this much raw data stay in the .onnx file on
`io.load(weights=False)`: every such tensor has more than `SMALL_ELEMENTS` elements."""


def fits_in_file(tensor: TensorProto, length: int) -> bool:
    """Whether `length` raw bytes found in the file are this tensor's whole data."""
    return tensor.data_type not in (TensorProto.STRING, TensorProto.UNDEFINED) and \
        not tensor.HasField("segment") and tensor_nbytes(tensor) == length


def defer_in_file(tensor: TensorProto, path: str, offset: int, length: int) -> None:
    """Make `tensor` (parsed without its raw data) a reference to bytes [offset, offset +
    length) of the model file `path` it was loaded from: deferred, like a weight in an
    external-data file."""
    base_dir, file_name = os.path.split(os.path.abspath(path))
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", file_name), ("offset", str(offset)),
                       ("length", str(length)), (BASE_KEY, base_dir)):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def forget_dir(tensor: TensorProto) -> None:
    """Drop `basepath` entries (a file may carry them; onnx never reads them)."""
    for i in reversed(range(len(tensor.external_data))):
        if tensor.external_data[i].key == BASE_KEY:
            del tensor.external_data[i]


# --- asking ------------------------------------------------------------------------------

def is_deferred(tensor: TensorProto) -> bool:
    return tensor.data_location == TensorProto.EXTERNAL and any(
        e.key == BASE_KEY for e in tensor.external_data)


def deferred(model: onnx.ModelProto) -> list[TensorProto]:
    """The model's deferred tensors (anywhere: passes may move a weight into a node)."""
    return [t for t in all_tensors(model) if is_deferred(t)]


def deferred_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's deferred tensors, as their references declare them."""
    return sum(int(reference(t).get("length", "0")) for t in deferred(model))


# --- reading -----------------------------------------------------------------------------

def to_array(tensor: TensorProto) -> np.ndarray:
    """The tensor's values, as `onnx.numpy_helper.to_array`; a deferred tensor's are read
    from its file (a fresh, writable array each call; the proto is not changed)."""
    if not is_deferred(tensor):
        return numpy_helper.to_array(tensor)
    info = reference(tensor)
    dtype = _raw_dtype(tensor)
    if dtype is None:
        return numpy_helper.to_array(tensor, base_dir=info[BASE_KEY])
    reader = PieceReader.open(tensor)  # into the array: no file object (8 us, not 20)
    if reader is not None:
        values = np.empty(tuple(tensor.dims), dtype)
        with reader:
            reader.read_into(values.reshape(-1), 0)
    else:  # no preadv here
        count = math.prod(tensor.dims)
        with _open(tensor, info) as f:
            values = np.fromfile(f, dtype=dtype, count=count)
        if values.size != count:
            raise _short(tensor, info)
        values = values.reshape(tuple(tensor.dims))
    return values.astype(dtype.newbyteorder("="), copy=False)


def inline_array(tensor: TensorProto) -> np.ndarray | None:
    """An inline tensor's values as gs's lazy values load them (`onnx.numpy_helper.
    to_array`, then a writable copy) where its raw data is numpy's own layout (`_PLAIN`),
    read directly; else None. About 1 us a small tensor instead of 3 (the passes read
    every constant they look at this way, `graph.rewire.constant_value`)."""
    dtype = _raw_dtype(tensor)
    if (dtype is None or tensor.data_location == TensorProto.EXTERNAL
            or not tensor.HasField("raw_data") or sys.byteorder != "little"):
        return None
    return np.frombuffer(tensor.raw_data, dtype).reshape(tuple(tensor.dims)).copy()


def _raw_dtype(tensor: TensorProto) -> np.dtype | None:
    """The little-endian numpy dtype of the tensor's raw data, where it is numpy's own
    layout (`_PLAIN`, no segment); else None."""
    dtype = _RAW_DTYPES.get(tensor.data_type)
    return None if dtype is None or tensor.HasField("segment") else dtype


def read_bytes(tensor: TensorProto) -> bytes:
    """A deferred tensor's raw data, as its file holds it."""
    info = reference(tensor)
    length = int(info.get("length", "-1"))
    with _open(tensor, info) as f:
        data = f.read() if length < 0 else f.read(length)
    if length >= 0 and len(data) != length:
        raise _short(tensor, info)
    return data


SAMPLE_WINDOW = 4096
"""Bytes per window of a sample (`read_sample`, `sample`)."""


def read_sample(tensor: TensorProto, window: int = SAMPLE_WINDOW) -> bytes:
    """A few windows of a deferred tensor's raw data (start, middle, end): tensors whose
    samples differ differ, so a search for equal weights reads whole tensors only where
    the samples agree."""
    info = reference(tensor)
    length = int(info.get("length", "0"))
    if not hasattr(os, "pread"):  # Windows: through Python's file object
        out = []
        with _open(tensor, info) as f:
            start = f.tell()
            for offset, size in _sample_windows(length, window):
                f.seek(start + offset)
                out.append(f.read(size))
        return b"".join(out)
    # a descriptor and pread: no buffered file object per tensor (dedup-constants samples
    # every deferred weight of a group of one dtype and shape; synthetic_1000's 2,000:
    # 91 -> 72 ms)
    start = int(info.get("offset", "0"))
    fd = _open_fd(tensor, info)
    try:
        return b"".join(os.pread(fd, size, start + offset)
                        for offset, size in _sample_windows(length, window))
    finally:
        os.close(fd)


def sample(tensor: TensorProto | np.ndarray, window: int = SAMPLE_WINDOW) -> bytes | None:
    """`read_sample`'s windows, the same bytes, of any weight whose raw data is numpy's own
    little-endian layout: a deferred tensor's file, an inline tensor's `raw_data`, or an
    array of a `_PLAIN` type; None for any other (typed fields, packed or string types)."""
    if isinstance(tensor, np.ndarray):
        if tensor.dtype.kind not in "biuf" or tensor.dtype.itemsize > 8:
            return None
        flat = np.ascontiguousarray(tensor).reshape(-1)
        data = flat.astype(flat.dtype.newbyteorder("<"), copy=False).view(np.uint8)
        return b"".join(data[o:o + n].tobytes() for o, n in _sample_windows(data.size, window))
    if is_deferred(tensor):
        return read_sample(tensor, window)
    if tensor.data_type not in _PLAIN or tensor.HasField("segment") or not tensor.raw_data:
        return None
    raw = tensor.raw_data
    return b"".join(raw[o:o + n] for o, n in _sample_windows(len(raw), window))


def _sample_windows(length: int, window: int) -> list[tuple[int, int]]:
    """(offset, size) of the start, middle and end windows of `length` bytes."""
    window = min(window, length)
    return [(o, window) for o in sorted({0, (length - window) // 2, length - window})]


def materialize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Read every deferred tensor of `model` into it (raw data, no longer external), one
    at a time; returns `model`."""
    for tensor in deferred(model):
        _read_into(tensor)  # data_location DEFAULT, and unset as in a plain export
    return model


def materialized(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself when nothing is deferred, else a copy with its weights read."""
    if not deferred(model):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # cheap: deferred weights are references
    return materialize(copy)


# --- onnxruntime -------------------------------------------------------------------------

def session_bytes(model: onnx.ModelProto, options) -> tuple[bytes | None, list]:
    """The serialized model for `onnxruntime.InferenceSession(bytes, options)` when it has
    deferred weights, without the `basepath` entries onnxruntime refuses. onnxruntime
    reads the weights of one directory itself (`options` name it: the one with the most
    bytes), as it reads any model's external data; the deferred main-graph initializers
    of any other directory (the run's spill, `graphfix.spill`, beside the input's) are
    handed to it as external initializers over read-only memory maps of their files
    (`mapped`), copying nothing. (Handing it every weight that way costs more memory:
    onnxruntime keeps the original of a weight it repacks when it does not own it; the
    2 GiB model's check then failed at 8 GiB of address space.) Deferred tensors
    elsewhere (a node's attribute) are read into a copy of the model. Returns the bytes
    (None when the model is over 2 GB even so, passes having made large inline weights:
    use `materialized(model)` then) and the values given to onnxruntime, which must
    live as long as the session does."""
    import onnxruntime as ort

    # A copy (the skeleton: about 1 ms): `model`'s tensors are shared with whatever reads
    # the weights meanwhile (the passes, while the check runs the original in a thread);
    # taking their `basepath` entries away there, even for a moment, raced those reads
    # (a segfault in the test suite).
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    main = [t for t in copy.graph.initializer if is_deferred(t)]
    if len(main) != len(deferred(copy)):
        for tensor in deferred(copy):
            if not any(tensor is t for t in copy.graph.initializer):
                _read_into(tensor)
    refs = [reference(t) for t in main]
    bases = [ref[BASE_KEY] for ref in refs]
    by_dir: dict[str, int] = {}
    for ref, base in zip(refs, bases, strict=True):
        by_dir[base] = by_dir.get(base, 0) + int(ref.get("length", "0"))
    values = []
    if by_dir:  # none when every deferred tensor was an attribute's, read above
        folder = max(by_dir, key=by_dir.__getitem__)
        options.add_session_config_entry(_ORT_FOLDER, folder)
        others = [t for t, base in zip(main, bases, strict=True) if base != folder]
        values = [ort.OrtValue.ortvalue_from_numpy(mapped(t)) for t in others]
        if others:
            options.add_external_initializers([t.name for t in others], values)
    for tensor in main:
        forget_dir(tensor)
    try:
        return copy.SerializeToString(), values
    except (EncodeError, ValueError):  # over the 2 GB protobuf limit
        return None, values


def mapped(tensor: TensorProto) -> np.ndarray:
    """A deferred tensor's values as a read-only memory map of its file where its type
    is numpy's own and its offset suits the type's alignment, else read (`to_array`)."""
    info = reference(tensor)
    offset = int(info.get("offset", "0"))
    dtype = _raw_dtype(tensor)
    if (dtype is None or offset % dtype.alignment or not dtype.isnative
            or math.prod(tensor.dims) == 0):
        return to_array(tensor)
    try:
        return np.memmap(_path(info), dtype=dtype, mode="r", offset=offset,
                         shape=tuple(tensor.dims))
    except (OSError, ValueError):  # a file shorter than the reference: read says why
        return to_array(tensor)


class PieceReader:
    """Reads a deferred tensor's raw data a piece at a time into the caller's buffer,
    with os.preadv: no array of the whole tensor (fold-bn scales Conv weights a block of
    output channels at a time into the spill, `passes.fold_bn`). `open` gives None where
    that cannot be done (not deferred, not numpy's own layout, no preadv); the caller
    then reads the whole tensor (`to_array`)."""

    def __init__(self, tensor: TensorProto, fd: int, offset: int, dtype: np.dtype) -> None:
        self.tensor, self.fd, self.offset, self.dtype = tensor, fd, offset, dtype

    @classmethod
    def open(cls, tensor: TensorProto) -> PieceReader | None:
        dtype = _raw_dtype(tensor) if is_deferred(tensor) else None
        if dtype is None or not hasattr(os, "preadv"):
            return None
        info = reference(tensor)
        return cls(tensor, _open_fd(tensor, info), int(info.get("offset", "0")), dtype)

    def read_into(self, out: np.ndarray, element: int) -> None:
        """Fill `out` (C-contiguous, of `self.dtype`) from element `element` on."""
        view = memoryview(out).cast("B")
        at, done = self.offset + element * self.dtype.itemsize, 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], at + done)
            if got <= 0:
                raise _short(self.tensor, reference(self.tensor))
            done += got

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PieceReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_into(tensor: TensorProto) -> None:
    tensor.raw_data = read_bytes(tensor)
    tensor.ClearField("data_location")
    del tensor.external_data[:]


# --- every tensor --------------------------------------------------------------------------

def all_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    """Every TensorProto in the model, sparse tensors' values and indices included."""
    out: list[TensorProto] = []
    _graph_tensors(model.graph, out)
    for function in model.functions:
        _node_tensors(function.node, out)
    return out


def _graph_tensors(graph: GraphProto, out: list[TensorProto]) -> None:
    out.extend(graph.initializer)
    for sparse in graph.sparse_initializer:
        out += (sparse.values, sparse.indices)
    _node_tensors(graph.node, out)


def _node_tensors(nodes: Iterable[NodeProto], out: list[TensorProto]) -> None:
    for node in nodes:
        for attr in node.attribute:
            kind = attr.type
            if kind == _A.TENSOR:  # fast paths first: this runs for every attribute
                out.append(attr.t)
            elif kind == _A.GRAPH:
                _graph_tensors(attr.g, out)
            elif kind in _RARE_HOLDERS:
                if attr.HasField("t"):
                    out.append(attr.t)
                out.extend(attr.tensors)
                sparse = [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []
                for tensor in [*sparse, *attr.sparse_tensors]:
                    out += (tensor.values, tensor.indices)
                for graph in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                    _graph_tensors(graph, out)


# --- files ---------------------------------------------------------------------------------

def reference(tensor: TensorProto) -> dict[str, str]:
    """A deferred tensor's reference: location, offset, length and basepath."""
    return {e.key: e.value for e in tensor.external_data}


def data_file(tensor: TensorProto) -> str:
    """The path of a deferred tensor's file."""
    return _path(reference(tensor))


def open_data(tensor: TensorProto):
    """A deferred tensor's file, open at its offset (a context manager)."""
    return _open(tensor, reference(tensor))


def short_read(tensor: TensorProto) -> GraphfixError:
    """The error for a deferred tensor's file that ended before its data did."""
    return _short(tensor, reference(tensor))


def _open(tensor: TensorProto, info: dict[str, str]):
    """The tensor's file, open at its offset. `io.load` checked the reference (relative,
    inside the model's directory, no links, long enough) when it deferred the tensor."""
    path = _path(info)
    try:
        f = open(path, "rb")  # noqa: SIM115 - returned to a with block
    except OSError as e:
        raise _unopened(tensor, path, e) from e
    f.seek(int(info.get("offset", "0")))
    return f


def _open_fd(tensor: TensorProto, info: dict[str, str]) -> int:
    """`_open`'s file as a descriptor, for reading with os.pread."""
    path = _path(info)
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as e:
        raise _unopened(tensor, path, e) from e


def _unopened(tensor: TensorProto, path: str, e: OSError) -> GraphfixError:
    return GraphfixError(f"Cannot read the weights of tensor '{tensor.name}'",
                         f"its external data file '{path}' cannot be opened "
                         f"({e.strerror or e})", "keep the model's data file in place "
                         "while graphfix uses the model")


def _path(info: dict[str, str]) -> str:
    """The file a deferred tensor's reference names."""
    return os.path.join(info[BASE_KEY], info.get("location", ""))


def _short(tensor: TensorProto, info: dict[str, str]) -> GraphfixError:
    path = _path(info)
    return GraphfixError(f"Cannot read the weights of tensor '{tensor.name}'",
                         f"its external data file '{path}' became shorter after the model "
                         "was loaded", "keep the model's data file in place, unchanged, "
                         "while graphfix uses the model")
