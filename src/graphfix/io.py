"""Loading and saving ONNX models: bad input becomes a `GraphfixError`, writes are atomic.

`load` reads the file once, parses it without touching external data, checks that it
is an ONNX model, then checks every external-data reference (initializers, node
attributes, sparse tensors, If/Loop/Scan subgraphs, functions) *before* any data file
is opened: relative, inside the model's directory, no symbolic links, file long enough.

`save` writes into a temporary file beside the target, fsyncs it and renames it onto
the target, so a crash never leaves a half-written output; external data (forced, or
automatic above the 2 GB protobuf limit) goes to `<output name>.data` the same way.
The IR version written is lowered to what the installed onnxruntime accepts.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import PureWindowsPath
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError, EncodeError
from onnx import GraphProto, TensorProto
from onnx.external_data_helper import load_external_data_for_tensor

from graphfix import wire
from graphfix.errors import GraphfixError
from graphfix.graph.wellformed import check_wellformed
from graphfix.staging import Writer, publish, stage
from graphfix.weights import (
    IN_FILE_MIN_BYTES,
    all_tensors,
    defer,
    defer_in_file,
    deferrable,
    fits_in_file,
    forget_dir,
    is_deferred,
    materialized,
    tensor_nbytes,
)
from graphfix.weights import deferred as deferred_tensors

_PROTOBUF_LIMIT = 2**31 - 1
"""Largest message protobuf serializes; bigger models must keep weights in external data."""
_EXTERNAL_MIN_BYTES = 1024
"""Initializers smaller than this stay inside the .onnx file when saving external data."""
_CONTROL_BYTES = bytes(b for b in range(32) if b not in (9, 10, 13)) + b"\x7f"
_REEXPORT = "re-export the model, or re-download it (it may be truncated)"


def load(path: str | os.PathLike, *, weights: bool = True) -> onnx.ModelProto:
    """Load an ONNX model and its external data (read from the model's directory only).

    Raises GraphfixError for a missing/empty/non-ONNX/truncated file and for external
    data that is absolute, outside the model's directory, behind a symbolic link,
    missing or shorter than declared. Nothing is attached to the returned proto but
    the directory of deferred weights: `weights=False` checks external data the same
    way but leaves the large main-graph initializers in their file, deferred
    (`graphfix.weights`: read on demand, e.g. by a pass; `save` copies them from their
    file as it writes). doctor reads no weights that way, and run and check
    hold in memory only the weights a pass rewrites (docs/large-models.md).
    """
    path = os.fspath(path)
    if not weights:
        light = _load_without_inline_weights(path)
        if light is not None:
            return light
    return _load(path, _read_model_file(path), weights)


def _load_without_inline_weights(path: str) -> onnx.ModelProto | None:
    """`load(weights=False)` reading only what is not a large inline weight: the file is
    mapped, its layout read (`graphfix.wire`), the rest parsed, and those weights become
    references into the file (`weights.defer_in_file`). None when the model has no such
    weights, its layout is unusual, or anything is wrong with it: `load` then reads the
    file whole, and says what is wrong."""
    import mmap

    try:
        _check_model_file(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            found = wire.without_raw(mm, IN_FILE_MIN_BYTES)
        if found is None or not found[1]:
            return None
        return _load(path, found[0], False, found[1])
    except (GraphfixError, OSError, ValueError):
        return None


def _load(path: str, data: bytes, weights: bool, in_file: Sequence[wire.RawSpan] = ()
          ) -> onnx.ModelProto:
    """`load` of the file's bytes `data`; `in_file`: initializers whose raw data was cut
    from `data`, to refer to the file (ValueError when one does not fit its tensor)."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except DecodeError as e:
        if "MaxDepth" in str(e):  # upb stops at 100 nested messages, ~30 If levels
            raise GraphfixError(f"Cannot load '{path}'", "it nests subgraphs (If/Loop/Scan "
                                "bodies) deeper than protobuf parses: about 30 levels",
                                "flatten the nesting before export (e.g. elif chains as "
                                "one If per level are better as Where or a lookup)") from None
        raise _not_onnx(path, data, "it is not a valid ONNX protobuf: the file looks "
                        "truncated or corrupt, or is not an ONNX model at all") from None
    for span in in_file:
        tensor = model.graph.initializer[span.index]
        if tensor.name != span.name or not fits_in_file(tensor, span.length):
            raise ValueError(f"initializer {span.index} does not fit its data")
        defer_in_file(tensor, path, span.offset, span.length)
    checks = [(model.ir_version > 0, "it has no IR version"),
              (model.HasField("graph"), "it has no graph"),
              (len(model.graph.output) > 0, "its graph has no outputs"),
              (len(model.opset_import) > 0, "it declares no opset")]
    for ok, problem in checks:  # protobuf parses some garbage without complaint
        if not ok:
            raise _not_onnx(path, data, f"it is not an ONNX model: {problem}")
    check_wellformed(model, path)
    base_dir = os.path.dirname(os.path.abspath(path))
    external = [t for t in all_tensors(model)
                if t.data_location == TensorProto.EXTERNAL and not is_deferred(t)]
    for tensor in external:  # all checks first: nothing is opened if any reference is bad
        info = {entry.key: entry.value for entry in tensor.external_data}
        why, fix = _external_problem(base_dir, info, tensor_nbytes(tensor))
        if why:
            raise GraphfixError(f"Cannot load '{path}'", f"tensor '{tensor.name}' keeps its "
                                f"data in external file '{info.get('location', '')}', which "
                                f"{why}", fix)
    if not weights:
        for tensor in external:
            forget_dir(tensor)
        for tensor in deferrable(model):
            defer(tensor, base_dir)
    for tensor in external:
        if not weights and is_deferred(tensor):
            continue
        try:
            load_external_data_for_tensor(tensor, base_dir)
        except (OSError, ValueError, onnx.checker.ValidationError) as e:
            raise GraphfixError(f"Cannot load external data of tensor '{tensor.name}' for "
                                f"'{path}'", str(e), _REEXPORT) from e
        # onnx < 1.20 leaves the tensor marked external (the model-level helper clears it);
        # cleared, not set to DEFAULT: the same bytes as `weights.materialize` writes
        tensor.ClearField("data_location")
        del tensor.external_data[:]
    return model


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file's bytes (the .onnx file only, not its external data)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as e:
        raise GraphfixError(f"Cannot read '{os.fspath(path)}'", e.strerror or str(e),
                            "check that the file exists and is readable") from e
    return digest.hexdigest()


def save(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None,
         input_path: str | os.PathLike | None = None, in_place: bool = False) -> None:
    """Write `model` atomically to `path`; the caller's `model` is left unchanged.

    external_data: None = only when the model exceeds the 2 GB protobuf limit; True =
    always. Initializers of 1 KiB or more then go to `<file name>.data` beside `path`,
    which is replaced before the model file. Deferred weights (`graphfix.weights`) are
    copied from their files as the file is written (`graphfix.streamsave`), not read
    into memory first. Writing onto `input_path` is refused
    unless `in_place`. The IR version written is `compatible_ir_version(model)`.
    Not thread-safe for one `model`: its IR version may be set during serialization.
    """
    path = os.fspath(path)
    check_output_path(path, input_path=input_path, in_place=in_place)
    _commit(path, model_files(model, path, external_data=external_data))



def model_files(model: onnx.ModelProto, path: str | os.PathLike, *,
                external_data: bool | None = None) -> list[tuple[str, Writer]]:
    """The files saving `model` at `path` writes, as (absolute target, writer) in the
    order they must replace their targets (external data before the model that names
    it). Serializes the model (the part that can fail on the model) before returning."""
    path = os.fspath(path)
    for tensor in all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL and not is_deferred(tensor):
            raise GraphfixError(f"Cannot write '{path}'", f"tensor '{tensor.name}' still "
                                "refers to external data that was never loaded", "load the "
                                "model with graphfix.io.load, which reads external data")
    ir = compatible_ir_version(model)
    if deferred_tensors(model):
        from graphfix import streamsave

        if external_data is not True and streamsave.streamable(model):
            return [(os.path.abspath(path), lambda f: streamsave.write(model, f, ir))]
        model = materialized(model)
    use_external = external_data
    if use_external is None:
        use_external = _initializer_bytes_lower_bound(model) > _PROTOBUF_LIMIT
    if not use_external:
        serialized = _serialize(model, ir)
        if serialized is not None:
            return [(os.path.abspath(path), lambda f: f.write(serialized))]
        if external_data is False:
            raise GraphfixError(f"Cannot write '{path}'", "the model is over the 2 GB protobuf "
                                "limit", "save it with external data (--external-data)")
    return _external_files(model, path, ir)


def check_output_path(path: str | os.PathLike, *, input_path: str | os.PathLike | None = None,
                      in_place: bool = False) -> None:
    """Raise GraphfixError if `path` cannot be an output (the checks `save` makes first)."""
    path = os.fspath(path)
    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    if os.path.isdir(target):
        raise GraphfixError(f"Cannot write '{path}'", "it is an existing directory",
                            f"give a file name, e.g. '{os.path.join(path, 'model.onnx')}'")
    if not os.path.isdir(directory):
        raise GraphfixError(f"Cannot write '{path}'", f"its directory '{directory}' does not "
                            f"exist", f"create it first (mkdir -p '{directory}')")
    if input_path is not None and not in_place and same_file(target, os.fspath(input_path)):
        raise GraphfixError(f"Refusing to overwrite the input model '{os.fspath(input_path)}'",
                            f"the output '{path}' is the input file, and graphfix never "
                            "modifies its input unless asked", "choose another output "
                            "with -o, or pass --in-place to replace the input")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text to `path` atomically (temp file, fsync, rename)."""
    path = os.fspath(path)
    check_output_path(path)
    _commit(path, text_files(path, text))


def text_files(path: str | os.PathLike, text: str) -> list[tuple[str, Writer]]:
    """`model_files` for a UTF-8 text file."""
    data = text.encode("utf-8")
    return [(os.path.abspath(path), lambda f: f.write(data))]


# onnxruntime 1.22, the oldest graphfix supports, accepts IR versions up to 10 (tested):
# models at or below it need no probe (which would import onnxruntime just to save).
_IR_ACCEPTED_BY_OLDEST_RUNTIME = 10


@functools.lru_cache(maxsize=1)
def runtime_ir_version() -> int:
    """Highest IR version the installed onnxruntime accepts, probed once per process
    with a one-node model; onnx.IR_VERSION when onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return onnx.IR_VERSION
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # no thread pools
    h = onnx.helper
    graph = h.make_graph([h.make_node("Identity", ["x"], ["y"])], "probe",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    for ir in range(onnx.IR_VERSION, 2, -1):
        probe = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=ir)
        try:
            ort.InferenceSession(probe.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
        except Exception:  # any refusal means "not this version"
            continue
        return ir
    return onnx.IR_VERSION


def compatible_ir_version(model: onnx.ModelProto) -> int:
    """model.ir_version, lowered to what onnxruntime accepts but never below what the
    model's opsets need (onnxruntime then refuses the model itself, saying why)."""
    if model.ir_version <= _IR_ACCEPTED_BY_OLDEST_RUNTIME or (
        model.ir_version <= runtime_ir_version()
    ):
        return model.ir_version
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(model.ir_version, max(runtime_ir_version(), needed))


# --- loading ---------------------------------------------------------------------------

def _read_model_file(path: str) -> bytes:
    _check_model_file(path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise GraphfixError(f"Cannot load '{path}'", e.strerror or str(e),
                            "check the path and its permissions") from e


def _check_model_file(path: str) -> None:
    """GraphfixError unless `path` is a non-empty regular file under 2 GB."""
    def fail(why: str, fix: str) -> GraphfixError:
        return GraphfixError(f"Cannot load '{path}'", why, fix)

    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            found = ", ".join(sorted(n for n in os.listdir(path) if n.endswith(".onnx"))[:3])
            raise fail("it is a directory, not an ONNX file",
                       f"pass the .onnx file inside it{' (' + found + ')' if found else ''}")
        if not stat.S_ISREG(st.st_mode):
            raise fail("it is not a regular file", "pass an .onnx file")
        if st.st_size == 0:
            raise fail("the file is empty (0 bytes): the export or download that wrote it "
                       "probably failed", "re-export or re-download it")
        if st.st_size > _PROTOBUF_LIMIT:
            raise fail(f"it is {st.st_size} bytes, over the 2 GB protobuf limit, so it cannot "
                       "be an ONNX file", "re-export the model with external data")
    except FileNotFoundError:
        raise fail("the file does not exist", "check the path (relative paths start at "
                   f"'{os.getcwd()}')") from None
    except OSError as e:
        raise fail(e.strerror or str(e), "check the path and its permissions") from e


def _not_onnx(path: str, data: bytes, why: str) -> GraphfixError:
    kind = _text_kind(data)
    if kind:
        why = f"it is a {kind} file, not an ONNX model (graphfix reads binary .onnx files)"
    return GraphfixError(f"Cannot load '{path}'", why, "pass the .onnx file written by the "
                         f"exporter (e.g. torch.onnx.export); if it is that file, {_REEXPORT}")


def _text_kind(data: bytes) -> str:
    head = data[:4096]
    if head.translate(None, _CONTROL_BYTES) != head:
        return ""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # more than a character cut at the end of the sample
            return ""
    return "JSON" if head.lstrip()[:1] in (b"{", b"[") else "text"


def _external_problem(base_dir: str, info: dict[str, str], nbytes: int | None
                       ) -> tuple[str, str]:
    """(why, fix) for a reference to refuse, never opening it: absolute, leaving
    `base_dir`, through a symbolic link; or a missing or too short file, or a length that
    does not match the tensor's `nbytes` (from its shape). ("", "") if fine."""
    location = info.get("location", "")
    move = "move the data file next to the model and give it a relative location"
    parts = re.split(r"[\\/]", location)
    if not location:
        return "is not named (the tensor has no 'location')", _REEXPORT
    if os.path.isabs(location) or PureWindowsPath(location).anchor or not parts[0]:
        return "is an absolute path (only files in the model's directory are read)", move
    if ".." in parts:
        return f"is outside the model's directory '{base_dir}' ('..' is refused)", move
    full = os.path.join(base_dir, location)
    real_base, real = os.path.realpath(base_dir), os.path.realpath(full)
    if real_base != real and not real.startswith(os.path.join(real_base, "")):
        return (f"resolves through a symbolic link to '{real}', outside the model's directory",
                "copy the data file into the model's directory (the link was not followed)")
    for i in range(1, len(parts) + 1):
        if os.path.islink(step := os.path.join(base_dir, *parts[:i])):
            return (f"is reached through the symbolic link '{step}', which onnx does not "
                    "follow", "replace the link with a copy of the file")
    if not os.path.isfile(full):
        return (f"does not exist (looked for '{full}')", "copy the data file next to the "
                "model: the .onnx file and its data go together")
    offset, length = info.get("offset", "0"), info.get("length", str(nbytes or 0))
    if not (offset.isdecimal() and length.isdecimal()):
        return f"has an invalid offset '{offset}' or length '{length}'", _REEXPORT
    if nbytes is not None and int(length) != nbytes:
        return (f"is declared as {length} bytes long, but the tensor's shape and type need "
                f"{nbytes} bytes", _REEXPORT)
    size, end = os.path.getsize(full), int(offset) + int(length)
    if size < end:
        return (f"is {size} bytes, but the tensor needs bytes up to {end} (truncated?)",
                "re-download or re-export the data file together with the model")
    return "", ""


def _initializers(graph: GraphProto) -> Iterator[TensorProto]:
    """Initializers of `graph` and of its subgraphs (If/Loop/Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                yield from _initializers(sub)


# --- saving ----------------------------------------------------------------------------

def _initializer_bytes_lower_bound(model: onnx.ModelProto) -> int:
    """Bytes of the main graph's raw initializers, from their shapes (no data is copied:
    in protobuf's upb backend ByteSize() serializes the whole model, and fails over 2 GB)."""
    tensors = (t for t in model.graph.initializer if t.HasField("raw_data"))
    return sum(tensor_nbytes(t) or 0 for t in tensors)


def _serialize(model: onnx.ModelProto, ir: int) -> bytes | None:
    """The model serialized with IR version `ir`, or None when it is over 2 GB."""
    old = model.ir_version
    if ir != old:
        model.ir_version = ir
    try:
        data = model.SerializeToString()
    except (EncodeError, ValueError):
        return None
    finally:
        if ir != old:
            model.ir_version = old
    return data if len(data) <= _PROTOBUF_LIMIT else None


def _external_files(model: onnx.ModelProto, path: str, ir: int) -> list[tuple[str, Writer]]:
    target = os.path.abspath(path)
    location = os.path.basename(target) + ".data"
    if os.path.isdir(target + ".data"):
        raise GraphfixError(f"Cannot write '{path}.data'", "it is an existing directory",
                            "remove it, or choose another output with -o")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # the caller's model keeps its data inline
    copy.ir_version = ir
    serialized: list[bytes] = []

    def write_data(f: BinaryIO) -> None:
        for tensor in _initializers(copy.graph):
            _move_to_file(tensor, f, location)
        serialized.append(_serialize(copy, ir) or b"")
        if not serialized[0]:
            raise GraphfixError(f"Cannot write '{path}'", "the model is still over the 2 GB "
                                "protobuf limit with its initializers in external data",
                                "turn large Constant nodes into initializers first")

    return [(target + ".data", write_data), (target, lambda f: f.write(serialized[0]))]


def _move_to_file(tensor: TensorProto, f: BinaryIO, location: str) -> None:
    if tensor.data_location == TensorProto.EXTERNAL or not tensor.HasField("raw_data"):
        return
    raw = tensor.raw_data
    if len(raw) < _EXTERNAL_MIN_BYTES:
        return
    offset = f.tell()
    f.write(raw)
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", len(raw))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def _commit(path: str, files: list[tuple[str, Writer]]) -> None:
    """Write each (target, writer) to a temp file beside it, then rename them onto their
    targets in order. Temp files are removed on any failure; OSError -> GraphfixError."""
    publish(stage(path, files))


def same_file(a: str, b: str) -> bool:
    """Same file by inode when both exist, else by resolved path."""
    if os.path.exists(a) and os.path.exists(b):
        with contextlib.suppress(OSError):
            return os.path.samefile(a, b)
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))
