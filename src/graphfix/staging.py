"""Writing files so that a failure leaves nothing half-written: each file goes to a
temporary beside its target (fsynced, with the target's permissions), and temporaries
are renamed onto their targets only when all of them are written. `graphfix.io.save`
writes one model this way; `graphfix.writeset.WriteSet` all the outputs of a command.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from graphfix.errors import GraphfixError

Writer = Callable[[BinaryIO], object]
"""Writes one output file's bytes into the open temporary file."""


def stage(path: str, files: list[tuple[str, Writer]]) -> list[tuple[str, str]]:
    """Write each (target, writer) to a temporary file beside its target (fsynced, with
    the target's permissions): [(target, temporary)]. On any failure the temporaries
    are removed; OSError -> GraphfixError naming `path`."""
    staged: list[tuple[str, str]] = []
    try:
        for target, write in files:
            directory, name = os.path.split(target)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + name + ".", suffix=".tmp")
            staged.append((target, tmp))
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _file_mode(target))
    except BaseException as e:
        discard(staged)
        if isinstance(e, OSError):
            raise _write_error(path, e) from e
        raise
    return staged


def publish(staged: list[tuple[str, str]]) -> None:
    """Rename staged temporaries onto their targets in order and make the renames
    durable; what is not yet renamed when one fails is removed."""
    left = list(staged)
    try:
        for target, tmp in staged:
            os.replace(tmp, target)
            left.pop(0)
    except OSError as e:
        raise _write_error(left[0][0], e) from e
    finally:
        discard(left)
    for directory in {os.path.dirname(target) for target, _ in staged}:
        with contextlib.suppress(OSError):  # not possible on Windows
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def discard(staged: list[tuple[str, str]]) -> None:
    """Remove staged temporaries (never their targets)."""
    for _, tmp in staged:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def _write_error(path: str, e: OSError) -> GraphfixError:
    return GraphfixError(f"Cannot write '{path}'", e.strerror or str(e), "free disk space "
                         "or fix the directory's permissions, or write it somewhere else")


def _file_mode(target: str) -> int:
    """Keep an existing file's permissions; new files get the usual 0o666 & ~umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
