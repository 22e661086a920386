"""graphfix: get ONNX models through NVIDIA TensorRT.

Verified graph rewrites (`run`), with every pass checked numerically against
the original model in onnxruntime.
"""

from importlib import metadata as _metadata

from graphfix.api import Result, run
from graphfix.errors import GraphfixError, InternalError
from graphfix.io import load, save
from graphfix.passes.registry import DEFAULT_PIPELINE, PASSES
from graphfix.report import Report

try:
    __version__ = _metadata.version("graphfix")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "GraphfixError",
    "InternalError",
    "Report",
    "Result",
    "__version__",
    "load",
    "run",
    "save",
]
