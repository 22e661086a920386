"""`graphfix doctor`: what a TensorRT version's ONNX parser will reject, node by node,
and the fix — offline, from the facts in `graphfix.trt` (no TensorRT, no GPU).

Names are imported on first use (PEP 562), so the CLI can import `doctor.findings`
without loading the rules. The package is also the API function: `graphfix.doctor(model,
trt="10")` is `graphfix.api.doctor` (`graphfix._command_module`).
"""

from graphfix._command_module import make_callable
from graphfix._lazy import lazy_attributes
from graphfix.doctor.findings import ERROR, INFO, SCHEMA, WARN, Diagnosis, Finding, Severity

_LAZY = {"Rule": "graphfix.doctor.engine", "diagnose": "graphfix.doctor.engine",
         "rules": "graphfix.doctor.engine"}

__all__ = ["ERROR", "INFO", "SCHEMA", "WARN", "Diagnosis", "Finding", "Rule", "Severity",
           "diagnose", "rules"]


__getattr__ = lazy_attributes(__name__, _LAZY)
make_callable(__name__, "doctor")
