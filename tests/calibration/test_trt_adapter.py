"""graphfix.calibration.trt without TensorRT: a fake `tensorrt` module (sys.modules) and fake
device buffers stand in for the real ones. The real TensorRT path is not run in CI."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

from graphfix.calibration import trt as adapter
from graphfix.errors import GraphfixError


class _FakeCalibratorBase:
    def __init__(self):
        self.base_initialised = True


def fake_tensorrt(version="10.3.0", with_calibrators=True):
    module = types.ModuleType("tensorrt")
    module.__version__ = version
    if with_calibrators:
        module.IInt8EntropyCalibrator2 = type("IInt8EntropyCalibrator2", (_FakeCalibratorBase,), {})
        module.IInt8MinMaxCalibrator = type("IInt8MinMaxCalibrator", (_FakeCalibratorBase,), {})
    return module


class FakeBuffer:
    """Records what the calibrator does with a device buffer."""

    next_ptr = 0x1000

    def __init__(self):
        self.ptr, self.capacity, self.data, self.freed, self.allocations = 0, 0, None, False, 0

    def resize(self, shape):
        (nbytes,) = shape
        if nbytes > self.capacity:
            FakeBuffer.next_ptr += 0x1000
            self.ptr, self.capacity = FakeBuffer.next_ptr, nbytes
            self.allocations += 1
        return self

    def copy_from(self, host):
        assert host.dtype == np.uint8 and host.flags.c_contiguous
        self.data = host.copy()
        return self

    def free(self):
        self.freed = True


@pytest.fixture
def trt(monkeypatch):
    module = fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    made: list[FakeBuffer] = []

    def new_buffer():
        made.append(FakeBuffer())
        return made[-1]

    monkeypatch.setattr(adapter, "new_device_buffer", new_buffer)
    module.buffers = made
    return module


def batches(count=3, batch=2):
    rng = np.random.default_rng(0)
    return [{"image": rng.standard_normal((batch, 3, 4, 4)),  # float64: sent as float32
             "size": np.full((batch,), i, np.int32)} for i in range(count)]


def test_importing_the_adapter_does_not_import_tensorrt():
    code = ("import sys; import graphfix.calibration.trt; "
            "print('tensorrt' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("method, base", [("entropy", "IInt8EntropyCalibrator2"),
                                          ("minmax", "IInt8MinMaxCalibrator")])
def test_method_picks_the_base_class_and_initialises_it(trt, method, base):
    calib = adapter.calibrator(batches(), method)
    assert isinstance(calib, getattr(trt, base))
    assert calib.base_initialised


def test_unknown_method_is_a_user_error_even_without_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(GraphfixError, match="no calibrator for method 'percentile'"):
        adapter.calibrator(batches(), "percentile")


def test_missing_tensorrt_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(GraphfixError, match="tensorrt is not installed"):
        adapter.calibrator(batches())


@pytest.mark.parametrize("module", [fake_tensorrt("11.1.0", with_calibrators=False),
                                    fake_tensorrt("11.0.0", with_calibrators=True)])
def test_tensorrt_11_is_refused_with_the_qdq_way(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    with pytest.raises(GraphfixError) as err:
        adapter.calibrator(batches())
    message = str(err.value)
    assert "TensorRT 11 removed implicit INT8 calibration" in message
    assert "Q/DQ model" in message


def test_get_batch_feeds_every_batch_then_none(trt):
    data = batches()
    calib = adapter.calibrator(data)
    assert calib.get_batch_size() == 2  # read from the first batch, which is not lost
    pointers = []
    for i in range(3):
        ptrs = calib.get_batch(["size", "image"])
        assert len(ptrs) == 2 and all(isinstance(p, int) and p for p in ptrs)
        pointers.append(ptrs)
        by_name = {b: buf for b, buf in zip(("size", "image"), trt.buffers, strict=True)}
        assert by_name["image"].data.tobytes() == data[i]["image"].astype(np.float32).tobytes()
        assert by_name["size"].data.tobytes() == data[i]["size"].tobytes()
    assert pointers[0] == pointers[1] == pointers[2]  # buffers are reused, not reallocated
    assert [b.allocations for b in trt.buffers] == [1, 1]
    assert calib.batches == 3
    assert calib.get_batch(["size", "image"]) is None
    assert all(b.freed for b in trt.buffers)
    assert calib.error is None


def test_reset_starts_the_data_over(trt):
    calib = adapter.calibrator(batches(count=2))
    assert calib.get_batch(["image"]) and calib.get_batch(["image"])
    assert calib.get_batch(["image"]) is None
    calib.reset()
    assert calib.get_batch(["image"]) is not None and calib.batches == 1


def test_batch_size_of_empty_data_is_one(trt):
    calib = adapter.calibrator([])
    assert calib.get_batch_size() == 1
    assert calib.get_batch(["image"]) is None


def test_a_batch_without_a_requested_input_ends_calibration_with_an_error(trt):
    calib = adapter.calibrator(batches())
    assert calib.get_batch(["image", "mask"]) is None
    assert isinstance(calib.error, GraphfixError)
    assert "has no input mask" in str(calib.error)


def test_cache_is_read_when_present_and_written_back(trt, tmp_path):
    path = tmp_path / "model.cache"
    calib = adapter.calibrator(batches(), cache=path)
    assert calib.read_calibration_cache() is None  # no file yet: TensorRT calibrates
    payload = b"TRT-100300-EntropyCalibration2\nimage: 3c010204\n"
    calib.write_calibration_cache(memoryview(payload))
    assert path.read_bytes() == payload
    assert adapter.calibrator(batches(), cache=path).read_calibration_cache() == payload
    path.write_bytes(b"")
    assert calib.read_calibration_cache() is None  # empty file: calibrate again
    assert calib.error is None


def test_without_a_cache_path_nothing_is_read_or_written(trt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calib = adapter.calibrator(batches())
    assert calib.read_calibration_cache() is None
    calib.write_calibration_cache(b"TRT-8601-MinMaxCalibration\n")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_is_reported_not_raised(trt, tmp_path):
    calib = adapter.calibrator(batches(), cache=tmp_path / "missing" / "model.cache")
    calib.write_calibration_cache(b"x")
    assert "cannot write the calibration cache" in str(calib.error)


def test_context_manager_frees_buffers(trt):
    with adapter.calibrator(batches()) as calib:
        calib.get_batch(["image"])
    assert trt.buffers and all(b.freed for b in trt.buffers)
