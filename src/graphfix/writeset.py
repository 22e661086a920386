"""Every file one command writes, as one set: claimed before any work, committed together.

    files = WriteSet([Given(model, "the input model", model=True), Given(data, "--data")])
    files.claim(out, "the output model (-o)")
    files.claim(report, "--report")           # both checked now, before any work
    ...
    files.model(result, out)                  # written to a temporary beside `out`
    files.text(report, json_text)
    files.commit()                            # every temporary renamed onto its target

A claim is refused (GraphfixError, exit 2) when the path is a file the command was given
(by resolved path and inode; a model's external-data files count), lies inside a folder
it was given (a data folder), is another output of the same command, or cannot be an
output at all (missing directory, an existing directory). Until `commit`, nothing but
temporaries `.NAME.*.tmp` exists; leaving the `with` block without committing (an
error, a crash the interpreter survives) removes them, so a command that fails leaves
no output behind. The renames of `commit` are the only step that can leave part of the
set: a rename within one directory fails only when the disk itself does.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx

from graphfix import io, staging, wire
from graphfix.errors import GraphfixError
from graphfix.weights import all_tensors

PathLike = str | os.PathLike


@dataclass(frozen=True)
class Given:
    """A path the command reads: `what` names it for messages ("--data"); `model`: an
    ONNX file, whose external-data files are inputs too."""

    path: PathLike
    what: str
    model: bool = False


class WriteSet:
    """The outputs of one command (see the module docstring)."""

    def __init__(self, given: Iterable[Given | None] = ()) -> None:
        self.given = [g for g in given if g is not None and g.path is not None]
        self.claims: dict[str, str] = {}  # resolved path -> what
        self.staged: list[tuple[str, str]] = []  # (target, temporary), in commit order
        self.committed = False
        # (target, replaces) already checked against the inputs: `model` claims its path
        # again, and a check may scan a whole input model (`target_is_external_data`)
        self._cleared: set[tuple[str, str]] = set()

    def __enter__(self) -> WriteSet:
        return self

    def __exit__(self, *exc) -> None:
        if not self.committed:
            self.discard()

    def claim(self, path: PathLike | None, what: str, *, model: bool = False,
              replaces: PathLike | None = None) -> None:
        """Check that `path` may be written (see the module docstring); `model`: it is an
        ONNX file, so `<path>.data` may be written beside it; `replaces`: the one input it
        may overwrite (--in-place). None is no output."""
        if path is None:
            return
        io.check_output_path(path)
        for target in [os.fspath(path)] + ([os.fspath(path) + ".data"] if model else []):
            self._against_inputs(target, what, replaces)
            key = _key(target)
            if key in self.claims and self.claims[key] != what:
                raise GraphfixError(
                    f"Two outputs would be the same file '{target}'",
                    f"{self.claims[key]} and {what} both name it",
                    f"give {what} another path")
            self.claims[key] = what

    def model(self, model: onnx.ModelProto, path: PathLike, what: str = "the output model",
              external_data: bool | None = None, replaces: PathLike | None = None) -> str:
        """Write `model` (and its external data) to temporaries; returns the temporary
        holding the .onnx file, to hash or read back before `commit`."""
        self.claim(path, what, model=True, replaces=replaces)
        return self._stage(path, io.model_files(model, path, external_data=external_data))

    def text(self, path: PathLike, text: str, what: str = "the output") -> str:
        """Write UTF-8 `text` to a temporary; returns its path."""
        self.claim(path, what)
        return self._stage(path, io.text_files(path, text))

    def commit(self) -> None:
        """Rename every temporary onto its target, in the order they were written."""
        staged, self.staged = self.staged, []
        self.committed = True
        staging.publish(staged)

    def withdraw(self, entries: list[tuple[str, str]]) -> None:
        """Remove these staged temporaries and forget them (a model staged early whose
        run then returned another, `graphfix.api`)."""
        staging.discard(entries)
        self.staged = [e for e in self.staged if e not in entries]

    def discard(self) -> None:
        staging.discard(self.staged)
        self.staged = []

    def _stage(self, path: PathLike, files: list[tuple[str, staging.Writer]]) -> str:
        keys = {_key(t) for t, _ in self.staged}
        for target, _ in files:
            if _key(target) in keys:
                raise GraphfixError(f"'{target}' would be written twice by one command",
                                    "two outputs name the same file",
                                    "give each output its own path")
        staged = staging.stage(os.fspath(path), files)
        self.staged += staged
        return staged[-1][1]

    def _against_inputs(self, target: str, what: str, replaces: PathLike | None) -> None:
        seen = (_key(target), _key(os.fspath(replaces)) if replaces is not None else "")
        if seen in self._cleared:
            return
        for given in self.given:
            if replaces is not None and io.same_file(os.fspath(replaces), os.fspath(given.path)):
                continue
            clash = _clash(target, given)
            if clash:
                raise GraphfixError(
                    f"Refusing to write {what} to '{target}'",
                    f"{clash}, and graphfix never writes over a file it was given",
                    f"give {what} another path")
        self._cleared.add(seen)


def _clash(target: str, given: Given) -> str:
    """Why writing `target` would touch the input `given` ("" when it would not)."""
    source = os.fspath(given.path)
    if os.path.isdir(source):
        inside = os.path.join(os.path.realpath(source), "")
        if os.path.realpath(target).startswith(inside):
            return (f"it lies inside {given.what} '{source}', a folder graphfix reads (a new "
                    "file there would change what the next run reads)")
        return ""
    if io.same_file(target, source):
        return f"it is {given.what} '{source}'"
    if given.model and target_is_external_data(source, target):
        return f"it holds the external data of {given.what} '{source}'"
    return ""


def target_is_external_data(model_path: str, target: str) -> bool:
    """Whether the ONNX file `model_path` keeps tensor data in the file `target`. Cheap:
    the file is searched for the name's bytes first and parsed only when they occur."""
    if not os.path.exists(target) or not os.path.isfile(model_path):
        return False
    directory = os.path.dirname(os.path.abspath(model_path))
    try:
        relative = os.path.relpath(os.path.realpath(target), os.path.realpath(directory))
    except ValueError:  # another drive (Windows)
        return False
    if relative.startswith(".."):
        return False  # graphfix only reads external data inside the model's folder
    try:
        with open(model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            proto = _without_inline_weights(m)
            if proto is None and m.find(Path(relative).name.encode("utf-8")) < 0:
                return False
    except (OSError, ValueError):  # empty or unreadable: loading it fails on its own
        return False
    try:
        proto = proto or onnx.load_model(model_path, load_external_data=False)
    except Exception:  # not a model: loading it says so
        return False
    wanted = os.path.realpath(target)
    for tensor in all_tensors(proto):
        for entry in tensor.external_data:
            location = os.path.join(directory, entry.value)
            if entry.key == "location" and io.same_file(location, wanted):
                return True
    return False


def _without_inline_weights(buf) -> onnx.ModelProto | None:
    """The model in `buf` without its large inline weights (`graphfix.wire`: its layout
    read, the rest parsed), which keeps every external-data reference; None where the
    layout is unusual. Searching the file for the name's bytes instead took 220 ms on
    vit_b_32's 337 MB (this: 5-10 ms), but is faster on a file of many small weights
    (synthetic_1000's 14,000: 45 ms, this 75 ms)."""
    found = wire.without_raw(buf, 1024)
    if found is None:
        return None
    try:
        return onnx.ModelProto.FromString(found[0])
    except Exception:  # noqa: BLE001 - not a model: the caller's search decides
        return None


def _key(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))
