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
(`keep_weights`).
"""

from __future__ import annotations

import os
import shutil
import tempfile

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
        self._file = None
        self.bytes = 0

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def put(self, name: str, values: np.ndarray) -> TensorProto:
        """Write `values` (a numpy-typed array) to the spill; returns the deferred
        TensorProto that refers to them."""
        if self._file is None:
            self.dir = tempfile.mkdtemp(prefix="graphfix-spill-")
            self._file = open(os.path.join(self.dir, FILE_NAME), "wb")  # noqa: SIM115
        offset = -self._file.tell() % ALIGN + self._file.tell()
        self._file.seek(offset)
        data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
        self._file.write(memoryview(data).cast("B"))
        self._file.flush()  # readers open the file by name
        self.bytes += data.nbytes
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(data.dtype)
        tensor.dims.extend(data.shape)
        weights.defer_in_file(tensor, os.path.join(self.dir, FILE_NAME), offset, data.nbytes)
        return tensor

    def close(self) -> None:
        """Delete the file; a model that refers to it can no longer be read."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
