"""Where calibration arrays come from: .npy/.npz files and data-loader scripts.

Files are checked from their headers alone before any array is read (a .npy header;
for an .npz, the header of every zip member), and each array must be as long as its
header says, so a bad or cut-short 150th file fails at once. Arrays are never
unpickled.

A folder's files are read one file at a time (numpy.load, a whole file per block).
A single .npy or .npz file is streamed instead: it is cut into blocks of about
CHUNK_BYTES of rows, each read from the file when used, so memory does not grow with
the number of samples. Rows are read straight from a .npy and through zipfile from
an .npz member, stored (numpy.savez) or deflated (numpy.savez_compressed) alike; the
arrays of a multi-input .npz are read side by side, block by block. A pass that
starts later (the held-apart tail of `split`) seeks past the earlier rows of a .npy,
and reads and drops them from a zip member (the only way forward in compressed data),
_SKIP_BYTES at a time. The exception: an array saved in Fortran order does not keep
a sample's values together, so it is read whole once per pass and held during it,
which costs the array's size in memory.

A data-loader script is `file.py:function` (function `load_data` by default). The
file is imported once; the function is called again for every pass over the data
and must give the same feed dicts, in the same order, every time.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from graphfix.errors import GraphfixError, said
from graphfix.runtime._blocks import Block, FeedChecker, Header, pickled, show_shape

CHUNK_BYTES = 4 << 20  # a single .npy/.npz is read in blocks of rows of about this size
_SKIP_BYTES = 1 << 20  # zip data before a pass's first row is read and dropped this much at once
_FORMAT = np.lib.format
# Version 3.0 differs from 2.0 only in decoding the header text as utf8, not latin1; the
# two agree on every header of a numeric array (only structured dtypes' field names differ).
_HEADER_READERS = {(1, 0): _FORMAT.read_array_header_1_0, (2, 0): _FORMAT.read_array_header_2_0,
                   (3, 0): _FORMAT.read_array_header_2_0}
_PICKLE_START = b"\x80"  # pickle protocol 2 and later
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError)


class _Array(NamedTuple):
    """One array of a .npy/.npz file, from its header."""

    member: str | None  # its zip member's name; None: the file is a .npy
    header: Header
    fortran: bool  # saved in Fortran order
    offset: int  # where its data starts in the .npy stream


def _npy_array(fp: IO[bytes], where: str, size: int, member: str | None = None) -> _Array:
    """The header of a .npy stream of `size` bytes; refuses pickles and short data."""
    start = fp.read(1)
    if start == _PICKLE_START:
        raise pickled(where)
    try:
        version = _FORMAT.read_magic(_Prefixed(start, fp))
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
        shape, fortran, dtype = reader(fp)
    except ValueError as err:
        raise GraphfixError(f"Cannot read '{where}' as a .npy array", f"numpy says: {err}",
                            "save the array with numpy.save") from None
    if dtype.hasobject:
        raise pickled(where)
    offset = fp.tell()
    need = math.prod(shape) * dtype.itemsize
    if size - offset < need:
        raise GraphfixError(
            f"'{where}' is cut short",
            f"its header says {show_shape(shape)} {dtype} ({need} bytes), but only "
            f"{size - offset} bytes follow it",
            "the file is damaged or was not fully written: save it again",
        )
    return _Array(member, (tuple(shape), dtype), bool(fortran) and len(shape) > 1, offset)


class _Prefixed:
    """A stream with `prefix` put back in front of it (for read_magic)."""

    def __init__(self, prefix: bytes, fp) -> None:
        self.prefix, self.fp = prefix, fp

    def read(self, n: int) -> bytes:
        head, self.prefix = self.prefix[:n], self.prefix[n:]
        return head + self.fp.read(n - len(head))


def _npy_file(path: Path, where: str) -> _Array:
    with open(path, "rb") as fp:
        return _npy_array(fp, where, os.fstat(fp.fileno()).st_size)


def _npz_arrays(path: Path, where: str) -> dict[str, _Array]:
    """{key: array} of every array in an .npz, read from the zip member headers."""
    try:
        with zipfile.ZipFile(path) as archive:
            out = {}
            for info in archive.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with archive.open(info) as fp:
                    out[key] = _npy_array(fp, f"{where}['{key}']", info.file_size,
                                          info.filename)
            return out
    except _ZIP_ERRORS as err:
        raise GraphfixError(f"Cannot read '{where}' as an .npz file", said(err),
                            "save the arrays with numpy.savez(path, **arrays)") from None


def npz_headers(path: Path, where: str) -> dict[str, Header]:
    """{key: (shape, dtype)} of every array in an .npz, read from the zip member headers."""
    return {key: array.header for key, array in _npz_arrays(path, where).items()}


def _read_npz(path: Path, keys: Mapping[str, str]) -> dict[str, np.ndarray]:
    """{input name: array} read from the .npz keys `keys` maps the names to."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[key] for name, key in keys.items()}


