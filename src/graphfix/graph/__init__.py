"""Small helpers over onnx-graphsurgeon used by passes and the manager.

Imported on first use (PEP 562): `graphfix.graph.protos` and `skeleton` work on plain
ONNX protos, and importing them must not load onnx-graphsurgeon.
"""

from importlib import import_module as _import_module

_LAZY = {
    "all_graphs": "graphfix.graph.walk",
    "bypass": "graphfix.graph.rewire",
    "constant_value": "graphfix.graph.rewire",
    "count_nodes": "graphfix.graph.walk",
    "fingerprint": "graphfix.graph.walk",
    "fresh_name": "graphfix.graph.rewire",
    "is_graph_output": "graphfix.graph.rewire",
    "is_onnx": "graphfix.graph.walk",
    "node_label": "graphfix.graph.walk",
    "opset_of": "graphfix.graph.walk",
    "replace_in": "graphfix.graph.rewire",
    "take_output": "graphfix.graph.rewire",
    "to_graph": "graphfix.graph.convert",
    "to_model": "graphfix.graph.convert",
}

__all__ = [
    "all_graphs",
    "bypass",
    "constant_value",
    "count_nodes",
    "fingerprint",
    "fresh_name",
    "is_graph_output",
    "is_onnx",
    "node_label",
    "opset_of",
    "replace_in",
    "take_output",
    "to_graph",
    "to_model",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'graphfix.graph' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
