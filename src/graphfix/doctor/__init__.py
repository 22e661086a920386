"""`graphfix doctor`: what a TensorRT version's ONNX parser will reject, node by node,
and the fix — offline, from the facts in `graphfix.trt` (no TensorRT, no GPU).

Names are imported on first use (PEP 562), so the CLI can import `doctor.findings`
without loading the rules.
"""

from importlib import import_module as _import_module

from graphfix.doctor.findings import ERROR, INFO, SCHEMA, WARN, Diagnosis, Finding

_LAZY = {"Rule": "graphfix.doctor.engine", "diagnose": "graphfix.doctor.engine",
         "rules": "graphfix.doctor.engine"}

__all__ = ["ERROR", "INFO", "SCHEMA", "WARN", "Diagnosis", "Finding", "Rule", "diagnose", "rules"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'graphfix.doctor' has no attribute {name!r}")
