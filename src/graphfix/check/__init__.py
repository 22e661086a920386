"""Numerical comparison: onnxruntime runs, seeded inputs, tolerances per dtype.

The package is also the API function: `graphfix.check(reference, candidate, ...)` is
`graphfix.api.check` (`graphfix._command_module`).
"""

from graphfix._command_module import make_callable

make_callable(__name__, "check")
