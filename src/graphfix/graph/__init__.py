"""Small helpers over onnx-graphsurgeon used by passes and the manager.

Imported on first use (PEP 562): `graphfix.graph.protos` and `skeleton` work on plain
ONNX protos, and importing them must not load onnx-graphsurgeon.
"""

from graphfix._lazy import lazy_attributes

_LAZY = {
    "all_graphs": "graphfix.graph.walk",
    "bypass": "graphfix.graph.rewire",
    "constant_value": "graphfix.graph.rewire",
    "count_nodes": "graphfix.graph.walk",
    "fingerprint": "graphfix.graph.walk",
    "fresh_name": "graphfix.graph.rewire",
    "is_graph_output": "graphfix.graph.rewire",
    "is_onnx": "graphfix.graph.walk",
    "names_in_use": "graphfix.graph.walk",
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
    "names_in_use",
    "node_label",
    "opset_of",
    "replace_in",
    "take_output",
    "to_graph",
    "to_model",
]


__getattr__ = lazy_attributes(__name__, _LAZY)
