"""Writing files so that a failure leaves nothing half-written: each file goes to a
temporary beside its target (fsynced, with the target's permissions), and temporaries
are renamed onto their targets only when all of them are written. `graphfix.io.save`
writes one model this way; `graphfix.writeset.WriteSet` all the outputs of a command.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import stat
import sys
import tempfile
import threading
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
                with _Writeback(fd):
                    write(f)
                    f.flush()
                os.fsync(fd)
            os.chmod(tmp, _file_mode(target))
    except BaseException as e:
        discard(staged)
        if isinstance(e, OSError):
            raise _write_error(path, e) from e
        raise
    return staged


class _Writeback:
    """While a file is written, the kernel is asked, every `WRITEBACK_BYTES` the file
    grows, to start writing what was written to the disk (Linux's sync_file_range with
    SYNC_FILE_RANGE_WRITE, which does not wait for it): the disk works while the rest is
    written, and the fsync after it waits for the last part only. Written at once then
    fsynced, a 176 MB file took 0.13 s here (the fsync 0.09 s), like this 0.09 s (the
    fsync 0.01 s). Where the call is missing (not Linux), nothing is asked."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> _Writeback:
        if _sync_file_range() is not None:
            self.thread = threading.Thread(target=self._run, name="graphfix-writeback",
                                           daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()

    def _run(self) -> None:
        sync, done = _sync_file_range(), 0
        while not self.stop.wait(WRITEBACK_POLL_S):
            try:
                size = os.fstat(self.fd).st_size
                if size - done >= WRITEBACK_BYTES:
                    sync(self.fd, done, size - done, _SYNC_FILE_RANGE_WRITE)
                    done = size
            except OSError:  # the file is closed or gone: the writer says what failed
                return


WRITEBACK_BYTES = 8 << 20
WRITEBACK_POLL_S = 0.005
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h


@functools.cache
def _sync_file_range():
    """libc's sync_file_range(fd, offset, nbytes, flags), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


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
