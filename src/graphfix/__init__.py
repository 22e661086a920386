"""graphfix: get ONNX models through NVIDIA TensorRT.

Verified graph rewrites (`run`), with every pass checked numerically against
the original model in onnxruntime.

The names below are imported on first use (PEP 562), so `import graphfix` and the
command line start fast: onnx-graphsurgeon and the passes load only when needed.
"""


from graphfix._lazy import lazy_attributes
from graphfix.errors import GraphfixError, InternalError

_LAZY = {
    "Result": "graphfix.api",
    "bisect": "graphfix.api",
    "run": "graphfix.api",
    "load": "graphfix.io",
    "save": "graphfix.io",
    "DEFAULT_PIPELINE": "graphfix.passes.registry",
    "PASSES": "graphfix.passes.registry",
    "Report": "graphfix.report",
}

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "GraphfixError",
    "InternalError",
    "Report",
    "Result",
    "__version__",
    "bisect",
    "load",
    "run",
    "save",
]


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("graphfix")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0"


_lazy_getattr = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted(__all__)
