"""A TensorRT implicit-INT8 calibrator over graphfix's calibration data (TensorRT 8.x-10.x).

    calib = calibrator(data, method="entropy", cache="model.cache")
    config.int8_calibrator = calib          # TensorRT <= 10 builder config, INT8 flag set
    ...build...
    if calib.error: raise calib.error       # what went wrong inside TensorRT's callbacks

`tensorrt` is imported when `calibrator` is called, never at import. Device buffers are
polygraphy's `cuda.DeviceArray` (polygraphy is a graphfix dependency; it loads the CUDA
runtime library only when a buffer is made).

TensorRT 10.1 deprecated the IInt8 calibrators and TensorRT 11 removed them
(../shared/trt/calibration_notes.md (d)); with TensorRT 11 `calibrator` raises and points
to the Q/DQ model, which every TensorRT from 8.6 reads.

Not run in CI (no TensorRT, no GPU there): tests/calibration/test_trt_adapter.py drives it
with a fake `tensorrt` module and fake device buffers: sequencing, batch size, end of data,
cache read/write, the TensorRT 11 error, lazy import.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from graphfix.calibration.stats import batch_samples
from graphfix.errors import GraphfixError

# method -> TensorRT base class (calibration_notes.md (c): the two per-tensor calibrators).
BASE_CLASSES = {"entropy": "IInt8EntropyCalibrator2", "minmax": "IInt8MinMaxCalibrator"}


def calibrator(data: Iterable[dict[str, np.ndarray]], method: str = "entropy",
               cache: str | os.PathLike | None = None) -> Any:
    """An IInt8EntropyCalibrator2 ("entropy") or IInt8MinMaxCalibrator ("minmax") that feeds
    TensorRT the batches of `data` (re-iterable: `reset()` starts it over).

    `cache`: the calibration cache file, read when it exists and is not empty (TensorRT
    then skips calibration) and written when TensorRT hands one back. Raises GraphfixError
    for another method, without TensorRT, and for TensorRT 11 or newer.
    """
    if method not in BASE_CLASSES:
        raise GraphfixError(
            f"TensorRT has no calibrator for method '{method}'",
            "TensorRT's calibrators are IInt8EntropyCalibrator2 (entropy) and "
            "IInt8MinMaxCalibrator (minmax); percentile and mse exist only in graphfix",
            "use method 'entropy' or 'minmax', or use graphfix's Q/DQ model",
        )
    trt = _import_tensorrt()
    version = str(getattr(trt, "__version__", "0"))
    base = getattr(trt, BASE_CLASSES[method], None)
    if _major(version) >= 11 or base is None:
        raise GraphfixError(
            f"TensorRT {version} has no {BASE_CLASSES[method]}",
            "TensorRT 11 removed implicit INT8 calibration (the IInt8 calibrators and the "
            "INT8 builder flag, deprecated since 10.1): it reads quantization only as "
            "QuantizeLinear/DequantizeLinear in the ONNX model",
            "build the Q/DQ model graphfix calibrate writes (trtexec --onnx=model.int8.onnx "
            "--stronglyTyped), with no calibrator",
        )
    return _calibrator_class(base)(data, cache)


def _import_tensorrt() -> Any:
    from graphfix.trt import import_tensorrt

    return import_tensorrt("make a TensorRT calibrator (or use the Q/DQ model)")


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def new_device_buffer() -> Any:
    """An empty device byte buffer with `resize((nbytes,))`, `copy_from(host)`, `ptr`,
    `free()` (polygraphy's DeviceArray; tests replace this function)."""
    from polygraphy import cuda

    return cuda.DeviceArray.raw((0,))


def _host_array(value: Any) -> np.ndarray:
    """A C-contiguous array; floating inputs as float32 (TensorRT calibrates float inputs
    in float32)."""
    array = np.asarray(value)
    if np.issubdtype(array.dtype, np.floating) and array.dtype != np.float32:
        array = array.astype(np.float32)
    return np.ascontiguousarray(array)


def _calibrator_class(base: type) -> type:
    """A subclass of TensorRT's `base` calibrator (made per call: the base is only known
    once tensorrt is imported)."""

    class Calibrator(base):  # type: ignore[misc, valid-type]
        """Feeds graphfix calibration batches to TensorRT, one device buffer per input."""

        def __init__(self, data: Iterable[dict[str, np.ndarray]],
                     cache: str | os.PathLike | None) -> None:
            # pybind11 trampoline classes must be initialised explicitly, or TensorRT
            # crashes when it calls back.
            base.__init__(self)
            self.data = data
            self.cache = Path(cache) if cache is not None else None
            self.buffers: dict[str, Any] = {}
            self.error: GraphfixError | None = None
            self.batches = 0
            self._iter: Iterator[dict[str, np.ndarray]] | None = None
            self._pending: dict[str, np.ndarray] | None = None
            self._batch_size: int | None = None

        def reset(self) -> None:
            """Start the data over (the next get_batch reads its first batch)."""
            self._iter, self._pending, self.batches = None, None, 0

        def _next(self) -> dict[str, np.ndarray] | None:
            if self._pending is not None:
                batch, self._pending = self._pending, None
                return batch
            if self._iter is None:
                self._iter = iter(self.data)
            return next(self._iter, None)

        def get_batch_size(self) -> int:
            """Samples per batch, as `batch_samples` counts them in the first batch (it is
            read now and handed to get_batch later); 1 when the data is empty or 0-d."""
            if self._batch_size is None:
                self._pending = self._next()
                self._batch_size = batch_samples(self._pending, self.data) \
                    if self._pending else 1
            return self._batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            """Device pointers of the next batch's inputs, in `names` order; None at the end
            of the data, or on an error (kept in `self.error`: raising inside a TensorRT
            callback would not reach the caller)."""
            batch = self._next()
            if batch is None:
                self.free()
                return None
            missing = [n for n in names if n not in batch]
            if missing:
                self.error = GraphfixError(
                    f"calibration batch {self.batches + 1} has no input {', '.join(missing)}",
                    f"TensorRT asks for {', '.join(names)}; the batch has "
                    f"{', '.join(batch) or 'nothing'}",
                    "name the data's arrays after the model's inputs",
                )
                self.free()
                return None
            self.batches += 1
            return [self._to_device(name, batch[name]) for name in names]

        def _to_device(self, name: str, value: Any) -> int:
            host = _host_array(value)
            buffer = self.buffers.get(name)
            if buffer is None:
                buffer = self.buffers[name] = new_device_buffer()
            buffer.resize((max(host.nbytes, 1),))  # never a null pointer for empty inputs
            if host.nbytes:
                buffer.copy_from(host.reshape(-1).view(np.uint8))
            return int(buffer.ptr)

        def read_calibration_cache(self) -> bytes | None:
            """The cache file's bytes when it exists and is not empty, else None."""
            if self.cache is None or not self.cache.is_file():
                return None
            try:
                data = self.cache.read_bytes()
            except OSError as err:
                self.error = GraphfixError(f"cannot read the calibration cache {self.cache}",
                                           str(err), "check the path and its permissions")
                return None
            return data or None

        def write_calibration_cache(self, cache: Any) -> None:
            """Write TensorRT's cache (a buffer) to the cache file atomically."""
            if self.cache is None:
                return
            try:
                _write_atomic(self.cache, bytes(cache))
            except OSError as err:
                self.error = GraphfixError(f"cannot write the calibration cache {self.cache}",
                                           str(err), "check the folder and its permissions")

        def free(self) -> None:
            """Release every device buffer."""
            for buffer in self.buffers.values():
                buffer.free()
            self.buffers.clear()

        def __enter__(self) -> Calibrator:
            return self

        def __exit__(self, *exc: object) -> None:
            self.free()

    return Calibrator


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temp file beside `path` (mode 0o644), then rename it onto `path`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