class FileSource:
    """Blocks from a list of files; each file is read only while its block is used."""

    def __init__(self, label: str, paths: list[Path], blocks: list[Block],
                 reader: Callable[[Path], Mapping[str, Any]]) -> None:
        self.label = label
        self.blocks = blocks
        self._paths = paths
        self._reader = reader

    def read(self, first: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
        for path, block in zip(self._paths[first:], self.blocks[first:], strict=True):
            yield block.where, self._reader(path)


class RowStream:
    """Blocks of rows of one .npy/.npz file, read in order when used: at most one
    block of every array in memory (Fortran-order arrays aside, see the module
    docstring). `arrays` are in the model's input order, as `block` is."""

    def __init__(self, label: str, path: Path, arrays: dict[str, _Array], block: Block
                 ) -> None:
        self.label = label
        self._path, self._arrays, self._where = path, arrays, block.where
        # An array with one dim fewer than the stack is one sample (its rows are not samples).
        self._stacked = {name: len(array.header[0]) == len(shape) + 1
                         for (name, array), shape in zip(arrays.items(), block.shapes,
                                                         strict=True)}
        row_bytes = sum(math.prod(a.header[0][1:]) * a.header[1].itemsize
                        for name, a in arrays.items() if self._stacked[name])
        self._rows = max(1, CHUNK_BYTES // max(row_bytes, 1))
        self.blocks = [replace(block, rows=min(self._rows, block.rows - row))
                       for row in range(0, block.rows, self._rows)]

    def read(self, first: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
        with ExitStack() as stack:
            readers = {name: _Rows(fp, self._arrays[name], self._stacked[name],
                                   first * self._rows, self._name(self._arrays[name]))
                       for name, fp in self._open(stack).items()}
            for block in self.blocks[first:]:
                yield self._where, {name: r.take(block.rows) for name, r in readers.items()}

    def _name(self, array: _Array) -> str:
        return self._where if array.member is None else (
            f"{self._path}['{array.member.removesuffix('.npy')}']")

    def _open(self, stack: ExitStack) -> dict[str, IO[bytes]]:
        """{input name: a stream of its .npy}, each at its start."""
        if None in (a.member for a in self._arrays.values()):  # a .npy: one array
            return {name: stack.enter_context(open(self._path, "rb")) for name in self._arrays}
        try:
            archive = stack.enter_context(zipfile.ZipFile(self._path))
            return {name: stack.enter_context(archive.open(a.member))
                    for name, a in self._arrays.items()}
        except _ZIP_ERRORS as err:
            raise _damaged(self._where, said(err)) from None


class _Rows:
    """The rows of one array from `start` on, read in order from a stream of its .npy."""

    def __init__(self, fp: IO[bytes], array: _Array, stacked: bool, start: int,
                 where: str) -> None:
        self._fp, self._where, self._stacked = fp, where, stacked
        (self._shape, self._dtype), self._fortran = array.header, array.fortran
        self._held = None  # a Fortran-order stack, read whole
        _skip(fp, array.offset, where)
        if stacked and array.fortran:
            self._held = self._read(self._shape, fortran=True)[start:]
        elif stacked:
            _skip(fp, start * math.prod(self._shape[1:]) * self._dtype.itemsize, where)

    def take(self, rows: int) -> np.ndarray:
        """The next `rows` rows (the whole array when it is one sample)."""
        if not self._stacked:
            return self._read(self._shape, self._fortran)
        if self._held is not None:
            part, self._held = self._held[:rows], self._held[rows:]
            return np.ascontiguousarray(part)
        return self._read((rows, *self._shape[1:]), fortran=False)

    def _read(self, shape: tuple[int, ...], fortran: bool) -> np.ndarray:
        """The next array of `shape` in the stream (Fortran order is stored transposed)."""
        out = np.empty(shape[::-1] if fortran else shape, self._dtype)
        buffer, done = out.reshape(-1).view(np.uint8), 0
        try:
            while done < buffer.size:
                got = self._fp.readinto(buffer[done:])
                if not got:
                    raise _damaged(self._where, f"it ends {buffer.size - done} bytes early")
                done += got
        except _ZIP_ERRORS as err:
            raise _damaged(self._where, said(err)) from None
        return out.T if fortran else out


def _skip(fp: IO[bytes], count: int, where: str) -> None:
    """Moves `count` bytes on: a seek in a file, reads dropped in a zip member."""
    if not isinstance(fp, zipfile.ZipExtFile):
        fp.seek(count, os.SEEK_CUR)
        return
    try:
        while count > 0:
            got = len(fp.read(min(count, _SKIP_BYTES)))
            if not got:
                raise _damaged(where, "it ends early")
            count -= got
    except _ZIP_ERRORS as err:
        raise _damaged(where, said(err)) from None


def _damaged(where: str, why: str) -> GraphfixError:
    return GraphfixError(f"Cannot read the samples in '{where}'", why,
                         "the file is damaged or changed after it was checked: save it "
                         "again (numpy.save / numpy.savez) and rerun")


def array_folder(folder: Path, paths: list[Path], checker: FeedChecker) -> FileSource:
    """A folder of .npy files (single-input models) or .npz files (name -> array)."""
    suffix = paths[0].suffix.lower()
    names = [i.name for i in checker.inputs]
    if suffix == ".npy" and len(names) != 1:
        raise GraphfixError(
            f"'{folder}' holds .npy files, but the model has {len(names)} inputs "
            f"({', '.join(names)})",
            "a .npy file holds one array, so it can feed only a single-input model",
            "save each sample as an .npz with one array per input name: "
            "numpy.savez(path, **{name: array})",
        )
    blocks = []
    for path in paths:
        where = str(path)
        if suffix == ".npy":
            headers = {names[0]: _npy_file(path, where).header}
        else:
            headers = npz_headers(path, where)
        blocks.append(checker.check(where, headers))
    if suffix == ".npy":
        def reader(path: Path) -> dict[str, np.ndarray]:
            return {names[0]: np.load(path, allow_pickle=False)}
    else:
        def reader(path: Path) -> dict[str, np.ndarray]:
            return _read_npz(path, {n: n for n in names})
    label = f"{folder.name or folder}/ ({len(paths)} {suffix} files)"
    return FileSource(label, paths, blocks, reader)


def single_npz(path: Path, checker: FeedChecker, data_key: str | None) -> RowStream:
    """One .npz whose arrays stack samples along axis 0 (streamed, see RowStream)."""
    members = _npz_arrays(path, str(path))
    names = [i.name for i in checker.inputs]
    keys = _pick_keys(path, {k: a.header for k, a in members.items()}, names, data_key)
    where = f"{path}['{keys[names[0]]}']" if data_key is not None else str(path)
    arrays = {name: members[keys[name]] for name in names}
    block = checker.check(where, {name: a.header for name, a in arrays.items()})
    shown = ", ".join(f"'{k}'" for k in keys.values())
    return RowStream(f"{path.name}[{shown}]", path, arrays, block)


def _pick_keys(path: Path, headers: Mapping[str, Header], names: list[str],
               data_key: str | None) -> dict[str, str]:
    """{input name: .npz key}: --data-key, else the input names, else the only array."""
    have = ", ".join(f"'{k}'" for k in headers) or "no arrays"
    if data_key is not None:
        if data_key not in headers:
            raise GraphfixError(f"'{path}' has no array '{data_key}'", f"it has {have}",
                                "pass one of those as --data-key")
        if len(names) != 1:
            raise GraphfixError(
                f"--data-key picks one array, but the model has {len(names)} inputs "
                f"({', '.join(names)})",
                "each input needs its own array",
                "store one array per input name in the .npz and leave --data-key out",
            )
        return {names[0]: data_key}
    if all(n in headers for n in names):
        return {n: n for n in names}
    if len(names) == 1 and len(headers) == 1:
        return {names[0]: next(iter(headers))}
    missing = ", ".join(f"'{n}'" for n in names if n not in headers)
    raise GraphfixError(
        f"Cannot tell which arrays in '{path}' feed the model's inputs "
        f"({', '.join(names)})",
        f"it has {have}, and none named {missing}",
        "pick one with --data-key" if len(names) == 1 and headers
        else "store one array per input, keyed by the input's name",
    )


def single_npy(path: Path, checker: FeedChecker) -> RowStream:
    """One .npy whose axis 0 stacks samples (streamed, see RowStream)."""
    names = [i.name for i in checker.inputs]
    if len(names) != 1:
        raise GraphfixError(
            f"'{path}' is one array, but the model has {len(names)} inputs "
            f"({', '.join(names)})",
            "a .npy file holds one array, so it can feed only a single-input model",
            "store one array per input name in an .npz: numpy.savez(path, **{name: array})",
        )
    array = _npy_file(path, str(path))
    block = checker.check(str(path), {names[0]: array.header})
    return RowStream(path.name, path, {names[0]: array}, block)


class LoaderScript:
    """Blocks from a data-loader script: `function()` is called once per pass."""

    blocks = None

    def __init__(self, spec: str) -> None:
        path, sep, name = spec.rpartition(":")
        if not sep or not name.isidentifier():
            path, name = spec, "load_data"
        self.label = f"{Path(path).name}:{name}"
        self._function = _load_function(Path(path), name)

    def read(self, first: int = 0) -> Iterator[tuple[str, Mapping[str, Any]]]:
        items = self._guarded(lambda: iter(self._function()), "when called")
        index = 0
        while True:
            item = self._guarded(lambda: next(items, _END), f"at item {index}")
            if item is _END:
                return
            where = f"{self.label} item {index}"
            if not isinstance(item, Mapping):
                raise GraphfixError(
                    f"The data-loader script gave a {type(item).__name__} as {where}",
                    "each item must be a feed dict {input name: array}",
                    "yield dicts keyed by the model's input names",
                )
            if index >= first:
                yield where, item
            index += 1

    def _guarded(self, call: Callable[[], Any], when: str) -> Any:
        try:
            return call()
        except GraphfixError:
            raise
        except Exception as err:
            raise GraphfixError(
                f"The data-loader script {self.label} failed {when}",
                f"{type(err).__name__}: {err}",
                "fix the script (graphfix calls the function again for every pass over the "
                "data; it must return an iterable of feed dicts)",
            ) from err


_END = object()


def _load_function(path: Path, name: str) -> Callable[[], Any]:
    if not path.is_file():
        raise GraphfixError(f"The data-loader script '{path}' does not exist", "",
                            "pass --data-loader-script path/to/file.py:function")
    module_name = f"graphfix_data_loader_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise GraphfixError(f"Cannot import '{path}' as a Python module", "",
                            "pass a .py file as --data-loader-script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up there
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise GraphfixError(f"The data-loader script '{path}' failed while importing",
                            f"{type(err).__name__}: {err}", "fix the script") from err
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(k for k, v in vars(module).items()
                       if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module_name)
        raise GraphfixError(
            f"The data-loader script '{path}' has no function '{name}'",
            f"its functions are: {', '.join(found) or 'none'}",
            f"pass --data-loader-script {path}:FUNCTION",
        )
    return function
