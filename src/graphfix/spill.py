"""A run's spill file: large weights a pass computes, written once and then deferred.

fold-bn gives a ResNet new Conv weights: as numpy arrays, every later export copies
them into the model, every check serializes them for onnxruntime, which parses them
into its own memory, and the process holds them all the while. The manager writes each
such constant (`graph.convert.settle_constants`) to the spill file of the run, once, and
gives the graph a reference to it instead, deferred like the input's own weights
(`graphfix.weights`): exports copy a reference, onnxruntime maps the file, the output is
written by copying from it (`graphfix.streamsave`), and the memory is the page cache's.

The spill lives in a temporary directory for as long as the `Spill` is open: `api.run`
opens it around a run and reads what `Result.model` keeps before closing it
(`keep_weights`). Threads may write at once (fold-bn's workers write the weights they
compute, `passes.fold_bn._Workers`): each reserves its range under a lock (`reserve`)
and writes it with `os.pwrite`, without the interpreter lock. Two writers were no faster
than one here (fcos_resnet50_fpn's fold-bn with its 100 MB of writes: 169 ms from the
workers, 170 ms from the main thread; plausibly the file's lock in the kernel); what the
workers save is the main thread's time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import numpy as np
from onnx import TensorProto, helper

from graphfix import weights

ALIGN = 64
"""Each tensor starts at a multiple of this many bytes (any numpy type can be mapped)."""
FILE_NAME = "spill.bin"


class Spill:
    """A temporary file that weights are appended to (module docstring)."""

    def __init__(self) -> None:
        self.dir: str | None = None
        self._fd: int | None = None
        self._end = 0  # where the next tensor's range may start
        self._lock = threading.Lock()
        self.bytes = 0

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def put(self, name: str, values: np.ndarray) -> TensorProto:
        """Write `values` (a numpy-typed array) to the spill; returns the deferred
        TensorProto that refers to them. Safe to call from several threads."""
        data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
        region = self.reserve(data.nbytes)
        region.write(data, 0)
        return region.tensor(name, data.dtype, data.shape)

    def reserve(self, nbytes: int) -> Region:
        """A range of `nbytes` of the spill (aligned) for one tensor, to write in pieces
        (`Region.write`, from any thread) and then refer to (`Region.tensor`)."""
        with self._lock:
            if self._fd is None:
                self.dir = tempfile.mkdtemp(prefix="graphfix-spill-")
                self._fd = os.open(os.path.join(self.dir, FILE_NAME),
                                   os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
            offset = -self._end % ALIGN + self._end
            self._end = offset + nbytes
            self.bytes += nbytes
            return Region(self, self._fd, os.path.join(self.dir, FILE_NAME), offset, nbytes)

    def _write_at(self, fd: int, view: memoryview, offset: int) -> None:
        """All of `view` at `offset`, unbuffered (readers open the file by name); where
        there is no `os.pwrite` (Windows), one write at a time."""
        done = 0
        if hasattr(os, "pwrite"):
            while done < len(view):
                done += os.pwrite(fd, view[done:], offset + done)
            return
        with self._lock:
            os.lseek(fd, offset, os.SEEK_SET)
            while done < len(view):
                done += os.write(fd, view[done:])

    def close(self) -> None:
        """Delete the file; a model that refers to it can no longer be read."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class Region:
    """A tensor's range of the spill (`Spill.reserve`)."""

    def __init__(self, spill: Spill, fd: int, path: str, offset: int, nbytes: int) -> None:
        self.spill, self.fd, self.path = spill, fd, path
        self.offset, self.nbytes = offset, nbytes

    def write(self, data: np.ndarray, at: int) -> None:
        """`data`'s bytes (C order, as they are) at byte `at` of the range."""
        view = memoryview(data).cast("B")
        if at < 0 or at + len(view) > self.nbytes:
            raise ValueError(f"{len(view)} bytes at {at} do not fit a range of {self.nbytes}")
        self.spill._write_at(self.fd, view, self.offset + at)  # noqa: SLF001 - its own

    def tensor(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> TensorProto:
        """The deferred TensorProto of the range, holding `shape` of little-endian `dtype`."""
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        tensor.dims.extend(shape)
        weights.defer_in_file(tensor, self.path, self.offset, self.nbytes)
        return tensor
