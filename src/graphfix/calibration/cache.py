"""The legacy TensorRT calibration cache (implicit INT8, TensorRT 8.x-10.x), written and read.

Format (shared/trt/calibration_notes.md, section a)::

    TRT-<version int>-<algorithm>
    <tensor name>: <hex>

`hex` is the big-endian bit pattern of the float32 scale = amax / 127, lowercase,
no `0x`, no zero padding (a zero scale is written `0`). The version int is
`NV_TENSORRT_VERSION` of the TensorRT that reads the cache: MAJOR*1000 +
MINOR*100 + PATCH up to 9.x, MAJOR*10000 + MINOR*100 + PATCH from 10.0.
TensorRT ties a cache to that version and to the calibrator's algorithm, so
both must match the reader.

The header's algorithm for each graphfix method is `methods.Method.cache_algorithm`:
entropy -> EntropyCalibration2, minmax -> MinMaxCalibration (the names TensorRT
itself writes). auto, percentile and mse are not TensorRT calibrators; their ranges
are written under EntropyCalibration2, the calibrator trtexec uses to read
`--calib` (its RndInt8Calibrator is an IInt8EntropyCalibrator2,
NVIDIA/TensorRT samples/common/sampleEngines.cpp). For the same reason a
minmax cache meant for `trtexec --calib` should be written with
algorithm="EntropyCalibration2": the values are plain ranges either way.
"""

from __future__ import annotations

import math
import re
import struct

from graphfix.errors import GraphfixError

LEVELS = 127
DEFAULT_ALGORITHM = "EntropyCalibration2"
_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.\d+)*\s*$")
_HEX = re.compile(r"^[0-9a-fA-F]{1,8}$")


def trt_version_int(version: str) -> int:
    """NV_TENSORRT_VERSION for "major[.minor[.patch[.build]]]": "8.6.1" -> 8601,
    "10.9.0" -> 100900, "10" -> 100000. Missing parts are 0; a build number is ignored."""
    m = _VERSION.match(version)
    if not m:
        raise GraphfixError(
            f"'{version}' is not a TensorRT version",
            "a calibration cache header needs major.minor.patch",
            "pass a version such as 8.6.1 or 10.9.0",
        )
    major, minor, patch = (int(x) if x else 0 for x in m.groups())
    if minor > 99 or patch > 99 or (major < 10 and minor > 9):
        raise GraphfixError(
            f"TensorRT version '{version}' cannot be encoded in a cache header",
            "the header packs minor and patch into two decimal digits each "
            "(minor into one before TensorRT 10)",
            "pass the TensorRT version as released, e.g. 10.9.0",
        )
    if major >= 10:
        return major * 10000 + minor * 100 + patch
    return major * 1000 + minor * 100 + patch


def scale_hex(amax: float) -> str:
    """The cache's hex for amax: float32(amax / 127) bits, lowercase, '0' for 0."""
    if not math.isfinite(amax) or amax < 0:
        raise ValueError(f"amax must be finite and >= 0, got {amax}")
    bits = struct.unpack(">I", struct.pack(">f", amax / LEVELS))[0]
    return format(bits & 0x7FFFFFFF, "x")  # -0.0 (never produced from amax >= 0) -> '0'


def hex_scale(text: str) -> float:
    """The float32 scale a cache hex stands for (no padding needed: '0' -> 0.0)."""
    return struct.unpack(">f", int(text, 16).to_bytes(4, "big"))[0]


def write_cache(
    amaxes: dict[str, float], *, algorithm: str = DEFAULT_ALGORITHM, trt_version: str = "10.9.0"
) -> str:
    """The cache text for these ranges, one `name: hex` line per tensor in dict order.

    TensorRT 11 removed implicit INT8 calibration, so a cache for it is refused
    (use the Q/DQ model). Names must be one line; each line ends with a newline.
    """
    version = trt_version_int(trt_version)
    if int(version) >= 110000:
        raise GraphfixError(
            f"TensorRT {trt_version} cannot use a calibration cache",
            "TensorRT 11 removed implicit INT8 calibration (IInt8Calibrator, --int8/--calib)",
            "use the Q/DQ model graphfix writes, or target TensorRT 10 or older",
        )
    if not re.fullmatch(r"[A-Za-z0-9_]+", algorithm):
        raise ValueError(f"not a calibrator name: {algorithm!r}")
    lines = [f"TRT-{version}-{algorithm}"]
    for name, amax in amaxes.items():
        if "\n" in name or "\r" in name:
            raise GraphfixError(f"Tensor name {name!r} has a line break",
                                "each cache entry is one line", "rename the tensor")
        try:
            lines.append(f"{name}: {scale_hex(float(amax))}")
        except ValueError as exc:
            raise GraphfixError(f"Tensor '{name}' has no usable range ({amax})",
                                str(exc), "check its calibration statistics") from exc
    return "\n".join(lines) + "\n"


def _malformed(lineno: int, line: str, why: str) -> GraphfixError:
    return GraphfixError(
        f"Line {lineno} of the calibration cache is malformed: {line[:80]!r}",
        why,
        "entries must read 'name: hex', the float32 scale's bits in hex, as TensorRT writes them",
    )


def read_cache(text: str) -> tuple[str, dict[str, float]]:
    """(header, name -> scale) from a TensorRT calibration cache's text.

    Names may contain ':' (the last ': ' splits); blank lines are ignored. A
    missing `TRT-` header, a bad hex, a non-finite or negative scale, or a
    repeated name raises GraphfixError naming the line.
    """
    lines = text.splitlines()
    header = lines[0].strip() if lines else ""
    if not re.fullmatch(r"TRT-\d+-\w+", header):
        raise GraphfixError(
            "This is not a TensorRT calibration cache",
            f"its first line is {header[:80]!r}, not 'TRT-<version>-<algorithm>' "
            "(onnxruntime's calibration.cache has no such header and stores plain floats)",
            "pass a cache written by TensorRT or by graphfix",
        )
    scales: dict[str, float] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")
        value = value.strip()
        if not sep or not name:
            raise _malformed(lineno, line, "it has no 'name: value' separator")
        if not _HEX.match(value):
            raise _malformed(lineno, line, f"'{value}' is not 1 to 8 hex digits")
        scale = hex_scale(value)
        if not math.isfinite(scale) or scale < 0:
            raise _malformed(lineno, line, f"'{value}' decodes to the scale {scale}")
        if name in scales:
            raise _malformed(lineno, line, f"'{name}' already has an entry")
        scales[name] = scale
    return header, scales


def cache_amaxes(text: str) -> dict[str, float]:
    """name -> amax (scale * 127) from a cache's text; the scale's float32 value is
    kept exactly, so write_cache(cache_amaxes(t)) reproduces t's entries."""
    return {name: scale * LEVELS for name, scale in read_cache(text)[1].items()}
