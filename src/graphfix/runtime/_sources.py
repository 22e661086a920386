"""Where calibration arrays come from: .npy/.npz files and data-loader scripts.

Files are checked from their headers alone before any array is read (a .npy header;
for an .npz, the header of every zip member), so a bad 150th file fails at once.
Arrays are read one file at a time, always with allow_pickle=False. A single .npz
file is the exception to "one file at a time, small": numpy reads a whole member
array at once, so the chosen arrays are held in memory during a pass. A single .npy
file is memory-mapped, so only the rows of the current batch are read.

A data-loader script is `file.py:function` (function `load_data` by default). The
file is imported once; the function is called again for every pass over the data
and must give the same feed dicts, in the same order, every time.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphfix.errors import GraphfixError
from graphfix.runtime._blocks import Block, FeedChecker, Header, pickled

_FORMAT = np.lib.format
_HEADER_READERS = {(1, 0): _FORMAT.read_array_header_1_0, (2, 0): _FORMAT.read_array_header_2_0}
_PICKLE_START = b"\x80"  # pickle protocol 2 and later


def npy_header(fp, where: str) -> Header:
    """(shape, dtype) from the header of a .npy stream; refuses pickles."""
    start = fp.read(1)
    if start == _PICKLE_START:
        raise pickled(where)
    try:
        version = _FORMAT.read_magic(_Prefixed(start, fp))
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
        shape, _, dtype = reader(fp)
    except ValueError as err:
        raise GraphfixError(f"Cannot read '{where}' as a .npy array", f"numpy says: {err}",
                            "save the array with numpy.save") from None
    if dtype.hasobject:
        raise pickled(where)
    return tuple(shape), dtype


class _Prefixed:
    """A stream with `prefix` put back in front of it (for read_magic)."""

    def __init__(self, prefix: bytes, fp) -> None:
        self.prefix, self.fp = prefix, fp

    def read(self, n: int) -> bytes:
        head, self.prefix = self.prefix[:n], self.prefix[n:]
        return head + self.fp.read(n - len(head))


def npz_headers(path: Path, where: str) -> dict[str, Header]:
    """{key: (shape, dtype)} of every array in an .npz, read from the zip member headers."""
    try:
        with zipfile.ZipFile(path) as archive:
            out = {}
            for info in archive.infolist():
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                with archive.open(info) as fp:
                    out[key] = npy_header(fp, f"{where}['{key}']")
            return out
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise GraphfixError(f"Cannot read '{where}' as an .npz file", f"{err}",
                            "save the arrays with numpy.savez(path, **arrays)") from None


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
            with open(path, "rb") as fp:
                headers = {names[0]: npy_header(fp, where)}
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


def single_npz(path: Path, checker: FeedChecker, data_key: str | None) -> FileSource:
    """One .npz whose arrays stack samples along axis 0 (the chosen arrays are read whole)."""
    headers = npz_headers(path, str(path))
    names = [i.name for i in checker.inputs]
    keys = _pick_keys(path, headers, names, data_key)
    where = f"{path}['{keys[names[0]]}']" if data_key is not None else str(path)
    block = checker.check(where, {name: headers[key] for name, key in keys.items()})
    shown = ", ".join(f"'{k}'" for k in keys.values())
    return FileSource(f"{path.name}[{shown}]", [path], [block],
                      lambda p: _read_npz(p, keys))


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


def single_npy(path: Path, checker: FeedChecker) -> FileSource:
    """One .npy whose axis 0 stacks samples (memory-mapped: rows are read as used)."""
    names = [i.name for i in checker.inputs]
    if len(names) != 1:
        raise GraphfixError(
            f"'{path}' is one array, but the model has {len(names)} inputs "
            f"({', '.join(names)})",
            "a .npy file holds one array, so it can feed only a single-input model",
            "store one array per input name in an .npz: numpy.savez(path, **{name: array})",
        )
    with open(path, "rb") as fp:
        block = checker.check(str(path), {names[0]: npy_header(fp, str(path))})
    return FileSource(path.name, [path], [block],
                      lambda p: {names[0]: np.load(p, mmap_mode="r", allow_pickle=False)})


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
