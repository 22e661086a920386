"""graphfix: get ONNX models through NVIDIA TensorRT.

One function per command, each returning a typed result with `to_json()` (what the
command's `--json` prints):

    result = graphfix.run("model.onnx", passes="cleanup,fold-bn", output="out.onnx")
    diagnosis = graphfix.doctor("out.onnx", trt="10")        # graphfix.doctor.Diagnosis
    calibration = graphfix.calibrate("out.onnx", data="calib.npz", output="int8.onnx")
    report = graphfix.check("out.onnx", "int8.onnx", data="calib.npz")  # .passed

`graphfix.doctor` and `graphfix.check` are also the packages behind those commands;
calling the package calls the command (`graphfix._command_module`).

The names below are imported on first use (PEP 562), so `import graphfix` and the
command line start fast: onnx-graphsurgeon and the passes load only when needed.
"""


from graphfix._lazy import lazy_attributes
from graphfix.errors import GraphfixError, InternalError

_LAZY = {
    "Calibration": "graphfix.api",
    "Result": "graphfix.api",
    "bisect": "graphfix.api",
    "calibrate": "graphfix.api",
    "run": "graphfix.api",
    "load": "graphfix.io",
    "save": "graphfix.io",
    "DEFAULT_PIPELINE": "graphfix.passes.registry",
    "PASSES": "graphfix.passes.registry",
    "Report": "graphfix.report",
}

_COMMAND_PACKAGES = ("check", "doctor")  # packages that are also API functions

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "Calibration",
    "GraphfixError",
    "InternalError",
    "Report",
    "Result",
    "__version__",
    "bisect",
    "calibrate",
    "check",
    "doctor",
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
    if name in _COMMAND_PACKAGES:  # importing binds the package here
        from importlib import import_module

        return import_module(f"{__name__}.{name}")
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted(__all__)
