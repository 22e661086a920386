"""`graphfix doctor`: what a TensorRT version's ONNX parser will reject, node by node,
and the fix — offline, from the facts in `graphfix.trt` (no TensorRT, no GPU)."""

from graphfix.doctor.engine import Rule, diagnose, rules
from graphfix.doctor.findings import ERROR, INFO, SCHEMA, WARN, Diagnosis, Finding

__all__ = ["ERROR", "INFO", "SCHEMA", "WARN", "Diagnosis", "Finding", "Rule", "diagnose", "rules"]
