"""TensorRT's own ONNX parser, next to doctor's static verdict, when `tensorrt` is installed.

Not run in graphfix's CI or on the machines it was developed on (no TensorRT there):
the message-to-node mapping is tested on recorded parser messages
(tests/trt/parser_messages.py), the call into TensorRT is not.
"""

from __future__ import annotations

from typing import Any

import onnx

from graphfix.errors import GraphfixError
from graphfix.trt.parser import map_errors_to_nodes, run_trt_parser


def live_verdict(path: str, model: onnx.ModelProto) -> dict[str, Any] | None:
    """{"verdict", "errors": [{"message", "node", "code"}]}, or None without tensorrt."""
    try:
        messages = run_trt_parser(path)
    except GraphfixError as err:  # tensorrt is installed but cannot start (no GPU/driver)
        return {"verdict": f"could not run: {err.message}", "errors": []}
    if messages is None:
        return None
    errors = [
        {"message": err.message, "node": node, "code": err.code}
        for err, node in map_errors_to_nodes(messages, model)
    ]
    verdict = "parsed" if not errors else f"failed with {len(errors)} error(s)"
    return {"verdict": verdict, "errors": errors}
