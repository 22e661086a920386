"""The TensorRT calibration cache: real caches (quoted in shared/trt/calibration_notes.md)
decoded and rewritten byte for byte, headers, and malformed input."""

from __future__ import annotations

import pytest

from graphfix.calibration import cache as C
from graphfix.errors import GraphfixError

# (TensorRT version, cache text) as TensorRT wrote them; see calibration_notes.md (a)
REAL = [
    ("7.0.0", "TRT-7000-EntropyCalibration2\n"  # NVIDIA/TensorRT sampleINT8 README (MNIST)
              "data: 3c008912\nconv1: 3c88edfc\npool1: 3c88edfc\nconv2: 3ddc858b\n"
              "pool2: 3ddc858b\nip1: 3db6bd6e\nip2: 3e691968\nprob: 3c010a14\n"),
    ("10.9.0", "TRT-100900-EntropyCalibration2\n"  # dnth/DEIMKit calibration.cache
               "images: 3c021406\n/model/backbone/stem/stem1/conv/Conv_output_0: 3aec0f08\n"
               "ONNXTRT_Broadcast_1855_output: 0\n"),
    ("8.5.1", "TRT-8501-EntropyCalibration2\n"  # zxm97/Pytorch_Retina_License_Plate_trt
              "input: 3f9234fa\n/fpn/Add_output_0: 3d68d820\noutput: 3d9a518a\n"),
    ("7.1.3", "TRT-7103-EntropyCalibration2\ndata_0: 4000889d\n"),  # onnxruntime TRT EP comment
]


@pytest.mark.parametrize(("version", "text"), REAL)
def test_real_caches_round_trip_byte_for_byte(version, text):
    header, scales = C.read_cache(text)
    assert header == text.splitlines()[0]
    amaxes = C.cache_amaxes(text)
    assert list(amaxes) == list(scales)
    assert C.write_cache(amaxes, trt_version=version) == text


def test_real_values_decode_to_the_expected_ranges():
    amaxes = C.cache_amaxes(REAL[0][1])
    assert amaxes["data"] == pytest.approx(0.99634, rel=1e-4)  # MNIST input in [0, 1]
    assert amaxes["prob"] == pytest.approx(1.00024, rel=1e-4)  # softmax output
    assert amaxes["conv2"] == pytest.approx(13.675, rel=1e-4)
    assert C.cache_amaxes(REAL[2][1])["input"] == pytest.approx(145.07, rel=1e-4)
    assert C.cache_amaxes(REAL[1][1])["images"] == pytest.approx(1.0083, rel=1e-4)


def test_scale_hex_examples():
    assert C.scale_hex(1.0) == "3c010204"  # scale 1/127
    assert C.scale_hex(0.0) == "0"
    assert C.hex_scale("0") == 0.0
    with pytest.raises(ValueError):
        C.scale_hex(-1.0)


def test_zero_entry_is_written_as_0():
    text = C.write_cache({"a": 0.0, "b": 127.0}, trt_version="8.6.1")
    assert text == "TRT-8601-EntropyCalibration2\na: 0\nb: 3f800000\n"
    assert C.read_cache(text)[1] == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize(("version", "expected"), [
    ("7.0.0", 7000), ("7.1.3", 7103), ("8.5.1", 8501), ("8.6.1", 8601), ("8.6", 8600),
    ("10.0.0", 100000), ("10.9.0", 100900), ("10.12", 101200), ("10", 100000),
    ("10.9.0.34", 100900),
])
def test_trt_version_int(version, expected):
    assert C.trt_version_int(version) == expected


@pytest.mark.parametrize("version", ["ten", "", "8.10.0", "10.100.0", "10.9.x"])
def test_trt_version_int_rejects_what_it_cannot_encode(version):
    with pytest.raises(GraphfixError):
        C.trt_version_int(version)


def test_headers_per_method():
    """The header's algorithm comes from the method registry (TensorRT's own names)."""
    from graphfix.calibration import methods

    header = {m.name: m.cache_algorithm for m in methods.METHODS}
    assert header == {"auto": "EntropyCalibration2", "entropy": "EntropyCalibration2",
                      "minmax": "MinMaxCalibration", "percentile": "EntropyCalibration2",
                      "mse": "EntropyCalibration2"}
    assert C.write_cache({}, algorithm=header["minmax"]).startswith(
        "TRT-100900-MinMaxCalibration\n")


def test_tensorrt_11_gets_no_cache():
    with pytest.raises(GraphfixError, match="TensorRT 11 removed"):
        C.write_cache({"a": 1.0}, trt_version="11.0")


def test_names_with_colons_and_spaces():
    text = ("TRT-8601-EntropyCalibration2\nconv1/Relu:0: 3c010204\n"
            "(Unnamed Layer* 4) [Fully Connected]_output: 3c010204\n")
    assert list(C.read_cache(text)[1]) == ["conv1/Relu:0",
                                           "(Unnamed Layer* 4) [Fully Connected]_output"]
    assert C.write_cache(C.cache_amaxes(text), trt_version="8.6.1") == text


@pytest.mark.parametrize(("text", "match"), [
    ("input 1.0\n", "not a TensorRT calibration cache"),  # onnxruntime's calibration.cache
    ("", "not a TensorRT calibration cache"),
    ("TRT-8601-EntropyCalibration2\na: 3c010204\nb 3c010204\n", "Line 3 .*no 'name: value'"),
    ("TRT-8601-EntropyCalibration2\na: 3c01020g\n", "Line 2 .*hex"),
    ("TRT-8601-EntropyCalibration2\na: 123456789\n", "Line 2 .*hex"),
    ("TRT-8601-EntropyCalibration2\na: 7fc00000\n", "Line 2 .*nan"),
    ("TRT-8601-EntropyCalibration2\na: bf800000\n", "Line 2 .*-1.0"),
    ("TRT-8601-EntropyCalibration2\na: 0\n\na: 0\n", "Line 4 .*already"),
])
def test_malformed_caches(text, match):
    with pytest.raises(GraphfixError, match=match):
        C.read_cache(text)


def test_blank_lines_are_ignored():
    header, scales = C.read_cache("TRT-8601-EntropyCalibration2\n\na: 3c010204\n\n")
    assert header == "TRT-8601-EntropyCalibration2"
    assert scales == {"a": pytest.approx(1 / 127)}


def test_bad_amax_is_a_user_error():
    with pytest.raises(GraphfixError, match="'a' has no usable range"):
        C.write_cache({"a": float("nan")})
