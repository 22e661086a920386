"""`graphfix doctor`: what a TensorRT version's ONNX parser will reject, node by node,
and the fix — offline, from the facts in `graphfix.trt` (no TensorRT, no GPU).

Names are imported on first use (PEP 562), so the CLI can import `doctor.findings`
without loading the rules.
"""

from graphfix._lazy import lazy_attributes
from graphfix.doctor.findings import ERROR, INFO, SCHEMA, WARN, Diagnosis, Finding

_LAZY = {"Rule": "graphfix.doctor.engine", "diagnose": "graphfix.doctor.engine",
         "rules": "graphfix.doctor.engine"}

__all__ = ["ERROR", "INFO", "SCHEMA", "WARN", "Diagnosis", "Finding", "Rule", "diagnose", "rules"]


__getattr__ = lazy_attributes(__name__, _LAZY)
